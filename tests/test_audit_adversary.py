"""The audit's training-time pieces: per-row losses from the model, per-pair EMAs, the
re-sampling schedule and the adversary's state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xylent.models.config import preset
from xylent.models.electra import ElectraModel, MaskedLMModel
from xylent.models.stats import ROW_FIELDS
from xylent.models.masking import row_noise
from xylent.models.training.audit.dro import chi2_best_response
from xylent.models.training.audit.step import baseline_due, language_due, pairs_due, trtd_steps_per_measurement as per
from xylent.models.training.run_config import DroConfig, TrainConfig
from xylent.models.training.audit.adversary import SUM_FIELDS, PairAdversary, binary_entropy, resample_steps
from xylent.tasks.audit.contract import audit_table, pair_baselines, trajectory_table
from xylent.tasks.vocab.specials import SPECIAL_PIECES

SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(len(SPECIAL_PIECES))))


def _pair_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (6, 30), generator=g)
    ids[:, 0], ids[:, 14], ids[:, 25] = SPECIALS["bos"], SPECIALS["eos"], SPECIALS["eos"]
    ids[3:, 26:] = SPECIALS["pad"]  # rows of different lengths
    ids[:3, 26:] = torch.randint(5, 300, (3, 4), generator=g)
    seg = torch.zeros_like(ids)
    seg[:, 15:] = 1
    pad = ids == SPECIALS["pad"]
    noise = row_noise(0, 0, 0, list(range(6)), (~pad).sum(1).tolist(), 30)
    return ids, pad, seg, noise


@pytest.mark.parametrize("cls", [ElectraModel, MaskedLMModel])
def test_per_row_losses_add_up_to_the_batch_totals(cls):
    cfg = preset("tiny", vocab_size=300, specials=SPECIALS)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    ids, pad, seg, noise = _pair_batch()
    plain = model(ids, pad, seg, noise)
    rows = model(ids, pad, seg, noise, per_row=True)
    assert rows.rows.shape == (len(ROW_FIELDS), 6) and plain.rows is None
    assert torch.allclose(rows.g_loss, plain.g_loss, rtol=1e-5) and torch.allclose(rows.d_loss, plain.d_loss, rtol=1e-5)
    r = dict(zip(ROW_FIELDS, rows.rows))
    assert r["g_loss"].sum().item() == pytest.approx(plain.g_loss.item(), rel=1e-5)
    assert r["g_count"].sum().item() == plain.g_count.item()
    if cls is ElectraModel:
        assert r["d_loss"].sum().item() == pytest.approx(plain.d_loss.item(), rel=1e-5)
        assert r["d_count"].tolist() == (~pad).sum(1).float().tolist()
        assert r["d_pos"].sum().item() == plain.d_pos.item()
    assert (r["g_loss"] > 0).all(), "every row has masked tokens, so a loss"


def _adversary(**kw):
    args = dict(rho=0.05, min_ratio=0.2, ema=0.1, weights=(1.0, 50.0), steps=100, resamples=4)
    args.update(kw)
    return PairAdversary(["a-b", "a-c", "b-c", "c-d"], np.array([0.4, 0.3, 0.2, 0.1]), **args)


def _sums(per_pair: dict[int, tuple[float, float, float, float, float, float]]) -> np.ndarray:
    s = np.zeros((4, len(SUM_FIELDS)))
    for i, v in per_pair.items():
        s[i] = v
    return s


def test_the_ema_starts_at_the_first_value_and_keeps_the_last_one_for_unseen_pairs():
    adv = _adversary()
    adv.observe(0, _sums({0: (20.0, 10, 4.0, 20, 5, 2), 1: (30.0, 10, 2.0, 20, 2, 1)}))
    assert adv.ema["g"][:2] == pytest.approx([2.0, 3.0])
    assert adv.ema["loss"][:2] == pytest.approx([2.0 + 50 * 0.2, 3.0 + 50 * 0.1])
    assert adv.ema["d_base"][0] == pytest.approx(binary_entropy(np.array(0.25)))
    assert np.isnan(adv.ema["loss"][2:]).all(), "never seen: no loss at all, not a made-up one"
    adv.observe(1, _sums({0: (40.0, 10, 4.0, 20, 5, 3)}))
    # corrected for its start: the two values weighted (1 - 0.1) ** age, not 0.9 · 2 + 0.1 · 4
    assert adv.ema["g"][0] == pytest.approx((0.9 * 2.0 + 4.0) / 1.9)
    for _ in range(200):  # warm: the rate itself
        adv.observe(2, _sums({0: (40.0, 10, 4.0, 20, 5, 3)}))
    adv.observe(3, _sums({0: (10.0, 10, 4.0, 20, 5, 3)}))
    assert adv.ema["g"][0] == pytest.approx(0.9 * 4.0 + 0.1 * 1.0)
    assert adv.ema["g"][1] == pytest.approx(3.0), "not seen this step: keeps its last value"
    assert adv.rows.tolist() == [5 + 3 * 201, 1, 0, 0] and adv.last_step.tolist() == [3, 0, -1, -1]


def test_resampling_solves_on_the_seen_pairs_and_leaves_unseen_ones_at_the_prior():
    adv = _adversary()
    adv.observe(0, _sums({0: (20.0, 10, 4.0, 20, 5, 2), 1: (30.0, 10, 2.0, 20, 2, 1), 2: (25.0, 10, 3, 20, 3, 1)}))
    q = adv.resample(25)
    assert q.sum() == pytest.approx(1.0) and q[3] == pytest.approx(0.1), "c-d was never drawn: q = Q"
    seen = adv.prior[:3] / adv.prior[:3].sum()
    expected = chi2_best_response(adv.ema["loss"][:3], seen, 0.05, min_ratio=0.2) * adv.prior[:3].sum()
    assert q[:3] == pytest.approx(expected)
    assert adv.trajectory[0]["step"] == 25 and adv.trajectory[0]["pairs_seen"] == 3
    assert not adv.due(25), "one re-sampling per scheduled step, also after a resume"
    m = adv.metrics()
    assert m["audit/w_max"] == pytest.approx(max(q / adv.prior)) and m["audit/divergence"] <= 0.05 + 1e-9


def test_schedule_spreads_k_resamplings_inside_the_run():
    assert resample_steps(100, 4) == [20, 40, 60, 80]
    assert resample_steps(1000, 10) == [round(k * 1000 / 11) for k in range(1, 11)]
    assert resample_steps(3, 10) == [1, 2], "a short run has fewer, never one at step 0 or at the end"
    assert resample_steps(1, 10) == []


def test_state_round_trips_through_json_and_feeds_the_output_tables():
    adv = _adversary()
    for step in range(60):
        rng = np.random.default_rng(step)
        adv.observe(step, _sums({i: (rng.uniform(10, 40), 10, rng.uniform(1, 5), 20, 4, 1) for i in range(4)}))
        if adv.due(step + 1):
            adv.resample(step + 1)
    state = json.loads(json.dumps(adv.state_dict()))  # what the trainer writes
    back = _adversary()
    back.load_state_dict(state)
    assert back.state_dict() == state
    table = audit_table(state)
    assert table["pair"].to_list()[0] == state["pairs"][int(np.argmax(np.array(state["q"]) / adv.prior))]
    assert table["w_final"].to_list() == sorted(table["w_final"].to_list(), reverse=True)
    assert table["rank_up"].to_list() == [1, 2, 3, 4]
    assert table["w_mean"].to_list() == pytest.approx(
        [np.mean([t["q"][state["pairs"].index(p)] / state["prior"][state["pairs"].index(p)]
                  for t in state["trajectory"]]) for p in table["pair"]])
    # beside the trained L_G + 50·L_D, the paper's form from the same EMAs, L_D + 50·L_G, and its best response
    paper = (table["d_loss_ema"] + 50 * table["g_loss_ema"]).to_numpy()
    assert table["paper_loss_ema"].to_list() == pytest.approx(paper.tolist())
    prior = table["prior"].to_numpy()
    assert table["w_paper"].to_list() == pytest.approx(
        (chi2_best_response(paper, prior, 0.05, min_ratio=0.2) / prior).tolist())
    traj = trajectory_table(state)
    assert traj.height == 4 * len(state["trajectory"]) and traj["w"].to_list() == pytest.approx(
        (traj["q"] / traj["prior"]).to_list())
    with pytest.raises(ValueError, match="other language pairs"):
        PairAdversary(["x-y"], np.ones(1), rho=0.05, min_ratio=0.2, ema=0.1, weights=(1.0, 50.0), steps=10,
                      resamples=2).load_state_dict(state)


def test_a_step_without_a_weighted_component_gives_no_loss_not_a_smaller_one():
    adv = _adversary(weights=(50.0, 1.0))  # L_D + λ·L_G: the generator term must be there
    adv.observe(0, _sums({0: (0.0, 0, 4.0, 20, 5, 1), 1: (30.0, 10, 2.0, 20, 2, 1)}))
    assert np.isnan(adv.ema["loss"][0]) and adv.ema["d"][0] == pytest.approx(0.2), "no masked token: L_G unknown"
    assert adv.ema["loss"][1] == pytest.approx(50 * 3.0 + 0.1)
    assert adv.rows[0] == 1, "the rows still count as trained"


def test_the_excess_pair_loss_ranks_what_the_translation_leaves_unexplained():
    """pair_loss: excess.  A hard clean pair (high loss, its sides alone higher still) ranks below
    a noisy pair of an easy language (its translation explains nothing: loss = alone)."""
    adv = _adversary(baseline="sides", weights=(1.0, 1.0))
    #            g_loss, g_count, d_loss, d_count, d_pos, rows
    pair = _sums({0: (60.0, 10, 2.0, 20, 5, 1),    # hard, clean: 6.0 + 0.1
                  1: (30.0, 10, 2.0, 20, 5, 1),    # easy, noisy: 3.0 + 0.1
                  2: (10.0, 10, 1.0, 20, 5, 1),    # a copy: 1.0 + 0.05
                  3: (40.0, 10, 2.0, 20, 5, 1)})
    alone = _sums({0: (80.0, 10, 2.0, 20, 5, 1),   # alone 8.1: the translation helps by 2.0
                   1: (30.0, 10, 2.0, 20, 5, 1),   # alone 3.1: it does not help
                   2: (50.0, 10, 2.0, 20, 5, 1),   # alone 5.1: the copy is given away
                   3: (40.0, 10, 2.0, 20, 5, 1)})
    adv.observe(0, pair, alone)
    assert adv.pair_losses() == pytest.approx([-2.0, 0.0, -4.05, 0.0])
    adv.observe(1, pair)  # a step without the baseline: its EMA is left as it was
    assert adv.ema["base"] == pytest.approx([8.1, 3.1, 5.1, 4.1])
    q = adv.resample(2)
    w = q / adv.prior
    assert w[1] > 1 > w[0] > w[2], "the noisy easy pair up, the hard clean pair down, the copy lowest"
    plain = _adversary(weights=(1.0, 1.0))
    plain.observe(0, pair)
    assert np.argmax(plain.resample(2) / plain.prior) == 0, "the paper's loss puts the hard clean pair on top"
    state = json.loads(json.dumps(adv.state_dict()))
    back = _adversary(baseline="sides", weights=(1.0, 1.0))
    back.load_state_dict(state)
    assert back.state_dict() == state
    table = audit_table(state)
    row = table.filter(table["pair"] == "a-c").to_dicts()[0]
    assert (row["baseline_loss_ema"], row["excess_loss_ema"]) == pytest.approx((3.1, 0.0))
    with pytest.raises(ValueError, match="another pair loss"):
        _adversary(weights=(1.0, 1.0)).load_state_dict(state)


def test_the_language_baseline_puts_memorised_pairs_down_and_noisy_ones_up():
    """baseline language: each pair's loss against the mean of its two languages' own losses.
    A hub pair whose repeated target the model memorised falls far below its languages, a noisy
    pair sits at them, a clean pair of a hard language (its languages hard too) in between."""
    adv = _adversary(baseline="language", weights=(1.0, 1.0), languages=["a", "b", "c", "d"])
    #            g_loss, g_count, d_loss, d_count, d_pos, rows
    pair = _sums({0: (20.0, 10, 2.0, 20, 5, 1),    # a-b, a hub: 2.0 + 0.1
                  1: (50.0, 10, 2.0, 20, 5, 1),    # a-c, noisy: 5.0 + 0.1
                  2: (60.0, 10, 2.0, 20, 5, 1),    # b-c, clean and hard: 6.0 + 0.1
                  3: (70.0, 10, 2.0, 20, 5, 1)})   # c-d, never gets a language baseline for d
    own = np.array([(40.0, 10, 2.0, 20, 5, 2),     # a: 4.1
                    (80.0, 10, 2.0, 20, 5, 2),     # b: 8.1
                    (60.0, 10, 2.0, 20, 5, 2),     # c: 6.1
                    (0.0, 0, 0.0, 0, 0, 0)])       # d: no row this step
    adv.observe(0, pair, lang=own)
    assert adv.baselines()[:3] == pytest.approx([6.1, 5.1, 7.1]) and np.isnan(adv.baselines()[3])
    assert adv.pair_losses()[:3] == pytest.approx([-4.0, 0.0, -1.0])
    w = adv.resample(1) / adv.prior
    assert w[1] > w[2] > 1 > w[0] and w[3] == 1.0, "noisy on top, the hub lowest, the pair without a baseline at Q"
    state = json.loads(json.dumps(adv.state_dict()))
    table = audit_table(state)
    row = table.filter(table["pair"] == "a-b").to_dicts()[0]
    assert (row["baseline_loss_ema"], row["excess_loss_ema"]) == pytest.approx((6.1, -4.0))
    with pytest.raises(ValueError, match="another pair loss"):
        _adversary(baseline="sides", weights=(1.0, 1.0)).load_state_dict(state)
    with pytest.raises(ValueError, match="no monolingual baseline for language"):
        _adversary(baseline="language", languages=["a", "b"])
    sparse = _adversary(baseline="language", weights=(1.0, 1.0), languages=["a", "b", "c", "d"], updates_per_language=4)
    sparse.observe(0, pair, lang=own)
    sparse.observe(40, pair, lang=own * [2, 1, 2, 1, 1, 1])  # measured 4 periods later: every loss doubled
    # the older value weighs (1 - 0.1) ** 4 of the newer (corrected for the start): 4 of the pairs' updates
    assert sparse.lang_ema[0] == pytest.approx((0.9 ** 4 * 4.1 + 8.2) / (0.9 ** 4 + 1)), "moved as far as 4 updates"
    for ema in (0.1, 0.05, 0.03):  # N = 1 is the rate itself, bit for bit: 1 - (1 - 0.1) ** 1 is not 0.1
        adv = _adversary(baseline="language", languages=["a", "b", "c", "d"], ema=ema)
        assert adv.lang_rate == adv.base_rate == ema
    assert _adversary(baseline="partner", updates_per_base=5).base_rate == pytest.approx(1 - 0.9 ** 5)


def test_the_larger_baseline_holds_a_memorised_pair_to_its_languages():
    """baseline larger: its sentences alone, raised by how far the pair's loss sits below its languages'
    beyond the median pair's.  A hub whose repeated target makes its text far easier than its
    languages goes down by the difference; a noisy and a clean pair keep their own sentences'
    baseline."""
    adv = _adversary(baseline="larger", weights=(1.0, 1.0), languages=["a", "b", "c", "d"])
    #            g_loss, g_count, d_loss, d_count, d_pos, rows
    pair = _sums({0: (20.0, 10, 2.0, 20, 5, 1),    # a-b, a hub: 2.1
                  1: (50.0, 10, 2.0, 20, 5, 1),    # a-c, noisy: 5.1
                  2: (60.0, 10, 2.0, 20, 5, 1)})   # b-c, clean: 6.1
    alone = _sums({0: (20.0, 10, 2.0, 20, 5, 1),   # 2.1: the repeated target, memorised
                   1: (50.0, 10, 2.0, 20, 5, 1),   # 5.1: no help from the translation
                   2: (65.0, 10, 2.0, 20, 5, 1)})  # 6.6: the translation helps by 0.5
    own = np.array([(40.0, 10, 2.0, 20, 5, 2), (80.0, 10, 2.0, 20, 5, 2), (40.0, 10, 2.0, 20, 5, 2),
                    (0.0, 0, 0.0, 0, 0, 0)])       # a 4.1, b 8.1, c 4.1: pairs 6.1, 4.1, 6.1
    adv.observe(0, pair, alone, own)
    # loss - language: -4.0, 1.0, 0.0; median 0.0: the hub's sides + 4.0, the others' sides as they are
    assert adv.baselines()[:3] == pytest.approx([6.1, 5.1, 6.6]) and np.isnan(adv.baselines()[3])
    assert adv.pair_losses()[:3] == pytest.approx([-4.0, 0.0, -0.5])
    assert pair_baselines(json.loads(json.dumps(adv.state_dict())))[:3] == pytest.approx([6.1, 5.1, 6.6])


def test_the_language_baseline_runs_the_whole_documents_of_a_pack():
    from xylent.models.training.audit.step import sentences

    pack = np.array([0, 5, 6, 2, 7, 8, 9, 2, 10, 11, 2, 12, 2, 1, 1])  # <s> …cut </s> d1 </s> d2 </s> cut… </s> pad
    assert [x.tolist() for x in sentences(pack, 0, 2, 1)] == [[7, 8, 9], [10, 11]]
    long_doc = np.array([0, *range(10, 80), 2])  # one document longer than the pack: 32-token stretches
    assert [len(x) for x in sentences(long_doc, 0, 2, 1)] == [32, 32]
    assert sentences(np.array([0, 2, 1]), 0, 2, 1) == []


def test_the_baseline_is_each_sentence_run_alone():
    """xylent.models.training.audit.step.sides_alone against each side's rows run by hand, one row at a time."""
    from xylent.models.pairs import split_pair
    from xylent.models.training.audit.step import BASELINE_NOISE, BASELINE_ROWS, sides_alone

    cfg = preset("tiny", vocab_size=300, specials=SPECIALS, dropout=0.0)
    torch.manual_seed(0)
    model = ElectraModel(cfg).eval()
    ids, pad, seg, _ = _pair_batch()
    rows = [0, 2, 4, 6, 8, 10]  # rank 0 of 2
    engine = type("Engine", (), {"module": model, "__call__": lambda self, *a, **k: model(*a, **k)})()
    got = sides_alone(engine, ids, pad, seg, 7, 3, 1, rows)
    x, _, y, _ = split_pair(ids, pad, seg, SPECIALS["bos"], SPECIALS["pad"])
    want = torch.zeros_like(got)
    with torch.no_grad():
        for side, offset in ((x, 0), (y, BASELINE_ROWS)):
            for k in range(len(rows)):
                one = side[k: k + 1]
                one = one[:, : int((one != SPECIALS["pad"]).sum())]
                noise = row_noise(7, 3, 1 + BASELINE_NOISE, [rows[k] + offset], [one.shape[1]], one.shape[1])
                want[:, k] += model(one, one == SPECIALS["pad"], None, noise, per_row=True).rows[:, 0]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert set(ROW_FIELDS) == {"g_loss", "g_count", "d_loss", "d_count", "d_pos"} and got[1].sum() > 0


def test_the_language_baseline_in_length_buckets_is_each_sentence_run_alone():
    """xylent.models.training.audit.step.languages_alone (its sentences in forwards of fixed widths, each in the narrowest that holds it)
    against every sentence of the packs run by hand, one at a time, with its own noise stream; the widths
    (the same list on every rank: ZeRO-3 needs as many forwards) put every longer sentence in one forward."""
    from xylent.models.training.audit.step import (BUCKET_WIDTHS, LANGUAGE_NOISE, SENTENCES_PER_PACK, bucket_widths, languages_alone,
                                   sentences)

    assert bucket_widths([3, 10, 12, 130, 300], BUCKET_WIDTHS, 1, "cpu") == [16, 384]
    assert bucket_widths([], BUCKET_WIDTHS, 1, "cpu") == []

    cfg = preset("tiny", vocab_size=300, specials=SPECIALS, dropout=0.0)
    torch.manual_seed(0)
    model = ElectraModel(cfg).eval()
    engine = type("Engine", (), {"module": model, "__call__": lambda self, *a, **k: model(*a, **k)})()
    bos, eos, pad = SPECIALS["bos"], SPECIALS["eos"], SPECIALS["pad"]
    rng = np.random.default_rng(0)
    packs = []
    for _ in range(6):  # documents of 1 to 40 tokens: mostly short, a few long, as the demo's
        body = [bos]
        while len(body) < 100:
            body += [*rng.integers(5, 300, int(rng.choice([1, 3, 5, 8, 40]))), eos]
        packs.append(np.array((body + [pad] * 128)[:128]))
    loader = type("Loader", (), {"bos": bos, "eos": eos, "pad": pad})()
    batch = {"input_ids": np.stack(packs), "langs": ["de", "fr", "de", "en", "fr", "de"]}
    languages = ["de", "en", "fr"]
    got = languages_alone(engine, batch, loader, languages, 7, 3, 0, 1, "cpu")
    want = torch.zeros_like(got)
    n = 0
    with torch.no_grad():
        for k, (pack, lang) in enumerate(zip(batch["input_ids"], batch["langs"])):
            for j, piece in enumerate(sentences(pack, bos, eos, pad)):
                one = torch.as_tensor([[bos, *piece.tolist(), eos]])
                noise = row_noise(7, 3, LANGUAGE_NOISE, [k * SENTENCES_PER_PACK + j], [one.shape[1]], one.shape[1])
                r = model(one, one == pad, None, noise, per_row=True).rows[:, 0].double()
                want[languages.index(lang), :-1] += r
                want[languages.index(lang), -1] += 1
                n += 1
    assert n > 20 and torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_partner_baseline_reruns_the_same_tokens_beside_another_rows_translation():
    """xylent.models.training.audit.step.partners_swapped against rows built by hand: x of each row, y of the next
    row of its pair, every token with its training-pass noise; a row alone of its pair is left out
    (or, with a store, borrows the last second sentence of its key seen before), and summed over a
    pair the masked and scored tokens are the training pass's own."""
    from xylent.models.training.audit.step import PartnerStore, directed, partner_rotation, partners_swapped

    assert partner_rotation([0, 0, 1, 0, 2, 1]) == {0: 1, 1: 3, 3: 0, 2: 5, 5: 2}
    # a flipped row's second sentence is the pair's other language: rows borrow within one direction
    assert directed(["a-b", "a-b", "a-b"], [False, True, False], {"a-b": 0}) == [0, 1, 0]
    assert partner_rotation(directed(["a-b", "a-b", "a-b"], [False, True, False], {"a-b": 0})) == {0: 2, 2: 0}
    cfg = preset("tiny", vocab_size=300, specials=SPECIALS, dropout=0.0)
    torch.manual_seed(0)
    model = ElectraModel(cfg).eval()
    ids, pad, seg, noise = _pair_batch()
    pairs = [0, 0, 1, 0, 2, 1]
    engine = type("Engine", (), {"module": model, "__call__": lambda self, *a, **k: model(*a, **k)})()
    got, kept = partners_swapped(engine, ids, pad, seg, noise, pairs, 0, 1)
    assert kept == [0, 1, 2, 3, 5]
    partner = partner_rotation(pairs)
    want = torch.zeros_like(got)
    with torch.no_grad():
        for col, i in enumerate(kept):
            j = partner[i]
            x, y = (~pad[i]) & (seg[i] == 0), (~pad[j]) & (seg[j] == 1)
            one = torch.cat([ids[i][x], ids[j][y]])[None]
            one_seg = torch.cat([torch.zeros(int(x.sum())), torch.ones(int(y.sum()))]).long()[None]
            one_noise = torch.cat([noise[:, i][:, x], noise[:, j][:, y]], 1)[:, None]
            want[:, col] = model(one, one == SPECIALS["pad"], one_seg, one_noise, per_row=True).rows[:, 0]
        own = model(ids, pad, seg, noise, per_row=True).rows[:, kept]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    counts = [ROW_FIELDS.index("g_count"), ROW_FIELDS.index("d_count")]
    for pair in (0, 1):  # the same tokens masked and scored over each pair, only the partners moved
        cols = [c for c, i in enumerate(kept) if pairs[i] == pair]
        assert torch.equal(got[counts][:, cols].sum(1), own[counts][:, cols].sum(1))

    # with a store, a row alone of its key borrows the last second sentence of that key seen before
    store = PartnerStore()
    assert torch.equal(partners_swapped(engine, ids, pad, seg, noise, pairs, 0, 1, store=store)[0], got)
    again, kept = partners_swapped(engine, ids, pad, seg, noise, [2, 0, 0, 1, 0, 3], 0, 1, store=store)
    assert kept == [0, 1, 2, 3, 4], "rows 0 (key 2) and 3 (key 1) borrow the first batch's rows 4 and 5; key 3: unseen"
    x, y = (~pad[0]) & (seg[0] == 0), (~pad[4]) & (seg[4] == 1)
    one = torch.cat([ids[0][x], ids[4][y]])[None]
    one_seg = torch.cat([torch.zeros(int(x.sum())), torch.ones(int(y.sum()))]).long()[None]
    one_noise = torch.cat([noise[:, 0][:, x], noise[:, 4][:, y]], 1)[:, None]
    with torch.no_grad():
        want = model(one, one == SPECIALS["pad"], one_seg, one_noise, per_row=True).rows[:, 0]
    assert torch.allclose(again[:, 0], want, rtol=1e-4, atol=1e-4)
    assert set(store.state()) == {0, 1, 2, 3}, "every key seen leaves its last second sentence"
    # a row drawn again right after itself does not borrow its own translation back
    own, kept = partners_swapped(engine, ids[4:5], pad[4:5], seg[4:5], noise[:, 4:5], [7], 0, 1, store=store)
    assert kept == [] and 7 in store.state()
    _, kept = partners_swapped(engine, ids[4:5], pad[4:5], seg[4:5], noise[:, 4:5], [7], 0, 1, store=store)
    assert kept == [], "the stored sentence of key 7 is this row's own"


def test_the_partner_baseline_is_the_loss_less_the_translations_help():
    """baseline partner: loss EMA − (the training pass's loss of the swapped rows − their loss beside
    another partner); partner-larger holds a memorised pair to its languages as larger does."""
    adv = _adversary(baseline="partner", weights=(1.0, 1.0))
    pair = _sums({0: (30.0, 10, 2.0, 20, 5, 2), 1: (50.0, 10, 2.0, 20, 5, 2)})    # 3.1, 5.1
    same = _sums({0: (20.0, 10, 2.0, 20, 5, 1), 1: (50.0, 10, 2.0, 20, 5, 1)})    # 2.1, 5.1: the swapped rows
    other = _sums({0: (25.0, 10, 2.0, 20, 5, 1), 1: (50.0, 10, 2.0, 20, 5, 1)})   # 2.6, 5.1 beside other partners
    adv.observe(0, pair, other, paired=same)
    assert adv.baselines()[:2] == pytest.approx([3.6, 5.1]) and np.isnan(adv.baselines()[2:]).all()
    assert adv.pair_losses()[:2] == pytest.approx([-0.5, 0.0]), "clean: the translation's help; noisy: none"
    state = json.loads(json.dumps(adv.state_dict()))
    assert pair_baselines(state)[:2] == pytest.approx([3.6, 5.1])
    larger = _adversary(baseline="partner-larger", weights=(1.0, 1.0), languages=["a", "b", "c", "d"])
    own = np.array([(90.0, 10, 2.0, 20, 5, 2), (40.0, 10, 2.0, 20, 5, 2), (60.0, 10, 2.0, 20, 5, 2),
                    (0.0, 0, 0.0, 0, 0, 0)])  # a 9.1, b 4.1, c 6.1: pairs a-b 6.6, a-c 7.6
    larger.observe(0, pair, other, own, paired=same)
    # loss - language: a-b 3.1 - 6.6 = -3.5, a-c 5.1 - 7.6 = -2.5, median -3.0: a-b 3.6 + 0.5, a-c 5.1 + 0
    assert larger.baselines()[:2] == pytest.approx([4.1, 5.1])
    for kind, want in (("heldout", [3.6, 5.1]), ("heldout-larger", [4.1, 5.1])):  # the same reading, held-out rows
        held = _adversary(baseline=kind, weights=(1.0, 1.0), languages=["a", "b", "c", "d"])
        held.observe(0, pair, other, own, paired=same)
        assert held.baselines()[:2] == pytest.approx(want), kind


def test_the_heldout_baseline_runs_the_held_out_rows_as_they_are_and_beside_other_partners():
    """xylent.models.training.audit.step.heldout_help: the held-out batch's own loss and its partner-swapped loss,
    both under the measurement's own noise, summed per pair over the rows that had a partner; the
    swapped pass replays the generator's replacements of the rows as they are (the same tokens
    replaced, the same count), so only the partner moves."""
    from xylent.models.training.audit.step import HELDOUT_NOISE, heldout_help, pair_totals, partner_rotation, partners_swapped

    cfg = preset("tiny", vocab_size=300, specials=SPECIALS, dropout=0.0)
    torch.manual_seed(0)
    model = ElectraModel(cfg).eval()
    engine = type("Engine", (), {"module": model, "__call__": lambda self, *a, **k: model(*a, **k)})()
    ids, pad, seg, _ = _pair_batch()
    names = ["a-b", "a-b", "a-c", "a-b", "b-c", "a-c"]
    index = {"a-b": 0, "a-c": 1, "b-c": 2}
    batch = {"input_ids": ids.numpy(), "segment_ids": seg.numpy(), "pairs": names, "flipped": np.zeros(6, bool)}
    paired, base = heldout_help(engine, batch, index, 7, 30, 0, 1, torch.device("cpu"))
    noise = row_noise(7, 30, HELDOUT_NOISE, list(range(6)), (~pad).sum(1).tolist(), ids.shape[1])
    with torch.no_grad():
        own = model(ids, pad, seg, noise, per_row=True).rows
    as_they_are = model.corrupted
    swapped, kept = partners_swapped(engine, ids, pad, seg, noise, [index[p] for p in names], 0, 1, as_they_are)
    kept_names = [names[i] for i in kept]
    assert kept == [0, 1, 2, 3, 5] and base[2, -1] == 0 and paired[2, -1] == 0, "b-c has one row: no partner"
    assert torch.allclose(paired, pair_totals(own[:, kept], kept_names, index))
    assert torch.allclose(base, pair_totals(swapped, kept_names, index))
    replaced = ROW_FIELDS.index("d_pos")
    assert torch.equal(base[:, replaced], paired[:, replaced]) and paired[:2, replaced].min() > 0
    partner = partner_rotation([index[p] for p in names])
    for i in kept:  # what the swapped pass's discriminator read: x_i and y_j as they were corrupted
        x, y = (~pad[i]) & (seg[i] == 0), (~pad[partner[i]]) & (seg[partner[i]] == 1)
        want = torch.cat([as_they_are[i][x], as_they_are[partner[i]][y]])
        assert torch.equal(model.corrupted[i][: len(want)], want)


def test_the_baselines_are_measured_on_the_first_trtd_step_of_each_period():
    """The demo's alternate schedule trains TRTD on odd steps only: a period of 10 starting on
    an MRTD step measures on its first odd step, not never; with mix every period's first step."""
    import dataclasses

    cfg = TrainConfig(**{f.name: None for f in dataclasses.fields(TrainConfig)})
    cfg.batch_kinds, cfg.batch_schedule, cfg.trtd_ratio, cfg.grad_accum = ["mrtd", "trtd"], "alternate", 0.5, 1
    cfg.dro = DroConfig(rho=0.05, min_ratio=0.2, ema=0.1, resamples=2, weights=[1.0, 1.0], baseline="larger",
                        baseline_every=10, language_every=2, holdout=0.0, state_file="")
    assert [s for s in range(40) if baseline_due(cfg, s)] == [1, 11, 21, 31]
    assert [s for s in range(40) if language_due(cfg, s)] == [1, 21]  # every second period's
    cfg.steps = 1000  # the EMAs' rates per measurement: 5 TRTD steps a period, 10 a language window
    assert (per(cfg, pairs_due), per(cfg, language_due)) == (5.0, 10.0)
    cfg.dro.baseline_every = cfg.dro.language_every = 1
    assert (per(cfg, pairs_due), per(cfg, language_due)) == (1.0, 1.0)  # every TRTD step
    cfg.dro.baseline = "heldout"  # its own passes on every step: two measurements per TRTD step
    assert per(cfg, pairs_due) == 0.5
    cfg.steps, cfg.trtd_ratio = 10_000, 0.01  # TRTD on steps 99, 199, ...: counted by TRTD steps, not never
    assert per(cfg, pairs_due) == 0.01
    cfg.steps, cfg.trtd_ratio = 1000, 0.5
    cfg.dro.baseline, cfg.dro.baseline_every, cfg.dro.language_every = "larger", 10, 2
    cfg.trtd_ratio = 0.05  # TRTD on steps 19, 39, 59, ...: odd periods only: by the window, not never
    assert [s for s in range(120) if language_due(cfg, s)] == [19, 39, 59, 79, 99, 119]
    cfg.trtd_ratio = 0.5
    cfg.dro.baseline_every = 5
    assert [s for s in range(20) if baseline_due(cfg, s)] == [1, 5, 11, 15]
    cfg.batch_schedule = "mix"
    assert [s for s in range(20) if baseline_due(cfg, s)] == [0, 5, 10, 15]
    cfg.dro.baseline = None  # the paper's form: nothing to measure
    assert not any(baseline_due(cfg, s) for s in range(20))


def test_auto_baseline_every_keeps_the_rows_each_baseline_ema_averages():
    """baseline_every auto: the largest N whose EMAs, moving 1 − (1 − ema)^(N·share) a measurement,
    still average 1 000 rows of the median pair (the knob's default is 3 000)."""
    from xylent.models.training.audit.adversary import rate_over
    from xylent.tasks.audit.train_config import auto_baseline_every

    for r, share in ((0.1, 1.0), (1.8, 1.0), (20.0, 1.0), (40.0, 0.5), (200.0, 1.0)):
        n = auto_baseline_every(r, 0.003, 1000, share, cap=10**6)
        a, a_next = rate_over(0.003, n * share), rate_over(0.003, (n + 1) * share)
        assert n == 1 or r * (2 - a) / a >= 1000, (r, n)  # the rows hold at N ...
        assert r * (2 - a_next) / a_next < 1000, (r, n)  # ... and not at N + 1
    assert [auto_baseline_every(r, 0.003, 1000, 1.0, cap=10**6) for r in (0.1, 1.8, 20.0)] == [1, 1, 13]
    assert auto_baseline_every(200.0, 0.003, 1000, 1.0, cap=40) == 40  # every re-sampling window measures 10 times
    assert auto_baseline_every(5000.0, 0.003, 1000, 1.0, cap=0) == 1


def test_the_first_trtd_step_in_closed_form_is_the_schedules():
    import dataclasses

    from xylent.models.training.run_config import first_trtd_step, task_plan

    cfg = TrainConfig(**{f.name: None for f in dataclasses.fields(TrainConfig)})
    cfg.batch_kinds, cfg.grad_accum = ["mrtd", "trtd"], 1
    for schedule in ("alternate", "mix"):
        for ratio in (0.5, 1 / 3, 0.25, 0.3, 0.1, 0.07, 1 / 7, 0.99, 1.0):
            cfg.batch_schedule, cfg.trtd_ratio = schedule, ratio
            want = next(s for s in range(1000) if "trtd" in task_plan(cfg, s))
            assert first_trtd_step(cfg) == want, (schedule, ratio)
    cfg.batch_schedule, cfg.trtd_ratio = "alternate", 0.0
    assert first_trtd_step(cfg) is None
    cfg.batch_kinds = ["mrtd"]
    assert first_trtd_step(cfg) is None
