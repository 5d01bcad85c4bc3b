"""shards stage and the training data loader.

    run.py     what the flow calls: :func:`work_items`, :func:`tokenize_items`,
               :func:`pack_part`, :func:`assemble`
    build.py   packing text into shards: :func:`pack_language`, :func:`encode_pairs`, :func:`truncate_pair`, ...
    loader.py  :class:`TrainingLoader`, the batches the trainer draws
    contract.py  the output contract: the shard index and how shards are opened

Names are re-exported on first use: the training ranks import the loader without the
shard builder's polars.
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {"TrainingLoader": "tasks.shards.loader",
         **{name: "tasks.shards.run" for name in ("assemble", "pack_part", "tokenize_items", "work_items")},
         **{name: "tasks.shards.build" for name in ("encode_pairs", "pack_language", "pack_tokens", "tokenize_part",
                                                     "truncate_pair")}}
__getattr__, __all__ = on_first_use(__name__, _HOME)
