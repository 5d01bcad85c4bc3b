"""audit stage: the χ² DRO bitext audit (XY-LENT §6.6): its evidence, report and output contract.

The adversary that trains with the model and its χ² best response run inside the ranks:
:mod:`xylent.models.training.audit.adversary` and :mod:`xylent.models.training.audit.dro`.
"""

# the names docs and benchmarks use
from xylent.models.training.audit.dro import chi2_best_response, chi2_divergence  # noqa: E402,F401
