"""evaluate stage: score encoders on XTREME / XTREME-R."""

from xylent.tasks.evaluate.scoring import score_submission

__all__ = ["score_submission"]
