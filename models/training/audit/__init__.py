"""The audit's training side (XY-LENT §6.6's DRO audit), what runs inside the training ranks:

    step.py       the one object the trainer calls at each step (:func:`make_audit`; a no-op in a
                  plain pretrain run), the per-pair losses and the excess baselines' passes
    adversary.py  :class:`PairAdversary`, the χ² adversary over language pairs every rank keeps
    dro.py        the χ² best response and divergence (pure NumPy)

The stage's side (its configuration, the ranking and the evidence it writes) is tasks/audit/.
"""
