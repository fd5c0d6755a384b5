"""cpuformer.Tokenizer over tokenizer.json and over SentencePiece-only directories (Marian, T5,
Llama, mBART-50, NLLB, M2M100): ids and text identical to transformers' tokenizer classes on the
same files. The SentencePiece models are trained here on a small multilingual text."""

from __future__ import annotations

import io
import json
import shutil
import sys

import numpy as np
import pytest

import cpuformer as cf
from cpuformer._sentencepiece import NLLB_CODES, open_sentencepiece
from cpuformer._tokenizer_dir import open_tokenizer

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

# MarianTokenizer warns that sacremoses (a normalizer its encode does not call) is not installed
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses:UserWarning")

CORPUS = ("""The quick brown fox jumps over the lazy dog. It was 1984 when 42 people arrived at 7:30.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München, Straße und Größe!
Le renard brun rapide saute par-dessus le chien paresseux. Où est la bibliothèque? C'est déjà l'été, très élégant.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, как дела? Москва и Санкт-Петербург.
敏捷的棕色狐狸跳过了懒狗。你好，世界！我们今天去北京。
素早い茶色の狐がのろまな犬を飛び越える。こんにちは、世界！東京に行きます。
Emoji time 😀🎉👍 and numbers 3.14159, 2718, 100% sure. Café naïve résumé coöperate façade.
Translation models read sentences in many languages and write them in another language.
Machine translation is useful. Übersetzung ist nützlich. La traduction est utile. Перевод полезен.
""" * 3 + "\n".join(f"Line {i}: the value {i * 37 % 101} is here, der Wert ist {i}, la valeur est {i}."
                    for i in range(60)))

# characters the models have never seen (unknown pieces, byte fallback), runs of spaces, tabs
SAMPLE = ("Hello world! Das Wetter ist schön, n'est-ce pas? Привет мир. 你好世界。 東京タワー 😀 3.14 "
          "  double  spaces and tabs\tand newline\n unseen chars: ∂∫ Ωmega ⅓ ｆｕｌｌｗｉｄｔｈ ﬁ ligature")
TEXTS = [SAMPLE, "Grüße aus München", "Привет, как дела?", "你好，世界！", "😀🎉👍", "", " lead space", "a  b ",
         "tab\there", "x\n\ny", "1984"]
# special tokens written in the text (split out as transformers does)
SPECIAL_TEXTS = ["hello <mask> world</s> x <pad> <unk>y en_XX __de__ <extra_id_0>", "a </s> b  </s>  c",
                 ">>fr<< Bonjour le monde", "<extra_id_1> and <extra_id_0>."]


def train(path, model_type, vocab_size, **options):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for s in CORPUS.split("\n") if s.strip()]),
                                   model_writer=model, model_type=model_type, vocab_size=vocab_size,
                                   minloglevel=2, **options)
    path.write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_file=str(path))


def write_json(path, value):
    path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")


def fairseq_vocab(processor, specials, extra=()):
    """vocab.json as Marian / M2M100 write it: specials first, then the model's pieces."""
    vocab = {token: i for i, token in enumerate(specials)}
    for i in range(3, processor.get_piece_size()):  # after SentencePiece's <unk> <s> </s>
        vocab.setdefault(processor.id_to_piece(i), len(vocab))
    for token in extra:
        vocab[token] = len(vocab)
    return vocab


def make_t5(directory):
    train(directory / "spiece.model", "unigram", 256, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    write_json(directory / "config.json", {"model_type": "t5"})
    return directory


def make_t5_config(directory):
    # tokenizer_config.json as t5-small's
    make_t5(directory)
    write_json(directory / "tokenizer_config.json",
               {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "extra_ids": 100,
                "additional_special_tokens": [f"<extra_id_{i}>" for i in range(100)], "model_max_length": 512,
                "tokenizer_class": "T5Tokenizer"})
    return directory


def make_mt5(directory):
    # as mT5's: no sentinels added, no tokenizer_class (config.json's model_type decides)
    make_t5(directory)
    write_json(directory / "config.json", {"model_type": "mt5"})
    write_json(directory / "tokenizer_config.json", {"extra_ids": 0, "additional_special_tokens": None})
    return directory


def make_marian(directory, separate=False):
    source = train(directory / "source.spm", "unigram", 256)
    if separate:
        target = train(directory / "target.spm", "bpe", 300)
        write_json(directory / "target_vocab.json", fairseq_vocab(target, ["</s>", "<unk>"], ["<pad>"]))
        write_json(directory / "tokenizer_config.json", {"separate_vocabs": True})
    else:
        shutil.copy(directory / "source.spm", directory / "target.spm")
    write_json(directory / "vocab.json", fairseq_vocab(source, ["</s>", "<unk>", ">>fr<<", ">>de<<"], ["<pad>"]))
    write_json(directory / "config.json", {"model_type": "marian"})
    return directory


def make_m2m100(directory):
    processor = train(directory / "sentencepiece.bpe.model", "bpe", 256)
    write_json(directory / "vocab.json", fairseq_vocab(processor, ["<s>", "<pad>", "</s>", "<unk>"]))
    write_json(directory / "config.json", {"model_type": "m2m_100"})
    write_json(directory / "tokenizer_config.json", {"tokenizer_class": "M2M100Tokenizer", "src_lang": "fr"})
    return directory


def make_mbart50(directory):
    train(directory / "sentencepiece.bpe.model", "unigram", 256)
    write_json(directory / "config.json", {"model_type": "mbart"})
    write_json(directory / "tokenizer_config.json", {"tokenizer_class": "MBart50Tokenizer", "src_lang": "fr_XX"})
    return directory


def make_nllb(directory, **settings):
    train(directory / "sentencepiece.bpe.model", "bpe", 256)
    write_json(directory / "config.json", {"model_type": "m2m_100"})
    write_json(directory / "tokenizer_config.json", {"tokenizer_class": "NllbTokenizer", "src_lang": "fra_Latn",
                                                     **settings})
    return directory


def make_llama(directory):
    # as Llama's tokenizer.model: BPE, byte fallback, split digits, no normalization
    train(directory / "tokenizer.model", "bpe", 400, character_coverage=0.99, byte_fallback=True, split_digits=True,
          normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True)
    write_json(directory / "config.json", {"model_type": "llama"})
    write_json(directory / "tokenizer_config.json", {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True})
    return directory


def make_llama_untyped(directory):
    # a tokenizer.model with SentencePiece's default normalization, named only by model_type
    train(directory / "tokenizer.model", "bpe", 400, character_coverage=0.99, byte_fallback=True)
    write_json(directory / "config.json", {"model_type": "llama"})
    return directory


MAKERS = {"t5": make_t5, "t5_config": make_t5_config, "mt5": make_mt5, "marian": make_marian,
          "marian_separate": lambda d: make_marian(d, separate=True), "m2m100": make_m2m100, "mbart50": make_mbart50,
          "nllb": make_nllb, "llama": make_llama, "llama_untyped": make_llama_untyped}
# the transformers class of each directory (besides AutoTokenizer)
CLASSES = {"t5": "T5Tokenizer", "t5_config": "T5Tokenizer", "mt5": "T5Tokenizer", "marian": "MarianTokenizer",
           "marian_separate": "MarianTokenizer", "m2m100": "M2M100Tokenizer", "mbart50": "MBart50Tokenizer",
           "nllb": "NllbTokenizer", "llama": "LlamaTokenizer", "llama_untyped": None}


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in MAKERS.items()}


def references(name, directory):
    """transformers' tokenizers of the directory: AutoTokenizer and the family's class."""
    refs = [transformers.AutoTokenizer.from_pretrained(directory)]
    if CLASSES[name] is not None:
        refs.append(getattr(transformers, CLASSES[name]).from_pretrained(directory))
    if name == "marian":  # the slow class straight from the files, as its docstring shows
        refs.append(transformers.MarianTokenizer(source_spm=str(directory / "source.spm"),
                                                 target_spm=str(directory / "target.spm"),
                                                 vocab=str(directory / "vocab.json")))
    return refs


@pytest.mark.parametrize("name", list(MAKERS))
def test_ids_and_text_identical_to_transformers(directories, name):
    directory = directories[name]
    ours = open_tokenizer(directory)
    assert ours is not None and ours.backend is None and ours.path.parent == directory
    # (transformers' NLLB has <mask> at another id, below)
    texts = TEXTS + [t for t in SPECIAL_TEXTS if name != "nllb" or "<mask>" not in t]
    nllb_code = 256 + 1 + NLLB_CODES.index("fra_Latn")  # real NLLB: codes after the pieces, then <mask>
    for ref in references(name, directory):
        for add in (True, False):
            expected = [ref(t, add_special_tokens=add)["input_ids"] for t in texts]
            got = ours.encode_batch(texts, add_special_tokens=add)
            if name == "nllb" and add:
                # transformers 5.24's NllbTokenizer built from sentencepiece.bpe.model alone adds no
                # language codes (src_lang becomes <unk>); the pieces and </s> are the same
                assert all(g[0] == nllb_code and e[0] == ref.unk_token_id for g, e in zip(got, expected))
                got, expected = [g[1:] for g in got], [e[1:] for e in expected]
            assert got == expected, (name, type(ref).__name__, add)
            assert [ours.encode(t, add) for t in texts] == ours.encode_batch(texts, add)
        for text in texts:
            ids = ref(text)["input_ids"]
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), (
                    name, text, skip)
        every = list(range(len(ref)))
        if name == "nllb":
            every = every[:-1]  # its <mask> sits where the real layout has the first language code
        assert ours.decode(every) == ref.decode(every, skip_special_tokens=True)
        assert ours.decode(every, skip_special_tokens=False) == ref.decode(every, skip_special_tokens=False)
        assert [ours.id_to_token(i) for i in every] == ref.convert_ids_to_tokens(every)
    vocab = ref.get_vocab()
    ours_vocab = ours.get_vocab()
    if name == "m2m100":  # its __xx__ language tokens: ids transformers gives them, not in its get_vocab
        assert ours_vocab["__fr__"] == ref.convert_tokens_to_ids("__fr__") == len(vocab) + 24
        ours_vocab = {t: i for t, i in ours_vocab.items() if not (t.startswith("__") and t.endswith("__"))}
    if name == "nllb":
        assert ours_vocab["fra_Latn"] == nllb_code and ours_vocab["<mask>"] == 257 + len(NLLB_CODES)
        ours_vocab = {t: i for t, i in ours_vocab.items() if t not in NLLB_CODES and t != "<mask>"}
        vocab = {t: i for t, i in vocab.items() if t != "<mask>"}
    assert ours_vocab == vocab
    assert all(ours.token_to_id(t) == i for t, i in vocab.items())
    assert ours.token_to_id("no such token") is None and ours.id_to_token(10**6) is None


def test_family_specifics(directories):
    t5 = open_tokenizer(directories["t5"])
    assert type(t5).__name__ == "T5SentencePiece" and t5.vocab_size == 256 + 100
    assert t5.token_to_id("<extra_id_0>") == 355 and t5.token_to_id("<extra_id_99>") == 256
    assert t5.encode("Hallo")[-1] == 1 and t5.eos_token is None  # no tokenizer_config.json: no settings
    marian = open_tokenizer(directories["marian"])
    assert marian.encode(">>fr<< Bonjour")[0] == 2 and marian.encode(">>de<<")[:1] == [3]
    reference = transformers.MarianTokenizer.from_pretrained(directories["marian"])
    ids = reference("Bonjour le monde", add_special_tokens=False)["input_ids"]
    assert marian.tokens("Bonjour le monde") == reference.convert_ids_to_tokens(ids)
    assert "<unk>" in marian.tokens("Bonjour le monde")  # "B" is not a piece of the tiny model
    mbart = open_tokenizer(directories["mbart50"])
    assert mbart.src_lang == "fr_XX" and mbart.encode("x")[0] == mbart.token_to_id("fr_XX") == 257 + 7
    assert mbart.token_to_id("<mask>") == 257 + 52
    llama = open_tokenizer(directories["llama"])
    assert llama.encode("hi")[0] == llama.token_to_id("<s>") == 1 and llama.encode("hi", False)[0] != 1
    assert llama.decode(llama.encode(SAMPLE)) == SAMPLE  # byte fallback: every character comes back
    assert llama.count("hi") == len(llama.encode("hi"))
    m2m = open_tokenizer(directories["m2m100"])
    assert m2m.encode("Bonjour")[0] == m2m.token_to_id("__fr__") and m2m.encode("Bonjour")[-1] == 2
    with pytest.raises(TypeError, match="encode.. takes strings, got int"):
        m2m.encode_batch(["a", 5])
    with pytest.raises(TypeError, match="encode.. takes a string, got bytes"):
        t5.encode(b"a")
    assert "T5SentencePiece(" in repr(t5) and "vocab_size=356" in repr(t5)


def test_nllb_legacy_behaviour(tmp_path):
    ours = open_tokenizer(make_nllb(tmp_path, legacy_behaviour=True))
    ids = ours.encode("Bonjour")
    assert ids[-2:] == [2, ours.token_to_id("fra_Latn")] and ids[:-2] == ours.encode("Bonjour", False)


def test_tokenizer_json_preferred(directories, tmp_path):
    """A directory with both files reads tokenizer.json (the tokenizers library)."""
    directory = tmp_path / "both"
    shutil.copytree(directories["t5"], directory)
    transformers.AutoTokenizer.from_pretrained(directory).save_pretrained(directory)
    assert (directory / "tokenizer.json").is_file() and (directory / "spiece.model").is_file()
    tokenizer = open_tokenizer(directory)
    assert type(tokenizer) is cf.Tokenizer and tokenizer.backend is not None
    assert tokenizer.path == directory / "tokenizer.json"
    # and it gives the same ids as the SentencePiece path
    assert tokenizer.encode_batch(TEXTS) == open_tokenizer(directories["t5"]).encode_batch(TEXTS)


def test_tokenizer_json_api(directories, tmp_path):
    ref = transformers.AutoTokenizer.from_pretrained(directories["llama"])
    ref.save_pretrained(tmp_path)
    ours = open_tokenizer(tmp_path)
    assert type(ours) is cf.Tokenizer and ours.path == tmp_path / "tokenizer.json"
    assert ours.encode(SAMPLE) == ref(SAMPLE)["input_ids"] and ours.encode(SAMPLE)[0] == 1
    assert ours.encode(SAMPLE, add_special_tokens=False) == ref(SAMPLE, add_special_tokens=False)["input_ids"]
    assert ours.encode_batch(TEXTS) == [ref(t)["input_ids"] for t in TEXTS]
    ids = ours.encode(SAMPLE)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True) == SAMPLE
    assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids)
    assert ours.decode_batch([ids, ids[:3]]) == [SAMPLE, ref.decode(ids[:3], skip_special_tokens=True)]
    assert ours.count(SAMPLE) == len(ids) and ours.count(SAMPLE, add_special_tokens=False) == len(ids) - 1
    assert ours.tokens("Hello") == ref.tokenize("Hello")
    assert ours.bos_token == "<s>" and ours.eos_token == "</s>" and ours.special_token("unk_token") == "<unk>"
    assert ours.special_token("no_such_token") is None and ours.settings["tokenizer_class"] == "LlamaTokenizer"
    assert ours.token_to_id("<s>") == 1 and ours.id_to_token(1) == "<s>" and ours.get_vocab() == ref.get_vocab()
    assert ours.vocab_size == len(ref) and "vocab_size=400" in repr(ours)
    with pytest.raises(TypeError, match="encode.. takes a string, got int"):
        ours.encode(5)


# ---- errors --------------------------------------------------------------------------------------

def test_corrupt_sentencepiece_file(directories, tmp_path):
    directory = tmp_path / "t5"
    shutil.copytree(directories["t5"], directory)
    (directory / "spiece.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ValueError, match=r"spiece.model: not a valid SentencePiece model \(.+\)"):
        open_tokenizer(directory)
    (directory / "spiece.model").write_bytes(b"")
    with pytest.raises(ValueError, match=r"spiece.model: not a valid SentencePiece model"):
        open_tokenizer(directory)
    llama = tmp_path / "llama"  # its model is rewritten (no normalizer) before loading
    shutil.copytree(directories["llama"], llama)
    (llama / "tokenizer.model").write_bytes((llama / "tokenizer.model").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"tokenizer.model: not a valid SentencePiece model \(.+\)"):
        open_tokenizer(llama)


def test_vocab_json_errors(directories, tmp_path):
    directory = tmp_path / "marian"
    shutil.copytree(directories["marian"], directory)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    write_json(directory / "vocab.json", {t: i for t, i in vocab.items() if t != "<unk>"})
    with pytest.raises(ValueError, match=r"vocab.json: has no '<unk>' token"):
        open_tokenizer(directory)
    write_json(directory / "vocab.json", {"</s>": 0, "<unk>": 1, "a": 2, "b": 3})
    with pytest.raises(ValueError, match=r"vocab.json: 25\d of the 25\d pieces of source.spm are not in it .*"
                                         "the two files belong to different tokenizers"):
        open_tokenizer(directory)
    write_json(directory / "vocab.json", {**vocab, "x": -1})
    with pytest.raises(ValueError, match=r"vocab.json: the id of 'x' must be an integer >= 0, got -1"):
        open_tokenizer(directory)
    write_json(directory / "vocab.json", {**vocab, "x": 5})
    with pytest.raises(ValueError, match=r"vocab.json: .* and 'x' have the same id 5"):
        open_tokenizer(directory)
    write_json(directory / "vocab.json", [1, 2])
    with pytest.raises(ValueError, match=r"vocab.json: must contain a JSON object, got list"):
        open_tokenizer(directory)


def test_directory_errors(directories, tmp_path):
    marian = tmp_path / "marian"
    shutil.copytree(directories["marian"], marian)
    (marian / "target.spm").unlink()
    with pytest.raises(ValueError, match=r"the Marian tokenizer needs target.spm, which is missing"):
        open_tokenizer(marian)
    separate = tmp_path / "separate"
    shutil.copytree(directories["marian_separate"], separate)
    (separate / "target_vocab.json").unlink()
    with pytest.raises(ValueError, match=r"separate_vocabs is true, but .*target_vocab.json is missing"):
        open_tokenizer(separate)
    gemma = tmp_path / "gemma"
    shutil.copytree(directories["llama_untyped"], gemma)
    write_json(gemma / "config.json", {"model_type": "gemma"})
    with pytest.raises(NotImplementedError, match=r"SentencePiece tokenizer \(tokenizer.model\) is of model_type "
                                                  "'gemma', which cpuformer does not read without tokenizer.json"):
        open_tokenizer(gemma)
    write_json(gemma / "tokenizer_config.json", {"tokenizer_class": "GemmaTokenizer"})
    with pytest.raises(NotImplementedError, match=r"tokenizer_class GemmaTokenizer\) is not one cpuformer reads"):
        open_tokenizer(gemma)
    mbart = tmp_path / "mbart"
    shutil.copytree(directories["mbart50"], mbart)
    write_json(mbart / "tokenizer_config.json", {"tokenizer_class": "MBart50Tokenizer", "src_lang": "xx_YY"})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: src_lang 'xx_YY' is not a language code of the "
                                         "mBART-50 tokenizer"):
        open_tokenizer(mbart)
    write_json(mbart / "tokenizer_config.json", {"tokenizer_class": "MBart50Tokenizer", "legacy_behaviour": "yes"})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: legacy_behaviour must be true or false, got 'yes'"):
        open_tokenizer(mbart)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert open_tokenizer(empty) is None and open_sentencepiece(empty, {}) is None


def test_settings_errors(directories, tmp_path):
    t5 = tmp_path / "t5"
    shutil.copytree(directories["t5"], t5)
    write_json(t5 / "tokenizer_config.json", {"extra_ids": -1})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: extra_ids must be an integer >= 0, got -1"):
        open_tokenizer(t5)
    write_json(t5 / "tokenizer_config.json", {"added_tokens_decoder": ["<x>"]})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: added_tokens_decoder must be an object of id -> "
                                         "token, got list"):
        open_tokenizer(t5)
    write_json(t5 / "tokenizer_config.json", {"added_tokens_decoder": {"x": {"content": "<x>"}}})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: added_tokens_decoder entry 'x' must map an "
                                         "integer id to a token"):
        open_tokenizer(t5)
    write_json(t5 / "tokenizer_config.json", {"added_tokens_decoder": {"400": {"content": "<x>", "special": False}}})
    tokenizer = open_tokenizer(t5)
    assert tokenizer.encode("a<x>b", False) == tokenizer.encode("a", False) + [400] + tokenizer.encode("b", False)
    assert tokenizer.decode([400]) == "<x>" and tokenizer.id_to_token(400) == "<x>"
    assert tokenizer.vocab_size == 401
    write_json(t5 / "tokenizer_config.json", {"pad_token": "<nothing>"})
    with pytest.raises(ValueError, match=r"spiece.model: has no '<nothing>' token"):
        open_tokenizer(t5)
    m2m = tmp_path / "m2m"
    shutil.copytree(directories["m2m100"], m2m)
    write_json(m2m / "tokenizer_config.json", {"language_codes": "m2m200"})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: language_codes must be 'm2m100' or 'wmt21', got "
                                         "'m2m200'"):
        open_tokenizer(m2m)
    write_json(m2m / "tokenizer_config.json", {"language_codes": "wmt21", "src_lang": "fr"})
    with pytest.raises(ValueError, match=r"tokenizer_config.json: src_lang 'fr' is not a language code of the "
                                         "M2M100 tokenizer"):
        open_tokenizer(m2m)
    write_json(m2m / "tokenizer_config.json", {"language_codes": "wmt21", "src_lang": "de"})
    size = len(json.loads((m2m / "vocab.json").read_text(encoding="utf-8")))
    assert open_tokenizer(m2m).encode("x")[0] == open_tokenizer(m2m).token_to_id("__de__") == size + 7


def test_sentencepiece_not_installed(directories, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # `import sentencepiece` raises ImportError
    with pytest.raises(ImportError, match=r"has no tokenizer.json but a SentencePiece model \(spiece.model\); "
                                          r"reading it needs the sentencepiece package: pip install "
                                          r"\"cpuformer\[sentencepiece\]\""):
        open_tokenizer(directories["t5"])


# ---- end to end: a model directory with only SentencePiece files ---------------------------------

def _save_model(directory, model_class, config):
    import torch

    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(directory)
    return model


def test_marian_translates_text(directories, tmp_path):
    directory = tmp_path / "marian_model"
    shutil.copytree(directories["marian"], directory)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(vocab_size=len(vocab), pad_token_id=pad, decoder_start_token_id=pad,
                                       eos_token_id=0, d_model=32, encoder_layers=1, decoder_layers=1,
                                       encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37,
                                       decoder_ffn_dim=37, max_position_embeddings=64)
    _save_model(directory, "MarianMTModel", config)
    assert not (directory / "tokenizer.json").exists()
    reference = transformers.MarianTokenizer.from_pretrained(directory)
    with cf.Seq2Seq(directory) as model:
        text = model.generate("Привет, как дела? Grüße aus München", max_new_tokens=8)
        ids = model.generate(reference("Привет, как дела? Grüße aus München")["input_ids"], max_new_tokens=8)[0]
        assert isinstance(text, str) and len(ids) > 0
        assert text == reference.decode(ids, skip_special_tokens=True)
        assert model.tokenizer.encode("Grüße") == reference("Grüße")["input_ids"]
    # a vocab.json of another model: more ids than the model's embeddings
    write_json(directory / "vocab.json", {**vocab, **{f"extra{i}": len(vocab) + i for i in range(5)}})
    with cf.Seq2Seq(directory) as model:
        with pytest.raises(ValueError, match=rf"source.spm: the tokenizer has {len(vocab) + 5} token ids, but the "
                                             rf"model's vocab_size is {len(vocab)}; the tokenizer files do not "
                                             "belong to this model"):
            model.generate("Bonjour")


def test_t5_translates_text(directories, tmp_path):
    directory = tmp_path / "t5_model"
    shutil.copytree(directories["t5"], directory)
    config = transformers.T5Config(vocab_size=256 + 100 + 4, d_model=32, d_kv=8, d_ff=37, num_layers=1,
                                   num_heads=2, decoder_start_token_id=0, relative_attention_num_buckets=8,
                                   relative_attention_max_distance=16)
    _save_model(directory, "T5ForConditionalGeneration", config)
    reference = transformers.T5Tokenizer.from_pretrained(directory)
    with cf.Seq2Seq(directory) as model:
        prompt = "translate English to German: The house is wonderful. <extra_id_0>"
        text = model.generate(prompt, max_new_tokens=8)
        ids = model.generate(np.array(reference(prompt)["input_ids"]), max_new_tokens=8)[0]
        assert len(ids) > 0 and text == reference.decode(ids, skip_special_tokens=True)
        assert model.tokenizer.vocab_size == 356 and model.tokenizer.decode(model.tokenizer.encode(prompt)) == (
            reference.decode(reference(prompt)["input_ids"], skip_special_tokens=True))


def test_llama_generates_text(directories, tmp_path):
    directory = tmp_path / "llama_model"
    shutil.copytree(directories["llama"], directory)
    config = transformers.LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=37, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2)
    _save_model(directory, "LlamaForCausalLM", config)
    reference = transformers.LlamaTokenizer.from_pretrained(directory)
    with cf.Generator(directory) as model:
        prompt = "Привет, 世界! 😀"
        text = model.generate(prompt, max_new_tokens=6)
        ids = model.generate(reference(prompt)["input_ids"], max_new_tokens=6)[0]
        assert len(ids) == 6 and text == reference.decode(ids, skip_special_tokens=True)
        assert model.tokenizer.encode(prompt) == reference(prompt)["input_ids"]
        assert "".join(model.stream(prompt, max_new_tokens=6)) == text
