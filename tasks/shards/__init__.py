"""shards stage.

    run.py     what the flow calls: :func:`work_items`, :func:`tokenize_items`,
               :func:`pack_part`, :func:`assemble`
    build.py   packing text into shards: :func:`pack_language`, :func:`encode_pairs`, :func:`truncate_pair`, ...

The output contract (the shard index, how shards are opened) is xylent/data/shards.py and the
loader the trainer draws batches from xylent/data/loader.py: the training ranks read them
without this stage's code.  Names are re-exported on first use (no polars on import).
"""

from __future__ import annotations

from xylent.reexport import on_first_use

_HOME = {**{name: "xylent.tasks.shards.run" for name in ("assemble", "pack_part", "tokenize_items", "work_items")},
         **{name: "xylent.tasks.shards.build" for name in ("encode_pairs", "pack_language", "pack_tokens", "tokenize_part",
                                                     "truncate_pair")}}
__getattr__, __all__ = on_first_use(__name__, _HOME)
