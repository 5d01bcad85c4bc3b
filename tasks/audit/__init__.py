"""audit stage: the χ² DRO bitext audit (XY-LENT §6.6): its evidence, report and output contract.

The adversary that trains with the model and its χ² best response run inside the ranks:
:mod:`models.audit.adversary` and :mod:`models.audit.dro`.
"""

from models.audit.dro import chi2_best_response, chi2_divergence  # noqa: E402,F401  (the names docs and benchmarks use)
