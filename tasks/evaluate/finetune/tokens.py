"""One tokenizer interface over xylent's SentencePiece model and Hugging Face's
fast tokenizers, with what span and token heads need: character offsets into
the original text, and the model's own way of joining two segments.

xylent joins a pair as pretraining's TRTD rows do (``<s> a </s> b </s>``,
xylent.data.loader); a Hugging Face model as its tokenizer says
(``build_inputs_with_special_tokens``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from itertools import accumulate


class TextTokenizer(ABC):
    pad_id: int
    unk_id: int
    max_positions: int | None = None  # the model's input limit, set by whoever pairs it with a model

    @abstractmethod
    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids without specials, and each one's [start, end) character span in ``text``."""

    @abstractmethod
    def build(self, a: list[int], b: list[int] | None = None) -> tuple[list[int], list[int]]:
        """-> (input ids with the specials, segment per position: -1 special, 0 from a, 1 from b)."""

    def ids(self, text: str) -> list[int]:
        return self.encode(text)[0]

    def word_ids(self, words: list[str]) -> list[list[int]]:
        """Each word's pieces as the model sees a word after a space (never empty:
        a word the vocabulary cannot spell is one unknown piece)."""
        return [self.ids(w) or [self.unk_id] for w in words]


class SentencePieceTokenizer(TextTokenizer):
    def __init__(self, sp, specials: dict[str, int]):
        self.sp = sp
        self.bos_id, self.eos_id = specials["bos"], specials["eos"]
        self.pad_id, self.unk_id = specials["pad"], specials["unk"]

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        proto = self.sp.encode(text, return_type="proto")
        # SentencePiece reports byte offsets into the original text; the heads need characters
        char_at = [0] * (len(text.encode("utf-8")) + 1)
        pos = 0
        for i, n in enumerate(accumulate(len(c.encode("utf-8")) for c in text)):
            for b in range(pos, n):
                char_at[b] = i
            pos = n
            char_at[n] = i + 1
        ids, spans = [], []
        for p in proto.pieces:
            ids.append(p.id)
            spans.append((char_at[p.begin], char_at[p.end]))
        return ids, spans

    def build(self, a, b=None):
        ids = [self.bos_id, *a, self.eos_id]
        seg = [-1, *[0] * len(a), -1]
        if b is not None:
            ids += [*b, self.eos_id]
            seg += [*[1] * len(b), -1]
        return ids, seg


class HuggingFaceTokenizer(TextTokenizer):
    def __init__(self, tokenizer):
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("span and token heads need a fast tokenizer (character offsets)")
        self.tok = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.unk_id = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else self.pad_id
        self.templates = {False: self._template(False), True: self._template(True)}

    def _template(self, pair: bool) -> list:
        """The specials the tokenizer's post-processor puts around one or two
        segments: special ids, and ("seq", k) where segment k goes.  Read from a real
        call because ``build_inputs_with_special_tokens`` adds nothing for a
        generic fast tokenizer (an exported xylent one, many others)."""
        enc = self.tok("a", "b") if pair else self.tok("a")
        out: list = []
        for tid, sid in zip(enc["input_ids"], enc.sequence_ids()):
            if sid is None:
                out.append(tid)
            elif not out or out[-1] != ("seq", sid):
                out.append(("seq", sid))
        return out

    def encode(self, text):
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def build(self, a, b=None):
        ids, seg = [], []
        for item in self.templates[b is not None]:
            if isinstance(item, tuple):
                part = a if item[1] == 0 else b
                ids += part
                seg += [item[1]] * len(part)
            else:
                ids.append(item)
                seg.append(-1)
        return ids, seg
