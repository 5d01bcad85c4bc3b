"""shards stage and the training data loader.

Public API: :class:`TrainingLoader` (batches for the trainer), :func:`pack_language`,
:func:`encode_pairs`, :func:`truncate_pair`.
"""

from tasks.shards.build import encode_pairs, pack_language, pack_tokens, tokenize_part, truncate_pair
from tasks.shards.loader import TrainingLoader

__all__ = ["TrainingLoader", "encode_pairs", "pack_language", "pack_tokens", "tokenize_part", "truncate_pair"]
