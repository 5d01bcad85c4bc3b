"""finetune stage: task heads and their data plumbing (extractive QA: :mod:`xylent.tasks.evaluate.finetune.qa`)."""
