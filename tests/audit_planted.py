"""A bitext corpus with planted defects, from real text (Django's catalogs), for the audit.

Every pair is English ⇄ xx from the catalogs (about 1 000 real translations each); three
are spoiled on purpose:

- ``noisy``: the xx side is shuffled, so no row is a translation of its English
  (XY-LENT §6.6: noisy pairs are pushed up); ``shuffled`` < 1 spoils only that share of it;
- ``copy``: the xx side is the English sentence itself (TRTD becomes trivial: §6.6's
  near duplicates, ca-es and cs-sk, are pushed down);
- ``hub``: every block of ``HUB_SOURCES`` English sentences is aligned to the
  translation of the first one (many sources to a few targets: §6.6's en-xh, pushed
  down as trivial).

    python -m tests.audit_planted OUT_DIR      # writes the tsv files and OUT_DIR/spec.yaml
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import yaml

CLEAN = ["fr", "es", "pt", "it", "nl", "pl"]
PLANTED = {"noisy": "de", "copy": "ca", "hub": "tr"}
HUB_SOURCES = 8  # as en-xh in the paper: many English sentences aligned to one target


def planted_pairs(seed: int = 0, max_pairs: int | None = None, shuffled: float = 1.0
                  ) -> tuple[dict[str, list[tuple[str, str]]], dict[str, list[str]]]:
    """(pair name ``en-xx`` -> rows (en, xx) with the defects planted, language -> its real
    sentences: the vocabulary's monolingual text).  ``shuffled``: the share of the noisy pair's
    rows whose xx side is shuffled (among themselves); the rest stay translations."""
    from xylent.tasks.evaluate.data import package_pairs

    langs = CLEAN + list(PLANTED.values())
    real = package_pairs("django", langs, max_pairs=max_pairs)
    mono = {lang: real[lang][0] for lang in langs}
    mono["en"] = sorted({en for lang in langs for en in real[lang][1]})
    rng = random.Random(seed)
    out = {}
    for lang in langs:
        xx, en = real[lang]
        if lang == PLANTED["noisy"]:
            xx, spoiled = xx[:], rng.sample(range(len(xx)), round(shuffled * len(xx)))
            moved = [xx[i] for i in spoiled]
            rng.shuffle(moved)
            for i, x in zip(spoiled, moved):
                xx[i] = x
        elif lang == PLANTED["copy"]:
            xx = en[:]
        elif lang == PLANTED["hub"]:  # blocks of HUB_SOURCES English sentences share one target
            xx = [xx[i - i % HUB_SOURCES] for i in range(len(en))]
        out[f"en-{lang}"] = list(zip(en, xx))
    return out, mono


def write_corpus(out: Path, *, seed: int = 0, steps: int = 3000, max_pairs: int | None = None,
                 shuffled: float = 1.0) -> Path:
    """The tsv files and a spec that trains the audit on them; returns the spec's path."""
    out.mkdir(parents=True, exist_ok=True)
    sources = []
    pairs, mono = planted_pairs(seed, max_pairs, shuffled)
    for pair, rows in pairs.items():
        path = out / f"{pair}.tsv"
        path.write_text("".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
        sources.append({"name": pair, "kind": "local", "path": str(path), "format": "tsv", "pair": pair})
    for lang, lines in mono.items():
        path = out / f"{lang}.txt"
        path.write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
        sources.append({"name": f"mono-{lang}", "kind": "local", "path": str(path), "format": "text", "lang": lang})
    langs = ["en", *CLEAN, *PLANTED.values()]
    spec = {
        "name": "audit-planted", "seed": seed, "languages": langs, "sources": sources,
        "runner": {"kind": "threads", "max_workers": 2},
        "tracking": {"experiment": "xylent-audit-planted"},
        "prepare": {"min_chars": 1},
        # the planted copies and hubs must reach training: dedup's copy, hub and lang-id rules are off
        "dedup": {"exact_level": "line", "near_level": "line", "buckets": 2, "copies": False, "hubs": False},
        "vocab": {"grid": [400, 800], "budget": 4000, "held_sentences": 100, "held_fraction": 0.15},
        "sampling": {"pair_method": "smoothed", "pair_alpha": 0.3},
        "shards": {"seq_len": 128, "shard_mb": 64},
        "model": {"size": "tiny"},
        "pretrain": {"tasks": ["trtd"], "steps": steps, "batch_size": 16, "trtd_max_tokens": 4096, "lr": 0.002,
                     "warmup_steps": 50, "zero_stage": 0, "checkpoint_every": steps, "ranks": 1, "log_every": 50},
        "audit": {"resamples": 5, "top_n": 3},
    }
    path = out / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write_corpus(Path(sys.argv[1]), steps=int(sys.argv[2]) if len(sys.argv) > 2 else 3000))
