"""The sampling stage's output contract (written by :func:`xylent.tasks.sampling.run.write_output`).

    mono_sampling.parquet    lang, ..., p_raw, p           (the loader's MRTD language table: column ``p``)
    bitext_sampling.parquet  lang_a, lang_b, count, q, p_star, p_m2m, p, ...
                             (``p`` is the table the loader samples TRTD pairs from:
                              sampling.pair_method's choice)
    pair_heatmaps.png, pair_probabilities.png, report.md   (no pictures when there is no bitext)
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq  # the training ranks read the tables here: no polars or pydantic

MONO_TABLE = "mono_sampling.parquet"
PAIR_TABLE = "bitext_sampling.parquet"


def language_table(sampling_dir: Path) -> dict[str, float]:
    """Language -> sampling probability (languages with p > 0)."""
    rows = pq.read_table(Path(sampling_dir) / MONO_TABLE, columns=["lang", "p"]).to_pylist()
    return {r["lang"]: r["p"] for r in rows if r["p"] > 0}


def pair_table(sampling_dir: Path, column: str = "p") -> dict[str, float]:
    """``xx-yy`` -> sampling probability (pairs with p > 0)."""
    rows = pq.read_table(Path(sampling_dir) / PAIR_TABLE, columns=["lang_a", "lang_b", column]).to_pylist()
    return {f"{r['lang_a']}-{r['lang_b']}": r[column] for r in rows if r[column] and r[column] > 0}
