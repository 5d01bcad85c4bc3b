"""audit stage: the χ² DRO bitext audit (XY-LENT §6.6): its evidence, report and output contract.

The adversary that trains with the model and its χ² best response run inside the ranks:
:mod:`xylent.models.audit.adversary` and :mod:`xylent.models.audit.dro`.
"""

from xylent.models.audit.dro import chi2_best_response, chi2_divergence  # noqa: E402,F401  (the names docs and benchmarks use)
