"""Retrieval evaluation without fine-tuning: Tatoeba accuracy and BUCC 2018
bitext mining, on pooled sentence embeddings, with exact faiss search.

Embeddings come from an :data:`EmbedFn` the caller supplies (this module knows
nothing about models); they are L2-normalised here, so inner product is cosine.
Memory stays bounded by the pooled vectors: each side is streamed batch by batch
into a ``faiss.IndexFlatIP`` (on GPU 0 when faiss sees a GPU), queries are
searched in batches, and only the k best neighbours of each query are kept,
never a dense similarity matrix.

References: google-research/xtreme ``third_party/utils_retrieve.py`` and
``third_party/evaluate_retrieval.py`` (snapshot 838c13b), which adapt LASER's
``source/mine_bitexts.py``; Artetxe & Schwenk 2019, "Margin-based parallel corpus
mining with multilingual sentence embeddings".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import faiss
import numpy as np

from xylent.tasks.evaluate import metrics
from xylent.tasks.evaluate.retrieval_data import (
    BUCC_TEST_SPLITS,
    BUCC_TUNE_SPLITS,
    find_bucc_split,
    read_bucc,
    read_tatoeba,
)
from xylent.errors import XylentError

EmbedFn = Callable[[Sequence[str]], Iterator[np.ndarray]]
"""Given texts, yields float32 arrays of shape (batch, dim), in the order of the texts."""

SEARCH_BATCH = 4096  # queries per faiss search: bounds the result buffers, not the answer

_gpu_resources = None  # one per process, alive as long as any GPU index that uses it


def new_index(dim: int) -> faiss.Index:
    """An empty exact inner-product index, on GPU 0 when faiss sees a GPU."""
    index = faiss.IndexFlatIP(dim)
    if faiss.get_num_gpus() > 0:
        global _gpu_resources
        if _gpu_resources is None:
            _gpu_resources = faiss.StandardGpuResources()
        # A single-GPU flat index can hand its vectors back (reconstruct_n),
        # which query-side streaming relies on.
        index = faiss.index_cpu_to_gpu(_gpu_resources, 0, index)
    return index


def _unit_batches(embed: EmbedFn, texts: Sequence[str], what: str, dim: int | None = None) -> Iterator[np.ndarray]:
    """The embeddings of ``texts``, L2-normalised, batch by batch."""
    seen = 0
    for batch in embed(texts):
        # A private copy: normalising in place must not touch the caller's array.
        unit = np.array(batch, dtype=np.float32, order="C", copy=True)
        if unit.ndim != 2:
            raise ValueError(f"embed yielded an array of shape {unit.shape} for {what}; expected (batch, dim)")
        if unit.shape[0] == 0:
            continue
        if dim is not None and unit.shape[1] != dim:
            raise ValueError(f"embed yielded {unit.shape[1]}-dim vectors for {what}, {dim}-dim before")
        start, seen, dim = seen, seen + unit.shape[0], unit.shape[1]
        if seen > len(texts):
            break
        if not np.isfinite(unit).all():
            row = start + int(np.flatnonzero(~np.isfinite(unit).all(axis=1))[0])
            raise XylentError(f"the encoder produced a non-finite embedding for {what} (text {row}: "
                              f"{texts[row][:60]!r})", where=f"{what}, text {row}",
                              fix="the checkpoint has probably diverged; evaluate an earlier one")
        faiss.normalize_L2(unit)  # a zero vector stays zero: cosine 0 with everything
        yield unit
    if seen != len(texts):
        raise ValueError(f"embed yielded {seen} vectors for {len(texts)} {what}")


def embed_index(embed: EmbedFn, texts: Sequence[str], what: str = "texts") -> faiss.Index:
    """An index of the L2-normalised embeddings of ``texts``, filled as batches come."""
    if not texts:
        raise ValueError(f"no {what} to embed")
    index = None
    for unit in _unit_batches(embed, texts, what):
        if index is None:
            index = new_index(unit.shape[1])
        index.add(unit)
    return index


def _count(vectors: np.ndarray | faiss.Index) -> int:
    return vectors.ntotal if isinstance(vectors, faiss.Index) else len(vectors)


def _rows(vectors: np.ndarray | faiss.Index, start: int, stop: int) -> np.ndarray:
    if isinstance(vectors, faiss.Index):
        return vectors.reconstruct_n(start, stop - start)
    return np.ascontiguousarray(vectors[start:stop], dtype=np.float32)


def knn(queries: np.ndarray | faiss.Index, database: np.ndarray | faiss.Index, k: int,
        batch: int = SEARCH_BATCH) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` neighbours by inner product: (scores, ids), each (n_queries, k),
    best first.  L2-normalise both sides beforehand for cosine.

    Either side may be an array or a flat faiss index (queries are then read back
    batch by batch); ``k`` is capped at the database size, as the reference does.
    Among exactly tied scores faiss decides the order (on CPU with k = 1, the
    lowest id wins; with k > 1 tied ids may come in any order).
    """
    if k < 1 or batch < 1:
        raise ValueError(f"k and batch must be >= 1, got k={k}, batch={batch}")
    if not isinstance(database, faiss.Index):
        array = np.ascontiguousarray(database, dtype=np.float32)
        if array.ndim != 2:
            raise ValueError(f"database must be (n, dim), got shape {array.shape}")
        database = new_index(array.shape[1])
        database.add(array)
    if database.ntotal == 0:
        raise ValueError("the database is empty")
    k = min(k, database.ntotal)
    n = _count(queries)
    scores, ids = np.empty((n, k), np.float32), np.empty((n, k), np.int64)
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        q = _rows(queries, start, stop)
        if q.ndim != 2 or q.shape[1] != database.d:
            raise ValueError(f"queries of shape {q.shape} against a {database.d}-dim database")
        scores[start:stop], ids[start:stop] = database.search(q, k)
    return scores, ids


# -- Tatoeba -------------------------------------------------------------------

def tatoeba_accuracy(embed: EmbedFn, src: list[str], tgt: list[str], *, batch: int = SEARCH_BATCH) -> dict:
    """Accuracy@1 (×100) of nearest-neighbour search by cosine between line-aligned
    xx sentences ``src`` and English ``tgt``: ``accuracy`` is xx→en, XTREME's
    number; ``accuracy_en_to_xx`` the other direction.  ``predictions``: for each
    xx sentence, the index in ``tgt`` it retrieved.

    Gold is the same line index only, as in XTREME's scorer (``evaluate.py``
    compares label indices): when ``tgt`` holds a sentence twice, a query whose
    gold is one copy and which retrieves the other counts as wrong.  Identical
    texts get identical vectors, so ties are decided by faiss (on CPU, the lowest
    index wins), which makes at most one of such queries right.
    """
    if len(src) != len(tgt) or not src:
        raise ValueError(f"need the same, non-zero number of xx and en sentences, got {len(src)} and {len(tgt)}")
    en = embed_index(embed, tgt, "English sentences")
    xx = new_index(en.d)
    to_en = np.empty(len(src), np.int64)
    done = 0
    # The xx side is searched as it comes and kept for the other direction.
    for unit in _unit_batches(embed, src, "xx sentences", dim=en.d):
        xx.add(unit)
        to_en[done: done + len(unit)] = knn(unit, en, 1, batch)[1][:, 0]
        done += len(unit)
    to_xx = knn(en, xx, 1, batch)[1][:, 0]
    gold = np.arange(len(src))
    return {"accuracy": 100.0 * float(np.mean(to_en == gold)),
            "accuracy_en_to_xx": 100.0 * float(np.mean(to_xx == gold)),
            "n": len(src), "predictions": to_en.tolist()}


def evaluate_tatoeba(embed: EmbedFn, data_dir: Path, lang: str, labels: Path | None = None) -> dict:
    """``tatoeba_accuracy`` on the files of ``lang`` in ``data_dir`` (see ``read_tatoeba``)."""
    src, tgt = read_tatoeba(Path(data_dir), lang, labels)
    return tatoeba_accuracy(embed, src, tgt)


# -- BUCC 2018: margin-based mining --------------------------------------------

def margin_knn(x: np.ndarray | faiss.Index, y: np.ndarray | faiss.Index, k: int = 4,
               batch: int = SEARCH_BATCH) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ratio-margin scores of each sentence's k nearest neighbours on the other side.

    For unit vectors x, y: margin(x, y) = cos(x, y) / (Σ_{z∈NN_k(x)} cos(x, z) / 2k
    + Σ_{z∈NN_k(y)} cos(y, z) / 2k), NN_k by cosine on the other side.  Returns
    (fwd_ids, fwd_margin) of shape (n_x, k) and (bwd_ids, bwd_margin) of shape
    (n_y, k).  A non-positive denominator gives -inf: the neighbourhoods are
    anti-correlated and a ratio would reward that with a flipped sign.
    """
    fwd_cos, fwd_ids = knn(x, y, k, batch)
    bwd_cos, bwd_ids = knn(y, x, k, batch)
    x_mean = fwd_cos.mean(axis=1, dtype=np.float64)
    y_mean = bwd_cos.mean(axis=1, dtype=np.float64)

    def ratio(cos, own_mean, other_mean):
        denominator = (own_mean[:, None] + other_mean) / 2
        out = np.full(cos.shape, -np.inf)
        np.divide(cos, denominator, out=out, where=denominator > 0)
        return out

    return fwd_ids, ratio(fwd_cos, x_mean, y_mean[fwd_ids]), bwd_ids, ratio(bwd_cos, y_mean, x_mean[bwd_ids])


def mine_pairs(x: np.ndarray | faiss.Index, y: np.ndarray | faiss.Index, k: int = 4,
               batch: int = SEARCH_BATCH) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate pairs (x index, y index, margin), best first, by LASER's
    ``--retrieval max``: every x's best y by margin among its k nearest, and every
    y's best x, pooled and taken greedily by descending margin, skipping a pair
    whose x or y was already taken, so each sentence is in at most one pair.
    Equal margins keep forward before backward, then lower index first.
    """
    fwd_ids, fwd_margin, bwd_ids, bwd_margin = margin_knn(x, y, k, batch)
    nx, ny = len(fwd_ids), len(bwd_ids)
    fwd_pick, bwd_pick = fwd_margin.argmax(axis=1), bwd_margin.argmax(axis=1)
    src = np.concatenate([np.arange(nx), bwd_ids[np.arange(ny), bwd_pick]])
    tgt = np.concatenate([fwd_ids[np.arange(nx), fwd_pick], np.arange(ny)])
    score = np.concatenate([fwd_margin[np.arange(nx), fwd_pick], bwd_margin[np.arange(ny), bwd_pick]])
    taken_src, taken_tgt = np.zeros(nx, bool), np.zeros(ny, bool)
    keep = []
    for i in np.argsort(-score, kind="stable"):
        s, t = src[i], tgt[i]
        if not (taken_src[s] or taken_tgt[t]):
            taken_src[s] = taken_tgt[t] = True
            keep.append(i)
    keep = np.asarray(keep, np.int64)
    return src[keep], tgt[keep], score[keep]


def _unify(ids: Sequence[str], texts: Sequence[str]) -> tuple[list[str], list[str | None]]:
    """Unique texts in first-seen order, and the id each stands for (None for a
    text that occurs more than once: its id is ambiguous)."""
    counts = Counter(texts)
    owner = dict(zip(texts, ids))
    unique = list(owner)  # dicts keep first-insertion order
    return unique, [owner[t] if counts[t] == 1 else None for t in unique]


def bucc_mine(embed: EmbedFn, src_ids: Sequence[str], src_texts: Sequence[str], tgt_ids: Sequence[str],
              tgt_texts: Sequence[str], k: int = 4, *, batch: int = SEARCH_BATCH) -> list[tuple[float, str, str]]:
    """Mined candidates (margin, src id, tgt id), best first, as XTREME's BUCC
    evaluation makes them: ``mine_bitext`` with its defaults, i.e. ratio margin,
    k = 4, ``retrieval='max'`` (see :func:`mine_pairs`) on the unique texts of each
    side.  As XTREME's ``read_sent2id`` does, a text that occurs more than once
    on its side is mined once but never proposed, since it has no single id.
    """
    if len(src_ids) != len(src_texts) or len(tgt_ids) != len(tgt_texts):
        raise ValueError("ids and texts differ in length")
    src_unique, src_owner = _unify(src_ids, src_texts)
    tgt_unique, tgt_owner = _unify(tgt_ids, tgt_texts)
    x = embed_index(embed, src_unique, "source sentences")
    y = embed_index(embed, tgt_unique, "target sentences")
    if x.d != y.d:
        raise ValueError(f"source vectors are {x.d}-dim, target vectors {y.d}-dim")
    src, tgt, score = mine_pairs(x, y, k, batch)
    return [(float(m), src_owner[s], tgt_owner[t]) for s, t, m in zip(src, tgt, score)
            if src_owner[s] is not None and tgt_owner[t] is not None]


def f1_at_threshold(candidates: Sequence[tuple[float, str, str]], gold: set[tuple[str, str]], threshold: float) -> dict:
    """F1, precision, recall (×100) of the candidates scoring >= ``threshold``,
    with XTREME's BUCC scorer."""
    mined = [f"{s}\t{t}" for score, s, t in candidates if score >= threshold]
    return metrics.bucc_f1([f"{s}\t{t}" for s, t in gold], mined)


def choose_threshold(candidates: Sequence[tuple[float, str, str]], gold: set[tuple[str, str]]) -> float:
    """The margin threshold with the best F1 on ``gold``, as XTREME's
    ``bucc_optimize``: halfway between the lowest margin kept and the next one
    down (the lowest margin itself when nothing is left out).  Unlike the
    reference, equal margins are kept or dropped together, as a threshold must;
    among equal F1 the higher threshold wins.  With no correct candidate every
    threshold scores 0 and, as in the reference, 0 is returned.
    """
    if not gold:
        raise ValueError("no gold pairs to tune the threshold on")
    scores = np.array([c[0] for c in candidates], np.float64)
    order = np.argsort(-scores, kind="stable")
    correct = np.cumsum([(candidates[i][1], candidates[i][2]) in gold for i in order])
    extracted = np.arange(1, len(order) + 1)
    ranked = scores[order]
    # The last item of each run of equal margins: where a threshold can cut.
    cuts = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True)) if len(order) else np.array([], int)
    best, threshold = 0.0, 0.0
    for i in cuts:
        if correct[i] == 0:
            continue
        precision, recall = correct[i] / extracted[i], correct[i] / len(gold)
        f1 = 2 * precision * recall / (precision + recall)
        if f1 > best:
            best = f1
            threshold = (ranked[i] + ranked[i + 1]) / 2 if i + 1 < len(ranked) else ranked[i]
    return float(threshold)


def evaluate_bucc(embed: EmbedFn, data_dir: Path, lang: str, k: int = 4, *, batch: int = SEARCH_BATCH) -> dict:
    """BUCC 2018 for ``<lang>-en``: the threshold that maximises F1 on the tuning
    split (``dev``, or the shared task's ``sample``) applied to the test split
    (``test``, or the shared task's ``training``, which XTREME renames ``test``).

    Returns ``threshold``, ``tune_split``, ``tune`` (F1/precision/recall ×100 on
    it), ``test_split``, ``test`` (the same, or None when the split has no gold
    file: XTREME deletes it, and then ``note`` says so), and ``predictions``: the
    test pairs (xx id, en id) at or above the threshold, the lines
    ``<xx-id>\\t<en-id>`` of XTREME's ``test-<lang>.tsv``.
    """
    data_dir = Path(data_dir)
    tune = read_bucc(data_dir, lang, find_bucc_split(data_dir, lang, BUCC_TUNE_SPLITS))
    if tune.gold is None:
        raise XylentError(f"BUCC split {tune.split!r} of {lang}-en has no gold file "
                          f"({lang}-en.{tune.split}.gold), so no threshold can be tuned", where=str(data_dir),
                          fix="download the sample/dev gold alignments with the sentences")
    test = read_bucc(data_dir, lang, find_bucc_split(data_dir, lang, BUCC_TEST_SPLITS))
    tune_candidates = bucc_mine(embed, tune.src_ids, tune.src_texts, tune.tgt_ids, tune.tgt_texts, k, batch=batch)
    threshold = choose_threshold(tune_candidates, tune.gold)
    test_candidates = bucc_mine(embed, test.src_ids, test.src_texts, test.tgt_ids, test.tgt_texts, k, batch=batch)
    result = {"threshold": threshold, "tune_split": tune.split, "tune": f1_at_threshold(tune_candidates, tune.gold, threshold),
              "test_split": test.split,
              "test": None if test.gold is None else f1_at_threshold(test_candidates, test.gold, threshold),
              "predictions": [(s, t) for score, s, t in test_candidates if score >= threshold]}
    if test.gold is None:
        result["note"] = (f"no {lang}-en.{test.split}.gold: test F1 cannot be computed here; write the predictions "
                          f"as test-{lang}.tsv and score them with XTREME's evaluate.py")
    return result


__all__ = ["EmbedFn", "f1_at_threshold", "bucc_mine", "choose_threshold", "embed_index", "evaluate_bucc",
           "evaluate_tatoeba", "knn", "margin_knn", "mine_pairs", "new_index", "tatoeba_accuracy"]

