"""The special pieces of every tokenizer the vocab stage writes, in id order.

This is where the layout is decided; everyone else reads the ids from the
tokenizer (:func:`special_ids`), from ``index.json`` (shards) or from the
model's config (``EncoderConfig.specials``), never from a constant.
"""

from __future__ import annotations

from xylent.errors import XylentError

SPECIAL_PIECES = ("<unk>", "<s>", "</s>", "<pad>", "<mask>")
UNK, BOS, EOS, PAD, MASK = range(len(SPECIAL_PIECES))
# SentencePiece reserves <unk>, <s>, </s> itself; the rest are control symbols
CONTROL_SYMBOLS = list(SPECIAL_PIECES[3:])
TRAINER_IDS = {"unk_id": UNK, "bos_id": BOS, "eos_id": EOS}


def special_ids(sp, where: str = "the tokenizer") -> dict[str, int]:
    """The special ids of a loaded ``SentencePieceProcessor``: unk, bos, eos, pad, mask."""
    ids = {"unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id(), "pad": sp.pad_id(),
           "mask": sp.piece_to_id("<mask>")}
    if ids["mask"] == ids["unk"] or min(ids.values()) < 0:
        raise XylentError(f"the tokenizer lacks a special piece (ids {ids}); it must have "
                          f"{', '.join(SPECIAL_PIECES)}", where=where,
                          fix="rebuild it with the vocab stage: xylent run vocab --force")
    return ids
