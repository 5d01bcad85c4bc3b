"""ELECTRA objectives: masking, replaced-token labels, and a tiny model that learns."""

from __future__ import annotations

import numpy as np
import torch

from models.config import preset
from models.electra import ElectraModel, choose_masked, corrupt, maskable


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 500, (4, 40), generator=g)
    ids[:, 0] = 1
    ids[:, 19] = 2  # </s> between the two sides
    ids[:, 30] = 2
    ids[:, 31:] = 3  # padding
    seg = torch.zeros_like(ids)
    seg[:, 20:31] = 1
    return ids, seg, g


def test_specials_and_padding_are_never_masked_and_each_side_gets_its_share():
    ids, seg, g = _batch()
    for trial in range(20):
        m = choose_masked(ids, seg, 0.15, g)
        assert not (m & ~maskable(ids)).any(), "no <s>, </s>, <pad>, <mask> or <unk> is masked"
        assert (m & (seg == 0)).sum(1).min() >= 1 and (m & (seg == 1)).sum(1).min() >= 1, "TRTD masks both sides"
        assert ((m & (seg == 0)).sum(1) == round(18 * 0.15)).all()
    single = choose_masked(ids, None, 0.15, g)
    assert (single.sum(1) == round(28 * 0.15)).all()


def test_a_sample_equal_to_the_original_counts_as_original():
    ids, seg, g = _batch()
    m = choose_masked(ids, seg, 0.15, g)
    corrupted, replaced = corrupt(ids, m, ids[m])  # the generator reproduced every original
    assert torch.equal(corrupted, ids) and not replaced.any()
    other = ids[m] + 1
    corrupted, replaced = corrupt(ids, m, other)
    assert torch.equal(replaced, m)


def test_a_tiny_model_learns_on_the_demo_shards(demo_run):
    from tasks.shards import TrainingLoader

    res, _ = demo_run
    shards, sampling = res["stages"]["shards"]["output_dir"], res["stages"]["sampling"]["output_dir"]
    import json
    from pathlib import Path

    vocab = sum(1 for _ in open(Path(res["stages"]["vocab"]["output_dir"]) / "spm.vocab", encoding="utf-8"))
    torch.manual_seed(0)
    model = ElectraModel(preset("tiny", vocab_size=vocab, max_position=json.loads(
        (Path(shards) / "index.json").read_text())["seq_len"]))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    gen_losses, disc_losses = [], []
    for batch in TrainingLoader(shards, sampling, task="mrtd", batch_size=8, seed=0).batches(120):
        ids = torch.from_numpy(batch["input_ids"]).long()
        out = model(ids, pad=ids == 3, generator=g)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        gen_losses.append(out.generator.item())
        disc_losses.append(out.discriminator.item())
    assert np.mean(gen_losses[-20:]) < np.mean(gen_losses[:20]) - 0.5, "the generator's MLM loss falls"
    assert np.mean(disc_losses[-20:]) < np.mean(disc_losses[:20]), "the discriminator's loss falls"
