"""The stages in pipeline order: each entry is a stage flow made by
:func:`flows.kit.stage_flow` (its declaration is ``flow.stage``).  A new stage
is one line here, after the stages it reads."""

from __future__ import annotations

from flows.audit import audit
from flows.dedup import dedup
from flows.download import download
from flows.evaluate import evaluate
from flows.prepare import prepare
from flows.pretrain import pretrain
from flows.sampling import sampling
from flows.shards import shards
from flows.vocab import vocab
from xylent.stage import order_stages

STAGE_FLOWS = [download, prepare, dedup, vocab, sampling, shards, pretrain, audit, evaluate]
STAGES = order_stages(f.stage for f in STAGE_FLOWS)  # checks: unique names, upstream declared first
STAGE_NAMES = [s.name for s in STAGES]
