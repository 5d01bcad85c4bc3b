"""Print the noisy pair's w_mean, rank and paired help per dose (wip/partner_dose.sh's outputs)."""
import glob
import json
import sys

import polars as pl

sys.path.insert(0, "tests")
from audit_planted import PLANTED  # noqa: E402

NOISY, COPY, HUB = ("-".join(sorted(("en", PLANTED[k]))) for k in ("noisy", "copy", "hub"))

for f in sorted(glob.glob(f"{sys.argv[1]}/out-*.json")):
    d = json.load(open(f))["stages"]["audit"]["output_dir"]
    s = json.load(open(d + "/adversary.json"))
    df = pl.read_parquet(d + "/audit.parquet")
    w = dict(zip(df["pair"], df["w_mean"]))
    wf = dict(zip(df["pair"], df["w_final"]))
    helped = {p: a - b for p, a, b in zip(s["pairs"], s["ema"]["paired"], s["ema"]["base"])
              if a is not None and b is not None}
    rank = {p: i + 1 for i, p in enumerate(df.sort("w_mean", descending=True)["pair"])}
    clean = [p for p in w if p not in (NOISY, COPY, HUB)]
    print(f"{f}: {NOISY} w_mean {w[NOISY]:.2f} w_final {wf[NOISY]:.2f} rank {rank[NOISY]} help {helped[NOISY]:.2f} | clean help mean "
          f"{sum(helped[p] for p in clean) / len(clean):.2f} | best clean w {max(w[p] for p in clean):.2f} | "
          f"copy/hub rank {rank[COPY]}/{rank[HUB]}")
