"""The attention kernel with bfloat16 products (AttentionArgs::bf16_products, which int8 / int4
encoders set) against a float64 reference on bfloat16-rounded operands.

On a CPU with AVX512-BF16, at the avx512 level, the query-block engine rounds q · scale · log2(e),
k, v and the unnormalised probabilities to bfloat16 and sums their exact products in float32
(vdpbf16ps). The reference rounds q, k and v the same way and computes the rest in float64, so what
remains is the probabilities' rounding (at most 2^-9 of each, i.e. 2^-9 · max|v| in the output) and
float32 summation. Everywhere else (other levels, the extension hidden, shapes the engine does not
take) the flag must change nothing: the output is bit for bit the float32 kernel's.
With AMX-BF16 and head_dim a multiple of 32 both products run on TDPBF16PS tiles instead, with the
same operands (float32 sums in the tiles' order, the same bound); test_without_amx_tiles reruns this
file with AMX-BF16 hidden, for vdpbf16ps at those shapes. test_without_bf16_products reruns it with
AVX512-BF16 hidden.
"""

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core, ops

from ._reference import rerun_with_features_hidden
from .test_attention import reference

LOG2E = np.float32(1.4426950408889634)


def bf16_engine():
    info = cf.cpu_info()
    return info["isa"] == "avx512" and "avx512_bf16" in info["features"]


def as_bfloat16(x):
    return (ops.to_bfloat16_bits(np.ascontiguousarray(x, dtype=np.float32)).astype(np.uint32) << 16).view(np.float32)


def views(q, k, v, bf16, causal=False, offset=0, window=0, mask=None):
    out = np.full(q.shape, np.nan, dtype=np.float32)
    _core._attention_views(q, k, v, out, causal, offset, window, mask, float(1.0 / np.sqrt(q.shape[3])), bf16)
    return out


def engine_takes(q, k):
    """Whether the bfloat16 engine serves this call (attention.h: head_dim a multiple of 16, a full
    tile of query rows per (batch, kv head))."""
    group = q.shape[1] // k.shape[1]
    return bf16_engine() and q.shape[3] % 16 == 0 and q.shape[2] * group >= 16


def check(q, k, v, **options):
    plain = views(q, k, v, False, **options)
    out = views(q, k, v, True, **options)
    if not engine_takes(q, k):
        np.testing.assert_array_equal(out, plain)
        return
    scale = np.float32(1.0 / np.sqrt(q.shape[3]))
    q_rounded = as_bfloat16(q * (scale * LOG2E)).astype(np.float64) / float(LOG2E)  # what the kernel multiplies
    ref = reference(q_rounded, as_bfloat16(k), as_bfloat16(v), scale=1.0, causal=options.get("causal", False),
                    causal_offset=options.get("offset"), window=options.get("window", 0), mask=options.get("mask"))
    error = np.abs(out.astype(np.float64) - ref).max()
    bound = 2.0**-9 * np.abs(v).max() + 1e-5 * np.abs(ref).max() + 1e-6
    assert error <= bound, f"max abs error {error:.3g} > {bound:.3g}"
    # and it is not the float32 kernel (the rounding is visible), nor far from it
    assert not np.array_equal(out, plain)
    assert np.abs(out - plain).max() <= 0.05 * np.abs(plain).max()


# (B, H, Hkv, Tq, Tk, D): BERT's head (64) and others, GQA, odd key counts (a zero padding key),
# partial query tiles, key counts around the 32-key block; D 17 and too few rows use float32.
SHAPES = [
    (2, 12, 12, 128, 128, 64),
    (1, 4, 4, 33, 33, 64),
    (1, 4, 2, 40, 37, 32),
    (1, 2, 2, 17, 5, 16),
    (1, 2, 2, 16, 16, 48),
    (1, 1, 1, 130, 129, 128),
    (2, 8, 2, 3, 65, 64),
    (1, 2, 2, 8, 40, 64),
    (1, 2, 2, 33, 40, 17),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_bf16_products(rng, shape):
    b, h, hkv, tq, tk, d = shape
    q = rng.standard_normal((b, h, tq, d), dtype=np.float32)
    k = rng.standard_normal((b, hkv, tk, d), dtype=np.float32)
    v = rng.standard_normal((b, hkv, tk, d), dtype=np.float32)
    check(q, k, v)


@pytest.mark.parametrize("causal,offset,window", [(True, 0, 0), (True, 5, 9), (False, 0, 7), (False, 3, 20)])
def test_bf16_products_causal_and_window(rng, causal, offset, window):
    # Windows start rows' key ranges at odd keys: key pairs straddle the range.
    q, k, v = (rng.standard_normal((1, 4, 48, 64), dtype=np.float32) for _ in range(3))
    check(q, k, v, causal=causal, offset=offset, window=window)


def test_bf16_products_padding_mask(rng):
    # Per-sequence key padding as the encoder passes it ([B, 1, 1, T] broadcast), with an odd
    # number of masked keys at the start of one sequence and at the end of the other.
    q, k, v = (rng.standard_normal((2, 4, 40, 64), dtype=np.float32) for _ in range(3))
    mask = np.zeros((2, 1, 1, 40), dtype=np.float32)
    mask[0, ..., 33:] = -np.inf
    mask[1, ..., :3] = -np.inf
    check(q, k, v, mask=np.broadcast_to(mask, (2, 4, 40, 40)))


def test_bf16_products_removed_nonfinite_values(rng):
    # A removed key shares a bfloat16 key pair with a visible one (its probability is 0 there): its
    # NaN / inf value must not reach any row (the tile is recomputed exactly, docs/reliability.md).
    q, k, v = (rng.standard_normal((1, 2, 32, 64), dtype=np.float32) for _ in range(3))
    v[0, 0, 2] = np.nan
    v[0, 1, 2] = np.inf
    mask = np.zeros((1, 1, 1, 32), dtype=np.float32)
    mask[..., :3] = -np.inf  # keys 0..2 removed: rows start at key 3, pairing it with key 2
    mask = np.broadcast_to(mask, (1, 2, 32, 32))
    out = views(q, k, v, True, mask=mask)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, views(q, k, v, False, mask=mask), rtol=0, atol=0.05)


def test_bf16_products_nonfinite_value_past_the_last_block(rng):
    # Causal grouped-query attention with 16 query heads on one kv head: a tile is one query
    # position's 16 heads, which all see keys 0..i and nothing past them, so no key of its last
    # block is removed; with AMX-BF16 a tile step still spans 32 keys (probability 0 past the
    # block). A NaN / inf value of key 20 must reach positions 20.. and no other.
    q = rng.standard_normal((1, 16, 48, 64), dtype=np.float32)
    k, v = (rng.standard_normal((1, 1, 48, 64), dtype=np.float32) for _ in range(2))
    for bad in (np.nan, np.inf):
        v[0, 0, 20] = bad
        out = views(q, k, v, True, causal=True)
        plain = views(q, k, v, False, causal=True)
        assert np.all(np.isfinite(out[:, :, :20]))
        np.testing.assert_allclose(out[:, :, :20], plain[:, :, :20], rtol=0, atol=0.05)
        assert np.array_equal(np.isfinite(out), np.isfinite(plain))


def test_bf16_products_nan_in_visible_value_reaches_its_rows(rng):
    q, k, v = (rng.standard_normal((1, 1, 16, 16), dtype=np.float32) for _ in range(3))
    v[0, 0, 5, 3] = np.nan
    out = views(q, k, v, True)
    assert np.all(np.isnan(out[..., 3]))


def test_without_bf16_products():
    # The same tests with AVX512-BF16 hidden: the flag must then change nothing.
    info = rerun_with_features_hidden(__file__, "avx512_bf16", "without_bf16")
    assert "avx512_bf16" not in info


@pytest.mark.skipif("amx_bf16" not in cf.cpu_info()["features"] or cf.cpu_info()["isa"] != "avx512",
                    reason="no AMX-BF16 at the avx512 level here")
def test_without_amx_tiles():
    # The same tests with AMX-BF16 hidden: vdpbf16ps serves the shapes the tiles took.
    info = rerun_with_features_hidden(__file__, "amx_bf16", "without")
    assert "amx_bf16" not in info and "avx512_bf16" in info
