"""pretrain.init (MetaXLM): vocabulary matching on hand-made vocabularies, init weights
built from real tiny exports (xylent, export-hf, a Hugging Face BERT), the errors a
user can cause, the spec field and the stage's fingerprint."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

from conftest import linked_data
from xylent.models.config import preset
from xylent.models.init_from import build_init_state, check_body, inspect_source, load_source
from xylent.models.objectives import build_model
from xylent.models.pretrained import export
from xylent.models.vocab_transfer import (
    RULES,
    Vocabulary,
    from_hf_tokenizer,
    from_sentencepiece,
    from_wordpiece,
    match_vocabularies,
    normalise,
    read_dictionary,
    transfer_report,
)
from xylent.tasks.vocab.specials import CONTROL_SYMBOLS, PAD, TRAINER_IDS, special_ids
from xylent.errors import XylentError

pytestmark = pytest.mark.demo_data  # reads the session demo only (pyproject.toml's markers)

ROOT = Path(__file__).resolve().parents[1]

# -- matching on hand-made vocabularies ------------------------------------------------------------

OLD = Vocabulary(
    pieces=["<unk>", "<s>", "</s>", "<pad>", "<mask>",   # 0-4
            "▁house", "house", "▁the", "ing", "▁Cat",     # 5-9
            "▁cat", "<0x41>", "ｆｉｌｅ", "▁dog", "▁Dog"],   # 10-14
    specials={"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4},
    scores=[0, 0, 0, 0, 0, -6.0, -2.0, -1.0, -3.0, -5.0, -3.0, 0, -4.0, -4.0, -4.0])
NEW = Vocabulary(
    pieces=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",  # 0-4 specials, other names and order: matched by role
            "▁the", "ing", "<0x41>", "<0x42>",            # 5-8: exact x3, a byte the old lacks
            "▁The", "CAT", "▁House", "House", "▁file",    # 9-13: normalised
            "▁Hund", "▁Katze",                            # 14-15: dictionary
            "▁zzz", "▁", "<0x42>x"],                      # 16-18: random (no match, empty key, no match)
    specials={"pad": 0, "unk": 1, "bos": 2, "eos": 3, "mask": 4})
DICTIONARY = "Hund\tdog\n\nKatze kitty\nKatze\tcat\nhaus house\n"


def test_normalised_key():
    assert normalise("▁Hello") == normalise("hello") == normalise("ＨＥＬＬＯ") == "hello"
    assert normalise("▁▁x") == "▁x"  # only one leading ▁ goes
    assert normalise("Straße") == normalise("STRASSE") == "strasse"  # case folding, not lowercasing
    assert normalise("ﬁ") == "fi" and normalise("▁") == ""


def test_every_rule_ties_specials_and_dictionary(tmp_path):
    (tmp_path / "dict.txt").write_text(DICTIONARY, encoding="utf-8")
    m = match_vocabularies(NEW, OLD, read_dictionary(tmp_path / "dict.txt"))
    want = {0: (3, "special"), 1: (0, "special"), 2: (1, "special"), 3: (2, "special"), 4: (4, "special"),
            5: (7, "exact"), 6: (8, "exact"), 7: (11, "exact"), 8: (-1, "random"),
            9: (7, "normalised"),
            10: (10, "normalised"),   # tie ▁Cat / ▁cat (both word starts): the higher score wins
            11: (5, "normalised"),    # ▁House: the word start ▁house beats house's higher score
            12: (6, "normalised"),    # House: the word-internal house
            13: (12, "normalised"),   # NFKC: ｆｉｌｅ = file
            14: (13, "dictionary"),   # Hund -> dog: ▁dog and ▁Dog tie on score, the lower id wins
            15: (10, "dictionary"),   # Katze: kitty has no piece, the next translation (cat) has two
            16: (-1, "random"), 17: (-1, "random"), 18: (-1, "random")}
    got = {i: (int(m.old_ids[i]), m.rule(i)) for i in range(len(NEW))}
    assert got == want
    assert m.via == {14: ("hund", "dog"), 15: ("katze", "cat")}
    assert m.counts() == {"special": 5, "exact": 3, "normalised": 5, "dictionary": 2, "random": 4}

    # without the dictionary those two are random; the rest does not move
    plain = match_vocabularies(NEW, OLD)
    assert plain.counts() == {"special": 5, "exact": 3, "normalised": 5, "dictionary": 0, "random": 6}
    # an old model without <mask>: the new <mask> stays random
    no_mask = Vocabulary(OLD.pieces, {k: v for k, v in OLD.specials.items() if k != "mask"}, OLD.scores)
    assert match_vocabularies(NEW, no_mask).rule(4) == "random"


def test_report_counts_per_language():
    m = match_vocabularies(NEW, OLD)
    usage = {"de": np.zeros(len(NEW), int), "en": np.zeros(len(NEW), int)}
    usage["de"][[2, 3]] = 50           # specials: in every sequence, never counted
    usage["de"][[5, 14, 15, 16]] = [10, 5, 3, 2]
    usage["en"][[5, 6, 10, 16]] = [10, 4, 4, 2]
    rep = transfer_report(m, NEW, OLD, usage)
    assert rep["counts"] == m.counts() and rep["matched"] == 13 and rep["matched_fraction"] == round(13 / 19, 6)
    de, en = rep["languages"]["de"], rep["languages"]["en"]
    assert de["pieces"] == 4 and de["counts"] == {"special": 0, "exact": 1, "normalised": 0, "dictionary": 0,
                                                   "random": 3}
    assert en["pieces"] == 4 and en["counts"]["exact"] == 2 and en["counts"]["normalised"] == 1
    assert de["matched_fraction"] == 0.25 and de["tokens_matched"] == 0.5 and en["tokens_matched"] == 0.9
    assert rep["examples"]["normalised"][0] == ["▁The", "▁the"]
    json.dumps(rep)  # the report is plain JSON


def test_dictionary_file_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("eins one\nzwei\n", encoding="utf-8")
    with pytest.raises(XylentError, match="line 2") as err:
        read_dictionary(bad)
    assert f"{bad}:2" in str(err.value)
    with pytest.raises(XylentError, match="does not exist"):
        read_dictionary(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(XylentError, match="empty"):
        read_dictionary(tmp_path / "empty.txt")


def test_wordpiece_and_hf_tokenizer_vocabularies(tmp_path):
    assert from_wordpiece(["[CLS]", "play", "##ing", "#", "##"]) == ["[CLS]", "▁play", "ing", "▁#", "▁##"]
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##ing"]))
    (tmp_path / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
         "mask_token": {"content": "[MASK]"}}))
    v = from_hf_tokenizer(tmp_path, {"pad_token_id": 0})
    assert v.pieces[5:] == ["▁the", "ing"] and v.scores is None
    assert v.specials == {"unk": 1, "bos": 2, "eos": 3, "pad": 0, "mask": 4}
    m = match_vocabularies(Vocabulary(["<unk>", "<s>", "</s>", "<pad>", "<mask>", "▁The", "ing"],
                                      {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4}), v)
    assert m.old_ids.tolist() == [1, 2, 3, 0, 4, 5, 6] and m.rule(5) == "normalised" and m.rule(6) == "exact"


def test_the_dictionary_comes_first_as_metaxlm_orders_it(tmp_path):
    """MetaXLM §3.2: "first searching the word translation in the dictionaries, and then applying the
    mapping strategy": German "Gift" (poison) takes English "poison", not the English "gift"."""
    old = Vocabulary(["<unk>", "<s>", "</s>", "<pad>", "<mask>", "▁gift", "▁poison", "▁rat"],
                     {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4})
    new = Vocabulary(["<unk>", "<s>", "</s>", "<pad>", "<mask>", "▁gift", "▁Gift", "▁Rat", "<0x41>"],
                     {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4})
    words = [("Gift", "poison"), ("Rat", "council")]  # "council" has no piece: the text rules still apply
    first = match_vocabularies(new, old, words)
    assert [(int(first.old_ids[i]), first.rule(i)) for i in (5, 6, 7)] == [(6, "dictionary"), (6, "dictionary"),
                                                                            (7, "normalised")]
    assert first.via == {5: ("gift", "poison"), 6: ("gift", "poison")} and first.rule(8) == "random"
    last = match_vocabularies(new, old, words, dictionary_first=False)
    assert [(int(last.old_ids[i]), last.rule(i)) for i in (5, 6, 7)] == [(5, "exact"), (5, "normalised"),
                                                                         (7, "normalised")]


def test_a_roberta_byte_level_vocabulary_is_read_as_text(tmp_path):
    """MetaXLM's own first phase is English RoBERTa: its byte-level pieces decode to text."""
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "ĠHello": 4, "Ã©": 5, "Ã": 6, "world": 7, "<mask>": 8}
    (tmp_path / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "added_tokens": [{"id": 8, "content": "<mask>"}]}), encoding="utf-8")
    v = from_hf_tokenizer(tmp_path, {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "unk_token_id": 3,
                                     "mask_token_id": 8})
    assert v.pieces == ["<s>", "<pad>", "</s>", "<unk>", "▁Hello", "é", "", "world", "<mask>"]
    new = Vocabulary(["<unk>", "<s>", "</s>", "<pad>", "<mask>", "▁hello", "é", "▁world"],
                     {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4})
    m = match_vocabularies(new, v)
    assert [(int(m.old_ids[i]), m.rule(i)) for i in (5, 6, 7)] == [(4, "normalised"), (5, "exact"), (7, "normalised")]


# -- weights from real tiny exports ------------------------------------------------------------------

WORDS = {"en": "the house of the cat is where the dog sleeps and the children are playing outside".split(),
         "de": "das Haus der Katze ist wo der Hund schläft und die Kinder spielen draußen".split(),
         "fr": "la maison du chat est où le chien dort et les enfants jouent dehors".split(),
         "ru": "дом кошки где спит собака и дети играют на улице".split()}


def _train_spm(d: Path, langs: list[str], size: int, seed: int) -> Path:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS[lang]).capitalize() if rng.random() < 0.2 else rng.choice(WORDS[lang])
                      for _ in range(rng.randint(4, 10))) for lang in langs for _ in range(300)]
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(d / "train.txt"), model_prefix=str(d / "spm"), vocab_size=size, model_type="unigram",
        character_coverage=1.0, byte_fallback=True, hard_vocab_limit=False, minloglevel=2,
        control_symbols=CONTROL_SYMBOLS[1:], pad_id=PAD, **TRAINER_IDS)
    return d


def _tok(d: Path):
    return spm.SentencePieceProcessor(model_file=str(d / "spm.model"))


def _export(root: Path, tok_dir: Path, objective: str, max_position: int = 64, **over) -> Path:
    """A real export of an untrained model whose every weight is moved off its init."""
    sp = _tok(tok_dir)
    cfg = preset("tiny", vocab_size=sp.get_piece_size(), max_position=max_position, specials=special_ids(sp), **over)
    torch.manual_seed(123)
    model = build_model(objective, cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    full = {k: v.clone() for k, v in model.state_dict().items()}
    export(root / "model", full, model.encoder_state_dict(), cfg, tok_dir, {"objective": objective})
    return root / "model"


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocabs")
    return {"old": _train_spm(root / "old", ["en", "de"], 340, 1), "new": _train_spm(root / "new", list(WORDS), 420, 2)}


@pytest.fixture(scope="module")
def mlm_export(tmp_path_factory, vocabs) -> Path:
    return _export(tmp_path_factory.mktemp("mlm"), vocabs["old"], "mlm")


def _new_model(vocabs, objective: str, seed: int = 7, max_position: int = 128, **over):
    sp = _tok(vocabs["new"])
    cfg = preset("tiny", vocab_size=sp.get_piece_size(), max_position=max_position, specials=special_ids(sp), **over)
    torch.manual_seed(seed)
    return build_model(objective, cfg), cfg


def _init(vocabs, source_dir: Path, objective: str, generator: str = "random", heads: bool = True, **over):
    model, cfg = _new_model(vocabs, objective, **over)
    info = inspect_source(source_dir)
    notes = check_body(info, cfg.to_dict())
    source = load_source(info)
    new_vocab = from_sentencepiece(vocabs["new"] / "spm.model", cfg.specials)
    match = match_vocabularies(new_vocab, source.vocab)
    state, copied = build_init_state(model, source, match.old_ids, generator, heads)
    fresh, _ = _new_model(vocabs, objective, **over)  # the same seed: the run's random init
    return state, copied, match, source, fresh.state_dict(), notes


def test_init_weights_from_an_xylent_export(vocabs, mlm_export):
    state, copied, match, source, fresh, notes = _init(vocabs, mlm_export, "electra")
    assert not notes and copied["generator"] == "random"
    counts = match.counts()
    assert counts["special"] == 5 and counts["exact"] > 50 and counts["random"] > 20, counts
    # body: every discriminator weight is the source's
    body = [k for k in source.encoder if k.startswith("discriminator.")]
    assert copied["body"] == len(body) and body
    for k in body:
        assert torch.equal(state[k], source.encoder[k]), k
    # token rows: matched ones are the source's rows, the rest the fresh random init
    tok, src_tok = state["embeddings.tokens.weight"], source.encoder["embeddings.tokens.weight"]
    for i, j in enumerate(match.old_ids.tolist()):
        assert torch.equal(tok[i], src_tok[j] if j >= 0 else fresh["embeddings.tokens.weight"][i]), i
    # positions: the source's 64 rows, then the new model's own
    pos = state["embeddings.positions.weight"]
    assert copied["positions"] == 64 and torch.equal(pos[:64], source.encoder["embeddings.positions.weight"])
    assert torch.equal(pos[64:], fresh["embeddings.positions.weight"][64:])
    # generator random (the default), heads: an MLM source has no RTD head -> random
    for k in state:
        if k.startswith(("generator", "discriminator_head")):
            assert torch.equal(state[k], fresh[k]), k
    model, _ = _new_model(vocabs, "electra")
    model.load_state_dict(state, strict=True)  # what the trainer does with init_from

    # generator: body -> the first generator_layers layers of the source body
    state, copied, *_ = _init(vocabs, mlm_export, "electra", generator="body")
    assert torch.equal(state["generator.layers.0.attn.qkv.weight"], source.encoder["discriminator.layers.0.attn.qkv.weight"])
    assert torch.equal(state["generator.ln.weight"], source.encoder["discriminator.ln.weight"])
    with pytest.raises(XylentError, match="generator: source needs"):
        _init(vocabs, mlm_export, "electra", generator="source")


def test_mlm_head_is_copied_with_its_bias_remapped(vocabs, mlm_export):
    state, copied, match, source, fresh, _ = _init(vocabs, mlm_export, "mlm")
    assert set(copied["heads"]) == {"head.dense.weight", "head.dense.bias", "head.ln.weight", "head.ln.bias",
                                    "head.bias"}
    assert torch.equal(state["head.dense.weight"], source.full["head.dense.weight"])
    bias = state["head.bias"]
    for i, j in enumerate(match.old_ids.tolist()):
        assert bias[i] == (source.full["head.bias"][j] if j >= 0 else fresh["head.bias"][i])
    assert torch.equal(state["encoder.layers.1.ffn.2.weight"], source.encoder["discriminator.layers.1.ffn.2.weight"])
    state, copied, *_ = _init(vocabs, mlm_export, "mlm", heads=False)
    assert not copied["heads"] and torch.equal(state["head.bias"], fresh["head.bias"])


def test_electra_source_generator(tmp_path, vocabs):
    src = _export(tmp_path, vocabs["old"], "electra")
    state, copied, match, source, fresh, _ = _init(vocabs, src, "electra", generator="source")
    for k in source.full:
        if k.startswith(("generator.", "discriminator_head.", "generator_head.dense")):
            assert torch.equal(state[k], source.full[k]), k
    assert "discriminator_head.out.weight" in copied["heads"] and "generator_head.bias" in copied["heads"]


def test_init_from_an_export_hf_dir_equals_the_xylent_export(tmp_path, vocabs, mlm_export):
    from xylent.models.hf_export import export_hf

    hf = export_hf(mlm_export, tmp_path / "hf")
    assert inspect_source(hf).kind == "xylent-hf"
    a, _, ma, *_ = _init(vocabs, mlm_export, "electra")
    b, copied, mb, source, *_ = _init(vocabs, hf, "electra")
    assert source.full is None and not copied["heads"] and not source.ignored
    assert np.array_equal(ma.old_ids, mb.old_ids)  # the fast tokenizer's pieces are spm.model's
    for k in a:
        if not k.startswith(("generator_head", "discriminator_head")):
            assert torch.equal(a[k], b[k]), k


def test_init_from_a_hugging_face_bert(tmp_path, vocabs):
    """A BertModel maps weight for weight: with the same ids, xylent's encoder (no relative
    bias) gives BERT's hidden states."""
    from transformers import BertConfig, BertModel

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "house", "##s", "cat", "dog", "haus", "##ing"]
    hf = tmp_path / "bert"
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(words), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=256, max_position_embeddings=40, layer_norm_eps=1e-5))
    with torch.no_grad():
        for p in bert.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    bert.save_pretrained(hf)
    (hf / "vocab.txt").write_text("\n".join(words) + "\n")
    (hf / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]"}))
    info = inspect_source(hf)
    assert info.kind == "bert" and not info.body["relative_bias"]
    # the default relative bias: allowed, it starts random (and says so)
    assert "no relative position bias" in check_body(info, preset("tiny").to_dict())[0]

    state, copied, match, source, fresh, _ = _init(vocabs, hf, "mlm", relative_bias=False)
    assert copied["positions"] == 40 and "pooler.dense.weight" in source.ignored
    model, _ = _new_model(vocabs, "mlm", relative_bias=False)
    model.load_state_dict(state, strict=True)
    model.eval()
    bert.eval()
    new_ids = [i for i, j in enumerate(match.old_ids.tolist()) if j >= 0]
    ids = torch.tensor([new_ids[:6], new_ids[6:12]])
    old = torch.as_tensor(match.old_ids)[ids]
    with torch.no_grad():
        ours = model.encoder(model.embeddings(ids), None)
        theirs = bert(input_ids=old, attention_mask=torch.ones_like(old)).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


def test_errors_say_what_and_what_to_do(tmp_path, vocabs, mlm_export):
    with pytest.raises(XylentError, match="does not exist") as err:
        inspect_source(tmp_path / "nope")
    assert "models:/" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(XylentError, match="no config.json"):
        inspect_source(tmp_path / "empty")
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(XylentError, match="model_type 'gpt2'") as err:
        inspect_source(tmp_path / "gpt")
    assert "BertModel" in str(err.value) and "export-hf" in str(err.value)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"format": "xylent-encoder/1", "encoder": {}}))
    with pytest.raises(XylentError, match="lacks model.safetensors"):
        inspect_source(tmp_path / "broken")
    info = inspect_source(mlm_export)
    with pytest.raises(XylentError) as err:
        check_body(info, preset("small").to_dict())
    msg = str(err.value)
    assert "2×64 (ffn 256, 2 heads" in msg and "12×256 (ffn 1024, 4 heads)" in msg and "model: {size: tiny}" in msg
    with pytest.raises(XylentError, match="rel_buckets 32, the new model 16"):
        check_body(info, preset("tiny", rel_buckets=16).to_dict())
    with pytest.raises(XylentError, match="relative_bias: true"):
        check_body(info, preset("tiny", relative_bias=False).to_dict())


# -- the spec field and the fingerprint ---------------------------------------------------------------


def test_spec_field_fingerprint_and_registry(tmp_path, mlm_export):
    from xylent.flows.registry import STAGES
    from xylent.tasks.pretrain.init_source import resolve_source
    from xylent.spec import load_spec
    from xylent.stage import section_identity, stage_fingerprints
    from xylent.workspace import Workspace

    demo = ROOT / "data_specs" / "demo.yaml"
    ws = Workspace(tmp_path / "ws")
    base = load_spec(demo)
    assert "init" not in section_identity(base.pretrain)  # unset: existing fingerprints stay
    with pytest.raises(XylentError, match="not a registered model URI"):
        load_spec(demo, ["pretrain.init.from=models:/only-a-name"])
    with pytest.raises(XylentError, match="pretrain.init.generator"):
        load_spec(demo, [f"pretrain.init.from={mlm_export}", "pretrain.init.generator=maybe"])

    spec = load_spec(demo, [f"pretrain.init.from={mlm_export}"])
    assert spec.dump()["pretrain"]["init"]["from"] == str(mlm_export)
    fps = stage_fingerprints(STAGES, spec, ws)
    assert fps["shards"] == stage_fingerprints(STAGES, base, ws)["shards"]
    assert fps["pretrain"] != stage_fingerprints(STAGES, base, ws)["pretrain"]
    assert stage_fingerprints(STAGES, spec, ws)["pretrain"] == fps["pretrain"]
    weights = mlm_export / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the weights change, not the path
    assert stage_fingerprints(STAGES, spec, ws)["pretrain"] != fps["pretrain"]
    with pytest.raises(XylentError, match="the new model is 12×256"):
        stage_fingerprints(STAGES, load_spec(demo, [f"pretrain.init.from={mlm_export}", "model.size=small"]), ws)
    with pytest.raises(XylentError, match="does not exist"):
        stage_fingerprints(STAGES, load_spec(demo, [f"pretrain.init.from={tmp_path}/gone"]), ws)

    # models:/<name>/<version|latest>: the registered version's pretrain output in the workspace's store
    reg = load_spec(demo, ["pretrain.init.from=models:/xylent-phase1/latest"])
    with pytest.raises(XylentError, match="no MLflow store yet"):
        resolve_source(reg, ws)
    from xylent.tracking import Tracker, tracking_uri_for

    ws.root.mkdir(parents=True)
    tracker = Tracker(tracking_uri_for(ws.root), "t", artifact_root=ws.root / "mlartifacts")
    with pytest.raises(XylentError, match="registered models: none"):
        resolve_source(reg, ws)
    runs = [tracker.start_run("pretrain", tags={"xylent.output_dir": str(d)})
            for d in (tmp_path / "gone-run", mlm_export.parent)]
    tracker.client.create_registered_model("xylent-phase1")
    for r in runs:
        tracker.client.create_model_version("xylent-phase1", f"runs:/{r}/model", run_id=r)
    got = resolve_source(reg, ws)
    assert got.path == mlm_export and got.registry == {"name": "xylent-phase1", "version": 2, "run_id": runs[1]}
    with pytest.raises(XylentError, match="pretrain output that is gone"):
        resolve_source(load_spec(demo, ["pretrain.init.from=models:/xylent-phase1/1"]), ws)
    fp = stage_fingerprints(STAGES, reg, ws)["pretrain"]
    assert fp != fps["pretrain"]


def test_timing_is_small(vocabs):
    """Matching is plain Python: a 250k-piece vocabulary against another in seconds."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyzäöüß"
    pieces = lambda n: list({("▁" if rng.random() < 0.5 else "") + "".join(rng.choice(letters) for _ in range(rng.randint(1, 8)))
                             for _ in range(n)})
    specials = {"unk": 0, "bos": 1, "eos": 2, "pad": 3, "mask": 4}
    a = Vocabulary(["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + pieces(250_000), specials)
    b = Vocabulary(["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + pieces(250_000), specials)
    t = time.perf_counter()
    m = match_vocabularies(a, b)
    assert time.perf_counter() - t < 20 and sum(m.counts().values()) == len(a)
    assert set(m.counts()) == set(RULES)


def test_metaxlm_recipes_load_and_chain(tmp_path):
    from xylent.flows.registry import STAGES
    from xylent.spec import load_spec
    from xylent.stage import stage_fingerprints
    from xylent.workspace import Workspace

    recipes = ROOT / "data_specs" / "recipes"
    one, two = load_spec(recipes / "metaxlm-phase1.yaml"), load_spec(recipes / "metaxlm-phase2.yaml")
    demo = load_spec(ROOT / "data_specs" / "demo.yaml")
    assert (one.pretrain.objective, one.pretrain.batch_kinds, one.pretrain.init) == ("mlm", ["mrtd"], None)
    assert one.languages == ["en"], "MetaXLM's phase 1 is an English model"
    assert two.pretrain.init.registry() == {"name": f"xylent-{one.name}", "version": "latest", "alias": None}
    assert len(read_dictionary(two.resolve_path(two.pretrain.init.dictionary))) > 50
    scratch = load_spec(recipes / "metaxlm-scratch.yaml")  # the claim's peer: phase 2 from a random init
    assert scratch.pretrain.init is None and scratch.pretrain.model_dump(exclude={"init", "register_name"}) == \
        two.pretrain.model_dump(exclude={"init", "register_name"}) and scratch.vocab == two.vocab
    ws = Workspace(tmp_path / "ws")
    fp_one, fp_demo = stage_fingerprints(STAGES, one, ws), stage_fingerprints(STAGES, demo, ws)
    assert fp_one["vocab"] != fp_demo["vocab"]  # phase 2 has another vocabulary to match
    data = [s for s in STAGES if s.name in ("download", "prepare", "dedup", "vocab", "sampling", "shards")]
    assert stage_fingerprints(data, two, ws) == stage_fingerprints(data, demo, ws)  # the demo's outputs are reused
    with pytest.raises(XylentError, match="no MLflow store yet") as err:  # phase 1 has not run in this workspace
        stage_fingerprints(STAGES, two, ws)
    assert "xylent run pretrain" in str(err.value)


# -- end to end: the stage, through the CLI and DeepSpeed (one short run) --------------------------------

E2E = ["--set", "pretrain.objective=mlm", "--set", "pretrain.steps=10", "--set", "pretrain.checkpoint_every=10",
       "--set", "pretrain.batch_size=16", "--set", "pretrain.trtd_max_tokens=1024", "--set", "pretrain.warmup_steps=2",
       "--set", "pretrain.log_every=5", "--set", "pretrain.system_metrics=false", "--set", "model.dropout=0.0"]


@pytest.mark.costs(deepspeed=1)
def test_the_stage_starts_from_an_export_and_reports_the_match(demo_run, run_cli, tmp_path, vocabs, mlm_export):
    from mlflow import MlflowClient

    ws = linked_data(demo_run[1], tmp_path / "ws")
    args = ["run", "pretrain", "--spec", ROOT / "data_specs" / "demo.yaml", "--workspace", ws, "--json", *E2E,
            "--set", f"pretrain.init.from={mlm_export}"]
    rc, out, err = run_cli(*args)
    assert rc == 0, err[-3000:]
    res = json.loads(out)["stages"]["pretrain"]
    outdir = Path(res["output_dir"])
    rep = json.loads((outdir / "init_report.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(outdir / "model" / "spm.model"))
    assert sum(rep["counts"].values()) == rep["new_vocab_size"] == sp.get_piece_size()
    assert rep["counts"]["special"] == 5 and rep["counts"]["exact"] > 0 and rep["source"]["path"] == str(mlm_export)
    assert set(rep["languages"]) == set(load_spec_languages()) and rep["copied"]["body"] > 0
    assert "Initialised from an existing encoder" in (outdir / "report.md").read_text()
    manifest = json.loads((outdir / "_manifest.json").read_text())
    assert manifest["config"]["_identity"]["init"]["files"]["model.safetensors"]
    assert json.loads((outdir / "model" / "config.json").read_text())["init"]["from"] == str(mlm_export)
    run = MlflowClient(f"sqlite:///{ws}/mlflow.db").get_run(res["mlflow_run_id"])
    assert run.data.metrics["init/exact"] == rep["counts"]["exact"] and "init/de/tokens_matched" in run.data.metrics
    ck = Path(manifest["checkpoints"])
    assert json.loads((ck / "train.json").read_text())["init_from"] == str(ck / "init.safetensors")

    rc, out, err = run_cli(*args)  # the same source: a cache hit
    assert rc == 0 and json.loads(out)["stages"]["pretrain"]["cached"], err[-2000:]
    rc, out, err = run_cli(*args, "--set", "model.size=small")  # refused before anything trains
    assert rc == 2 and "the new model is 12×256" in err and "Traceback" not in err


def load_spec_languages() -> list[str]:
    from xylent.spec import load_spec

    return load_spec(ROOT / "data_specs" / "demo.yaml").languages


def test_registering_again_after_a_run_stopped_mid_registration(mlm_export, tmp_path):
    """A full disk stopped a run inside MLflow's save_model: the next run found ``mlflow-model`` "already exists
    and is not empty" and failed forever (issue 64, item 1); the folder is scratch, and it is cleared first.
    The logged model carries the xylent core and xylent.models (no stages), as installed."""
    from xylent.tasks.pretrain.publish import register_model
    from xylent.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "t", artifact_root=tmp_path / "mlartifacts")
    run_id = tracker.start_run("pretrain")
    scratch = tmp_path / "_checkpoints"
    (scratch / "mlflow-model" / "code").mkdir(parents=True)
    (scratch / "mlflow-model" / "MLmodel").write_text("half written\n")
    uri, version = register_model(tracker, run_id, mlm_export, "xylent-t", scratch)
    assert version == 1 and not (scratch / "mlflow-model").exists() and not (scratch / "pyfunc-code").exists()
    root = next((tmp_path / "mlartifacts").rglob("MLmodel")).parent
    code = root / "code" / "xylent"
    assert (code / "models" / "serving.py").is_file() and (code / "errors.py").is_file(), sorted(root.rglob("*"))[:20]
    assert not (code / "tasks").exists() and not (code / "flows").exists()
