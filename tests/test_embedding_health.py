"""The token embeddings' health (issue 63, item 2): the numbers against hand-computed ones.  A run
writing them for random init and every checkpoint: tests/test_pretrain.py."""

from __future__ import annotations

import pytest
import torch

from xylent.models.embedding_health import embedding_health


def test_the_health_of_a_small_matrix_is_what_the_hand_computes():
    # rows (2, 0), (-2, 0), (0, 1), (0, 3): mean (0, 1); centred scatter diag(8, 6): the top component holds 8/14
    w = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    got = embedding_health(w, torch.tensor([True, True, False, False]))
    assert got["top_pc_share"] == pytest.approx(8 / 14)
    assert got["unseen_rows"] == 2 and got["unseen_mean_norm"] == pytest.approx(2.0)  # norms 1 and 3
    assert got["unseen_cos_to_mean"] == pytest.approx(1.0), "both point along their mean (0, 2)"
    assert got["seen_mean_norm"] == pytest.approx(2.0)
    spread = embedding_health(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]),
                              torch.tensor([False, False, False, False]))
    assert spread["top_pc_share"] == pytest.approx(0.5) and spread["unseen_cos_to_mean"] == pytest.approx(0.0)
    assert spread["seen_mean_norm"] == 0.0


def test_a_random_matrix_has_no_dominant_direction_and_a_collapsed_one_has_one():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2000, 64, generator=g) * 0.02
    assert embedding_health(w, torch.ones(2000, dtype=torch.bool))["top_pc_share"] < 0.05
    collapsed = w + torch.randn(2000, 1, generator=g) * torch.randn(1, 64, generator=g)  # one shared direction
    assert embedding_health(collapsed, torch.ones(2000, dtype=torch.bool))["top_pc_share"] > 0.9
