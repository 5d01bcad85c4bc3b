"""The embedded demo on the real Django catalogs, and the task runners agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data_specs" / "demo.yaml"


def _files(res: dict) -> list:
    m = json.loads((Path(res["stages"]["prepare"]["output_dir"]) / "_manifest.json").read_text())
    return sorted((f["path"], f["sha256"]) for f in m["files"])


def test_demo_pipeline_on_django_catalogs(run_cli, tmp_path, demo_run):
    res, _ = demo_run
    assert set(res["stages"]) == {"download", "prepare", "dedup", "vocab", "sampling", "shards", "pretrain"}
    prep = Path(res["stages"]["prepare"]["output_dir"])
    mono = pl.scan_parquet(prep / "mono" / "**" / "*.parquet", hive_partitioning=True)
    per_lang = dict(mono.group_by("lang").len().collect().rows())
    assert len(per_lang) == 20
    assert all(n >= 500 for n in per_lang.values()), per_lang
    assert per_lang["de"] > 800 and per_lang["en"] > per_lang["de"]
    bitext = pl.scan_parquet(prep / "bitext" / "**" / "*.parquet", hive_partitioning=True)
    per_pair = dict(bitext.group_by("pair").len().collect().rows())
    assert len(per_pair) == 190, "20 languages, every pair shares messages"
    assert per_pair["de-en"] > 800 and per_pair["en-th"] > 400
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
    assert (samp / "pair_heatmaps.png").stat().st_size > 10_000

    pre = Path(res["stages"]["pretrain"]["output_dir"])
    m = json.loads((pre / "_manifest.json").read_text())["metrics"]
    for task in ("mrtd", "trtd"):
        for loss in ("generator_loss", "discriminator_loss"):
            assert m[f"final.{task}/{loss}"] < m[f"first.{task}/{loss}"] - 0.05, (task, loss)
    assert m["steps"] == 300
    assert (pre / "loss_curves.png").stat().st_size > 20_000
    assert {"model.safetensors", "pretraining.safetensors", "config.json", "spm.model"} <= {
        p.name for p in (pre / "model").iterdir()}

    proc = run_cli("run", "prepare", "--spec", DEMO, "--workspace", tmp_path / "ws-proc", "--json",
                   "--set", "runner.kind=processes")
    assert proc[0] == 0, proc[2]
    assert _files(json.loads(proc[1])) == _files(res), "processes runner writes the same bytes as threads"
