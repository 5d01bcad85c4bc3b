"""The trainer's host work moved off the step (issue 61): what the loader's thread prepares is what
the step computed itself before, and the metrics read once per interval are the per-step ones."""

from __future__ import annotations

import numpy as np
import torch

from xylent.models.masking import row_noise
from xylent.models.stats import Stats
from xylent.models.training.step_inputs import StepInputs
from xylent.models.training.step_metrics import Interval, summarise
from xylent.models.training.trainer import UnigramBaseline

SPECIAL_IDS = (0, 1, 2, 3, 4)
PAD = 3


def _numpy_batch(seed: int, rows: int = 5, width: int = 20, vocab: int = 50) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (rows, width)).astype(np.int32)
    seg = np.zeros_like(ids, dtype=np.int8)
    for r, n in enumerate(rng.integers(3, width + 1, rows)):
        ids[r, 0], ids[r, n - 1], ids[r, n:] = 1, 2, PAD
        seg[r, n // 2: n] = 1
    return {"input_ids": ids, "segment_ids": seg}


def test_the_prepared_inputs_are_what_the_step_computed_itself():
    positions = [(7, 0), (7, 2), (8, 1)]
    prepare = StepInputs(positions, seed=3, rank=1, world=2, pad=PAD, special_ids=SPECIAL_IDS, vocab_size=50,
                         host_counts=lambda ids, seg, real: {"n_real": int(real.sum()), "n": int((ids > 4).sum())})
    for k, (step, micro) in enumerate(positions):
        batch = _numpy_batch(k)
        out = prepare(k, batch)
        ids = torch.from_numpy(batch["input_ids"]).long()
        pad = ids == PAD
        rows = [1 + 2 * i for i in range(ids.shape[0])]
        assert torch.equal(out["ids"], ids) and torch.equal(out["segments"], torch.from_numpy(batch["segment_ids"]))
        assert torch.equal(out["noise"], row_noise(3, step, micro, rows, (~pad).sum(1).tolist(), ids.shape[1]))
        # what UnigramBaseline computed on the device before: a boolean mask, then a bincount
        tokens = ids[~pad & ~torch.isin(ids, torch.tensor(SPECIAL_IDS))]
        assert torch.equal(out["unigram_tokens"], tokens)
        assert torch.equal(out["unigram_seen"], torch.bincount(tokens, minlength=50).double())
        assert out["host_counts"] == {"n_real": int((~pad).sum()), "n": int((batch["input_ids"] > 4).sum())}
        assert out["input_ids"] is batch["input_ids"], "the loader's own fields stay"


def test_the_unigram_baseline_from_host_counts_is_the_one_from_device_masks():
    vocab, new = 50, UnigramBaseline(50, torch.device("cpu"))
    counts = torch.ones(vocab, dtype=torch.float64)
    prepare = StepInputs([(0, 0)] * 6, 0, 0, 1, PAD, SPECIAL_IDS, vocab)
    for k in range(6):
        batch = prepare(k, _numpy_batch(10 + k))
        ids = batch["ids"]
        tokens = ids[(ids != PAD) & ~torch.isin(ids, torch.tensor(SPECIAL_IDS))]  # the baseline before issue 61
        want = torch.stack([-(counts[tokens] / counts.sum()).log().sum(), torch.tensor(float(tokens.numel()),
                                                                                       dtype=torch.float64)])
        counts += torch.bincount(tokens, minlength=vocab).double()
        assert torch.equal(new(batch["unigram_tokens"], batch["unigram_seen"], 1), want)
    assert torch.equal(new.counts, counts)


def _sums(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randint(0, 400, (len(Stats.fields()),), generator=g).float()
    v[: len(Stats.SUMS)] = torch.rand(len(Stats.SUMS), generator=g) * 900
    return v


def test_an_interval_read_at_once_gives_each_step_the_line_a_read_per_step_gave():
    for averaged in (False, True):
        interval = Interval({"generator_loss": 1.0, "discriminator_loss": 50.0}, 10.0, 1e9, averaged=averaged)
        for step in range(1, 5):
            interval.add(step, {"mrtd": _sums(step), "trtd": _sums(10 + step)},
                         {"mrtd": torch.tensor([30.0 + step, 7.0], dtype=torch.float64)},
                         torch.tensor(2.5 + step), 1e-4 * step, {"gauge": 0.5})
        lines = interval.lines()
        assert [s for s, _ in lines] == [1, 2, 3, 4]
        for step, m in lines:
            want = summarise({"mrtd": _sums(step).tolist(), "trtd": _sums(10 + step).tolist()})
            assert {k: m[k] for k in want} == want
            assert m["mrtd/generator_unigram_loss"] == float(torch.tensor(30.0 + step, dtype=torch.float64) / 7.0)
            assert (m["grad_norm"], m["lr"], m["gauge"]) == (float(torch.tensor(2.5 + step)), 1e-4 * step, 0.5)
            tokens = float(_sums(step)[Stats.fields().index("tokens")] + _sums(10 + step)[Stats.fields().index("tokens")])
            assert m["tokens"] == tokens
            assert list(m)[-4:] == ["tokens_per_second", "step_seconds", "tokens", "mfu"], "the lines' old order"
        seconds = {m["step_seconds"] for _, m in lines}
        assert len(seconds) == 1 if averaged else len(seconds) == 4, "a GPU's lines share the interval's time"
