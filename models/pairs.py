"""The two sides of a TRTD row, as two sentences of their own.

A TRTD row is ``<s> x </s> y </s>`` with segment 0 over ``<s> x </s>`` and 1
over ``y </s>`` (xylent.data.loader).  Sentence-level objectives (InfoXLM's
XLCo, VECO's cross-attention) need ``<s> x </s>`` and ``<s> y </s>`` apart:
each side left-aligned in a batch of its own, padded to its longest row.
"""

from __future__ import annotations

import torch


def split_pair(ids: torch.Tensor, pad: torch.Tensor, segments: torch.Tensor, bos_id: int,
               pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_ids, x_pad, y_ids, y_pad): ``x`` = segment 0 as it is, ``y`` = ``<s>`` + segment 1."""
    real = ~pad
    in_x = real & (segments == 0)
    in_y = real & (segments == 1)
    x_len, y_len = in_x.sum(1), in_y.sum(1) + 1
    x_ids = _left_aligned(ids, in_x, x_len, pad_id, None)
    y_ids = _left_aligned(ids, in_y, y_len, pad_id, bos_id)
    return x_ids, x_ids == pad_id, y_ids, y_ids == pad_id


def _left_aligned(ids: torch.Tensor, where: torch.Tensor, lengths: torch.Tensor, pad_id: int,
                  prefix: int | None) -> torch.Tensor:
    width = int(lengths.max()) if len(lengths) else 1
    out = torch.full((ids.shape[0], width), pad_id, dtype=ids.dtype, device=ids.device)
    start = 0 if prefix is None else 1
    if prefix is not None:
        out[:, 0] = prefix
    # position of each selected token within its side: a running count along the row
    pos = where.long().cumsum(1) - 1 + start
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(ids)
    out[rows[where], pos[where]] = ids[where]
    return out
