"""export_hf: a real (untrained) xylent export, converted, then loaded offline through
transformers' Auto classes: same ids as xylent's tokenizer, same hidden states."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from xylent.models.config import preset
from xylent.models.hf_export import export_hf
from xylent.models.pretrained import PretrainedEncoder, export, load_pretrained
from xylent.tasks.vocab.specials import CONTROL_SYMBOLS, PAD, TRAINER_IDS, special_ids
from xylent.errors import XylentError

SENTENCES = {
    "en": "The quick brown fox jumps over the lazy dog while the children watch from the window.",
    "de": "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "fr": "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë.",
    "ru": "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "zh": "敏捷的棕色狐狸跳过了懒狗，孩子们在花园的窗户里看着。",
    "ja": "いろはにほへと ちりぬるを、わかよたれそ つねならむ。東京は晴れです。",
    "ko": "다람쥐 헌 쳇바퀴에 타고파. 한국어 문장입니다.",
    "th": "สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ เด็กๆ มองจากหน้าต่าง",
    "ar": "الثعلب البني السريع يقفز فوق الكلب الكسول بينما يشاهد الأطفال.",
    "hi": "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
}
TEXTS = [
    *SENTENCES.values(),
    "",
    "  leading,  inner   and trailing   spaces  ",
    "\ttabs\tand\nnew lines",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３, the ﬁ ligature, ① and ½",  # NFKC's job
    "emoji 👍🏽 and ☕ fall back to bytes",
    "mixed: English 中文 ไทย عربي русский",
    " ".join(SENTENCES.values()) * 3,  # longer than max_position: both truncate
]
MAX_POSITION = 128


def _corpus(n: int = 1500, seed: int = 0) -> list[str]:
    """Lines over every language's letters: its sentence's words plus pseudo-words."""
    rng = random.Random(seed)
    lines = []
    for lang, text in SENTENCES.items():
        letters = sorted({c for c in text if c.isalpha()})
        words = text.split() + ["".join(rng.choice(letters) for _ in range(rng.randint(2, 5))) for _ in range(15)]
        joiner = "" if lang in ("zh", "ja", "th") else " "
        lines += [joiner.join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n // len(SENTENCES))]
    return lines


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A unigram model with the vocab stage's special layout and byte fallback."""
    d = tmp_path_factory.mktemp("vocab")
    (d / "train.txt").write_text("\n".join(_corpus()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(d / "train.txt"), model_prefix=str(d / "spm"), vocab_size=600, model_type="unigram",
        character_coverage=1.0, byte_fallback=True, hard_vocab_limit=False, minloglevel=2,
        control_symbols=CONTROL_SYMBOLS[1:], pad_id=PAD, **TRAINER_IDS)
    return d


def _xylent_export(root: Path, tokenizer_dir: Path, relative_bias: bool) -> Path:
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "spm.model"))
    cfg = preset("tiny", vocab_size=sp.get_piece_size(), max_position=MAX_POSITION, relative_bias=relative_bias,
                 specials=special_ids(sp))
    torch.manual_seed(0)
    enc = PretrainedEncoder(cfg)
    with torch.no_grad():  # every weight off its init (norms, gate w = 1): a misplaced one shows
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    state = enc.state_dict()
    export(root / "model", state, state, cfg, tokenizer_dir, {"objective": "electra"})
    return root / "model"


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tokenizer_dir) -> dict[bool, tuple[Path, Path]]:
    """relative_bias -> (xylent model/ dir, HF dir)."""
    out = {}
    for rel in (True, False):
        root = tmp_path_factory.mktemp(f"rel{int(rel)}")
        model_dir = _xylent_export(root, tokenizer_dir, rel)
        out[rel] = model_dir, export_hf(model_dir, root / f"hf-rel{int(rel)}")
    return out


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _auto(cls_name: str, path: Path, **kwargs):
    import transformers

    return getattr(transformers, cls_name).from_pretrained(path, trust_remote_code=True, local_files_only=True,
                                                           **kwargs)


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    # refusing remote code proves the tokenizer needs none (and spares transformers 5's prompt)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def test_the_fast_tokenizer_gives_xylents_ids(exports):
    model_dir, hf_dir = exports[True]
    xylent = load_pretrained(model_dir)
    tok = _tokenizer(hf_dir)
    ids, mask = xylent.tokenize(TEXTS)
    batch = tok(TEXTS, padding=True, truncation=True, return_tensors="pt")
    assert set(batch) == {"input_ids", "attention_mask"}
    for text, want, got in zip(TEXTS, ids.tolist(), batch["input_ids"].tolist()):
        assert got == want, text
    assert torch.equal(batch["attention_mask"], mask)

    sp, (bos, eos) = xylent.tokenizer, (xylent.bos_id, xylent.eos_id)
    a, b = SENTENCES["th"], SENTENCES["ar"]
    assert tok(a, b)["input_ids"] == [bos, *sp.encode(a), eos, *sp.encode(b), eos], "tasks/shards pair layout"
    assert tok.decode(tok(TEXTS[3])["input_ids"], skip_special_tokens=True) == sp.decode(sp.encode(TEXTS[3]))
    assert (tok.mask_token_id, tok.pad_token_id) == (xylent.config.special("mask"), xylent.pad_id)


@pytest.mark.parametrize("relative_bias", [True, False])
def test_automodel_gives_xylents_hidden_states(exports, relative_bias):
    model_dir, hf_dir = exports[relative_bias]
    xylent = load_pretrained(model_dir)
    model = _auto("AutoModel", hf_dir)
    assert type(model).__name__ == "XylentModel" and type(model).__module__.startswith("transformers_modules")
    assert not model.training and model.dtype == torch.float32

    ids, mask = xylent.tokenize(TEXTS[:8])
    assert (mask == 0).any(), "a padded batch"
    with torch.no_grad():
        want_last, want = xylent(ids, mask, output_hidden_states=True)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        no_mask = model(input_ids=ids).last_hidden_state  # as xylent: the pad id marks padding
        as_tuple = model(input_ids=ids, attention_mask=mask, return_dict=False)[0]
    assert len(out.hidden_states) == len(want) == xylent.config.layers + 1
    for k, (got, ref) in enumerate(zip(out.hidden_states, want)):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0, msg=lambda m, k=k: f"hidden_states[{k}]: {m}")
    for got in (out.last_hidden_state, no_mask, as_tuple):
        torch.testing.assert_close(got, want_last, atol=1e-5, rtol=0)
    assert model.config.xylent_objective == "electra", "evaluate reads ELECTRA's retrieval layer from the export"


def test_task_heads_load_the_body_and_train(exports):
    _, hf_dir = exports[True]
    body = _auto("AutoModel", hf_dir).state_dict()
    tok = _tokenizer(hf_dir)
    batch = tok(TEXTS[:4], padding=True, return_tensors="pt")
    n, length = batch["input_ids"].shape
    cases = [
        ("AutoModelForSequenceClassification", {"num_labels": 3}, {"labels": torch.tensor([0, 2, 1, 2])}, (n, 3)),
        ("AutoModelForSequenceClassification", {"num_labels": 1}, {"labels": torch.rand(n)}, (n, 1)),  # regression
        ("AutoModelForTokenClassification", {"num_labels": 5},
         {"labels": torch.randint(0, 5, (n, length)).masked_fill(batch["attention_mask"] == 0, -100)}, (n, length, 5)),
        ("AutoModelForQuestionAnswering", {}, {"start_positions": torch.tensor([1, 2, 0, 999]),  # 999: clamped
                                               "end_positions": torch.tensor([3, 2, 0, 999])}, (n, length)),
    ]
    for cls_name, config_kwargs, labels, shape in cases:
        model = _auto(cls_name, hf_dir, **config_kwargs)
        loaded = model.xylent.state_dict()
        assert loaded.keys() == body.keys() and all(torch.equal(loaded[k], body[k]) for k in body), cls_name
        model.train()
        out = model(**batch, **labels)
        logits = out.logits if hasattr(out, "logits") else out.start_logits
        assert tuple(logits.shape) == shape and math.isfinite(out.loss.item()), cls_name
        out.loss.backward()
        assert model.xylent.embeddings.word_embeddings.weight.grad.abs().sum() > 0, cls_name


def test_exporting_again_replaces_the_folder_whole(exports, tmp_path):
    model_dir = exports[False][0]
    out = tmp_path / "hf"
    export_hf(model_dir, out)
    (out / "stale.txt").write_text("from an older export")
    assert export_hf(model_dir, out) == out
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"], "no temporary folder left beside it"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "xylent" and cfg["relative_bias"] is False
    assert set(cfg["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSequenceClassification",
                                    "AutoModelForTokenClassification", "AutoModelForQuestionAnswering"}


def test_a_folder_that_is_not_an_xylent_export_is_refused(exports, tmp_path):
    _, hf_dir = exports[True]
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    shutil.copytree(exports[True][0], broken)
    (broken / "model.safetensors").unlink()
    for src, says in ((tmp_path / "empty", "no config.json"), (hf_dir, "format"), (broken, "model.safetensors")):
        with pytest.raises(XylentError, match=says) as err:
            export_hf(src, tmp_path / "out")
        assert err.value.where and err.value.fix
        assert not (tmp_path / "out").exists()


def test_export_hf_never_replaces_a_users_folder_or_a_published_output_unless_asked(tmp_path, run_cli):
    mine = tmp_path / "my-notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    rc, _, err = run_cli("export-hf", str(tmp_path / "no-model"), str(mine))
    assert rc == 2 and "not an earlier Hugging Face export" in err and "--replace" in err, err
    assert (mine / "thesis.tex").read_text() == "years of work"
    published = tmp_path / "ws" / "pretrain" / "0123abcd"
    (published / "model").mkdir(parents=True)
    (published / "_manifest.json").write_text("{}")
    for target in (published, published / "model", published / "hf"):
        rc, _, err = run_cli("export-hf", str(tmp_path / "no-model"), str(target), "--replace")
        assert rc == 2 and "published stage output" in err, err
    assert sorted(p.name for p in published.iterdir()) == ["_manifest.json", "model"]
