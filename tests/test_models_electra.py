"""ELECTRA objectives: masking, replaced-token labels, and a tiny model that learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xylent.models.config import preset
from xylent.models.electra import ElectraModel, MaskedLMModel
from xylent.models.stats import Norms
from xylent.models.masking import bert_corrupt, choose_masked, corrupt, maskable, positions, row_noise, sample_tokens
from xylent.tasks.vocab.specials import BOS, EOS, MASK, PAD, SPECIAL_PIECES

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)

# the layout every xylent tokenizer has; models get it from the tokenizer, tests write it out
SPECIALS = dict(zip(("unk", "bos", "eos", "pad", "mask"), range(len(SPECIAL_PIECES))))
SPECIAL_IDS = tuple(sorted(SPECIALS.values()))


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 500, (4, 40), generator=g)
    ids[:, 0] = BOS
    ids[:, 19] = EOS  # </s> between the two sides
    ids[:, 30] = EOS
    ids[:, 31:] = PAD
    seg = torch.zeros_like(ids)
    seg[:, 20:31] = 1
    return ids, seg, g


def test_specials_and_padding_are_never_masked_and_each_side_gets_its_share():
    ids, seg, g = _batch()
    for trial in range(20):
        m = choose_masked(ids, seg, 0.15, torch.rand(ids.shape, generator=g), SPECIAL_IDS)
        assert not (m & ~maskable(ids, SPECIAL_IDS)).any(), "no <s>, </s>, <pad>, <mask> or <unk> is masked"
        assert (m & (seg == 0)).sum(1).min() >= 1 and (m & (seg == 1)).sum(1).min() >= 1, "TRTD masks both sides"
        assert ((m & (seg == 0)).sum(1) == round(18 * 0.15)).all()
    single = choose_masked(ids, None, 0.15, torch.rand(ids.shape, generator=g), SPECIAL_IDS)
    assert (single.sum(1) == round(28 * 0.15)).all()


def test_a_sample_equal_to_the_original_counts_as_original():
    ids, seg, g = _batch()
    m = choose_masked(ids, seg, 0.15, torch.rand(ids.shape, generator=g), SPECIAL_IDS)
    at = positions(m, int(m.sum()))
    assert torch.equal(ids.flatten()[at], ids[m]), "the masked positions, in row-major order"
    corrupted, replaced = corrupt(ids, at, ids.flatten()[at])  # the generator reproduced every original
    assert torch.equal(corrupted, ids) and not replaced.any()
    corrupted, replaced = corrupt(ids, at, ids.flatten()[at] + 1)
    assert torch.equal(replaced, m)


def test_a_tiny_model_learns_on_the_demo_shards(demo_run):
    from xylent.data.loader import TrainingLoader

    res, _ = demo_run
    shards, sampling = res["stages"]["shards"]["output_dir"], res["stages"]["sampling"]["output_dir"]
    import json
    from pathlib import Path

    vocab = sum(1 for _ in open(Path(res["stages"]["vocab"]["output_dir"]) / "spm.vocab", encoding="utf-8"))
    torch.manual_seed(0)
    index = json.loads((Path(shards) / "index.json").read_text())
    model = ElectraModel(preset("tiny", vocab_size=vocab, max_position=index["seq_len"], specials=index["specials"]))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    gen_losses, disc_losses = [], []
    for step, batch in enumerate(TrainingLoader(shards, sampling, task="mrtd", batch_size=8, seed=0).batches(120)):
        ids = torch.from_numpy(batch["input_ids"]).long()
        pad = ids == 3
        st = model(ids, pad, None, row_noise(0, step, 0, list(range(len(ids))), (~pad).sum(1).tolist(), ids.shape[1]))
        opt.zero_grad()
        model.loss(st, Norms(st.g_count.item(), st.d_count.item())).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
        gen_losses.append(st.g_loss.item() / st.g_count.item())
        disc_losses.append(st.d_loss.item() / st.d_count.item())
    assert np.mean(gen_losses[-20:]) < np.mean(gen_losses[:20]) - 0.5, "the generator's MLM loss falls"
    assert np.mean(disc_losses[-20:]) < np.mean(disc_losses[:20]), "the discriminator's loss falls"


def test_row_noise_depends_on_the_global_row_not_on_the_batch_it_is_in():
    a = row_noise(7, 3, 0, [0, 1, 2, 3], [10, 12, 8, 5], 12)
    b = row_noise(7, 3, 0, [1, 3], [12, 5], 16)
    assert torch.equal(a[:, 1, :12], b[:, 0, :12]) and torch.equal(a[:, 3, :5], b[:, 1, :5])
    assert (b[:, 0, 12:] == 2.0).all(), "padding gets noise no threshold selects"
    assert not torch.equal(row_noise(7, 4, 0, [0], [10], 10), a[:, :1, :10]), "a new step, new noise"


def test_sampling_by_inverse_cdf_follows_the_generator_distribution():
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]])).repeat(60000, 1)
    u = torch.rand(60000, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(sample_tokens(logits, u), minlength=3).float() / 60000
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=0.01)


def test_bert_80_10_10_on_the_chosen_positions_only():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (64, 200), generator=g)
    noise = torch.rand((3, 64, 200), generator=g)
    masked = choose_masked(ids, None, 0.15, noise[0], SPECIAL_IDS)
    out = bert_corrupt(ids, masked, noise, 1000, MASK, len(SPECIAL_IDS))
    assert torch.equal(out[~masked], ids[~masked])
    n = masked.sum().item()
    to_mask = (out[masked] == MASK).float().sum().item() / n
    kept = (out[masked] == ids[masked]).float().sum().item() / n
    assert abs(to_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02
    assert out[masked & (out != MASK)].min() >= 5, "a random replacement is never a special token"


def test_the_mlm_ablation_learns_and_exposes_the_same_encoder_keys():
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=60, max_position=64, dropout=0.0, specials=SPECIALS)
    mlm, electra = MaskedLMModel(cfg), ElectraModel(cfg)
    assert set(mlm.encoder_state_dict()) == set(electra.encoder_state_dict())
    opt = torch.optim.AdamW(mlm.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(150):  # a learnable language: every row counts up from a random start
        start = torch.randint(5, 20, (16, 1), generator=g)
        ids = start + torch.arange(32)[None]
        pad = torch.zeros_like(ids, dtype=torch.bool)
        st = mlm(ids, pad, None, row_noise(0, step, 0, list(range(16)), [32] * 16, 32))
        opt.zero_grad()
        mlm.loss(st, Norms(st.g_count.item())).backward()
        opt.step()
        losses.append(st.g_loss.item() / st.g_count.item())
    assert np.mean(losses[-20:]) < np.mean(losses[:20]) - 1.0


def test_models_take_special_ids_from_their_config_not_a_constant():
    shifted = {"unk": 7, "bos": 8, "eos": 9, "pad": 10, "mask": 11}  # a tokenizer with another layout
    cfg = preset("tiny", vocab_size=60, max_position=64, specials=shifted)
    model = ElectraModel(cfg)
    ids = torch.randint(0, 60, (8, 32), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = 8, 9
    masked = choose_masked(ids, None, 0.5, torch.rand(ids.shape), model.special_ids)
    assert model.special_ids == (7, 8, 9, 10, 11) and model.mask_id == 11
    assert not masked[:, [0, -1]].any() and not masked[(ids >= 7) & (ids <= 11)].any()
    with __import__("pytest").raises(ValueError, match="special"):
        ElectraModel(preset("tiny", vocab_size=60, max_position=64))  # no tokenizer ids: refused, not guessed


def test_an_untied_generator_output_moves_only_the_embeddings_of_tokens_input():
    """Issue 63's collapse: with the output layer tied, the generator's softmax gives every row of the token
    embeddings a gradient each step, tokens never input included; untied, those rows get none."""
    ids, segments, _ = _batch()
    pad = ids == PAD
    noise = row_noise(0, 0, 0, list(range(ids.shape[0])), [int(n) for n in (~pad).sum(1)], ids.shape[1])
    grads = {}
    for output in ("tied", "untied"):
        torch.manual_seed(0)
        model = ElectraModel(preset("tiny", vocab_size=500, max_position=64, specials=SPECIALS, generator_output=output))
        st = model(ids, pad, segments, noise)
        model.loss(st, Norms(st.g_count, st.d_count, None)).backward()
        never_input = torch.ones(500, dtype=torch.bool)
        # the generator reads the ids and <mask>, the discriminator the ids with the generator's samples
        never_input[torch.cat([ids.flatten(), model.generated_input().flatten(), torch.tensor(SPECIAL_IDS)])] = False
        assert never_input.sum() > 300
        grads[output] = model.token_embedding().grad[never_input].abs().amax(dim=1)
        assert (model.output_embedding() is model.token_embedding()) == (output == "tied")
    assert (grads["tied"] > 0).all() and (grads["untied"] == 0).all()
