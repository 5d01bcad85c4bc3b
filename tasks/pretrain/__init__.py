"""pretrain stage: train.json and the warm start before the ranks, the exported and registered model after (run.py)."""
