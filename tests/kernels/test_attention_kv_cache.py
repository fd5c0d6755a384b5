"""Attention over a KV cache stored in float16, bfloat16 or int8 (kv_cache_dtype).

The kernels widen a block of keys and values at a time to float32 and then compute exactly as for
a float32 cache, so attention over a typed cache must give the bits that float32 attention gives
over the stored values widened back (``_attention_kv_cache`` returns both). The stored values
themselves are checked against the rounding rules: float16 and bfloat16 round to nearest even,
int8 keeps one scale per row (its largest magnitude / 127) and codes rounded to nearest. Runs at
every ISA level through tests/test_runtime.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpuformer import _core

KV_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}
# (B, H, Hkv, Tq, Tk, D): decode with GQA (the wide engine), MHA decode (the narrow engine), a
# verification pass of several queries, a prefill; head dims with vector tails (the narrow engine
# widens such blocks into scratch) and without (it reads the cache into registers): MHA decode at
# D = 64 and a narrow tile of 6 rows (3 queries × 2 heads per kv head) at D = 32.
SHAPES = [(1, 8, 1, 1, 200, 64), (2, 4, 4, 1, 77, 24), (1, 6, 2, 5, 130, 40), (2, 2, 2, 33, 33, 10),
          (2, 4, 4, 1, 77, 64), (1, 4, 2, 3, 50, 32)]


def _inputs(rng, shape):
    B, H, Hkv, Tq, Tk, D = shape
    q = rng.standard_normal((B, H, Tq, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32) * 3
    v = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
    return q, k, v


def _stored(x, dtype):
    """The rounding a cache of `dtype` applies to rows of x (float32)."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    scale = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    codes = np.rint(x * (np.float32(127) / np.abs(x).max(axis=-1, keepdims=True)))
    return (codes * scale).astype(np.float32)


@pytest.mark.parametrize("dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_typed_cache_gives_float32_attention_over_the_stored_values(rng, dtype, shape, causal):
    q, k, v = _inputs(rng, shape)
    out, k_stored, v_stored = _core._attention_kv_cache(q, k, v, KV_DTYPES[dtype], causal)
    np.testing.assert_allclose(k_stored, _stored(k, dtype), rtol=0, atol=1e-6 * np.abs(k).max())
    np.testing.assert_allclose(v_stored, _stored(v, dtype), rtol=0, atol=1e-6 * np.abs(v).max())
    B, H, Hkv, Tq, Tk, D = shape
    reference = np.zeros_like(out)
    _core._attention_views(q, np.ascontiguousarray(k_stored), np.ascontiguousarray(v_stored), reference, causal,
                           Tk - Tq, 0, None, float(1 / np.sqrt(np.float32(D))))
    np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_typed_cache_error_bound(rng, dtype):
    """The attention output's error against the float32 cache: float16 < 1e-3, bfloat16 and
    int8 < 2e-2 of the values' scale (docs/precision.md, "KV cache")."""
    q, k, v = _inputs(rng, (1, 8, 2, 1, 300, 64))
    exact = _core._attention_kv_cache(q, k, v, 0)[0]
    out = _core._attention_kv_cache(q, k, v, KV_DTYPES[dtype])[0]
    bound = {"float16": 1e-3, "bfloat16": 2e-2, "int8": 2e-2}[dtype]
    assert np.abs(out - exact).max() < bound * np.abs(v).max()


@pytest.mark.parametrize("dim", [8, 16])
def test_int8_rows_with_zeros_and_non_finite_values(rng, dim):
    q, k, v = _inputs(rng, (1, 2, 1, 1, 5, dim))
    k[0, 0, 1] = 0.0  # an all-zero key: scale 0, reads back as zeros
    v[0, 0, 3, 2] = np.inf  # a non-finite value: the row reads back as NaN, and so does the output
    out, k_stored, v_stored = _core._attention_kv_cache(q, k, v, KV_DTYPES["int8"])
    assert (k_stored[0, 0, 1] == 0).all()
    assert np.isnan(v_stored[0, 0, 3]).all()
    assert np.isnan(out).all()
    out, _, _ = _core._attention_kv_cache(q, k, np.nan_to_num(v, posinf=0.0), KV_DTYPES["int8"])
    assert np.isfinite(out).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("dim", [8, 16, 64])
def test_typed_cache_non_finite_value_of_a_key_only_the_last_query_sees(rng, dtype, dim):
    """A verification pass (3 queries, causal) over a cache whose last key's value row is inf
    (int8: NaN once stored): the queries that cannot see that key stay finite, and every row has
    the bits of float32 attention over the stored values (the exact pass of the narrow engine)."""
    q, k, v = _inputs(rng, (1, 4, 4, 3, 40, dim))
    v[:, :, -1] = np.inf
    out, k_stored, v_stored = _core._attention_kv_cache(q, k, v, KV_DTYPES[dtype], True)
    assert np.isfinite(out[:, :, :2]).all()
    assert not np.isfinite(out[:, :, 2]).all()
    reference = np.zeros_like(out)
    _core._attention_views(q, np.ascontiguousarray(k_stored), np.ascontiguousarray(v_stored), reference, True, 40 - 3,
                           0, None, float(1 / np.sqrt(np.float32(dim))))
    np.testing.assert_array_equal(out, reference)
