"""A small random BERT (built with transformers, saved as safetensors) shared by the reliability tests,
and a float64 NumPy reference forward pass over its weights."""

from __future__ import annotations

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Sizes exercise vector tails: head_dim 9, intermediate 33, hidden 27.
TINY_BERT = dict(vocab_size=61, hidden_size=27, num_hidden_layers=2, num_attention_heads=3, intermediate_size=33,
                 max_position_embeddings=24, type_vocab_size=2)


def build_bert(directory, seed=0, **overrides):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.BertConfig(**dict(TINY_BERT, **overrides))
    model = transformers.BertModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    weights = {name: t.detach().double().numpy() for name, t in model.state_dict().items()}
    return weights, config


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    """(directory, float64 weights by HF name, config) of a 2-layer random BERT."""
    directory = tmp_path_factory.mktemp("tiny_bert")
    weights, config = build_bert(directory)
    return str(directory), weights, config


_erf = np.frompyfunc(math.erf, 1, 1)


def _layer_norm(x, w, b, eps):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps) * w + b


def reference_forward(weights, config, ids, mask=None, token_types=None):
    """last_hidden_state [B, T, H] in float64, with cpuformer's convention that a query with no
    visible key gets a zero attention output (only padded queries of all-padding rows)."""
    W = weights
    ids = np.asarray(ids)
    B, T = ids.shape
    H, heads = config.hidden_size, config.num_attention_heads
    D = H // heads
    eps = config.layer_norm_eps
    mask = np.ones((B, T)) if mask is None else np.asarray(mask, dtype=np.float64)
    types = np.zeros((B, T), dtype=np.int64) if token_types is None else np.asarray(token_types)
    h = (W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][np.arange(T)]
         + W["embeddings.token_type_embeddings.weight"][types])
    h = _layer_norm(h, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
    additive = np.where(mask > 0, 0.0, -np.inf)[:, None, None, :]  # [B, 1, 1, Tk]
    for layer in range(config.num_hidden_layers):
        p = f"encoder.layer.{layer}."

        def dense(x, name, p=p):
            return x @ W[p + name + ".weight"].T + W[p + name + ".bias"]

        def split(x):
            return x.reshape(B, T, heads, D).transpose(0, 2, 1, 3)

        q, k, v = (split(dense(h, "attention.self." + n)) for n in ("query", "key", "value"))
        with np.errstate(invalid="ignore"):
            s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D) + additive
            m = s.max(axis=-1, keepdims=True)
            e = np.exp(s - m)
            prob = np.where(np.isneginf(m), 0.0, e / e.sum(axis=-1, keepdims=True))
        ctx = (prob @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        h = _layer_norm(dense(ctx, "attention.output.dense") + h, W[p + "attention.output.LayerNorm.weight"],
                        W[p + "attention.output.LayerNorm.bias"], eps)
        f = dense(h, "intermediate.dense")
        f = 0.5 * f * (1.0 + np.asarray(_erf(f / math.sqrt(2.0)), dtype=np.float64))
        h = _layer_norm(dense(f, "output.dense") + h, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"],
                        eps)
    return h
