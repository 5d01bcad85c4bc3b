"""finetune stage: task heads and their data plumbing (extractive QA: :mod:`tasks.evaluate.finetune.qa`)."""
