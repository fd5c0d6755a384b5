"""Per-call languages (``Seq2Seq.generate(tgt_lang=, src_lang=)``, ``cpuformer translate --tgt-lang``)
against transformers' tokenizers and generate() on the same random-weight models.

One tiny SentencePiece BPE model is trained here; transformers' NllbTokenizer, MBart50Tokenizer,
MBartTokenizer and M2M100Tokenizer are built from it and saved into the model directories
(tokenizer.json where transformers writes one). M2M100Tokenizer and MarianTokenizer write no
tokenizer.json: their directories get one built here from the NLLB conversion of the same
SentencePiece model (the same pieces and ids) with their language tokens, and the test checks it
encodes as the transformers tokenizer does. The reference for every model is transformers'
``generate(**tok(text), forced_bos_token_id=tok.convert_tokens_to_ids(tgt_lang))`` with
``tok.src_lang`` set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer.models._languages import apply_languages  # noqa: E402

from ._hf import save_random_model  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a small test sentence.",
          "Translation models map a source sentence to a target sentence.",
          "Le renard brun saute par dessus le chien paresseux.", "Der schnelle braune Fuchs springt."]
TEXTS = ["Hello world, the fox jumps.", "A small source sentence"]
NEW = 8
_SIZES = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64, init_std=0.2)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _spm_dir(root):
    """A directory holding sentencepiece.bpe.model (BPE; <s> 0, <pad> 1, </s> 2, <unk> 3)."""
    directory = root / "spm"
    directory.mkdir()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 10), model_prefix=str(directory / "sp"),
                                   vocab_size=120, model_type="bpe", character_coverage=1.0, bos_id=0, pad_id=1,
                                   eos_id=2, unk_id=3, minloglevel=2)
    shutil.copy(directory / "sp.model", directory / "sentencepiece.bpe.model")
    return directory


def _spm_vocab(spm_dir):
    processor = spm.SentencePieceProcessor(model_file=str(spm_dir / "sp.model"))
    return {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}


def _derived_tokenizer_json(nllb_tok, directory, codes, template, tokenizer_class):
    """tokenizer.json: the NLLB conversion's pieces with ``codes`` added (ids from the base vocabulary
    on, in order) and the post-processor ``template``; tokenizer_config.json naming the class."""
    from tokenizers import Tokenizer, processors

    backend = Tokenizer.from_str(nllb_tok.backend_tokenizer.to_str())
    base = json.loads(backend.to_str())
    base["added_tokens"] = [t for t in base["added_tokens"] if t["id"] < 120]
    backend = Tokenizer.from_str(json.dumps(base))
    backend.add_special_tokens(list(codes))
    ids = {t: backend.token_to_id(t) for t in template if t != "$A"}
    backend.post_processor = processors.TemplateProcessing(single=template, special_tokens=list(ids.items()))
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": tokenizer_class, "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}))


def _peaky(model):
    """Scales up the norm feeding the head, so the greedy choices are far from ties."""
    decoder = model.model.decoder
    norm = getattr(decoder, "layer_norm", None)
    (decoder.layers[-1].final_layer_norm if norm is None else norm).weight.mul_(8.0)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """name -> (directory, transformers model, transformers tokenizer)."""
    root = tmp_path_factory.mktemp("languages")
    sp = _spm_dir(root)
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES as M2M_CODES
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as NLLB_CODES

    out = {}
    nllb_tok = transformers.NllbTokenizer.from_pretrained(sp, additional_special_tokens=NLLB_CODES)
    legacy_tok = transformers.NllbTokenizer.from_pretrained(sp, additional_special_tokens=NLLB_CODES,
                                                            legacy_behaviour=True)
    mbart50_tok = transformers.MBart50Tokenizer.from_pretrained(sp)
    mbart_tok = transformers.MBartTokenizer.from_pretrained(sp)

    # M2M100: sentencepiece.bpe.model + vocab.json (the pieces' SentencePiece ids).
    m2m_src = root / "m2m_src"
    m2m_src.mkdir()
    shutil.copy(sp / "sentencepiece.bpe.model", m2m_src)
    (m2m_src / "vocab.json").write_text(json.dumps(_spm_vocab(sp)))
    m2m_tok = transformers.M2M100Tokenizer.from_pretrained(m2m_src)

    # Marian: source.spm / target.spm + vocab.json with two target-language tokens.
    marian_src = root / "marian_src"
    marian_src.mkdir()
    vocab = _spm_vocab(sp)
    vocab.update({">>fra<<": len(vocab), ">>deu<<": len(vocab) + 1})
    (marian_src / "vocab.json").write_text(json.dumps(vocab))
    for name in ("source.spm", "target.spm"):
        shutil.copy(sp / "sp.model", marian_src / name)
    with warnings.catch_warnings():  # "Recommended: pip install sacremoses" (punctuation normalizer)
        warnings.simplefilter("ignore", UserWarning)
        marian_tok = transformers.MarianTokenizer(source_spm=str(marian_src / "source.spm"),
                                                  target_spm=str(marian_src / "target.spm"),
                                                  vocab=str(marian_src / "vocab.json"))

    m2m = dict(activation_function="relu", scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               decoder_start_token_id=2, **_SIZES)
    mbart = dict(scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                 **_SIZES)
    specs = {
        "nllb": (nllb_tok, "M2M100ForConditionalGeneration", "M2M100Config", m2m),
        "nllb_legacy": (legacy_tok, "M2M100ForConditionalGeneration", "M2M100Config", m2m),
        "m2m100": (m2m_tok, "M2M100ForConditionalGeneration", "M2M100Config", m2m),
        "mbart50": (mbart50_tok, "MBartForConditionalGeneration", "MBartConfig", mbart),
        "mbart": (mbart_tok, "MBartForConditionalGeneration", "MBartConfig", mbart),
        "marian": (marian_tok, "MarianMTModel", "MarianConfig",
                   dict(pad_token_id=1, eos_token_id=2, decoder_start_token_id=1, **_SIZES)),
    }
    for i, (name, (tok, model_class, config_class, config)) in enumerate(specs.items()):
        directory = root / name
        directory.mkdir()
        ids = [*tok.get_vocab().values(), *getattr(tok, "lang_code_to_id", {}).values()]
        vocab_size = max(ids) + 4  # (a model's vocabulary may be larger than its tokenizer's)
        model = save_random_model(directory, getattr(transformers, model_class),
                                  getattr(transformers, config_class)(vocab_size=vocab_size, **config), seed=50 + i,
                                  prepare=_peaky)
        tok.save_pretrained(directory)
        if name == "m2m100":
            _derived_tokenizer_json(nllb_tok, directory, [f"__{c}__" for c in M2M_CODES["m2m100"]],
                                    ["__en__", "$A", "</s>"], "M2M100Tokenizer")
        if name == "marian":
            _derived_tokenizer_json(nllb_tok, directory, [">>fra<<", ">>deu<<"], ["$A", "</s>"], "MarianTokenizer")
        assert (directory / "tokenizer.json").is_file()
        out[name] = (directory, model, tok)
    return out


# (model, src_lang, tgt_lang): the codes as transformers' tokenizers spell them.
CASES = [("nllb", "deu_Latn", "fra_Latn"), ("nllb_legacy", "deu_Latn", "fra_Latn"), ("m2m100", "de", "fr"),
         ("mbart50", "de_DE", "fr_XX"), ("mbart", "de_DE", "fr_XX")]


def _hf_tokens(model, tok, ids, forced):
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                             forced_bos_token_id=forced)
    return out[0, 1:].tolist()


def _hf_target(tok, tgt):
    return tok.get_lang_id(tgt) if isinstance(tok, transformers.M2M100Tokenizer) else tok.convert_tokens_to_ids(tgt)


def test_built_tokenizer_files_encode_as_transformers(dirs):
    for name in ("m2m100", "marian"):
        directory, _, tok = dirs[name]
        ours = cf.load(directory).tokenizer
        for text in TEXTS:
            assert ours.encode(text) == tok(text).input_ids, name
            assert ours.encode(text, add_special_tokens=False) == tok(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("name, src, tgt", CASES)
def test_source_ids_and_forced_token_are_transformers(dirs, name, src, tgt):
    directory, _, tok = dirs[name]
    s2s = cf.load(directory)
    tok.src_lang = src
    ids, kind, forced = apply_languages(s2s, TEXTS, tgt, src)
    assert kind == "strs" and ids == [tok(text).input_ids for text in TEXTS]
    assert forced == _hf_target(tok, tgt)
    # tgt_lang alone: the tokenizer's own source layout (tokenizer.json's post-processor)
    ids, _, forced = apply_languages(s2s, TEXTS[0], tgt, None)
    assert ids == [s2s.tokenizer.encode(TEXTS[0])] and forced == _hf_target(tok, tgt)


@pytest.mark.parametrize("name, src, tgt", CASES)
def test_generate_matches_transformers(dirs, name, src, tgt):
    directory, model, tok = dirs[name]
    s2s = cf.load(directory)
    tok.src_lang = src
    forced = _hf_target(tok, tgt)
    expected = [_hf_tokens(model, tok, tok(text).input_ids, forced) for text in TEXTS]
    assert expected[0][0] == forced
    results = s2s.generate(TEXTS, max_new_tokens=NEW, min_new_tokens=NEW, tgt_lang=tgt, src_lang=src,
                           return_scores=True)
    assert [r.token_ids for r in results] == expected
    texts = s2s.generate(TEXTS, max_new_tokens=NEW, min_new_tokens=NEW, tgt_lang=tgt, src_lang=src)
    assert texts == [s2s.tokenizer.decode(t) for t in expected]
    # token-id sources: tgt_lang forces the first token
    assert s2s.generate(tok(TEXTS[0]).input_ids, max_new_tokens=NEW, min_new_tokens=NEW,
                        tgt_lang=tgt) == [expected[0]]
    # one string gives one text
    assert s2s.generate(TEXTS[1], max_new_tokens=NEW, min_new_tokens=NEW, tgt_lang=tgt, src_lang=src) == texts[1]


def test_m2m100_long_codes(dirs):
    directory, _, tok = dirs["m2m100"]
    s2s = cf.load(directory)
    tok.src_lang = "de"
    ids, _, forced = apply_languages(s2s, TEXTS[0], "__fr__", "__de__")
    assert ids == [tok(TEXTS[0]).input_ids] and forced == tok.get_lang_id("fr")


def test_marian_target_token_prefix(dirs):
    directory, model, tok = dirs["marian"]
    s2s = cf.load(directory)
    for code in ("fra", ">>fra<<"):
        ids, _, forced = apply_languages(s2s, TEXTS, code, None)
        assert forced is None and ids == [tok(">>fra<< " + text).input_ids for text in TEXTS]
    expected = _hf_tokens(model, tok, tok(">>deu<< " + TEXTS[0]).input_ids, None)
    source = tok(TEXTS[0]).input_ids
    assert s2s.generate(source, max_new_tokens=NEW, min_new_tokens=NEW, tgt_lang="deu") == [expected]


def test_errors(dirs, tmp_path):
    nllb = cf.load(dirs["nllb"][0])
    with pytest.raises(ValueError, match=r"tgt_lang='xx_Yyyy' is not a language code of this model; its codes: "
                                         r"ace_Arab, .* \(202 codes\)"):
        nllb.generate(TEXTS[0], tgt_lang="xx_Yyyy")
    with pytest.raises(ValueError, match="src_lang='fr' is not a language code of this model; its codes: ace_Arab"):
        nllb.generate(TEXTS[0], tgt_lang="fra_Latn", src_lang="fr")
    with pytest.raises(ValueError, match="src_lang applies to string sources"):
        nllb.generate([5, 6, 7], src_lang="fra_Latn")
    with pytest.raises(TypeError, match="tgt_lang must be a language code string such as 'fra_Latn', got int"):
        nllb.generate(TEXTS[0], tgt_lang=7)
    with pytest.raises(TypeError, match="src_lang must be a language code string"):
        nllb.generate(TEXTS[0], src_lang=["fra_Latn"])
    with pytest.raises(ValueError, match="sources is empty"):
        nllb.generate([], src_lang="fra_Latn")
    marian = cf.load(dirs["marian"][0])
    with pytest.raises(ValueError, match="tgt_lang='en' is not a language code of this model; its codes: >>deu<<, "
                                         ">>fra<<$"):
        marian.generate(TEXTS[0], tgt_lang="en")
    with pytest.raises(ValueError, match="src_lang='fra': Marian models have no source-language token"):
        marian.generate(TEXTS[0], src_lang="fra")
    # a model whose vocabulary has no language codes
    plain = tmp_path / "plain"
    shutil.copytree(dirs["marian"][0], plain)
    tokenizer = json.loads((plain / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if not t["content"].startswith(">>")]
    (plain / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ValueError, match=r"tgt_lang='fra': this model's vocabulary has no language codes \(NLLB "
                                         r"fra_Latn, .*\); tgt_lang is for multilingual translation models"):
        cf.load(plain).generate(TEXTS[0], tgt_lang="fra")
    # no tokenizer files at all
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(dirs["nllb"][0] / file, bare / file)
    with pytest.raises(ValueError, match="tgt_lang needs the model's tokenizer files .* has none"):
        cf.load(bare).generate([5, 6, 7], tgt_lang="fra_Latn")
    # a tokenizer larger than the model
    small = tmp_path / "small"
    shutil.copytree(dirs["nllb"][0], small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 170  # below fra_Latn (177)
    (small / "config.json").write_text(json.dumps(config))
    model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**config))
    model.save_pretrained(small)
    with pytest.raises(ValueError, match=r"token id \d+ from the tokenizer is outside the model's vocabulary \(170\)"):
        cf.load(small).generate(TEXTS[0], tgt_lang="fra_Latn")


def _run_cli(*args):
    # the cpuformer these tests import (the installed one in CI, not necessarily the source tree's)
    environment = dict(os.environ)
    package = os.path.dirname(os.path.dirname(os.path.abspath(cf.__file__)))
    environment["PYTHONPATH"] = package + os.pathsep + environment.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "cpuformer", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=environment)


def test_cli_translate_languages(dirs):
    directory = dirs["nllb"][0]
    expected = cf.load(directory).generate(TEXTS, max_new_tokens=NEW, min_new_tokens=NEW, tgt_lang="fra_Latn",
                                           src_lang="deu_Latn")
    out = _run_cli("translate", directory, *TEXTS, "--max-new-tokens", NEW, "--min-new-tokens", NEW,
                   "--tgt-lang", "fra_Latn", "--src-lang", "deu_Latn")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [t.replace("\n", " ") for t in expected]
    out = _run_cli("translate", directory, TEXTS[0], "--tgt-lang", "xx_Yyyy")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("cpuformer translate: error: tgt_lang='xx_Yyyy' is not a language code")


def test_generation_config_forced_bos_is_overridden(dirs, tmp_path):
    """A generation_config.json forced_bos_token_id (NLLB checkpoints may carry one) yields to tgt_lang."""
    directory, model, tok = dirs["nllb"]
    copy = tmp_path / "nllb"
    shutil.copytree(directory, copy)
    settings = json.loads((copy / "generation_config.json").read_text())
    settings["forced_bos_token_id"] = tok.convert_tokens_to_ids("deu_Latn")
    (copy / "generation_config.json").write_text(json.dumps(settings))
    s2s = cf.load(copy)
    source = tok(TEXTS[0]).input_ids
    assert s2s.generate(source, max_new_tokens=2)[0][0] == tok.convert_tokens_to_ids("deu_Latn")
    assert s2s.generate(source, max_new_tokens=2, tgt_lang="fra_Latn")[0][0] == tok.convert_tokens_to_ids("fra_Latn")
    assert np.array_equal(s2s.generate(source, max_new_tokens=NEW, min_new_tokens=NEW, tgt_lang="fra_Latn"),
                          [_hf_tokens(model, tok, source, tok.convert_tokens_to_ids("fra_Latn"))])


def test_beam_search_with_languages(dirs):
    directory, model, tok = dirs["nllb"]
    tok.src_lang = "deu_Latn"
    forced = tok.convert_tokens_to_ids("spa_Latn")
    with torch.inference_mode():
        expected = model.generate(**tok(TEXTS, return_tensors="pt", padding=True), max_new_tokens=NEW,
                                  min_new_tokens=NEW, num_beams=3, do_sample=False,
                                  forced_bos_token_id=forced)[:, 1:].tolist()
    results = cf.load(directory).generate(TEXTS, max_new_tokens=NEW, min_new_tokens=NEW, num_beams=3,
                                          tgt_lang="spa_Latn", src_lang="deu_Latn", return_scores=True)
    assert [r.token_ids for r in results] == expected and all(t[0] == forced for t in expected)
