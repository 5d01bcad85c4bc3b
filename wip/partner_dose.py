"""Print the noisy pair's w_mean, rank and paired help per dose (wip/partner_dose.sh's outputs)."""
import glob
import json
import sys

import polars as pl

for f in sorted(glob.glob(f"{sys.argv[1]}/out-*.json")):
    d = json.load(open(f))["stages"]["audit"]["output_dir"]
    s = json.load(open(d + "/adversary.json"))
    df = pl.read_parquet(d + "/audit.parquet")
    w = dict(zip(df["pair"], df["w_mean"]))
    helped = {p: a - b for p, a, b in zip(s["pairs"], s["ema"]["paired"], s["ema"]["base"])
              if a is not None and b is not None}
    rank = {p: i + 1 for i, p in enumerate(df.sort("w_mean", descending=True)["pair"])}
    clean = [p for p in w if p not in ("de-en", "ca-en", "en-tr")]
    print(f"{f}: de-en w_mean {w['de-en']:.2f} rank {rank['de-en']} help {helped['de-en']:.2f} | clean help mean "
          f"{sum(helped[p] for p in clean) / len(clean):.2f} | best clean w {max(w[p] for p in clean):.2f} | "
          f"copy/hub rank {rank['ca-en']}/{rank['en-tr']}")
