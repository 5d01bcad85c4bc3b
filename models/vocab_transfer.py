"""Vocabulary transfer (MetaXLM): which piece of an old vocabulary each piece of a
new one takes its embedding from.  Pure Python + NumPy: no torch.

Each new piece is matched by the first rule that applies.  With a dictionary,
MetaXLM's order (§3.2: "first searching the word translation in the
dictionaries, and then applying the mapping strategy") puts ``dictionary``
right after ``special`` (``dictionary_first``, the default); the order below is
``dictionary_first=False``:

``special``
    ``<unk> <s> </s> <pad> <mask>`` take the old model's special of the same role
    (whatever the pieces are called: ``[CLS]`` is a ``<s>``); a role the old model
    lacks stays random.
``exact``
    an old piece with the same string (SentencePiece's ``▁`` included).  Byte
    pieces (``<0x41>``) are matched only by this rule.
``normalised``
    an old piece with the same key ``normalise(piece)`` =
    NFKC(casefold(NFKC(piece))) with one leading ``▁`` removed, so ``▁Hello``,
    ``hello`` and ``ＨＥＬＬＯ`` share the key ``hello``.  Pieces whose key is empty
    (a bare ``▁``) are left to the other rules.  When several old pieces share the
    key, the one chosen is, in order: the one that agrees with the new piece on the
    leading ``▁`` (a word start stays a word start), the one with the higher score
    (SentencePiece unigram log-probability: the more frequent piece; vocabularies
    without scores tie here), the lowest id.
``dictionary``
    with a bilingual dictionary (lines ``new-word<TAB>old-word`` or whitespace
    separated ``new-word old-word`` as in MUSE), a new piece whose key is the key of
    a dictionary word takes the old piece of its translation: the translations
    are tried in file order, the first one whose key is the key of an old piece wins
    (chosen among several as above).
``random``
    nothing matched: the row keeps the new model's random initialisation.

Specials and byte pieces of the old vocabulary are never the target of
``normalised`` or ``dictionary``.  A WordPiece vocabulary (BERT) and a
byte-level BPE one (RoBERTa, the English model MetaXLM starts from) are read in
SentencePiece's convention (:func:`from_wordpiece`: ``##ing`` -> ``ing``,
``play`` -> ``▁play``; :func:`from_byte_level`: ``ĠHello`` -> ``▁Hello``) before
any rule, so "exact" means exact in that writing.

:func:`transfer_report` counts the rules overall and per language (a piece is in
every language whose text uses it; see ``tasks/pretrain/init_source.py``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xylent.errors import XylentError

RULES = ("special", "exact", "normalised", "dictionary", "random")
ROLES = ("unk", "bos", "eos", "pad", "mask")
MATCHED = RULES[:-1]
WORD_START = "\u2581"  # SentencePiece's "▁"
_BYTE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def normalise(piece: str) -> str:
    """The ``normalised`` rule's key: NFKC, case-folded, NFKC again (folding can
    leave text that is not NFKC), then one leading ``▁`` removed."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", piece).casefold()).removeprefix(WORD_START)


def is_byte(piece: str) -> bool:
    return bool(_BYTE.match(piece))


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's pieces in id order, their scores (None: the tokenizer has none,
    e.g. WordPiece) and the ids of its special roles (unk, bos, eos, pad, mask)."""

    pieces: list[str]
    specials: dict[str, int]
    scores: list[float] | None = None

    def __post_init__(self):
        bad = {r: i for r, i in self.specials.items() if r not in ROLES or not 0 <= i < len(self.pieces)}
        if bad:
            raise ValueError(f"special ids {bad} are not roles {ROLES} with ids in 0..{len(self.pieces) - 1}")
        if self.scores is not None and len(self.scores) != len(self.pieces):
            raise ValueError(f"{len(self.scores)} scores for {len(self.pieces)} pieces")

    def __len__(self) -> int:
        return len(self.pieces)


@dataclass
class Match:
    """``old_ids[i]``: the old id new piece ``i`` takes its embedding from (-1: random);
    ``rules[i]``: the index in :data:`RULES` of the rule that matched it;
    ``via[i]``: for ``dictionary`` matches, the dictionary word pair used."""

    old_ids: np.ndarray
    rules: np.ndarray
    via: dict[int, tuple[str, str]] = field(default_factory=dict)

    def rule(self, i: int) -> str:
        return RULES[int(self.rules[i])]

    def counts(self, ids: np.ndarray | None = None) -> dict[str, int]:
        rules = self.rules if ids is None else self.rules[ids]
        n = np.bincount(rules, minlength=len(RULES))
        return {r: int(n[k]) for k, r in enumerate(RULES)}


def _preference(new_piece: str, scores: list[float] | None):
    """Sort key among old candidates for ``new_piece`` (smaller is better), see the module docstring."""
    starts = new_piece.startswith(WORD_START)

    def key(pair: tuple[int, str]) -> tuple:
        old_id, old_piece = pair
        return (old_piece.startswith(WORD_START) != starts, -(scores[old_id] if scores else 0.0), old_id)

    return key


def match_vocabularies(new: Vocabulary, old: Vocabulary, dictionary: list[tuple[str, str]] | None = None,
                       dictionary_first: bool = True) -> Match:
    """Match every piece of ``new`` to one of ``old`` (or none); see the module docstring."""
    n = len(new)
    old_ids = np.full(n, -1, dtype=np.int64)
    rules = np.full(n, RULES.index("random"), dtype=np.int64)
    via: dict[int, tuple[str, str]] = {}

    old_special = set(old.specials.values())
    exact: dict[str, int] = {}
    by_key: dict[str, list[tuple[int, str]]] = {}
    for i, p in enumerate(old.pieces):
        if i in old_special:
            continue
        exact.setdefault(p, i)  # a converted WordPiece vocabulary may repeat a string: the lowest id keeps it
        if not is_byte(p):
            k = normalise(p)
            if k:
                by_key.setdefault(k, []).append((i, p))

    translations: dict[str, list[str]] = {}
    for src, tgt in dictionary or ():
        ks, kt = normalise(src), normalise(tgt)
        if ks and kt:
            translations.setdefault(ks, []).append(kt)

    def translated(i: int, p: str, k: str) -> bool:
        for t in translations.get(k, ()):
            if t in by_key:
                old_ids[i], rules[i] = min(by_key[t], key=_preference(p, old.scores))[0], RULES.index("dictionary")
                via[i] = (k, t)
                return True
        return False

    new_special = {i: role for role, i in new.specials.items()}
    for i, p in enumerate(new.pieces):
        if i in new_special:
            if new_special[i] in old.specials:
                old_ids[i], rules[i] = old.specials[new_special[i]], RULES.index("special")
            continue
        k = "" if is_byte(p) else normalise(p)
        if dictionary_first and k and translated(i, p, k):
            continue
        if p in exact:
            old_ids[i], rules[i] = exact[p], RULES.index("exact")
            continue
        if not k:
            continue
        if k in by_key:
            old_ids[i], rules[i] = min(by_key[k], key=_preference(p, old.scores))[0], RULES.index("normalised")
            continue
        if not dictionary_first:
            translated(i, p, k)
    return Match(old_ids, rules, via)


# -- reading vocabularies and dictionaries ------------------------------------------------


def from_sentencepiece(model_file: Path, specials: dict[str, int] | None = None) -> Vocabulary:
    """A SentencePiece model's pieces and scores; ``specials`` default to the model's
    own unk/bos/eos/pad ids and the ``<mask>`` piece."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    try:
        proto.ParseFromString(Path(model_file).read_bytes())
    except Exception as exc:  # protobuf raises DecodeError; a wrong file may raise others
        raise XylentError(f"not a SentencePiece model ({exc})", where=str(model_file),
                          fix="point at the spm.model of an xylent export or of the vocab stage") from None
    pieces = [p.piece for p in proto.pieces]
    if specials is None:
        ts, index = proto.trainer_spec, {p: i for i, p in enumerate(pieces)}
        specials = {role: i for role, i in (("unk", ts.unk_id), ("bos", ts.bos_id), ("eos", ts.eos_id),
                                            ("pad", ts.pad_id), ("mask", index.get("<mask>", -1))) if i >= 0}
    return Vocabulary(pieces, dict(specials), [p.score for p in proto.pieces])


def from_wordpiece(tokens: list[str], prefix: str = "##") -> list[str]:
    """WordPiece tokens in SentencePiece's writing: a continuation ``##ing`` is ``ing``,
    a word-initial ``play`` is ``▁play``; bracketed specials (``[CLS]``) stay as they are."""
    out = []
    for t in tokens:
        if t.startswith(prefix) and len(t) > len(prefix):
            out.append(t[len(prefix):])
        elif t.startswith("[") and t.endswith("]"):
            out.append(t)
        else:
            out.append(WORD_START + t)
    return out


_HF_ROLES = {"unk": ("unk_token",), "bos": ("bos_token", "cls_token"), "eos": ("eos_token", "sep_token"),
             "pad": ("pad_token",), "mask": ("mask_token",)}


def from_byte_level(pieces: list[str]) -> list[str]:
    """GPT-2/RoBERTa byte-level BPE pieces in SentencePiece's writing.  Each character of
    such a piece stands for one byte (``Ġ`` for a space); the tokenizers library's
    ByteLevel decoder turns the bytes back into text, and a leading space becomes ``▁``:
    ``ĠHello`` -> ``▁Hello``, ``Ã©`` -> ``é``.  A piece that ends inside a multi-byte
    character decodes to U+FFFD and becomes ``""``, which no rule matches."""
    from tokenizers import decoders

    decoder = decoders.ByteLevel()
    out = []
    for p in pieces:
        text = decoder.decode([p]) if p else ""
        if "\ufffd" in text and "\ufffd" not in p:
            text = ""  # half a character: not text
        out.append(WORD_START + text[1:] if text.startswith(" ") else text)
    return out


def from_hf_tokenizer(path: Path, config: dict | None = None) -> Vocabulary:
    """The vocabulary of a Hugging Face model dir: ``tokenizer.json`` (Unigram, BPE or
    WordPiece) or a BERT ``vocab.txt``; special roles from the model's config.json
    (``*_token_id``), else the tokenizer's special-token names."""
    path, config = Path(path), config or {}
    scores = None
    tj = path / "tokenizer.json"
    if tj.is_file():
        try:
            data = json.loads(tj.read_text(encoding="utf-8"))
            model = data["model"]
            kind = model.get("type")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise XylentError(f"tokenizer.json is not a tokenizers file ({exc})", where=str(tj),
                              fix="save the tokenizer with save_pretrained") from None
        if kind == "Unigram":
            pieces, scores = [p for p, _ in model["vocab"]], [float(s) for _, s in model["vocab"]]
        elif kind in ("BPE", "WordPiece"):
            vocab = model["vocab"]
            size = max(vocab.values()) + 1 if vocab else 0
            pieces = [""] * size
            for p, i in vocab.items():
                pieces[i] = p
            if kind == "WordPiece":
                pieces = from_wordpiece(pieces, model.get("continuing_subword_prefix") or "##")
            elif "ByteLevel" in json.dumps(data.get("pre_tokenizer")):
                pieces = from_byte_level(pieces)  # RoBERTa, MetaXLM's own phase-1 model
        else:
            raise XylentError(f"tokenizer.json has a {kind!r} model; Unigram, BPE and WordPiece are supported",
                              where=str(tj), fix="start from a SentencePiece/BPE/WordPiece model")
        for tok in data.get("added_tokens") or []:  # XLM-R's <mask> lives only here
            i = tok["id"]
            if i >= len(pieces):
                pieces += [""] * (i + 1 - len(pieces))
                if scores is not None:
                    scores += [0.0] * (i + 1 - len(scores))
            pieces[i] = tok["content"]
    elif (path / "vocab.txt").is_file():
        pieces = from_wordpiece((path / "vocab.txt").read_text(encoding="utf-8").splitlines())
    else:
        raise XylentError("the Hugging Face dir has no tokenizer.json or vocab.txt: its vocabulary is unknown",
                          where=str(path), fix="save the tokenizer next to the model (tokenizer.save_pretrained)")
    index = {}
    for i, p in enumerate(pieces):
        index.setdefault(p, i)
    names = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):
        f = path / fname
        if f.is_file():
            try:
                for k, v in json.loads(f.read_text(encoding="utf-8")).items():
                    if k.endswith("_token") and k not in names:
                        names[k] = v.get("content") if isinstance(v, dict) else v
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue  # an unreadable side file: the config's ids still say most roles
    specials = {}
    for role, keys in _HF_ROLES.items():
        i = config.get(f"{role}_token_id")
        if not isinstance(i, int) or not 0 <= i < len(pieces):
            i = next((index[names[k]] for k in keys if isinstance(names.get(k), str) and names[k] in index), None)
        if i is not None:
            specials[role] = i
    return Vocabulary(pieces, specials, scores)


def read_dictionary(path: Path) -> list[tuple[str, str]]:
    """(new-vocabulary word, old-vocabulary word) pairs: one per line, ``src<TAB>tgt``
    or two whitespace-separated words (MUSE); blank lines are skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise XylentError("the bilingual dictionary does not exist", where=str(path),
                          fix="point pretrain.init.dictionary at a file of 'word<TAB>translation' lines "
                              "(relative paths are resolved from the spec file's folder)") from None
    except UnicodeDecodeError as exc:
        raise XylentError(f"the bilingual dictionary is not UTF-8 ({exc.reason} at byte {exc.start})",
                          where=str(path), fix="save it as UTF-8") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rstrip("\r\n").split("\t") if "\t" in line else line.split()
        parts = [p.strip() for p in parts]
        if len(parts) != 2 or not all(parts):
            raise XylentError(f"line {n} of the bilingual dictionary is not two fields: {line[:80]!r}",
                              where=f"{path}:{n}", fix="write one 'new-word<TAB>old-word' (or 'new old') per line")
        out.append((parts[0], parts[1]))
    if not out:
        raise XylentError("the bilingual dictionary is empty", where=str(path),
                          fix="write one 'new-word<TAB>old-word' per line, or drop pretrain.init.dictionary")
    return out


# -- the report -----------------------------------------------------------------------------


def _fraction(counts: dict[str, int]) -> float:
    total = sum(counts.values())
    return round(sum(counts[r] for r in MATCHED) / total, 6) if total else 0.0


def transfer_report(match: Match, new: Vocabulary, old: Vocabulary,
                    usage: dict[str, np.ndarray] | None = None, examples: int = 8) -> dict:
    """Counts by rule, overall and per language, and the matched fractions.

    ``usage``: language -> how often each new id occurs in that language's text
    (length ``len(new)``).  A language's pieces are the non-special ids it uses
    (a piece used by several languages counts in each); ``tokens_matched`` is the
    share of its (non-special) tokens whose piece was matched."""
    counts = match.counts()
    out = {"new_vocab_size": len(new), "old_vocab_size": len(old), "counts": counts,
           "matched": sum(counts[r] for r in MATCHED), "matched_fraction": _fraction(counts),
           "examples": {}}
    for k, rule in enumerate(RULES):  # a few of each rule (byte pieces left out: 256 dull exact matches)
        ids = [i for i in np.flatnonzero(match.rules == k).tolist() if not is_byte(new.pieces[i])][:examples]
        out["examples"][rule] = [[new.pieces[i], old.pieces[match.old_ids[i]] if match.old_ids[i] >= 0 else None]
                                 + (list(match.via[i]) if i in match.via else []) for i in ids]
    if usage is not None:
        special = np.zeros(len(new), dtype=bool)
        special[list(new.specials.values())] = True
        matched = match.old_ids >= 0
        per = {}
        for lang in sorted(usage):
            u = np.asarray(usage[lang])
            if u.shape != (len(new),):
                raise ValueError(f"usage of {lang!r} has shape {u.shape}, not ({len(new)},)")
            used = (u > 0) & ~special
            c = match.counts(np.flatnonzero(used))
            tokens = float(u[~special].sum())
            per[lang] = {"pieces": int(used.sum()), "counts": c, "matched_fraction": _fraction(c),
                         "tokens": int(tokens),
                         "tokens_matched": round(float(u[used & matched].sum()) / tokens, 6) if tokens else 0.0}
        out["languages"] = per
    return out
