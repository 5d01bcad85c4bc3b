"""The reference peer of issue 63: transformers' ELECTRA as an objective of xylent's trainer.
It builds from the registry, keeps the objective contract (sums and counts, host counts, the
audit's replay), learns on a toy batch, and its exported encoder is what transformers computes."""

from __future__ import annotations

import pytest
import torch

from xylent.models.config import preset
from xylent.models.masking import row_noise
from xylent.models.objectives import build_model
from xylent.models.training.optim import make_optimizer
from xylent.models.pretrained import PretrainedEncoder
from xylent.models.stats import Norms

SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(5)))


def _cfg(**kw):
    return preset("tiny", vocab_size=60, max_position=32, dropout=0.0, relative_bias=False, specials=SPECIALS, **kw)


def _batch(seed: int = 1):
    ids = torch.randint(5, 60, (6, 20), generator=torch.Generator().manual_seed(seed))
    pad = torch.zeros_like(ids, dtype=torch.bool)
    pad[0, 14:] = pad[3, 9:] = True
    ids[pad] = SPECIALS["pad"]
    ids[:, 0] = SPECIALS["bos"]
    segments = torch.zeros_like(ids)
    segments[:, 10:] = 1
    noise = row_noise(0, 0, 0, list(range(6)), [int(n) for n in (~pad).sum(1)], ids.shape[1])
    return ids, pad, segments, noise


def test_the_reference_refuses_xlm_es_relative_bias():
    with pytest.raises(ValueError, match="set model.relative_bias: false"):
        build_model("transformers-electra", preset("tiny", vocab_size=60, specials=SPECIALS))


def test_the_reference_shares_transformers_embeddings_and_learns_a_toy_batch():
    torch.manual_seed(0)
    model = build_model("transformers-electra", _cfg())
    gen, disc = model.generator, model.discriminator
    assert type(gen).__name__ == "ElectraForMaskedLM" and type(disc).__name__ == "ElectraForPreTraining"
    assert gen.electra.embeddings is disc.electra.embeddings
    assert gen.generator_lm_head.weight is model.token_embedding()
    assert len(disc.electra.encoder.layer) == 2 and len(gen.electra.encoder.layer) == 1
    ids, pad, segments, noise = _batch()
    counts = model.host_counts(ids.numpy(), segments.numpy(), (~pad).numpy())
    st = model(ids, pad, segments, noise, **counts)
    again = model(ids, pad, segments, noise)  # the counts read from the device instead: the same step
    sampled = model.generated_input().clone()
    assert torch.equal(st.g_loss, again.g_loss) and torch.equal(st.d_loss, again.d_loss)
    assert int(st.g_count) == counts["n_masked"] and int(st.d_count) == counts["n_real"] == int((~pad).sum())
    # the audit's partner-swapped pass replays the generator's samples: the same discriminator input
    replayed = model(ids, pad, segments, noise, per_row=True, replay=model.generated_input(), **counts)
    assert torch.equal(model.generated_input(), sampled)
    assert replayed.rows.shape == (5, 6) and torch.allclose(replayed.rows[0].sum(), st.g_loss)
    opt = make_optimizer(model, lr=5e-3)
    losses = []
    for _ in range(15):
        st = model(ids, pad, segments, noise, **counts)
        loss = model.loss(st, Norms(st.g_count, st.d_count, None))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_exported_encoder_computes_what_transformers_computes():
    torch.manual_seed(0)
    cfg = _cfg()
    model = build_model("transformers-electra", cfg)
    with torch.no_grad():  # trained-looking weights: no row of any table at its init value
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    encoder = PretrainedEncoder(cfg)
    encoder.load_state_dict(model.encoder_state_dict(), strict=True)
    ids, pad, _, _ = _batch(seed=2)
    mask = (~pad).long()
    with torch.no_grad():
        ours = encoder(ids, mask, output_hidden_states=True)[1]
        theirs = model.discriminator.electra(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(ours) == len(theirs) == cfg.layers + 1
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.allclose(a[~pad], b[~pad], atol=1e-5), (i, (a[~pad] - b[~pad]).abs().max())
