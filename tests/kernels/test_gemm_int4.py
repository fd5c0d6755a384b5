"""ops.Linear(dtype="int4") and ops.quantize_int4 against a NumPy model of the contract in gemm.h.

The model: u, scales, zeros = ops.quantize_int4(w, G, zero_point); each row of x is quantized
exactly as for int8 (test_gemm_int8.quantize_rows); per group the integer sum
t = Σ qa·u − z·Σ qa is taken exactly in int64 (and checked to be below 2^19); the groups are
combined in order with a float32 fused multiply-add (emulated in float64, exact for these
operands but for the final rounding); then sa · acc + bias and the residual in float32. Every ISA
level must reproduce this bit for bit without an activation; with one, the level's activation
kernel is checked against float64 with its stated bound, as in test_gemm_int8.py.

tests/test_runtime.py reruns this directory at every lower ISA level; test_without_dot_product_extensions
reruns this file with AVX512-VNNI and AVX-VNNI hidden, so both kernels of a level run (vpdpbusd and
the AVX2 vpmaddubsw kernel).
"""

import re

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import ops

from ._reference import assert_epilogue, assert_threads_agree, randn, rerun_with_features_hidden
from .test_gemm_int8 import quantize_rows


def nibbles(u, k):
    """uint8 [N, Kp / 2] nibble pairs -> int64 [N, Kp] codes."""
    codes = np.empty((u.shape[0], u.shape[1] * 2), np.int64)
    codes[:, 0::2] = u & 0x0F
    codes[:, 1::2] = u >> 4
    return codes


def dequantize(u, scales, zeros, group_size, k):
    """float64 [N, K]: the weights the int4 codes stand for."""
    codes = nibbles(u, k)
    n, groups = scales.shape
    z = np.full((n, groups), 8, np.int64) if zeros is None else zeros.astype(np.int64)
    w = (codes.reshape(n, groups, group_size) - z[:, :, None]) * scales.astype(np.float64)[:, :, None]
    return w.reshape(n, groups * group_size)[:, :k]


def fma32(a, b, c):
    """float32 a·b + c rounded once (the products here are exact in float64)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def preactivation(x, w, bias, group_size, zero_point):
    u, scales, zeros = ops.quantize_int4(w, group_size, zero_point)
    qa, sa = quantize_rows(x)
    m, k = qa.shape
    groups = scales.shape[1]
    kp = groups * group_size
    qa = np.pad(qa, ((0, 0), (0, kp - k))).reshape(m, groups, group_size)
    codes = nibbles(u, k).reshape(-1, groups, group_size)
    z = np.full(scales.shape, 8, np.int64) if zeros is None else zeros.astype(np.int64)
    acc = np.zeros((m, w.shape[0]), np.float32)
    for g in range(groups):
        t = qa[:, g, :] @ codes[:, g, :].T - qa[:, g, :].sum(axis=1)[:, None] * z[None, :, g]
        assert np.abs(t).max(initial=0) < 2**19
        acc = fma32(scales[:, g].astype(np.float32)[None, :], t.astype(np.float32), acc)
    y = (sa[:, None] * acc).astype(np.float32)
    if bias is not None:
        y = (y + bias.astype(np.float32)).astype(np.float32)
    return y


def check(x, w, bias=None, activation=None, residual=None, group_size=32, zero_point=False):
    lin = ops.Linear(w, bias, activation, dtype="int4", group_size=group_size, zero_point=zero_point)
    assert (lin.dtype, lin.group_size, lin.zero_point) == ("int4", group_size, zero_point)
    y = lin(x, residual.copy() if residual is not None else None)
    assert y.dtype == np.float32 and y.shape == (x.shape[0], w.shape[0])
    assert_epilogue(y, preactivation(x, w, bias, group_size, zero_point), activation, residual)
    return y


# M through the row tiles (4 rows at the avx2 level, 8 with AVX512-VNNI) and row blocks (32, 64), N
# through the 8-feature panels and the pairs of them (AVX512-VNNI: 16 features, a lone last panel
# when their count is odd), K through whole groups, partial last groups and K < G.
SHAPES = [
    (1, 1, 1), (1, 5, 3), (2, 31, 17), (3, 768, 130), (4, 32, 64), (5, 33, 9), (6, 100, 63), (7, 129, 8),
    (33, 64, 7), (48, 200, 70), (1, 4096, 40), (65, 515, 24), (8, 96, 16), (9, 257, 24), (16, 130, 56),
    (64, 128, 33), (70, 200, 48), (131, 96, 25),
]


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_shapes_exact(rng, m, k, n, group_size, zero_point):
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    check(x, w, b, group_size=group_size, zero_point=zero_point)
    check(x, w, group_size=group_size, zero_point=zero_point)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 70, 33), (9, 129, 100)])
def test_activations(rng, activation, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k) * 0.3, randn(rng, n)
    check(x, w, b, activation)
    check(x, w, b, activation, group_size=64, zero_point=True)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 64, 70), (7, 300, 65), (50, 33, 130)])
def test_residual(rng, activation, m, k, n):
    x, w, b, r = randn(rng, m, k), randn(rng, n, k), randn(rng, n), randn(rng, m, n)
    check(x, w, b, activation, r)


def test_quantization_is_the_documented_rounding(rng):
    # Symmetric: the value of largest magnitude maps to code 0 (−8 · s), s = float16(m / −8);
    # with zero points, lo ≤ 0 ≤ hi span the 16 codes.
    w = randn(rng, 5, 96)
    for zero_point in (False, True):
        u, scales, zeros = ops.quantize_int4(w, 32, zero_point)
        assert u.shape == (5, 48) and u.dtype == np.uint8
        assert scales.shape == (5, 3) and scales.dtype == np.float16
        back = dequantize(u, scales, zeros, 32, 96)
        for j in range(5):
            for g in range(3):
                part, s = w[j, 32 * g:32 * (g + 1)], np.float32(scales[j, g])
                if zero_point:
                    assert zeros[j, g] <= 15
                    lo, hi = min(part.min(), 0), max(part.max(), 0)
                    assert s == np.float32(np.float16((hi - lo) / np.float32(15)))
                else:
                    extreme = part[np.argmax(np.abs(part))]
                    assert s == np.float32(np.float16(extreme / np.float32(-8)))
                # Weights within half a step of their code, but those clamped at an end code: the
                # symmetric range is [-8, 7] steps, so the side opposite the extreme loses up to
                # one step (as llama.cpp's Q4_0), and the float16 rounding of s moves the ends.
                err = np.abs(back[j, 32 * g:32 * (g + 1)] - part)
                codes = nibbles(u, 96)[j, 32 * g:32 * (g + 1)]
                inner = (codes > 0) & (codes < 15)
                assert err[inner].max() <= 0.5 * abs(s) * (1 + 1e-5)
                assert err.max() <= abs(s) * (1 + 2e-3)
        assert zeros is None or zeros.dtype == np.uint8


def test_padding_of_a_partial_last_group(rng):
    # K = 40 with G = 32: the second group holds 8 weights and 24 padding codes equal to z, so the
    # padding stands for zero weights.
    w = randn(rng, 3, 40)
    for zero_point in (False, True):
        u, scales, zeros = ops.quantize_int4(w, 32, zero_point)
        codes = nibbles(u, 40)
        z = np.full((3, 2), 8) if zeros is None else zeros
        np.testing.assert_array_equal(codes[:, 40:], np.repeat(z[:, 1:2], 24, axis=1))


def test_zero_groups_and_rows(rng):
    m, k, n = 9, 96, 20
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    w[3] = 0.0
    w[5, 32:64] = 0.0
    x[[0, 4]] = 0.0
    for zero_point in (False, True):
        y = check(x, w, b, zero_point=zero_point)
        np.testing.assert_array_equal(y[:, 3], np.broadcast_to(b[3], (m,)))
        np.testing.assert_array_equal(y[4], b)
        u, scales, zeros = ops.quantize_int4(w, 32, zero_point)
        assert scales[5, 1] == 0 and np.all(dequantize(u, scales, zeros, 32, k)[5, 32:64] == 0)


def test_constant_group_is_exact():
    # lo ≤ 0 ≤ hi: a group of one repeated value c gets s = c / 15 (or −c / 8): c is a code exactly.
    w = np.full((2, 32), 0.75, np.float32)
    w[1] = -0.75
    for zero_point in (False, True):
        u, scales, zeros = ops.quantize_int4(w, 32, zero_point)
        np.testing.assert_allclose(dequantize(u, scales, zeros, 32, 32), w, rtol=1e-3)


@pytest.mark.parametrize("m,n", [(5, 16), (11, 40)])
def test_extreme_codes(rng, m, n):
    # Every code 0 or 15 and every qa ±127: the int16 sums of vpmaddubsw reach 8 · 2 · 15 · 127 =
    # 30480 (their limit is 32767) and the group sums their largest magnitude (the vpdpbusd sums
    # start at −z·Σqa and pass through values of either sign).
    k = 512
    x = np.where(rng.random((m, k)) < 0.5, -1.0, 1.0).astype(np.float32) * np.float32(3.0)
    x[1] = 2.0  # qa = 127 everywhere
    x[2] = -2.0
    w = np.where(rng.random((n, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    w[3] = 1.0  # with zero points: lo = 0, hi = 1 → codes 15
    w[4] = -1.0
    w[5, ::2] = 1.0
    w[5, 1::2] = -1.0
    for group_size in (32, 64, 128):
        for zero_point in (False, True):
            check(x, w, None, group_size=group_size, zero_point=zero_point)


def test_non_finite_weights_and_inputs(rng):
    m, k, n = 3, 64, 16
    x, w = randn(rng, m, k), randn(rng, n, k)
    x[1, 5] = np.inf
    y = ops.Linear(w, None, dtype="int4")(x)
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()
    w[2, 40] = np.nan
    with pytest.raises(ValueError, match=r"w has a non-finite value at flat index 168; int4 needs finite weights"):
        ops.Linear(w, None, dtype="int4")
    with pytest.raises(ValueError, match=r"w has a non-finite value at flat index 168; int4 needs finite weights"):
        ops.quantize_int4(w)


def test_scale_out_of_float16_range():
    w = np.ones((2, 32), np.float32)
    w[1, 0] = 6e5  # 6e5 / 8 > 65504
    with pytest.raises(ValueError, match=r"w: a weight group spans more than int4's float16 scales can hold "
                                         r"\(magnitudes up to about 5.2e5\); use int8 or a float dtype"):
        ops.Linear(w, None, dtype="int4")
    with pytest.raises(ValueError, match=r"about 9.8e5"):
        ops.quantize_int4(w * 2, zero_point=True)


@pytest.mark.parametrize("group_size", [0, 16, 48, 256, -32, 1.5, None, True, "32"])
def test_group_size_errors(rng, group_size):
    # Values outside {32, 64, 128} and values of another type (checked in Python) alike.
    w = randn(rng, 4, 64)
    with pytest.raises(ValueError, match=rf"^group_size must be 32, 64 or 128, got {re.escape(repr(group_size))}$"):
        ops.Linear(w, None, dtype="int4", group_size=group_size)
    with pytest.raises(ValueError, match=rf"^group_size must be 32, 64 or 128, got {re.escape(repr(group_size))}$"):
        ops.quantize_int4(w, group_size)


def test_zero_point_of_another_type_is_named(rng):
    w = randn(rng, 4, 64)
    with pytest.raises(TypeError, match=r"^zero_point must be True or False, got 'yes'$"):
        ops.quantize_int4(w, 32, zero_point="yes")
    assert ops.quantize_int4(w, np.int64(64), zero_point=np.bool_(True))[2] is not None


def test_group_size_is_ignored_by_other_dtypes(rng):
    w = randn(rng, 4, 64)
    assert ops.Linear(w, None, dtype="int8", group_size=16).group_size == 0


def test_strided_input(rng):
    x = randn(rng, 6, 90)[:, 5:75]
    w, b = randn(rng, 40, 70), randn(rng, 40)
    check(np.ascontiguousarray(x), w, b)
    lin = ops.Linear(w, b, dtype="int4")
    np.testing.assert_array_equal(lin(x), lin(np.ascontiguousarray(x)))


def test_threads_agree(rng):
    x, w, b = randn(rng, 100, 300), randn(rng, 200, 300), randn(rng, 200)
    assert_threads_agree(ops.Linear(w, b, "relu", dtype="int4", group_size=64, zero_point=True), x)


def test_without_dot_product_extensions():
    # The same tests with AVX512-VNNI and AVX-VNNI hidden: the level's fallback kernel (AVX2
    # vpmaddubsw) runs, and must give the same bits as the NumPy model too.
    info = rerun_with_features_hidden(__file__, "avx512_vnni,avx_vnni", "without_dot_product")
    features = info[info.index("'features'"):]
    assert "vnni" not in features and "avx2" in features or cf.cpu_info()["isa"] == "scalar"
    matmul = info[info.index("'matmul'"):]
    assert "'int4': 'avx2 vpmaddubsw'" in matmul or cf.cpu_info()["isa"] == "scalar"


def test_kernel_name():
    # The int4 kernel cpu_info() names follows the CPU: vpdpbusd where the level has it.
    features, isa = set(cf.cpu_info()["features"]), cf.cpu_info()["isa"]
    if isa == "scalar":
        expected = "scalar"
    elif isa == "avx512":  # without AVX512-VNNI the AVX2 kernel serves this level
        expected = "avx512_vnni vpdpbusd" if "avx512_vnni" in features else "avx2 vpmaddubsw"
    elif "avx_vnni" in features:
        expected = "avx_vnni vpdpbusd"
    else:
        expected = "avx2 vpmaddubsw"
    assert cf.cpu_info()["matmul"]["int4"] == expected


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("zero_point", [False, True])
def test_weight_quantization_is_the_contract_bit_for_bit(rng, group_size, zero_point):
    # Per group of G weights: symmetric, s = float16(e / −8) with e the FIRST weight of the largest
    # magnitude (+0 if all are ±0), codes rint(w / s) + 8; with zero points s = float16((hi − lo) / 15) over
    # lo = min(0, w) ≤ 0 ≤ hi = max(0, w), z = rint(−lo / s), codes rint(w / s) + z; float32
    # arithmetic, round half to even, codes clamped to [0, 15], a zero scale gives every code z.
    # Rows hold ties (.5 steps after scaling), equal magnitudes of both signs, ±0 and a partial last group.
    k = 3 * group_size - 8
    w = randn(rng, 12, k) * np.float32(3)
    w[1] = 0.0
    w[2] = -0.0
    w[3] = np.round(w[3] * 2) / 2
    w[4, :] = np.float32(0.5)
    w[4, ::3] = -0.5
    w[5] = np.float32(-0.75)
    w[5, 5] = 0.75
    w[6, :group_size] = 0.0
    w[7] = (np.arange(k) % 17 - 8) * np.float32(0.125)
    w = w.astype(np.float32)
    u, scales, zeros = ops.quantize_int4(w, group_size, zero_point)
    codes = nibbles(u, 3 * group_size)
    groups = 3
    for j in range(w.shape[0]):
        for g in range(groups):
            part = w[j, g * group_size:(g + 1) * group_size]
            if zero_point:
                lo, hi = min(np.float32(part.min()), np.float32(0)), max(np.float32(part.max()), np.float32(0))
                s16 = np.float16((hi - lo) / np.float32(15))
            else:
                extreme = part[np.argmax(np.abs(part))]  # argmax: the first of equal magnitudes
                extreme = extreme if extreme != 0 else np.float32(0)  # (all ±0: e = +0, s = −0)
                s16 = np.float16(extreme / np.float32(-8))
            assert scales[j, g].tobytes() == s16.tobytes(), (j, g)
            s = np.float32(s16)
            if s == 0:
                z = 0 if zero_point else 8
                want = np.full(group_size, z)
            else:
                z = int(np.clip(np.rint(-lo / s), 0, 15)) if zero_point else 8
                want = np.clip(np.rint(part / s) + np.float32(z), 0, 15)
                want = np.concatenate([want, np.full(group_size - part.size, z)])
            if zero_point:
                assert zeros[j, g] == z, (j, g)
            np.testing.assert_array_equal(codes[j, g * group_size:(g + 1) * group_size], want.astype(np.uint8),
                                          err_msg=f"row {j} group {g}")
