"""The sampling distribution over languages that two stages share: vocab weighs each
language's vocabulary by it (VoCAP), sampling draws training languages by it.  It
lives below both so that vocab, which runs first, does not import a later stage."""

from __future__ import annotations

import numpy as np

from xylent.errors import XylentError


def language_distribution(sizes: np.ndarray, alpha: float, *, field: str = "sampling.alpha") -> np.ndarray:
    """p_j ∝ m_j^α over example counts; languages with no examples get 0.  ``field``: the
    spec field ``alpha`` came from, for the error."""
    m = np.asarray(sizes, dtype=np.float64)
    if m.ndim != 1 or not np.all(np.isfinite(m)) or np.any(m < 0):
        raise XylentError("language sizes must be finite and non-negative", where=f"{field.split('.')[0]} input")
    if not np.isfinite(alpha) or alpha <= 0:
        raise XylentError(f"alpha must be a positive number, got {alpha!r}", where=f"spec field {field}",
                          fix=f"set {field} > 0")
    if m.sum() <= 0:
        raise XylentError("no language has any data", where=f"{field.split('.')[0]} input",
                          fix="check the prepare/dedup statistics: every language is empty")
    w = np.where(m > 0, m, 0.0) ** alpha
    w[m == 0] = 0.0
    return w / w.sum()
