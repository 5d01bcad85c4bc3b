"""audit stage: the χ² DRO bitext audit (XY-LENT §6.6) — best response and divergence."""

from tasks.audit.dro import chi2_best_response, chi2_divergence  # noqa: F401

__all__ = ["chi2_best_response", "chi2_divergence"]
