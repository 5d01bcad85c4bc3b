"""InfoXLM's XLCo: the loss against a hand-written InfoNCE, the momentum encoder
against a hand-kept EMA, the queue's order and its round trip through a checkpoint."""

from __future__ import annotations

import pytest
import torch

from xylent.models.config import preset
from xylent.models.infoxlm import InfoXLMModel, XLCoConfig, merge_groups, xlco_default_layer
from xylent.spec import InfoXLMConfig  # the options' one home: their defaults
from xylent.models.stats import gather_rows
from xylent.models.masking import row_noise
from xylent.models.pairs import split_pair
from xylent.models.stats import Norms
from tests.test_models_electra import SPECIALS, _batch

PAD, BOS = SPECIALS["pad"], SPECIALS["bos"]


def _model(seed=0, **xlco) -> InfoXLMModel:
    torch.manual_seed(seed)
    cfg = preset("tiny", vocab_size=500, specials=SPECIALS, layers=3, dropout=0.0)
    m = InfoXLMModel(cfg, xlco=XLCoConfig(**{**InfoXLMConfig().model_dump(), "queue_size": 8, "layer": 2, **xlco}))
    m.attach(torch.device("cpu"))
    return m


def _step(m: InfoXLMModel, step: int, ids=None, seg=None):
    if ids is None:
        ids, seg, _ = _batch(step)
    pad = ids == PAD
    noise = row_noise(0, step, 0, list(range(len(ids))), (~pad).sum(1).tolist(), ids.shape[1])
    return m(ids, pad, seg, noise), ids, seg


def test_the_two_sides_of_a_pair_row_come_apart_as_sentences_of_their_own():
    ids = torch.tensor([[BOS, 10, 11, 2, 20, 21, 22, 2, PAD], [BOS, 12, 2, 23, 2, PAD, PAD, PAD, PAD]])
    seg = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1, 1]])
    x, x_pad, y, y_pad = split_pair(ids, ids == PAD, seg, BOS, PAD)
    assert x.tolist() == [[BOS, 10, 11, 2], [BOS, 12, 2, PAD]]
    assert y.tolist() == [[BOS, 20, 21, 22, 2], [BOS, 23, 2, PAD, PAD]]
    assert torch.equal(x_pad, x == PAD) and torch.equal(y_pad, y == PAD)


def test_xlco_equals_a_hand_written_info_nce_over_the_queue():
    m = _model(temperature=0.5)
    keys = torch.randn(5, m.cfg.hidden)
    m._enqueue(keys)  # five negatives in a queue of eight
    ids, seg, _ = _batch(3)
    pad = ids == PAD
    loss, count, correct = m.contrast(ids, pad, seg)

    x, x_pad, y, y_pad = split_pair(ids, pad, seg, BOS, PAD)
    with torch.no_grad():
        _, hx = m.encoder(m.embeddings(x), x_pad, return_layers=True)
        key = m._key["module"]  # at step 0 the key encoder is a copy of the query side
        _, hy = key["encoder"](key["embeddings"](y), y_pad, return_layers=True)
        q, k = m.proj(hx[2][:, 0]), key["proj"](hy[2][:, 0])
        expected = 0.0
        wins = 0
        for i in range(len(q)):
            scores = torch.cat([(q[i] * k[i]).sum().view(1), keys @ q[i]]) / 0.5
            expected += -(scores[0] - torch.logsumexp(scores, 0))
            wins += int(scores[0] > scores[1:].max())
    assert torch.allclose(loss.detach(), torch.as_tensor(expected), rtol=1e-5)
    assert int(count) == len(q) and int(correct) == wins
    assert torch.allclose(m.queue_keys(), torch.cat([keys[1:], k])), "then the batch's 4 keys push out the oldest"
    loss.backward()
    assert m.proj.weight.grad is not None and m.proj.weight.grad.abs().sum() > 0, "the query side learns"
    assert all(p.grad is None for p in m._key["module"].parameters()), "the key side gets no gradient"


def test_mixup_merges_rows_two_by_two_as_each_rows_noise_says():
    assert merge_groups([[0.9, 0, 0, 0]] * 5, 0.5) == [(0,), (1,), (2,), (3,), (4,)], "nobody below the share"
    # row 0 merges with the last free row (u=0.99), row 1 with the first free one (u=0), row 4 has no one left
    u = [[0.1, 0.99, 0, 0], [0.2, 0.0, 0, 0], [0.0, 0.5, 0, 0], [0.0, 0.5, 0, 0], [0.0, 0.5, 0, 0]]
    assert merge_groups(u, 0.5) == [(0, 4), (1, 2), (3,)]
    assert merge_groups(u, 0.0) == [(i,) for i in range(5)], "share 0: every pair on its own"


def test_mixup_contrast_equals_a_hand_written_info_nce_over_merged_pairs():
    """Rows 0 and 2 merge (x2 first, y0 first), rows 1 and 3 stay alone: three examples, each
    query against the three in-batch keys and the queue."""
    m = _model(temperature=0.5, mixup=0.5, in_batch_negatives=True)
    keys = torch.randn(3, m.cfg.hidden)
    m._enqueue(keys)
    ids, seg, _ = _batch(3)
    pad = ids == PAD
    noise = row_noise(0, 3, 0, list(range(len(ids))), (~pad).sum(1).tolist(), ids.shape[1])
    noise[-1, :, :4] = torch.tensor([[0.1, 0.5, 0.9, 0.1], [0.9, 0, 0, 0], [0.9, 0, 0, 0], [0.9, 0, 0, 0]])
    loss, count, correct = m.contrast(ids, pad, seg, noise)

    x, _, y, _ = split_pair(ids, pad, seg, BOS, PAD)
    def real(t):
        return t[t != PAD]

    def joined(a, b):  # <s> a </s> + b </s>
        return torch.cat([real(a), real(b)[1:]])

    qs = [joined(x[2], x[0]), real(x[1]), real(x[3])]
    ks = [joined(y[0], y[2]), real(y[1]), real(y[3])]
    assert qs[0][0] == BOS and (qs[0] == 2).sum() == 2, "one <s>, the two sides' </s>"

    def cls(seqs, emb, enc, proj):
        width = max(len(t) for t in seqs)
        batch = torch.stack([torch.cat([t, t.new_full((width - len(t),), PAD)]) for t in seqs])
        _, h = enc(emb(batch), batch == PAD, return_layers=True)
        return proj(h[2][:, 0])

    with torch.no_grad():
        key = m._key["module"]
        q, k = cls(qs, m.embeddings, m.encoder, m.proj), cls(ks, key["embeddings"], key["encoder"], key["proj"])
        expected, wins = 0.0, 0
        for i in range(3):
            scores = torch.cat([k @ q[i], keys @ q[i]]) / 0.5
            expected += -(scores[i] - torch.logsumexp(scores, 0))
            wins += int(scores.argmax() == i)
    assert torch.allclose(loss.detach(), torch.as_tensor(expected), rtol=1e-5)
    assert int(count) == 3 and int(correct) == wins
    assert torch.allclose(m.queue_keys()[-3:], k, atol=1e-6), "the merged keys are what the queue keeps"
    assert m._mixup_share == 0.5, "2 of 4 rows were merged"
    st = m(ids, pad, seg, noise)
    assert st.extra["trtd/contrast_mixup_share"] == 0.5


def test_with_an_empty_queue_nothing_is_contrasted_and_the_keys_start_the_queue():
    m = _model()
    st, ids, _ = _step(m, 0)
    assert int(st.c_count) == 0 and float(st.c_loss.detach()) == 0.0
    assert m._key["fill"] == len(ids) and st.extra["trtd/contrast_chance_loss"] == 0.0
    st, _, _ = _step(m, 1)
    assert int(st.c_count) == len(ids)
    assert abs(st.extra["trtd/contrast_chance_loss"] - torch.log(torch.tensor(1.0 + len(ids))).item()) < 1e-6


def test_xlco_is_weighted_as_infoxlms_code_weights_it_and_contrasts_the_masked_pair():
    """unilm/infoxlm sums the MLM/TLM token losses and λ·XLCo's per-example losses and divides
    by the summed sample sizes (masked tokens + examples); its XLCo inputs are masked."""
    def warmed(**kw):  # step 0 fills the queue; step 1 is contrasted against it
        m = _model(weight=2.0, **kw)
        with torch.no_grad():
            _step(m, 0)
        return m

    m = warmed()  # scale: shared, masked_inputs: true (the reference's form)
    with torch.no_grad():
        st, ids, seg = _step(m, 1)
    g, c, n_g, n_c = float(st.g_loss), float(st.c_loss), float(st.g_count), float(st.c_count)
    assert n_c == len(ids) and n_g > 0
    assert float(m.loss(st, Norms(n_g, 1.0, n_c))) == pytest.approx((g + 2.0 * c) / (n_g + n_c), rel=1e-6)
    sep = warmed(scale="separate")
    with torch.no_grad():
        st2, _, _ = _step(sep, 1)
    assert float(sep.loss(st2, Norms(n_g, 1.0, n_c))) == pytest.approx(g / n_g + 2.0 * c / n_c, rel=1e-6)
    # XLCo read the TLM-masked row: contrasting that row by hand gives the same loss, the clean row another
    by_hand = warmed()
    with torch.no_grad():
        loss, _, _ = by_hand.contrast(m.corrupted, ids == PAD, seg)
    assert float(loss) == pytest.approx(c, rel=1e-5)
    clean = warmed(masked_inputs=False)
    with torch.no_grad():
        st3, _, _ = _step(clean, 1)
    assert float(st3.g_loss) == pytest.approx(g, rel=1e-6), "TLM is the same"
    assert abs(float(st3.c_loss) - c) > 1e-4


def test_the_key_encoder_is_the_ema_of_the_query_encoder_after_n_steps():
    m = _model(momentum=0.9)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
    query = dict(m.named_parameters())
    ema = {n: p.detach().clone() for n, p in query.items() if n.startswith(("embeddings.", "encoder.", "proj."))}
    for step in range(5):
        st, _, _ = _step(m, step)
        opt.zero_grad()
        m.loss(st, Norms(max(int(st.g_count), 1), 1.0, max(int(st.c_count), 1))).backward()
        opt.step()
        m.after_step()
        for n in ema:
            ema[n] = 0.9 * ema[n] + 0.1 * query[n].detach()
    key = m._key["module"].state_dict()
    moved = 0
    for n, v in ema.items():
        assert torch.allclose(key[n], v, atol=1e-6), n
        moved += int(not torch.allclose(v, query[n]))
    assert moved > 10, "the key side lags the query side (it is not a copy)"


def test_the_queue_keeps_the_last_keys_in_order_and_survives_a_checkpoint():
    m = _model(queue_size=8)
    batches = [torch.randn(3, m.cfg.hidden) for _ in range(4)]  # 12 keys through a queue of 8
    for b in batches:
        m._enqueue(b)
    assert torch.equal(m.queue_keys(), torch.cat(batches)[-8:])
    m._enqueue(torch.randn(20, m.cfg.hidden))  # more than the queue holds at once: its last 8
    last = m.queue_keys()
    state = m.objective_state()

    resumed = _model(queue_size=8, seed=1)  # other weights: everything must come from the state
    resumed.load_state_dict(m.state_dict())
    resumed.load_objective_state(state)
    assert torch.equal(resumed.queue_keys(), last)
    a, _, _ = _step(m, 7)
    b, _, _ = _step(resumed, 7)
    assert torch.equal(a.c_loss, b.c_loss) and torch.equal(m.queue_keys(), resumed.queue_keys())

    other = _model(queue_size=16)
    try:
        other.load_objective_state(state)
    except ValueError as exc:
        assert "queue_size" in str(exc)
    else:
        raise AssertionError("a queue of another size must be refused")


def test_rows_are_gathered_in_global_order_outside_a_process_group():
    x = torch.randn(4, 3, requires_grad=True)
    out = gather_rows(x)
    assert torch.equal(out, x.detach()) and not out.requires_grad


def test_the_contrasted_layer_defaults_to_infoxlms_choice():
    assert xlco_default_layer(12) == 8 and xlco_default_layer(24) == 12 and xlco_default_layer(2) == 1 and xlco_default_layer(6) == 4


def test_xlco_learns_the_translation_of_pairs_it_never_saw():
    """y is x with every token shifted by 100 (either side first, as the loader flips pairs): the
    pairing can only be learned from the pairs.  Mean pooling, as the demo recipe trains it."""
    m = _model(queue_size=64, temperature=0.1, normalize=True, momentum=0.99, pool="mean", in_batch_negatives=True)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=3e-3)
    g = torch.Generator().manual_seed(1)
    acc = []
    for step in range(150):
        x = torch.randint(10, 100, (16, 6), generator=g)
        flip = torch.rand(16, 1, generator=g) < 0.5
        a, b = torch.where(flip, x + 100, x), torch.where(flip, x, x + 100)
        ids = torch.cat([torch.full((16, 1), BOS), a, torch.full((16, 1), 2), b, torch.full((16, 1), 2)], 1)
        seg = torch.cat([torch.zeros(16, 8), torch.ones(16, 7)], 1).long()
        st, _, _ = _step(m, step, ids, seg)
        opt.zero_grad()
        m.loss(st, Norms(max(int(st.g_count), 1), 1.0, max(int(st.c_count), 1))).backward()
        opt.step()
        m.after_step()
        acc.append(int(st.c_correct) / max(int(st.c_count), 1))
    assert sum(acc[-20:]) / 20 > 0.5, "well above the chance of picking 1 key among 16 + 64"
    # on pairs it never saw: the query side finds each sentence's translation among 32
    x = torch.randint(10, 100, (32, 6), generator=g)
    side = lambda t: torch.cat([torch.full((32, 1), BOS), t, torch.full((32, 1), 2)], 1)  # noqa: E731
    with torch.no_grad():
        key = m._key["module"]
        q = m._cls(m.embeddings, m.encoder, m.proj, side(x), side(x) == PAD)
        k = m._cls(key["embeddings"], key["encoder"], key["proj"], side(x + 100), side(x) == PAD)
    assert ((q @ k.T).argmax(1) == torch.arange(32)).float().mean() > 0.5, "1 in 32 is chance"
