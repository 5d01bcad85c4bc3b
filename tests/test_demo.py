"""The embedded demo on the real Django catalogs (the session's short run, tests/data/demo-short.yaml:
every stage's contract, and both losses fall), and the task runners agree.  That the demo as shipped
learns (1500 steps: both losses below their trivial peers) is tests/acceptance/test_demo_learns.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"
SHORT_STEPS = 150  # tests/data/demo-short.yaml's pretrain.steps


def _rgb(path: Path) -> np.ndarray:
    """The PNG as 0–255 ints, (height, width, 3)."""
    from matplotlib.image import imread

    img = imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4), img.shape
    return np.round(img[..., :3] * 255).astype(np.int64)


def _codes(rgb: np.ndarray) -> np.ndarray:
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def _near(rgb: np.ndarray, colour: str, tol: int = 40) -> np.ndarray:
    from matplotlib.colors import to_rgb

    want = np.round(np.array(to_rgb(colour)) * 255)
    return np.abs(rgb - want).max(-1) <= tol


def _files(res: dict) -> list:
    m = json.loads((Path(res["stages"]["prepare"]["output_dir"]) / "_manifest.json").read_text())
    return sorted((f["path"], f["sha256"]) for f in m["files"])


def test_demo_pipeline_on_django_catalogs(run_cli, tmp_path, demo_run):
    res, _ = demo_run
    assert set(res["stages"]) == {"download", "prepare", "dedup", "vocab", "sampling", "shards", "pretrain", "audit",
                                  "evaluate"}
    prep = Path(res["stages"]["prepare"]["output_dir"])
    mono = pl.scan_parquet(prep / "mono" / "**" / "*.parquet", hive_partitioning=True)
    per_lang = dict(mono.group_by("lang").len().collect().rows())
    assert len(per_lang) == 20
    assert all(n >= 380 for n in per_lang.values()), per_lang  # a quarter of the messages is held out
    assert per_lang["de"] > 600 and per_lang["en"] > per_lang["de"]
    bitext = pl.scan_parquet(prep / "bitext" / "**" / "*.parquet", hive_partitioning=True)
    per_pair = dict(bitext.group_by("pair").len().collect().rows())
    assert len(per_pair) == 190, "20 languages, every pair shares messages"
    assert per_pair["de-en"] > 600 and per_pair["en-th"] > 300
    th = bitext.filter(pl.col("pair") == "en-th").select("tgt").collect()["tgt"].to_list()
    assert sum(bool(re.search("[\u0e00-\u0e7f]", t)) for t in th) > 0.8 * len(th), "Thai side is Thai"
    zh = mono.filter(pl.col("lang") == "zh").collect()["text"].to_list()
    assert sum(bool(re.search("[\u4e00-\u9fff]", t)) for t in zh) > 0.8 * len(zh)

    samp = Path(res["stages"]["sampling"]["output_dir"])
    table = pl.read_parquet(samp / "bitext_sampling.parquet")
    assert len(table) == 190 and (table["p_star"] > 0).all()
    assert (table["p_m2m"] > 0).sum() < 60, "the M2M LP is a sparse vertex"
    assert abs(table["p"].sum() - 1) < 1e-9
    assert len(pl.read_parquet(samp / "mono_sampling.parquet")) == 20
    _check_heatmaps(samp / "pair_heatmaps.png", table, n_langs=20)

    pre = Path(res["stages"]["pretrain"]["output_dir"])
    m = json.loads((pre / "_manifest.json").read_text())["metrics"]
    for task in ("mrtd", "trtd"):
        for loss in ("generator_loss", "discriminator_loss"):
            assert m[f"final.{task}/{loss}"] < m[f"first.{task}/{loss}"] - 0.05, (task, loss)
        for peer in ("discriminator_base_loss", "generator_unigram_loss"):  # beside each loss, its trivial peer
            assert m[f"final.{task}/{peer}"] > 0, (task, peer)
    assert m["steps"] == SHORT_STEPS
    _check_loss_curves(pre / "loss_curves.png")
    from xylent.launch import shm_buffers

    log = Path(json.loads((pre / "_manifest.json").read_text())["checkpoints"]) / "train.log"
    launched = [ln[2:].split() for ln in log.read_text().splitlines() if ln.startswith("$ ")]
    assert launched and all("--master_port" in c for c in launched), log
    assert not any(shm_buffers(c) for c in launched), "DeepSpeed's /dev/shm all-reduce buffers are removed"
    assert {"model.safetensors", "pretraining.safetensors", "config.json", "spm.model"} <= {
        p.name for p in (pre / "model").iterdir()}
    exported = json.loads((pre / "model" / "config.json").read_text())
    assert exported["steps"] == SHORT_STEPS and exported["fingerprint"] == res["stages"]["pretrain"]["fingerprint"]
    vocab = Path(res["stages"]["vocab"]["output_dir"])
    assert (pre / "model" / "spm.model").read_bytes() == (vocab / "spm.model").read_bytes(), "the vocab's tokenizer"

    proc = run_cli("run", "prepare", "--spec", DEMO, "--workspace", tmp_path / "ws-proc", "--json",
                   "--set", "runner.kind=processes")
    assert proc[0] == 0, proc[2]
    assert _files(json.loads(proc[1])) == _files(res), "processes runner writes the same bytes as threads"


def _check_heatmaps(path: Path, table: pl.DataFrame, n_langs: int) -> None:
    """Three n×n heatmaps (Q, M2M LP, P*) in viridis, white where a cell is exactly zero, then a colour bar."""
    from matplotlib import colormaps

    rgb = _rgb(path)
    h, w = rgb.shape[:2]
    assert h >= 300 and w > 2.5 * h, f"three square panels side by side, got {w}x{h}"
    viridis = np.isin(_codes(rgb), _codes(colormaps["viridis"](np.arange(256), bytes=True)[:, :3].astype(np.int64)))
    cols = _runs(viridis.any(0))
    assert len(cols) == 4, f"three heatmaps and a colour bar, got column runs {cols}"
    *panels, bar = cols
    widths = [b - a for a, b in panels]
    assert min(widths) > 0.15 * w and max(widths) - min(widths) <= 2, widths
    assert bar[1] - bar[0] < 0.05 * w, "the colour bar is narrow"
    fill = [viridis[:, a:b].sum() / (b - a) ** 2 for a, b in panels]
    cells = n_langs * n_langs
    q, m2m = int((table["q"] > 0).sum()), int((table["p_m2m"] > 0).sum())
    # Q and P* have both directions of every pair with data (the diagonal stays white); the LP's vertex
    # has one or both directions of each pair it keeps
    assert abs(fill[0] - 2 * q / cells) < 0.03 and abs(fill[2] - 2 * q / cells) < 0.03, (fill, q)
    assert m2m / cells - 0.02 < fill[1] < 2 * m2m / cells + 0.02, (fill, m2m)
    levels = len(np.unique(_codes(rgb[:, panels[0][0]:panels[0][1]])[viridis[:, panels[0][0]:panels[0][1]]]))
    assert levels >= 20, f"the densities of Q span the colour map, not one flat colour ({levels} colours)"


def _check_loss_curves(path: Path) -> None:
    """2×2 panels: G and D loss with an MRTD (C0) and a TRTD (C1) curve each, lr and throughput (C0)."""
    rgb = _rgb(path)
    h, w = rgb.shape[:2]
    assert h >= 500 and w >= 800 and w > h, (w, h)
    assert rgb.std() > 20 and len(np.unique(_codes(rgb))) > 100, "not a blank image"
    blue, orange = _near(rgb, "C0"), _near(rgb, "C1")
    for name, rows, cols, tasks in (("generator loss", slice(0, h // 2), slice(0, w // 2), 2),
                                    ("discriminator loss", slice(0, h // 2), slice(w // 2, w), 2),
                                    ("learning rate", slice(h // 2, h), slice(0, w // 2), 1),
                                    ("throughput", slice(h // 2, h), slice(w // 2, w), 1)):
        b, o = blue[rows, cols].sum(), orange[rows, cols].sum()
        assert b > 300, f"{name}: no MRTD/only curve ({b} px)"
        # a legend swatch is ~60 px; a curve across the panel is hundreds
        assert (o > 300) if tasks == 2 else (o == 0), f"{name}: {o} px of the TRTD colour"
        xs = np.flatnonzero(blue[rows, cols].any(0))
        assert xs.max() - xs.min() > 0.6 * (w // 2), f"{name}: the curve spans the steps"
