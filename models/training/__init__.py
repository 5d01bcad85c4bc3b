"""Training: what runs inside a DeepSpeed rank -- the trainer (``trainer``, started by the launcher), the
run's settings (``run_config``), the optimizer (``optim``), the per-step inputs and metrics, and the
audit's DRO side of a step (``audit``).  The model code it trains lives one level up, in
``xylent.models``."""
