"""VECO's CA-MLM (xylent.models.veco): the stop-gradient on H^L, plug-out = the plain MLM
encoder, the four-term loss by hand, per-row sums, and a model that learns to use
the translation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xylent.models.config import preset
from xylent.models.electra import MaskedLMModel
from xylent.models.masking import bert_corrupt, choose_masked, row_noise
from xylent.models.pretrained import PretrainedEncoder
from xylent.models.stats import Norms
from xylent.models.veco import VecoModel, VecoOptions
from xylent.spec import VecoConfig
from xylent.tasks.vocab.specials import BOS, EOS, PAD, SPECIAL_PIECES
from tests.test_hf_export import tokenizer_dir  # noqa: F401  (a fixture: a small SentencePiece model)
from xylent.errors import XylentError

SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(len(SPECIAL_PIECES))))


def _options(**over) -> VecoOptions:
    """pretrain.veco's defaults (the spec is their one home) with ``over``."""
    return VecoOptions(**{**VecoConfig().model_dump(), **over})


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("options", _options())
    return VecoModel(preset("tiny", vocab_size=60, max_position=64, dropout=0.0, specials=SPECIALS), **kw)


def _pairs(seed=0, x_lens=(9, 5, 12, 3), y_lens=(7, 11, 4, 2)):
    """TRTD rows ``<s> x </s> y </s>`` of different lengths (so both sides pad differently)."""
    g = torch.Generator().manual_seed(seed)
    width = max(a + b for a, b in zip(x_lens, y_lens)) + 3
    ids = torch.full((len(x_lens), width), PAD)
    seg = torch.zeros_like(ids)
    for r, (a, b) in enumerate(zip(x_lens, y_lens)):
        ids[r, : a + b + 3] = torch.randint(5, 60, (a + b + 3,), generator=g)
        ids[r, 0], ids[r, a + 1], ids[r, a + b + 2] = BOS, EOS, EOS
        seg[r, a + 2:] = 1
    pad = ids == PAD
    noise = row_noise(seed, 0, 0, list(range(len(ids))), (~pad).sum(1).tolist(), width)
    return ids, pad, seg, noise


def _mrtd(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (4, 24), generator=g)
    ids[:, 0], ids[:, 17], ids[:, 18:] = BOS, EOS, PAD
    pad = ids == PAD
    return ids, pad, row_noise(seed, 0, 0, list(range(4)), (~pad).sum(1).tolist(), 24)


def test_no_gradient_reaches_the_paired_side_through_cross_attention():
    model = _model()
    ids, pad, seg, noise = _pairs()
    captured = []
    def keep(module, inputs, out):  # H^L: the plug-out pass (the only call of model.encoder)
        out.retain_grad()
        captured.append(out)
    hook = model.encoder.register_forward_hook(keep)
    tok_out, tok_in, *_ = model.pair_terms(ids, pad, seg, noise)
    hook.remove()
    (h,) = captured
    body = [p for n, p in model.named_parameters() if not model.is_cross(n)]
    tok_in.sum().backward(retain_graph=True)
    assert h.grad is None or not h.grad.any(), "the plug-in terms send no gradient into H^L"
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if model.is_cross(n) and n.endswith("weight")), "yet the plug-in terms train the cross-attention"
    grads_in = [p.grad.clone() for p in body]

    # the same gradients with H^L replaced by a constant: nothing flows back through the paired side
    model.zero_grad()
    masked = choose_masked(ids, seg, model.options.pair_mask_prob, noise[0], model.special_ids)
    corrupted = bert_corrupt(ids, masked, noise, model.cfg.vocab_size, SPECIALS["mask"], 5)
    src, tgt = model._sides(corrupted, pad, seg, BOS, PAD), model._sides(ids, pad, seg, BOS, PAD)
    masked, side_pad = model._sides(masked.long(), pad, seg, 0, 0).bool(), tgt == PAD
    b = ids.shape[0]
    with torch.no_grad():
        memory = model.plug_out(src, side_pad)
    memory, memory_pad = torch.cat([memory[b:], memory[:b]]), torch.cat([side_pad[b:], side_pad[:b]])
    hidden = model.plug_in(src, side_pad, memory, memory_pad)
    logits = model.head(hidden[masked], model.embeddings.tokens.weight)
    F.cross_entropy(logits, tgt[masked], reduction="sum").backward()
    for g_ref, p in zip(grads_in, body):
        torch.testing.assert_close(p.grad, g_ref, rtol=1e-4, atol=1e-7)

    model.zero_grad()
    tok_out.sum().backward()
    assert h.grad is not None and h.grad.abs().sum() > 0, "the plug-out terms do train through H^L"


def test_the_plug_in_pass_reads_the_translation():
    model = _model()
    ids, pad, seg, noise = _pairs()
    other = ids.clone()
    regular = (seg == 1) & (ids >= 5)
    other[regular] = 5 + (ids[regular] - 5 + 17) % 55  # another y, same masking (specials stay put)
    with torch.no_grad():
        a_out, a_in, m, *_ = model.pair_terms(ids, pad, seg, noise)
        b_out, b_in, *_ = model.pair_terms(other, pad, seg, noise)
    n_x = int(m[: len(ids)].sum())  # x's tokens come first
    torch.testing.assert_close(a_out[:n_x], b_out[:n_x])  # plug-out over x does not see y
    assert (a_in[:n_x] - b_in[:n_x]).abs().max() > 1e-4, "plug-in over x does"


def test_plug_out_is_the_mlm_encoder_and_exports_as_a_pretrained_encoder():
    model = _model()
    mlm = MaskedLMModel(model.cfg)
    body = {k: v for k, v in model.state_dict().items() if not k.startswith("cross.")}
    mlm.load_state_dict(body, strict=True)
    assert set(model.plug_in_state_dict()) == set(model.state_dict()) - set(body)
    assert {n for n, _ in model.named_parameters() if not model.is_cross(n)} == {n for n, _ in mlm.named_parameters()}
    ids, pad, noise = _mrtd()
    a, b = model(ids, pad, None, noise), mlm(ids, pad, None, noise)
    torch.testing.assert_close(a.g_loss, b.g_loss)
    assert (a.g_count, a.g_correct, a.tokens) == (b.g_count, b.g_correct, b.tokens)
    h = model.plug_out(ids, pad)
    torch.testing.assert_close(h, mlm.encoder(mlm.embeddings(ids), pad))

    assert set(model.encoder_state_dict()) == set(mlm.encoder_state_dict())
    enc = PretrainedEncoder(model.cfg)
    enc.load_state_dict(model.encoder_state_dict(), strict=True)
    torch.testing.assert_close(enc.eval()(ids, (~pad).long()), h)


def test_a_silent_cross_attention_leaves_the_plug_in_pass_equal_to_plug_out():
    """Guards the plug-in loop, which re-states xylent.models.encoder.Layer with the cross sublayer inside."""
    model = _model()
    for c in model.cross:
        torch.nn.init.zeros_(c.attn.out.weight)
        torch.nn.init.zeros_(c.attn.out.bias)
    ids, pad, _ = _mrtd()
    h = model.plug_out(ids, pad)
    torch.testing.assert_close(model.plug_in(ids, pad, h, pad), h, rtol=1e-4, atol=1e-4)  # LN(LN(z)) ≈ LN(z)


def _by_hand(model, ids, pad, seg, noise):
    """VECO §4's TLM + CA-MLM of each pair row: TLM on the joined masked row, then CA-MLM's
    four terms (Eq. 1), each side run alone (no stacking, no padding)."""
    masked = choose_masked(ids, seg, model.options.pair_mask_prob, noise[0], model.special_ids)
    corrupted = bert_corrupt(ids, masked, noise, model.cfg.vocab_size, SPECIALS["mask"], 5)
    rows, count, correct = [], 0, 0
    for r in range(len(ids)):
        side = {}
        for s in (0, 1):
            pos = ((seg[r] == s) & ~pad[r]).nonzero().squeeze(1)
            lead = [] if s == 0 else [BOS]
            src = torch.tensor(lead + corrupted[r, pos].tolist())[None]
            tgt = torch.tensor(lead + ids[r, pos].tolist())
            m = torch.tensor([False] * len(lead) + masked[r, pos].tolist())
            side[s] = (src, tgt, m, torch.zeros_like(src, dtype=torch.bool))
        real = ~pad[r]
        h = model.plug_out(corrupted[r, real][None], torch.zeros(1, int(real.sum()), dtype=torch.bool))
        tlm = model.head(h[0][masked[r, real]], model.embeddings.tokens.weight)
        total = F.cross_entropy(tlm, ids[r, real][masked[r, real]], reduction="sum")
        correct += int((tlm.argmax(-1) == ids[r, real][masked[r, real]]).sum())
        count += int(masked[r].sum())
        for s in (0, 1):
            src, tgt, m, p = side[s]
            o_src, _, _, o_p = side[1 - s]
            for h in (model.plug_out(src, p), model.plug_in(src, p, model.plug_out(o_src, o_p), o_p)):
                logits = model.head(h[0][m], model.embeddings.tokens.weight)
                total = total + F.cross_entropy(logits, tgt[m], reduction="sum")
                correct += int((logits.argmax(-1) == tgt[m]).sum())
            count += 2 * int(m.sum())
        rows.append(total)
    return torch.stack(rows), count, correct  # correct: every (masked token, term)'s prediction, TLM's too


def test_the_loss_is_tlm_plus_the_four_cross_entropies_and_per_row_adds_up():
    model = _model()
    assert (model.options.pair_mask_prob, model.mask_prob) == (0.25, 0.15), "VECO Table 8: bilingual 25 %, mono 15 %"
    ids, pad, seg, noise = _pairs()
    with torch.no_grad():
        st = model(ids, pad, seg, noise)
        rows_st = model(ids, pad, seg, noise, per_row=True)
        by_row, count, correct = _by_hand(model, ids, pad, seg, noise)
    torch.testing.assert_close(st.g_loss, by_row.sum(), rtol=1e-5, atol=1e-4)
    assert int(st.g_count) == count and int(st.tokens) == int((~pad).sum())
    assert int(st.g_correct) == correct, "generator accuracy over every term: TLM's predictions too"
    assert float(st.d_loss) == 0 and int(st.d_count) == 0
    r = rows_st.rows
    torch.testing.assert_close(r[0], by_row, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(r[0].sum(), rows_st.g_loss, rtol=1e-5, atol=1e-4)
    assert int(r[1].sum()) == int(rows_st.g_count) == count and not r[2:].any()
    # the paper adds the terms: Σ of all five / masked tokens = the per-(token, term) mean × 3
    n = count // 3
    torch.testing.assert_close(model.loss(st, Norms(g=float(count))), by_row.sum() / n, rtol=1e-5, atol=1e-5)
    mean = _model(options=_options(combine="mean"))
    with torch.no_grad():
        torch.testing.assert_close(mean.loss(mean(ids, pad, seg, noise), Norms(g=float(count))), by_row.sum() / count,
                                   rtol=1e-5, atol=1e-5)

    ids, pad, noise = _mrtd()  # MRTD rows: plain MLM, per_row as MaskedLMModel
    with torch.no_grad():
        st = model(ids, pad, None, noise, per_row=True)
    torch.testing.assert_close(st.rows[0].sum(), st.g_loss)
    assert int(st.rows[1].sum()) == int(st.g_count)
    torch.testing.assert_close(model.loss(st, Norms(g=float(st.g_count))), st.g_loss / st.g_count)  # one term


def test_the_freeze_schedule_names_the_body():
    model = _model(options=_options(freeze_body_steps=3))
    assert model.body_frozen(0) and model.body_frozen(2) and not model.body_frozen(3)
    assert not _model().body_frozen(0)
    assert all(model.is_cross(k) for k in model.plug_in_state_dict()) and model.plug_in_state_dict()
    assert not any(model.is_cross(k) for k in model.encoder_state_dict())


@pytest.fixture
def one_thread():
    """Tiny matrices: on a shared, busy CPU a second thread only adds contention (tens of times slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_the_model_learns_and_the_translation_helps(one_thread):
    """x is random (plug-out cannot do better than the unigram, ln 20 ≈ 3.0); y = x + 20
    position by position, so a plug-in pass that finds the aligned token can copy it."""
    torch.manual_seed(0)
    model = VecoModel(preset("tiny", vocab_size=48, heads=4, max_position=64, dropout=0.0, specials=SPECIALS),
                      options=_options())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    b, n = 64, 4
    seg = torch.tensor([0] * (n + 2) + [1] * (n + 1)).expand(b, -1)
    pad = torch.zeros(b, 2 * n + 3, dtype=torch.bool)
    total, plug_out, plug_in = [], [], []
    for step in range(250):
        x = torch.randint(5, 25, (b, n), generator=g)
        ids = torch.cat([torch.full((b, 1), BOS), x, torch.full((b, 1), EOS), x + 20, torch.full((b, 1), EOS)], 1)
        st = model(ids, pad, seg, row_noise(0, step, 0, list(range(b)), [2 * n + 3] * b, 2 * n + 3))
        opt.zero_grad()
        model.loss(st, Norms(g=st.g_count.item())).backward()
        opt.step()
        total.append(st.g_loss.item() / st.g_count.item())
        plug_out.append(st.extra["trtd/plug_out_loss"])
        plug_in.append(st.extra["trtd/plug_in_loss"])
    assert np.mean(total[-20:]) < np.mean(total[:20]) - 0.8, "the loss falls"
    assert np.mean(plug_in[-20:]) < np.mean(plug_out[-20:]) - 0.3, "the plug-in terms end lower: y helps"


def test_plug_in_mode_puts_the_cross_attention_back_and_reads_the_translation(tmp_path, tokenizer_dir):  # noqa: F811
    """xylent.models.load_plug_in: the exported model/ folder's pretraining weights in plug-in mode give
    VecoModel.plug_in's states over H^L of the translation; the same folder's plug-out encoder
    (xylent.models.load_pretrained) does not see the translation; a non-VECO export is refused."""
    import sentencepiece as spm

    from xylent import models
    from xylent.models.pretrained import export, tokenize
    from xylent.tasks.vocab.specials import special_ids

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "spm.model"))
    cfg = preset("tiny", vocab_size=sp.get_piece_size(), max_position=64, dropout=0.0, specials=special_ids(sp))
    torch.manual_seed(0)
    model = VecoModel(cfg).eval()
    with torch.no_grad():  # a cross-attention off its init, so that it visibly reads the translation
        for name, p in model.named_parameters():
            if model.is_cross(name):
                p.add_(torch.randn_like(p) * 0.3)
    export(tmp_path / "veco", model.state_dict(), model.encoder_state_dict(), cfg, tokenizer_dir,
           {"objective": "veco"})
    plug, plug_out = models.load_plug_in(tmp_path / "veco"), models.load_pretrained(tmp_path / "veco")

    texts, translations = ["the cat sat on the mat", "a dog"], ["die Katze sass auf der Matte", "ein Hund"]
    ids, mask = tokenize(sp, cfg, texts)
    tr, tr_mask = tokenize(sp, cfg, translations)
    with torch.no_grad():
        expected = model.plug_in(ids, mask == 0, model.plug_out(tr, tr_mask == 0), tr_mask == 0)
        got = plug(ids, mask, tr, tr_mask)
        alone = plug_out(ids, mask)
    torch.testing.assert_close(got, expected)
    real = mask.bool()
    assert (got[real] - alone[real]).abs().max() > 1e-3, "plug-in is not the plug-out encoder"
    swapped = plug.embed(texts, translations[::-1])
    assert not torch.allclose(plug.embed(texts, translations), swapped), "another translation, other states"

    export(tmp_path / "electra", model.encoder_state_dict(), model.encoder_state_dict(), cfg, tokenizer_dir,
           {"objective": "electra"})
    with pytest.raises(XylentError, match="objective 'electra'"):
        models.load_plug_in(tmp_path / "electra")
    with pytest.raises(ValueError, match="2 texts and 1 translations"):
        plug.embed(texts, translations[:1])


def test_the_evaluate_probe_in_plug_in_mode_reads_each_text_beside_its_translation(tmp_path, tokenizer_dir):  # noqa: F811
    """evaluate's probe with ``plug_in: true``: every input's label is only in its translation
    (the texts themselves are label-free filler), so the plug-in probe learns it and the plain
    probe, which never sees the translation, stays near the majority rate; random-init gets a
    random VECO model in plug-in mode; models without cross-attention are 'not applicable'."""
    import random

    import sentencepiece as spm

    from xylent.models.pretrained import export
    from xylent.tasks.evaluate.encoders import load_ref
    from xylent.tasks.evaluate.model_eval import evaluate_model
    from xylent.tasks.vocab.specials import special_ids
    from xylent.spec.evaluate import EvalTask

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "spm.model"))
    cfg = preset("tiny", vocab_size=sp.get_piece_size(), max_position=64, dropout=0.0, specials=special_ids(sp))
    torch.manual_seed(0)
    model = VecoModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if model.is_cross(name):
                p.add_(torch.randn_like(p) * 0.3)
    export(tmp_path / "veco", model.state_dict(), model.encoder_state_dict(), cfg, tokenizer_dir,
           {"objective": "veco"})
    export(tmp_path / "electra", model.encoder_state_dict(), model.encoder_state_dict(), cfg, tokenizer_dir,
           {"objective": "electra"})

    rng = random.Random(0)
    words = {"animal": ["cat", "dog", "horse", "bird"], "food": ["bread", "cheese", "apple", "soup"]}
    filler = ["la la", "na na na", "ta", "pa pa"]

    def rows(n):
        out = []
        for _ in range(n):
            label = rng.choice(sorted(words))
            sentence = " ".join(rng.choice(words[label]) for _ in range(3))
            out.append(f"{label}\t{rng.choice(filler)}\t{sentence}")
        return "\n".join(out) + "\n"

    data = tmp_path / "probe"
    data.mkdir()
    (data / "train-en.tsv").write_text(rows(60))
    (data / "test-en.tsv").write_text(rows(30))
    (data / "test-de.tsv").write_text(rows(30))
    task = dict(kind="probe", format="tsv", path=str(data), languages=["en", "de"])
    plug, plain = EvalTask(name="plug", plug_in=True, **task), EvalTask(name="plain", **task)

    def scores(ref):
        enc = load_ref({"path": str(tmp_path / ref.pop("dir")), **ref})
        return evaluate_model(enc, [plug, plain], {"plug": (data, None), "plain": (data, None)}, tmp_path / "preds",
                              batch_size=8, max_length=32)

    veco = scores({"kind": "xylent", "name": "pipeline", "dir": "veco"})
    assert veco["plug"]["plug_in"] and veco["plug"]["layer"] == cfg.layers
    assert veco["plug"]["languages"]["de"]["accuracy"] >= 90, veco["plug"]
    assert veco["plain"]["avg"] < veco["plain"]["majority_baseline"] + 15, veco["plain"]
    untrained = scores({"kind": "random-init", "name": "random-init", "dir": "veco", "seed": 0})
    assert untrained["plug"]["plug_in"] and untrained["plug"]["avg"] is not None
    electra = scores({"kind": "xylent", "name": "electra", "dir": "electra"})
    assert electra["plug"]["avg"] is None and "VECO models only" in electra["plug"]["not_applicable"]

    (data / "test-fr.tsv").write_text("animal\tla la\n")  # no translation column
    with pytest.raises(XylentError, match=r"test-fr.tsv:1"):
        evaluate_model(load_ref({"kind": "xylent", "name": "p", "path": str(tmp_path / "veco")}),
                       [EvalTask(name="plug", plug_in=True, **{**task, "languages": ["en", "fr"]})],
                       {"plug": (data, None)}, tmp_path / "preds", batch_size=8, max_length=32)
    with pytest.raises(ValueError, match="plug_in applies to kind probe only"):
        EvalTask(name="x", kind="tatoeba", format="tatoeba", path=str(data), languages=["de"], plug_in=True)
