"""Hostile model directories: config values that would compute garbage (T5 relative-attention
buckets, a token-type table the config does not describe, contradictory aliased keys, token ids
that are not integers), bad generation_config.json ids and corrupt tokenizer files are refused at
load (or at the first use of the file) with a ValueError naming the file and the key."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _bench

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 40
SHAPES = {
    "encoder": dict(name="config-bert", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=32),
    "decoder": dict(name="config-gpt2", vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32),
    "seq2seq": dict(name="config-marian", vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                    max_position_embeddings=32),
}
T5 = dict(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=24, num_layers=1, num_heads=2, decoder_start_token_id=0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """NumPy-written GPT-2 / Marian / BERT directories with WordLevel tokenizers, and a DistilBERT
    saved by transformers."""
    root = tmp_path_factory.mktemp("config_validation")
    out = {kind: pathlib.Path(_bench.build_model(kind, shape, str(root / kind))) for kind, shape in SHAPES.items()}
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                                           max_position_embeddings=32)
    transformers.DistilBertModel(config).eval().save_pretrained(root / "distilbert")
    out["distilbert"] = root / "distilbert"
    return out


def variant(source: pathlib.Path, target: pathlib.Path, config=None, drop=(), generation=None, files=None):
    """A copy of the model directory ``source`` (weights linked) with config.json keys changed
    (``config``) or removed (``drop``), generation_config.json set to ``generation`` (a dict, or
    the raw text) and other files replaced by ``files`` {name: text}."""
    target.mkdir()
    for name in os.listdir(source):
        if not name.endswith(".json"):
            os.symlink(source / name, target / name)
        else:
            (target / name).write_bytes((source / name).read_bytes())
    settings = json.loads((target / "config.json").read_text())
    settings.update(config or {})
    for key in drop:
        settings.pop(key)
    (target / "config.json").write_text(json.dumps(settings))
    if generation is not None:
        text = generation if isinstance(generation, str) else json.dumps(generation)
        (target / "generation_config.json").write_text(text)
    for name, text in (files or {}).items():
        (target / name).write_text(text)
    return target


# ---- T5 relative attention ---------------------------------------------------------------------

def _t5(directory, **changes):
    torch.manual_seed(1)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**dict(T5, **changes))).eval()
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("buckets, distance, message", [
    (2, 128, r"'relative_attention_num_buckets' must be an integer >= 4 \(the encoder's bidirectional buckets "
             r"need num_buckets // 4 >= 1\), got 2"),
    (3, 128, r"'relative_attention_num_buckets' must be an integer >= 4 .*, got 3"),
    # below num_buckets / 4: the encoder's log-spaced buckets go negative (reads before the table)
    (16, 3, r"'relative_attention_max_distance' must be an integer >= 9 \(more than "
            r"relative_attention_num_buckets // 2 = 8, the decoder's exactly bucketed distances\), got 3"),
    # == num_buckets // 2: the decoder's log(max_distance / max_exact) is 0 (NaN buckets)
    (16, 8, r"'relative_attention_max_distance' must be an integer >= 9 .*, got 8"),
], ids=["two_buckets", "three_buckets", "distance_below_quarter", "distance_half"])
def test_t5_relative_attention_buckets(tmp_path, buckets, distance, message):
    _t5(tmp_path, relative_attention_num_buckets=buckets, relative_attention_max_distance=distance)
    with pytest.raises(ValueError, match="^config.json: " + message):
        cf.load(tmp_path)


def test_t5_smallest_valid_buckets_match_transformers(tmp_path):
    """The bounds refuse nothing that works: with 4 buckets, max_distance 2 is refused and 3 (the
    smallest allowed) gives transformers' numbers over distances far beyond max_distance."""
    _t5(tmp_path / "refused", relative_attention_num_buckets=4, relative_attention_max_distance=2)
    with pytest.raises(ValueError, match=r"'relative_attention_max_distance' must be an integer >= 3 .*, got 2"):
        cf.load(tmp_path / "refused")
    model = _t5(tmp_path, relative_attention_num_buckets=4, relative_attention_max_distance=3)
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(1, 12))
    target = np.random.default_rng(1).integers(1, VOCAB, size=(1, 9))
    with torch.no_grad():
        reference = model(input_ids=torch.tensor(ids), decoder_input_ids=torch.tensor(target)).logits.numpy()
    with cf.load(tmp_path) as s2s:
        ours = s2s.logits(ids, target)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4 * max(1.0, float(np.abs(reference).max())))


# ---- BERT token types --------------------------------------------------------------------------

@pytest.mark.parametrize("type_vocab_size", [0, 3])
def test_type_vocab_size_against_the_checkpoint(base, tmp_path, type_vocab_size):
    directory = variant(base["encoder"], tmp_path / "bert", config={"type_vocab_size": type_vocab_size})
    with pytest.raises(ValueError, match=rf"^config.json: 'type_vocab_size' gives {type_vocab_size} rows, but "
                                         r"the checkpoint's embeddings.token_type_embeddings.weight has shape "
                                         r"\[2, 16\] \(expected type_vocab_size × \[16\]\)"):
        cf.load(directory)


# ---- aliased keys ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, key, alias", [
    ("distilbert", "dim", "hidden_size"), ("distilbert", "n_layers", "num_hidden_layers"),
    ("distilbert", "n_heads", "num_attention_heads"),
    ("decoder", "n_embd", "hidden_size"), ("decoder", "n_positions", "max_position_embeddings"),
    ("decoder", "n_head", "num_attention_heads"), ("decoder", "n_layer", "num_hidden_layers"),
    ("seq2seq", "d_model", "hidden_size"), ("seq2seq", "encoder_attention_heads", "num_attention_heads"),
    ("seq2seq", "encoder_layers", "num_hidden_layers"),
])
def test_contradictory_aliases(base, tmp_path, kind, key, alias):
    value = json.loads((base[kind] / "config.json").read_text())[key]
    directory = variant(base[kind], tmp_path / "contradicts", config={alias: value * 2})
    with pytest.raises(ValueError, match=rf"^config.json: '{key}' \({value}\) and '{alias}' \({value * 2}\) name the "
                                         "same setting but differ; keep one of them$"):
        cf.load(directory)
    cf.load(variant(base[kind], tmp_path / "agrees", config={alias: value})).close()  # the same value is fine


def test_alias_alone_is_used(base, tmp_path):
    """DistilBERT's config written with hidden_size instead of dim (as transformers' attribute_map
    allows) gives the same model, not a 768-wide default."""
    with cf.load(base["distilbert"]) as enc:
        expected = enc([[1, 2, 3]])
    directory = variant(base["distilbert"], tmp_path / "alias", config={"hidden_size": 16, "num_attention_heads": 2},
                        drop=("dim", "n_heads"))
    with cf.load(directory) as enc:
        np.testing.assert_array_equal(enc([[1, 2, 3]]), expected)


# ---- token ids in config.json and generation_config.json ---------------------------------------

NOT_IDS = [2.0, "abc", [[1]], {}, True, [1, "2"], 2 ** 64]


@pytest.mark.parametrize("value", NOT_IDS)
@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
@pytest.mark.parametrize("file", ["config.json", "generation_config.json"])
def test_eos_token_id_must_be_integers(base, tmp_path, kind, file, value):
    key = "eos_token_id"
    directory = (variant(base[kind], tmp_path / "m", config={key: value}) if file == "config.json" else
                 variant(base[kind], tmp_path / "m", generation={key: value}))
    with pytest.raises(ValueError, match=rf"^{file}: '{key}' must be a token id or a list of token ids \(integers "
                                         r"within int64\), got "):
        cf.load(directory)


@pytest.mark.parametrize("key, value, message", [
    ("pad_token_id", 2 ** 64, r"'pad_token_id' must be a token id or a list of token ids \(integers within int64\)"),
    ("pad_token_id", "x", r"'pad_token_id' must be a token id"),
    ("decoder_start_token_id", 2 ** 64, rf"'decoder_start_token_id' must be a token id or a list of token ids "
                                        rf"\(integers in \[0, {VOCAB}\)\), got {2 ** 64}"),
    ("decoder_start_token_id", VOCAB, rf"'decoder_start_token_id' must be .*\[0, {VOCAB}\)\), got {VOCAB}"),
    ("decoder_start_token_id", 1.0, r"'decoder_start_token_id' must be a token id"),
    ("forced_bos_token_id", 2 ** 64, rf"'forced_bos_token_id' must be a token id \(an integer in \[0, {VOCAB}\)\)"),
    ("forced_bos_token_id", [1], r"'forced_bos_token_id' must be a token id \(an integer"),
    ("forced_bos_token_id", -1, r"'forced_bos_token_id' must be a token id"),
    ("forced_eos_token_id", [], r"'forced_eos_token_id' must be one token id \(or a list of one\), got \[\]"),
    ("forced_eos_token_id", "abc", r"'forced_eos_token_id' must be a token id or a list of token ids"),
    ("bad_words_ids", [[2 ** 64]], rf"'bad_words_ids' must be a list of non-empty lists of token ids \(integers in "
                                   rf"\[0, {VOCAB}\)\), got \[\[{2 ** 64}\]\]"),
    ("bad_words_ids", [1], r"'bad_words_ids' must be a list of non-empty lists of token ids"),
    ("bad_words_ids", [[]], r"'bad_words_ids' must be a list of non-empty lists of token ids"),
    ("bad_words_ids", "x", r"'bad_words_ids' must be a list of non-empty lists of token ids"),
])
def test_seq2seq_generation_ids(base, tmp_path, key, value, message):
    directory = variant(base["seq2seq"], tmp_path / "m", generation={key: value})
    with pytest.raises(ValueError, match="^generation_config.json: " + message):
        cf.load(directory)


@pytest.mark.parametrize("key, value, message", [
    ("forced_eos_token_id", [3, 4], r"'forced_eos_token_id' must be one token id \(or a list of one\), got \[3, 4\]"),
    ("decoder_start_token_id", [1, 2], r"'decoder_start_token_id' lists different start tokens \[1, 2\]"),
])
def test_seq2seq_generation_ids_not_supported(base, tmp_path, key, value, message):
    directory = variant(base["seq2seq"], tmp_path / "m", generation={key: value})
    with pytest.raises(NotImplementedError, match="^generation_config.json: " + message):
        cf.load(directory)


def test_seq2seq_generation_ids_lists_of_one(base, tmp_path):
    """A one-element list means that id, as in transformers; an empty forced-eos list forces
    nothing and is refused."""
    with pytest.raises(ValueError, match="forced_eos_token_id' must be one token id"):
        cf.load(variant(base["seq2seq"], tmp_path / "empty", generation={"forced_eos_token_id": []}))
    with cf.load(base["seq2seq"]) as s2s:
        expected = s2s.generate([[5, 6, 7]], max_new_tokens=4)
        start, forced_eos = s2s.decoder_start_token_id, s2s.forced_eos_token_id
    directory = variant(base["seq2seq"], tmp_path / "m", generation={
        "decoder_start_token_id": [start], "forced_eos_token_id": [forced_eos], "eos_token_id": [0],
        "pad_token_id": start, "bad_words_ids": [[start]]})
    with cf.load(directory) as s2s:
        assert s2s.generate([[5, 6, 7]], max_new_tokens=4) == expected


# ---- tokenizer files ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", ['{"x": 1}', "{nope", "[]", ""])
def test_corrupt_tokenizer_json(base, tmp_path, text):
    pattern = r"tokenizer.json: not a valid tokenizer file \(.+\)$"
    with cf.load(variant(base["decoder"], tmp_path / "gen", files={"tokenizer.json": text})) as gen:
        with pytest.raises(ValueError, match=pattern):
            gen.generate("t1 t2", max_new_tokens=2)
        assert gen.generate([[1, 2]], max_new_tokens=2)  # token ids need no tokenizer
    with cf.load(variant(base["encoder"], tmp_path / "enc", files={"tokenizer.json": text})) as enc:
        with pytest.raises(ValueError, match=pattern):
            enc.embed(["t1 t2"])
    with cf.load(variant(base["seq2seq"], tmp_path / "s2s", files={"tokenizer.json": text})) as s2s:
        with pytest.raises(ValueError, match=pattern):
            s2s.generate(["t1 t2"], max_new_tokens=2)


@pytest.mark.parametrize("file, key", [("tokenizer_config.json", "model_max_length"),
                                       ("sentence_bert_config.json", "max_seq_length")])
@pytest.mark.parametrize("text, message", [
    ("[1]", r"must contain a JSON object, got list"),
    ("{nope", r"invalid JSON"),
    ('{"KEY": "x"}', r"'KEY' must be an integer >= 1, got 'x'"),
    ('{"KEY": 0}', r"'KEY' must be an integer >= 1, got 0"),
])
def test_corrupt_tokenizer_side_files(base, tmp_path, file, key, text, message):
    directory = variant(base["encoder"], tmp_path / "enc", files={file: text.replace("KEY", key)})
    with cf.load(directory) as enc:
        with pytest.raises(ValueError, match=f"{file}: " + message.replace("KEY", key)):
            enc.embed(["t1 t2"])


def test_tokenizer_side_file_limits_apply(base, tmp_path):
    """Valid limits still truncate (the largest, transformers' 1e30 "no limit", changes nothing);
    an invalid one is an error, not ignored."""
    refused = variant(base["encoder"], tmp_path / "refused",
                      files={"sentence_bert_config.json": '{"max_seq_length": -5}'})
    with cf.load(refused) as enc, pytest.raises(ValueError, match="'max_seq_length' must be an integer >= 1, got -5"):
        _ = enc.max_tokens
    directory = variant(base["encoder"], tmp_path / "enc", files={
        "tokenizer_config.json": '{"model_max_length": 1000000000000000019884624838656}',
        "sentence_bert_config.json": '{"max_seq_length": 5}'})
    with cf.load(directory) as enc:
        assert enc.max_tokens == 5
