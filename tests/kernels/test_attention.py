"""cpuformer.ops.attention and the kernel's strided entry point against a float64 NumPy reference.

Tolerance: max |out − ref| ≤ 1e-5 · max |ref| + 1e-6 (float32 scores and online softmax against
float64 with an explicit softmax). Runs at every ISA level through tests/test_runtime.py.
"""

import re

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core, ops

NEG_INF = -np.inf


def reference(q, k, v, causal=False, mask=None, scale=None, causal_offset=None, window=0):
    """softmax(scale · q·kᵀ + mask) · v in float64; rows that see no key give zeros."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    _, heads, q_len, dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if mask is not None:
        if mask.dtype == np.bool_:
            mask = np.where(mask, 0.0, NEG_INF)
        scores = scores + mask.astype(np.float64)
    if causal:
        offset = kv_len - q_len if causal_offset is None else causal_offset
        i = np.arange(q_len)[:, None]
        j = np.arange(kv_len)[None, :]
        visible = j <= i + offset
        if window > 0:
            visible &= j > i + offset - window
        scores = np.where(visible, scores, NEG_INF)
    elif window > 0:  # bidirectional window: keys within window - 1 positions on both sides
        offset = 0 if causal_offset is None else causal_offset
        i = np.arange(q_len)[:, None]
        j = np.arange(kv_len)[None, :]
        scores = np.where(np.abs(j - (i + offset)) < window, scores, NEG_INF)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - row_max)
    total = weights.sum(axis=-1, keepdims=True)
    probabilities = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return np.einsum("bhij,bhjd->bhid", probabilities, v)


def assert_close(out, ref):
    assert out.dtype == np.float32
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out))
    error = np.abs(out.astype(np.float64) - ref).max()
    bound = 1e-5 * np.abs(ref).max() + 1e-6
    assert error <= bound, f"max abs error {error:.3g} > {bound:.3g}"


def make_qkv(rng, batch, heads, kv_heads, q_len, kv_len, dim):
    q = rng.standard_normal((batch, heads, q_len, dim), dtype=np.float32)
    k = rng.standard_normal((batch, kv_heads, kv_len, dim), dtype=np.float32)
    v = rng.standard_normal((batch, kv_heads, kv_len, dim), dtype=np.float32)
    return q, k, v


# (B, H, Hkv, Tq, Tk, D): every D in {1, 3, 7, 17, 33, 64, 65, 128} (and below) and Tq/Tk in
# {1, 3, 7, 17, 33, 65, 127}; MHA, GQA 8/2 and 32/4; query tiles full, partial and single rows.
SHAPES = [
    (1, 1, 1, 1, 1, 1),
    (2, 3, 3, 3, 7, 3),
    (1, 2, 2, 7, 17, 7),
    (2, 2, 1, 17, 33, 17),
    (1, 4, 4, 33, 65, 33),
    (2, 2, 2, 65, 127, 64),
    (1, 2, 2, 127, 33, 65),
    (1, 2, 1, 17, 65, 128),
    (1, 8, 2, 1, 127, 64),
    (2, 8, 2, 7, 33, 65),
    (1, 8, 2, 33, 17, 17),
    (1, 32, 4, 1, 65, 64),
    (1, 32, 4, 3, 127, 128),
    (3, 6, 2, 5, 19, 7),
    (1, 3, 1, 9, 23, 33),
    # D whose last partial chunk of the P·V tile needs 4 vectors (kPvVecs = 4): 50, 60, 120 at
    # AVX-512 (16 lanes), 13, 30 at NEON (4 lanes)
    (2, 2, 2, 1, 70, 50),
    (1, 4, 2, 5, 33, 60),
    (1, 8, 2, 3, 40, 120),
    (1, 2, 2, 1, 33, 13),
    (1, 4, 2, 6, 40, 30),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(rng, shape, causal):
    q, k, v = make_qkv(rng, *shape)
    assert_close(ops.attention(q, k, v, causal=causal), reference(q, k, v, causal=causal))


@pytest.mark.parametrize("shape", [(1, 2, 1, 1, 4097, 64), (1, 1, 1, 3, 4097, 17), (2, 8, 2, 1, 4097, 65)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
def test_long_key_range(rng, shape, causal):
    # Few (batch, kv head) pairs and a long key range: the keys are split across tasks and merged.
    q, k, v = make_qkv(rng, *shape)
    assert_close(ops.attention(q, k, v, causal=causal), reference(q, k, v, causal=causal))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_counts(rng, threads):
    before = cf.get_num_threads()
    try:
        cf.set_num_threads(threads)
        for shape in [(1, 8, 2, 1, 2053, 64), (2, 4, 4, 70, 70, 32)]:
            q, k, v = make_qkv(rng, *shape)
            assert_close(ops.attention(q, k, v, causal=True), reference(q, k, v, causal=True))
    finally:
        cf.set_num_threads(before)


@pytest.mark.parametrize("shape", [(64, 8, 8, 1, 16, 64), (16, 8, 8, 4, 24, 64), (37, 3, 3, 1, 5, 17),
                                   (9, 4, 2, 1, 3, 128)], ids=lambda s: "x".join(map(str, s)))
def test_many_small_items_in_chunks(rng, shape):
    # Beam-search / batched decode steps: hundreds of one-row tiles over short caches, which the
    # threads take in chunks. Every thread count gives the reference, and the same bits.
    q, k, v = make_qkv(rng, *shape)
    before = cf.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            cf.set_num_threads(threads)
            outs.append(ops.attention(q, k, v))
    finally:
        cf.set_num_threads(before)
    assert_close(outs[0], reference(q, k, v))
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_causal_prefill_against_decode(rng):
    # Causal aligned to the end: the last Tq rows of a Tk-long causal prefill.
    q, k, v = make_qkv(rng, 1, 4, 2, 40, 40, 64)
    full = ops.attention(q, k, v, causal=True)
    for q_len in (1, 5):
        part = ops.attention(np.ascontiguousarray(q[:, :, -q_len:]), k, v, causal=True)
        np.testing.assert_allclose(part, full[:, :, -q_len:], rtol=0, atol=1e-5)


def test_one_key_gives_its_value(rng):
    q, k, v = make_qkv(rng, 2, 4, 2, 3, 1, 9)
    np.testing.assert_allclose(ops.attention(q, k, v), np.repeat(v, 2, axis=1).repeat(3, axis=2), rtol=1e-6)


MASK_SHAPES = {
    "key [Tk]": lambda b, h, i, j: (j,),
    "key [1,1,1,Tk]": lambda b, h, i, j: (1, 1, 1, j),
    "padding [B,1,1,Tk]": lambda b, h, i, j: (b, 1, 1, j),
    "full [B,H,Tq,Tk]": lambda b, h, i, j: (b, h, i, j),
    "bias [1,H,Tq,Tk]": lambda b, h, i, j: (1, h, i, j),
    "rows [Tq,Tk]": lambda b, h, i, j: (i, j),
    "per head [B,H,1,Tk]": lambda b, h, i, j: (b, h, 1, j),
    "per query [B,1,Tq,1]": lambda b, h, i, j: (b, 1, i, 1),
}


@pytest.mark.parametrize("shape", [(2, 4, 4, 17, 33, 64), (2, 8, 2, 1, 65, 17), (1, 4, 2, 33, 300, 7)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", list(MASK_SHAPES))
def test_float_mask_broadcasts(rng, shape, causal, mask_kind):
    q, k, v = make_qkv(rng, *shape)
    b, h, _, i, j, _ = shape
    mask = rng.standard_normal(MASK_SHAPES[mask_kind](b, h, i, j)).astype(np.float32) * 2
    assert_close(ops.attention(q, k, v, causal=causal, mask=mask), reference(q, k, v, causal=causal, mask=mask))


@pytest.mark.parametrize("shape", [(2, 4, 4, 17, 33, 64), (3, 8, 2, 1, 70, 32), (2, 2, 2, 2, 1000, 16),
                                   (3, 1, 1, 1, 3000, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("side", ["right", "left"])
def test_key_padding_with_inf(rng, shape, side):
    # Padded keys at either end are skipped (not visited at all), with or without key splits.
    q, k, v = make_qkv(rng, *shape)
    b, _, _, _, kv_len, _ = shape
    lengths = rng.integers(1, kv_len + 1, size=b)
    lengths[0] = kv_len
    positions = np.arange(kv_len)[None, :]
    keep = positions < lengths[:, None] if side == "right" else positions >= kv_len - lengths[:, None]
    mask = np.where(keep, 0.0, NEG_INF).astype(np.float32)[:, None, None, :]
    out = ops.attention(q, k, v, mask=mask)
    assert_close(out, reference(q, k, v, mask=mask))
    # Keys behind -inf have no influence at all: changing them changes nothing.
    hidden = ~keep[:, None, :, None]
    k2, v2 = np.where(hidden, np.float32(1e3), k), np.where(hidden, np.float32(-1e3), v)
    np.testing.assert_array_equal(ops.attention(q, k2, v2, mask=mask), out)


@pytest.mark.parametrize("shape", [(2, 4, 4, 17, 33, 64), (2, 8, 2, 1, 65, 17)], ids=lambda s: "x".join(map(str, s)))
def test_bool_mask(rng, shape):
    q, k, v = make_qkv(rng, *shape)
    b, h, _, i, j, _ = shape
    keep = rng.random((b, 1, i, j)) < 0.6
    keep[..., 0] = True
    assert_close(ops.attention(q, k, v, mask=keep), reference(q, k, v, mask=keep))


@pytest.mark.parametrize("shape", [(2, 4, 4, 17, 33, 64), (2, 8, 2, 1, 65, 17), (1, 1, 1, 2, 5000, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fully_masked_rows_give_zeros(rng, shape):
    q, k, v = make_qkv(rng, *shape)
    b, h, _, i, j, _ = shape
    keep = rng.random((b, h, i, j)) < 0.5
    keep[0, 0, 0] = False  # a row that sees nothing
    keep[-1, -1, -1] = False
    keep[-1, -1, -1, j // 2] = True  # a row that sees exactly one key
    out = ops.attention(q, k, v, mask=keep)
    assert_close(out, reference(q, k, v, mask=keep))
    assert np.all(out[0, 0, 0] == 0)
    assert np.all(ops.attention(q, k, v, mask=np.zeros((1, 1, 1, j), dtype=bool)) == 0)


def test_causal_with_fewer_keys_than_queries_gives_zero_rows(rng):
    # Tk < Tq with end alignment: the first Tq − Tk rows see no key.
    q, k, v = make_qkv(rng, 1, 2, 2, 9, 4, 16)
    out = ops.attention(q, k, v, causal=True)
    assert_close(out, reference(q, k, v, causal=True))
    assert np.all(out[:, :, :5] == 0) and np.all(np.abs(out[:, :, 5:]).max(axis=-1) > 0)


@pytest.mark.parametrize("scale", [0.0, 0.05, 1.0, -0.3])
def test_custom_scale(rng, scale):
    q, k, v = make_qkv(rng, 2, 4, 2, 7, 65, 33)
    assert_close(ops.attention(q, k, v, scale=scale), reference(q, k, v, scale=scale))


def test_large_scores_and_large_negative_mask(rng):
    # Peaked softmax (scores in the hundreds) and HF-style finfo.min masking stay finite and exact.
    q, k, v = make_qkv(rng, 2, 4, 4, 17, 40, 64)
    mask = np.zeros((2, 1, 1, 40), dtype=np.float32)
    mask[0, ..., 30:] = np.finfo(np.float32).min
    assert_close(ops.attention(q, k, v, mask=mask, scale=2.0), reference(q, k, v, mask=mask, scale=2.0))
    everything = np.full((1, 1, 1, 40), np.finfo(np.float32).min, dtype=np.float32)
    assert_close(ops.attention(q, k, v, mask=everything), reference(q, k, v, mask=everything))


def test_non_contiguous_inputs(rng):
    base = rng.standard_normal((2, 21, 3, 4, 16), dtype=np.float32)  # [B, T, 3, H, D]
    q, k, v = (base[:, :, n].transpose(0, 2, 1, 3) for n in range(3))
    assert not q.flags.c_contiguous
    mask = np.asfortranarray(rng.standard_normal((2, 4, 21, 21)).astype(np.float32))
    out = ops.attention(q, k, v, causal=True, mask=mask)
    assert_close(out, reference(q, k, v, causal=True, mask=mask))


def _views(rng):
    """q, k, v views with a contiguous last dimension: a fused projection's transposed slice, a
    preallocated cache sliced to its length, reversed keys, a broadcast (zero-stride) key axis."""
    qkv = rng.standard_normal((2, 9, 3 * 4, 16), dtype=np.float32)  # [B, T, 3·H, D]
    cache = rng.standard_normal((2, 2, 2, 64, 16), dtype=np.float32)  # [k|v, B, Hkv, Tmax, D]
    row = rng.standard_normal((2, 2, 1, 16), dtype=np.float32)
    q, k, v = (qkv[:, :, n * 4:(n + 1) * 4].transpose(0, 2, 1, 3) for n in range(3))
    return [
        (q, k, v),
        (q, cache[0, :, :, :30], cache[1, :, :, :30]),
        (q, cache[0, :, :, 40:10:-1], cache[1, :, :, 59:29:-1]),
        (q, np.broadcast_to(row, (2, 2, 30, 16)), cache[1, :, :, :30]),
    ]


@pytest.mark.parametrize("case", range(4))
def test_views_with_a_contiguous_last_dimension_give_the_copies_bits(rng, case):
    q, k, v = _views(rng)[case]
    assert not (q.flags.c_contiguous and k.flags.c_contiguous and v.flags.c_contiguous)
    out = ops.attention(q, k, v, causal=True)
    expected = ops.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), causal=True)
    np.testing.assert_array_equal(out, expected)
    assert_close(out, reference(q, k, v, causal=True))


def test_views_are_read_in_place(rng):
    # A cache of 64 MB sliced to 4,000 of its 8,192 positions is read where it lies: the call
    # allocates its output (and scratch below a MB), not a copy of the keys and values.
    import tracemalloc

    cache = np.zeros((2, 1, 2, 8192, 512), dtype=np.float32)
    k, v = cache[0, :, :, :4000], cache[1, :, :, :4000]
    q = rng.standard_normal((1, 8, 1, 512), dtype=np.float32)
    ops.attention(q, k, v)
    tracemalloc.start()
    try:
        ops.attention(q, k, v)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


# ---- the kernel on views, as the models call it (cpuformer._core._attention_views)


def attention_views(q, k, v, out, causal=False, causal_offset=None, window=0, mask=None, scale=None):
    offset = k.shape[2] - q.shape[2] if causal_offset is None else causal_offset
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    _core._attention_views(q, k, v, out, causal, offset, window, mask, scale)


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 64), (8, 2, 17), (4, 1, 128)])
def test_views_into_fused_qkv_and_cache(rng, heads, kv_heads, dim):
    batch, seq, t_max = 2, 19, 40
    # q from a fused projection [B, T, H + 2·Hkv, D]; k/v from a preallocated cache [B, Hkv, Tmax, D].
    qkv = rng.standard_normal((batch, seq, heads + 2 * kv_heads, dim), dtype=np.float32)
    q = qkv[:, :, :heads].transpose(0, 2, 1, 3)
    cache_k = rng.standard_normal((batch, kv_heads, t_max, dim), dtype=np.float32)
    cache_v = rng.standard_normal((batch, kv_heads, t_max, dim), dtype=np.float32)
    kv_len = 31
    k, v = cache_k[:, :, :kv_len], cache_v[:, :, :kv_len]
    # out written straight into a [B, T, H, D] buffer (the layout the output projection reads).
    out_buffer = np.full((batch, seq, heads, dim), np.nan, dtype=np.float32)
    out = out_buffer.transpose(0, 2, 1, 3)
    attention_views(q, k, v, out, causal=True)
    assert_close(out_buffer.transpose(0, 2, 1, 3), reference(q, k, v, causal=True))


@pytest.mark.parametrize("heads,kv_heads,dim", [(12, 12, 64), (8, 2, 17), (32, 4, 64)])
def test_many_calls_in_one_region_give_each_calls_bits(rng, heads, kv_heads, dim):
    # attention_many (a ragged batch: one call per sequence) against the same calls one by one:
    # decode rows over caches of other lengths (the longest split across keys), several query rows,
    # a mask and a window; the outputs interleaved in one buffer.
    shapes = [(1, 700, 699, 0, False), (1, 40, 39, 0, False), (5, 90, 85, 0, False), (3, 1300, 1297, 0, True),
              (1, 64, 63, 16, False), (7, 7, 0, 0, False)]
    calls, outs = [], []
    buffer = np.full((len(shapes), 8, heads, dim), np.nan, dtype=np.float32)
    for i, (q_len, kv_len, offset, window, masked) in enumerate(shapes):
        q, k, v = make_qkv(rng, 1, heads, kv_heads, q_len, kv_len, dim)
        mask = None
        if masked:
            mask = np.where(rng.random((1, heads, q_len, kv_len)) < 0.2, -np.inf, 0.0).astype(np.float32)
        out = buffer[i, :q_len].transpose(1, 0, 2)[None]  # [1, H, Tq, D] views of [Tq, H, D] rows
        calls.append((q, k, v, out, True, offset, window, mask, float(1.0 / np.sqrt(dim)), False))
        outs.append(out)
    _core._attention_views_many(calls)
    together = [o.copy() for o in outs]
    buffer[:] = np.nan
    for call in calls:
        _core._attention_views(*call)
    for i, (a, b) in enumerate(zip(together, outs)):
        np.testing.assert_array_equal(a, b, err_msg=str(shapes[i]))
        q, k, v, _, _, offset, window, mask = calls[i][:8]
        assert_close(a, reference(q, k, v, causal=True, causal_offset=offset, window=window, mask=mask))
    for bad, name in [([list(calls[0])], "list"), ([calls[0][:9]], "tuple"), ([None], "NoneType")]:
        with pytest.raises(TypeError, match=rf"^each call must be a tuple of _attention_views' 10 arguments, "
                                            rf"got {name}$"):
            _core._attention_views_many(bad)


@pytest.mark.parametrize("offset,window", [(0, 0), (5, 0), (-3, 0), (12, 4), (0, 1), (30, 7), (2, 100)])
def test_views_causal_offset_and_window(rng, offset, window):
    q, k, v = make_qkv(rng, 2, 8, 2, 20, 33, 24)
    out = np.empty_like(q)
    attention_views(q, k, v, out, causal=True, causal_offset=offset, window=window)
    assert_close(out, reference(q, k, v, causal=True, causal_offset=offset, window=window))


@pytest.mark.parametrize("offset,window", [(0, 1), (0, 3), (0, 5), (4, 2), (-6, 4), (0, 40), (25, 3)])
@pytest.mark.parametrize("heads,kv_heads,q_len,dim", [(8, 2, 20, 24), (3, 3, 37, 17), (4, 4, 1, 16)])
def test_views_bidirectional_window(rng, offset, window, heads, kv_heads, q_len, dim):
    # Tiles of query rows whose key ranges differ at both ends; odd sizes leave vector tails.
    q, k, v = make_qkv(rng, 2, heads, kv_heads, q_len, 33, dim)
    out = np.empty_like(q)
    attention_views(q, k, v, out, causal_offset=offset, window=window)
    assert_close(out, reference(q, k, v, causal_offset=offset, window=window))


def test_views_bidirectional_window_with_padding_mask(rng):
    q, k, v = make_qkv(rng, 2, 4, 4, 29, 29, 20)
    valid = np.ones((2, 29), dtype=bool)
    valid[1, 17:] = False  # right padding, as the encoders pass it: [B, 1, 1, T]
    small = np.where(valid, 0.0, NEG_INF).astype(np.float32)[:, None, None, :]
    mask = np.broadcast_to(small, (2, 4, 29, 29))
    out = np.empty_like(q)
    attention_views(q, k, v, out, window=3, mask=mask)
    assert_close(out, reference(q, k, v, causal_offset=0, window=3, mask=small))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,kv_len", [(1, 3000), (2, 4097)])
def test_views_window_with_split_keys(rng, q_len, kv_len, causal):
    q, k, v = make_qkv(rng, 1, 8, 2, q_len, kv_len, 64)
    out = np.empty_like(q)
    offset = kv_len - q_len if causal else 2000
    attention_views(q, k, v, out, causal=causal, causal_offset=offset, window=1500)
    assert_close(out, reference(q, k, v, causal=causal, causal_offset=offset, window=1500))


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 33), (1, 8, 20, 33), (2, 8, 20, 33), (1, 1, 20, 1)])
def test_views_broadcast_mask_strides(rng, mask_shape):
    q, k, v = make_qkv(rng, 2, 8, 2, 20, 33, 16)
    small = rng.standard_normal(mask_shape).astype(np.float32)
    mask = np.broadcast_to(small, (2, 8, 20, 33))  # stride 0 where broadcast
    out = np.empty_like(q)
    attention_views(q, k, v, out, causal=True, causal_offset=20, mask=mask)
    assert_close(out, reference(q, k, v, causal=True, causal_offset=20, mask=small))
    # A mask read with a key stride other than 1 (a transposed view).
    mask_t = np.ascontiguousarray(np.broadcast_to(small, (2, 8, 20, 33)).transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    attention_views(q, k, v, out, mask=mask_t)
    assert_close(out, reference(q, k, v, mask=small))


def test_views_reversed_and_strided_rows(rng):
    q, k, v = make_qkv(rng, 2, 4, 2, 34, 66, 8)
    q, k, v = q[:, :, ::-2], k[:, ::-1, ::2], v[:, ::-1, ::2]
    out = np.empty(q.shape, dtype=np.float32)
    attention_views(q, k, v, out, causal=True)
    assert_close(out, reference(q, k, v, causal=True))


def guarded_float32(shape):
    """A C-contiguous float32 array of `shape` whose last byte is the last before an unreadable page:
    a kernel that reads one byte past it crashes the test."""
    import ctypes
    import mmap

    nbytes = int(np.prod(shape)) * 4
    page = mmap.PAGESIZE
    total = -(-nbytes // page) * page + page
    buffer = mmap.mmap(-1, total)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(address + total - page, page, 0) == 0  # PROT_NONE
    data = np.frombuffer(buffer, dtype=np.uint8)[total - page - nbytes : total - page]
    return data.view(np.float32).reshape(shape)


@pytest.mark.parametrize("dim", [64, 17, 8])
@pytest.mark.parametrize("kv_len", [1, 33, 70])
@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("group", [1, 8])
def test_decode_reads_no_key_past_the_cache(rng, dim, kv_len, step, group):
    # A decode step over keys and values that end right at an unreadable page, rows contiguous
    # (step 1) or every other row of the buffer (step 2). Both engines read each block's key rows
    # line by line first: the single-row one (group 1: one query row per kv head) and the query-block
    # one (group 8: a grouped-query step, 8 rows per kv head).
    kv_heads = 3
    q = rng.standard_normal((1, kv_heads * group, 1, dim), dtype=np.float32)
    k_buffer = guarded_float32((1, kv_heads, kv_len * step, dim))
    v_buffer = guarded_float32((1, kv_heads, kv_len * step, dim))
    k_buffer[...] = rng.standard_normal(k_buffer.shape, dtype=np.float32)
    v_buffer[...] = rng.standard_normal(v_buffer.shape, dtype=np.float32)
    k, v = k_buffer[:, :, step - 1 :: step], v_buffer[:, :, step - 1 :: step]
    out = np.empty_like(q)
    attention_views(q, k, v, out, causal=True)
    assert_close(out, reference(q, k, v, causal=True))


@pytest.mark.parametrize("dim", [64, 17, 128])
@pytest.mark.parametrize("kv_len", [5, 70, 300])
def test_grouped_decode_rows_do_not_depend_on_their_tile(rng, dim, kv_len):
    # A grouped-query decode step's 8 rows per kv head (AVX-512: scored in 8-lane vectors) get the
    # bits they get as the first 8 of 16 rows (full-width vectors): the same products and sums in
    # the same order for every row.
    q16 = rng.standard_normal((1, 16, 1, dim), dtype=np.float32)
    k = rng.standard_normal((1, 1, kv_len, dim), dtype=np.float32)
    v = rng.standard_normal((1, 1, kv_len, dim), dtype=np.float32)
    q8 = np.ascontiguousarray(q16[:, :8])
    out8 = ops.attention(q8, k, v, causal=True, num_threads=1)
    out16 = ops.attention(q16, k, v, causal=True, num_threads=1)
    np.testing.assert_array_equal(out8, out16[:, :8])
    assert_close(out8, reference(q8, k, v, causal=True))


# ---- errors of cpuformer.ops.attention


def test_errors_type(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 3, 4, 8)
    with pytest.raises(TypeError, match="q must be a numpy.ndarray of float32, got list"):
        ops.attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="k must have dtype float32, got float64"):
        ops.attention(q, k.astype(np.float64), v)
    with pytest.raises(TypeError, match="v must have dtype float32, got float16"):
        ops.attention(q, k, v.astype(np.float16))
    with pytest.raises(TypeError, match=r"mask must be a numpy.ndarray of float32 \(additive\) or bool, got list"):
        ops.attention(q, k, v, mask=[[0.0] * 4])
    with pytest.raises(TypeError, match="mask must have dtype float32, got float64"):
        ops.attention(q, k, v, mask=np.zeros(4))
    with pytest.raises(TypeError, match="mask must have dtype float32, got int64"):
        ops.attention(q, k, v, mask=np.zeros(4, dtype=np.int64))


@pytest.mark.parametrize("scale,shown", [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf"),
                                         (1e40, "1e+40"), (np.float64(-1e39), "-1e+39")])
def test_errors_scale_not_finite(rng, scale, shown):
    q, k, v = make_qkv(rng, 1, 2, 2, 3, 4, 8)
    with pytest.raises(ValueError, match=rf"^scale must be finite, got {re.escape(shown)}$"):
        ops.attention(q, k, v, scale=scale)
    ref = reference(q, k, v, scale=-2.5)  # any finite scale, negative included, is taken
    np.testing.assert_allclose(ops.attention(q, k, v, scale=-2.5), ref, rtol=0, atol=1e-5 * np.abs(ref).max() + 1e-6)


def test_errors_shape(rng):
    q, k, v = make_qkv(rng, 1, 4, 2, 3, 5, 8)
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \[B, H, Tq, D\], got shape \[4, 3, 8\]"):
        ops.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"k must have 4 dimensions \[B, Hkv, Tk, D\], got shape \[1, 1, 2, 5, 8\]"):
        ops.attention(q, k[None], v)
    with pytest.raises(ValueError, match=r"v must have 4 dimensions \[B, Hkv, Tk, D\], got shape \[2, 5, 8\]"):
        ops.attention(q, k, v[0])
    with pytest.raises(ValueError, match=r"k must have shape \[1, Hkv, Tk, 8\] \(B and D of q\), got \[1, 2, 5, 7\]"):
        ops.attention(q, k[..., :7], v[..., :7])
    with pytest.raises(ValueError, match=r"k must have shape \[1, Hkv, Tk, 8\] \(B and D of q\), got \[2, 2, 5, 8\]"):
        ops.attention(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match=r"v must have the shape of k \[1, 2, 5, 8\], got \[1, 2, 4, 8\]"):
        ops.attention(q, k, v[:, :, :4])
    q3 = np.ascontiguousarray(q[:, :3])
    with pytest.raises(ValueError, match=r"the number of query heads \(3\) must be a multiple of the number of "
                                         r"key/value heads \(2\)"):
        ops.attention(q3, k, v)


@pytest.mark.parametrize("empty", ["q", "k"])
def test_errors_empty(rng, empty):
    q, k, v = make_qkv(rng, 1, 2, 2, 3, 5, 8)
    if empty == "q":
        q = q[:, :, :0]
    else:
        k, v = k[:, :, :0], v[:, :, :0]
    with pytest.raises(ValueError, match=f"{empty} must not have an empty dimension, got shape"):
        ops.attention(q, k, v)


@pytest.mark.parametrize("mask_shape", [(), (1, 1, 1, 1, 5), (4,), (1, 3, 3, 5), (2, 1, 1, 5), (1, 1, 2, 5)])
def test_errors_mask_shape(rng, mask_shape):
    q, k, v = make_qkv(rng, 1, 2, 2, 3, 5, 8)
    with pytest.raises(ValueError, match=r"mask must be broadcastable to \[B, 1\|H, Tq, Tk\]"):
        ops.attention(q, k, v, mask=np.zeros(mask_shape, dtype=np.float32))
    with pytest.raises(ValueError, match=r"mask must be broadcastable to \[B, 1\|H, Tq, Tk\]"):
        ops.attention(q, k, v, mask=np.ones(mask_shape, dtype=bool))


# ---- errors of the view entry point


def test_errors_views(rng):
    q, k, v = make_qkv(rng, 1, 4, 2, 3, 5, 8)
    out = np.empty_like(q)
    bad_layout = "must be a 4-D float32 numpy.ndarray with a contiguous last dimension"
    with pytest.raises(TypeError, match="q " + bad_layout):
        _core._attention_views(q.tolist(), k, v, out, False, 0, 0, None, 1.0)
    with pytest.raises(TypeError, match="k " + bad_layout):
        attention_views(q, k.astype(np.float64), v, out)
    with pytest.raises(TypeError, match="v " + bad_layout):
        attention_views(q, k, v[0], out)
    with pytest.raises(TypeError, match="out " + bad_layout):
        attention_views(q, k, v, np.empty((1, 4, 3, 16), dtype=np.float32)[..., ::2])
    misaligned = np.zeros((1, 4, 3, 8 * 4 + 2), dtype=np.uint8)[..., 2:].view(np.float32)  # row stride 34 bytes
    with pytest.raises(TypeError, match="q " + bad_layout):
        attention_views(misaligned, k, v, out)
    # Whole-element strides but data one byte off a float's alignment: refused as well.
    shifted = np.zeros(q.size * 4 + 1, dtype=np.uint8)[1:].view(np.float32).reshape(q.shape)
    with pytest.raises(TypeError, match=r"q .*strides that are whole elements, float-aligned"):
        attention_views(shifted, k, v, out)
    with pytest.raises(TypeError,
                       match="mask must be a 4-D float32 numpy.ndarray with strides that are whole elements"):
        attention_views(q, k, v, out, mask=np.zeros((1, 4, 3, 5)))
    with pytest.raises(ValueError, match="k must not have an empty dimension"):
        attention_views(q, k[:, :, :0], v[:, :, :0], out)
    shapes = r"shapes must be q, out \[B, H, Tq, D\]; k, v \[B, Hkv, Tk, D\] with Hkv dividing H; mask \[B, H, Tq, Tk\]"
    with pytest.raises(ValueError, match=shapes):
        attention_views(q, k, v[:, :, :4], out)
    with pytest.raises(ValueError, match=shapes):
        attention_views(q, k, v, out[:, :2])
    with pytest.raises(ValueError, match=shapes):
        attention_views(q[:, :3], k, v, out[:, :3])
    with pytest.raises(ValueError, match=shapes):
        attention_views(q, k, v, out, mask=np.zeros((1, 1, 1, 5), dtype=np.float32))
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        attention_views(q, k, v, out)
