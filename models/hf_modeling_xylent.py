"""xylent encoders as Hugging Face transformers models (``trust_remote_code=True``).

Self-contained on purpose: :func:`xylent.models.hf_export.export_hf` copies this file into
the exported folder, where transformers' dynamic module loader imports it without
xylent installed.  The computation is :mod:`xylent.models.encoder` / :mod:`xylent.models.attention`
op for op (post-LayerNorm blocks, XLM-E's gated relative position bias over T5
buckets, absolute position embeddings), so hidden states match
``xylent.models.load_pretrained`` to rounding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import CrossEntropyLoss, MSELoss
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

try:  # transformers >= 5: init functions that leave loaded weights alone
    from transformers import initialization as _init
except ImportError:  # 4.x initialises only the modules whose weights are missing
    _init = nn.init


class XylentConfig(PretrainedConfig):
    model_type = "xylent"

    def __init__(self, vocab_size=250_002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, rel_buckets=32, rel_max_distance=128,
                 relative_bias=True, gate="wavlm", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                 classifier_dropout=None, layer_norm_eps=1e-5, initializer_range=0.02,
                 pad_token_id=3, bos_token_id=1, eos_token_id=2, mask_token_id=4, unk_token_id=0, **kwargs):
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads "
                             f"({num_attention_heads})")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rel_buckets = rel_buckets
        self.rel_max_distance = rel_max_distance
        self.relative_bias = relative_bias
        self.gate = gate  # "wavlm" by default: exports written before the field were trained with it
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.classifier_dropout = classifier_dropout
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        self.unk_token_id = unk_token_id
        # 4.x's base __init__ sets the token ids itself (to None when not passed)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id, **kwargs)


def relative_buckets(length: int, num_buckets: int, max_distance: int, device=None) -> torch.Tensor:
    """T5 bidirectional buckets of j − i, (length, length)."""
    pos = torch.arange(length, device=device)
    rel = pos[None, :] - pos[:, None]
    half = num_buckets // 2
    buckets = (rel > 0).long() * half
    rel = rel.abs()
    exact = half // 2
    large = exact + (torch.log(rel.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (half - exact)).long()
    large = torch.minimum(large, torch.full_like(large, half - 1))
    return buckets + torch.where(rel < exact, rel, large)


class XylentEmbeddings(nn.Module):
    """Token + absolute position embeddings, then LayerNorm and dropout: hidden_states[0]."""

    def __init__(self, config: XylentConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)[None]
        return self.dropout(self.layer_norm(x))


class XylentRelativeBias(nn.Module):
    """The bias table d[bucket, head], shared by every layer."""

    def __init__(self, config: XylentConfig):
        super().__init__()
        self.num_buckets, self.max_distance = config.rel_buckets, config.rel_max_distance
        self.table = nn.Embedding(config.rel_buckets, config.num_attention_heads)

    def forward(self, length: int) -> torch.Tensor:
        b = relative_buckets(length, self.num_buckets, self.max_distance, device=self.table.weight.device)
        return self.table(b).permute(2, 0, 1)  # (heads, L, L)


class XylentGate(nn.Module):
    """Per-layer gate of the shared table: r = d + g_u·d + (1 − g_u)·w·g_r·d.  ``gate: xlm-e``:
    gates from each head's projected query, one w (XLM-E §3.3); ``wavlm``: from the attention
    input split into heads, a w per head.  -inf at padded keys folded into the same tensor."""

    def __init__(self, config: XylentConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.form = config.gate
        self.uv = nn.Linear(self.head_dim, 2, bias=False)
        self.w = nn.Parameter(torch.ones(self.num_heads if self.form == "wavlm" else 1))

    def forward(self, x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        src = q if self.form == "xlm-e" else x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        g = torch.sigmoid(self.uv(src))
        g_u, g_r = g[..., 0:1], g[..., 1:2]
        scale = 1 + g_u + (1 - g_u) * self.w.view(1, -1, 1, 1) * g_r
        neg = torch.zeros(pad.shape, dtype=d.dtype, device=d.device).masked_fill(pad, float("-inf"))
        return torch.addcmul(neg[:, None, None, :], scale, d.unsqueeze(0))


class XylentSelfAttention(nn.Module):
    def __init__(self, config: XylentConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.gate = XylentGate(config) if config.relative_bias else None
        self.dropout = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, rel: torch.Tensor | None, pad: torch.Tensor) -> torch.Tensor:
        b, n, dim = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        mask = self.gate(x, q, rel, pad) if self.gate is not None else ~pad[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(b, n, dim))


class XylentLayer(nn.Module):
    """Post-LayerNorm block (BERT/ELECTRA)."""

    def __init__(self, config: XylentConfig):
        super().__init__()
        self.attention = XylentSelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, rel: torch.Tensor | None, pad: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, rel, pad)))
        return self.output_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class XylentEncoder(nn.Module):
    def __init__(self, config: XylentConfig):
        super().__init__()
        self.relative_bias = XylentRelativeBias(config) if config.relative_bias else None
        self.layer = nn.ModuleList(XylentLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> list[torch.Tensor]:
        rel = self.relative_bias(x.shape[1]) if self.relative_bias is not None else None
        hidden = [x]
        for layer in self.layer:
            x = layer(x, rel, pad)
            hidden.append(x)
        return hidden


class XylentPreTrainedModel(PreTrainedModel):
    config_class = XylentConfig
    base_model_prefix = "xylent"
    _no_split_modules = ["XylentLayer", "XylentEmbeddings"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        # xylent's own scheme (models/weight_init.py): N(0, σ) weights, zero biases, identity norms, gate w = 1
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            _init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                _init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            _init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            _init.ones_(module.weight)
            _init.zeros_(module.bias)
        elif isinstance(module, XylentGate):
            _init.ones_(module.w)


class XylentModel(XylentPreTrainedModel):
    """The encoder body: BaseModelOutput with last_hidden_state and, when asked, hidden_states
    (embeddings output first, then every layer)."""

    def __init__(self, config: XylentConfig):
        super().__init__(config)
        self.embeddings = XylentEmbeddings(config)
        self.encoder = XylentEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None):
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        # as xylent: without a mask, pad ids are the padding (HF models would attend to everything)
        pad = input_ids == self.config.pad_token_id if attention_mask is None else attention_mask == 0
        hidden = self.encoder(self.embeddings(input_ids), pad)
        states = tuple(hidden) if output_hidden_states else None
        if not return_dict:
            return (hidden[-1], states) if output_hidden_states else (hidden[-1],)
        return BaseModelOutput(last_hidden_state=hidden[-1], hidden_states=states)


def _dropout(config: XylentConfig) -> float:
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class XylentClassificationHead(nn.Module):
    """First token (<s>): dropout → dense → tanh → dropout → out_proj (RoBERTa)."""

    def __init__(self, config: XylentConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(_dropout(config))
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense(self.dropout(features[:, 0])))
        return self.out_proj(self.dropout(x))


def _as_tuple(loss, logits: tuple, hidden) -> tuple:
    """transformers' return_dict=False convention: (loss?, *logits, hidden_states?)."""
    rest = logits + ((hidden,) if hidden is not None else ())
    return ((loss,) + rest) if loss is not None else rest


class XylentForSequenceClassification(XylentPreTrainedModel):
    def __init__(self, config: XylentConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.xylent = XylentModel(config)
        self.classifier = XylentClassificationHead(config)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xylent(input_ids, attention_mask, output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.classifier(out.last_hidden_state)
        loss = None
        if labels is not None:
            problem = self.config.problem_type or ("regression" if self.num_labels == 1
                                                   else "single_label_classification")
            if problem == "regression":
                loss = MSELoss()(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype)) if self.num_labels == 1 \
                    else MSELoss()(logits, labels.to(logits.dtype))
            elif problem == "single_label_classification":
                loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
            else:
                raise ValueError(f"problem_type {problem!r} is not supported by XylentForSequenceClassification: "
                                 "use 'single_label_classification' or 'regression'")
        if not return_dict:
            return _as_tuple(loss, (logits,), out.hidden_states)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class XylentForTokenClassification(XylentPreTrainedModel):
    def __init__(self, config: XylentConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.xylent = XylentModel(config)
        self.dropout = nn.Dropout(_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xylent(input_ids, attention_mask, output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = None if labels is None else CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        if not return_dict:
            return _as_tuple(loss, (logits,), out.hidden_states)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class XylentForQuestionAnswering(XylentPreTrainedModel):
    def __init__(self, config: XylentConfig):
        super().__init__(config)
        self.xylent = XylentModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None, end_positions: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.xylent(input_ids, attention_mask, output_hidden_states=output_hidden_states, return_dict=True)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in self.qa_outputs(out.last_hidden_state)
                                    .split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            # answers outside the window point at index L, which the loss ignores
            n = start_logits.size(1)
            ce = CrossEntropyLoss(ignore_index=n)
            loss = (ce(start_logits, start_positions.view(-1).clamp(0, n))
                    + ce(end_logits, end_positions.view(-1).clamp(0, n))) / 2
        if not return_dict:
            return _as_tuple(loss, (start_logits, end_logits), out.hidden_states)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=out.hidden_states)
