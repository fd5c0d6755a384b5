"""ops.Linear(dtype="float16" | "bfloat16") against a NumPy float64 reference.

The contract (gemm.h): each 16-bit weight is widened to float32 exactly and the products are summed
in float32, A staying float32. The reference takes the same widened weights (np.float16 rounding of
w for float16; the bfloat16 bit patterns shifted into the upper half of a float32) and sums in
float64, so the only difference allowed is float32 summation error: |y - ref| ≤ 1e-5 · Σ|x|·|w|
plus a small absolute term, and with an activation the activation kernel's bound (2e-6 absolute +
1e-6 relative, tests/kernels/test_activation.py) with margin, as in test_gemm_int8.py.

On a CPU with AVX512-BF16 the avx512 level multiplies bfloat16 weights with vdpbf16ps, which
rounds each activation to bfloat16 first: there the reference rounds x the same way (products of
two bfloat16 values are exact in float32, so the same float32-summation bound applies), and
test_without_bf16_dot_product reruns this file with the extension hidden, for the widening kernel.
With AMX-BF16, GEMMs of 16 rows or more run on TDPBF16PS tiles with the same rounding of x (the
float32 sums in another order, within the same bound); test_without_amx_tiles reruns this file with
AMX-BF16 hidden, for vdpbf16ps at those shapes.

tests/test_runtime.py reruns this file (all of tests/kernels) at every lower ISA level.
"""


import numpy as np
import pytest

import cpuformer as cf
from cpuformer import ops

from ._reference import activate, assert_threads_agree, randn, rerun_with_features_hidden

DTYPES = ["float16", "bfloat16"]


def widened(w, dtype):
    """The float32 weights the kernels multiply with."""
    if dtype == "float16":
        bits = ops.to_float16_bits(w)
        ref = bits.view(np.float16).astype(np.float32)
        np.testing.assert_array_equal(ref[np.isfinite(ref)], w.astype(np.float16).astype(np.float32)[np.isfinite(ref)])
        return ref
    bits = ops.to_bfloat16_bits(w)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_dot_product():
    """True when bfloat16 weights run on vdpbf16ps (activations rounded to bfloat16)."""
    info = cf.cpu_info()
    return info["isa"] == "avx512" and "avx512_bf16" in info["features"]


def as_bfloat16(x):
    return (ops.to_bfloat16_bits(np.ascontiguousarray(x, dtype=np.float32)).astype(np.uint32) << 16).view(np.float32)


def multiplied_input(x, dtype):
    """The float32 activations the kernels multiply with."""
    return as_bfloat16(x) if dtype == "bfloat16" and bf16_dot_product() else np.asarray(x, dtype=np.float32)


def slope_bound(activation):
    """Largest |act'(z)|: how much a pre-activation error can grow through the activation."""
    return {None: 1.0, "relu": 1.0, "gelu": 1.13, "gelu_tanh": 1.13, "silu": 1.1, "quick_gelu": 1.1}[activation]


def check(x, w, dtype, bias=None, activation=None, residual=None):
    lin = ops.Linear(w, bias, activation, dtype=dtype)
    assert lin.dtype == dtype
    y = lin(x, residual.copy() if residual is not None else None)
    assert y.dtype == np.float32 and y.shape == (x.shape[0], w.shape[0])
    wf = widened(w, dtype).astype(np.float64)
    x64 = multiplied_input(x, dtype).astype(np.float64)
    z = x64 @ wf.T
    scale = np.abs(x64) @ np.abs(wf).T
    if bias is not None:
        z = z + bias
        scale = scale + np.abs(bias)
    ref = activate(z, activation)
    tol = (1e-5 * scale + 1e-6) * slope_bound(activation)
    if activation is not None:
        tol = tol + 4e-6 + 3e-6 * np.abs(ref)
    if residual is not None:
        ref = ref + residual
        tol = tol + 1.2e-7 * (np.abs(ref) + np.abs(residual))  # the float32 rounding of the final add
    err = np.abs(y - ref)
    assert np.all(err <= tol), f"max excess {float((err - tol).max()):.3g}, max err {float(err.max()):.3g}"
    return y


# M walks through the tile and GEMV sizes (the GEMV kernel takes 6 or 8 rows at once and up to 64
# rows in chunks when N has 4 panels or more; tiles of 6 or 14 rows otherwise), N
# through the panel tails (16 or 32 columns), K through the slices (256) and their tails.
SHAPES = [
    (1, 1, 1), (1, 5, 3), (2, 7, 17), (3, 768, 130), (4, 33, 64), (5, 4, 65), (6, 100, 63),
    (7, 13, 129), (8, 40, 33), (9, 300, 48), (12, 3, 200), (13, 257, 31), (14, 512, 32), (15, 513, 47),
    (48, 66, 70), (49, 130, 300), (64, 4096, 40), (1, 4095, 100), (2, 4097, 9), (130, 515, 96),
    (300, 64, 17), (400, 300, 700),
    (16, 700, 300), (28, 1000, 130), (21, 129, 200),  # avx512: 15-28 rows in two chunks over K blocks
    # bfloat16 with AMX-BF16: 4 rows or more and K (rounded up to 2) a multiple of 32 take the tiles
    # (32 × 64 work tiles, the last 16 rows or fewer of a block on one A tile, K = 31 padded)
    (3, 64, 70), (4, 64, 70), (9, 32, 65), (15, 64, 70), (16, 32, 70), (17, 64, 1), (20, 31, 64), (33, 96, 130),
    (100, 768, 200), (257, 64, 65),
    (290, 256, 129),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_shapes(rng, dtype, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    check(x, w, dtype, b)
    check(x, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 70, 33), (9, 129, 100), (20, 600, 130), (60, 600, 70), (60, 640, 70)])
def test_activations(rng, dtype, activation, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k) * 0.1, randn(rng, n)
    check(x, w, dtype, b, activation)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 64, 70), (7, 300, 65), (16, 700, 130), (28, 300, 200), (50, 33, 130),
                                   (100, 700, 90), (100, 704, 90)])
def test_residual(rng, dtype, activation, m, k, n):
    # Linear adds the residual in place: the GEMM's residual aliases its output.
    x, w, b, r = randn(rng, m, k), randn(rng, n, k) * 0.1, randn(rng, n), randn(rng, m, n)
    check(x, w, dtype, b, activation, r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [300, 320])
def test_exact_small_integers(rng, dtype, k):
    # Small integers are exact in both formats and in every float32 partial sum: every level and
    # summation order must give the exact result.
    m, n = 20, 50
    x = rng.integers(-8, 9, (m, k)).astype(np.float32)
    w = rng.integers(-8, 9, (n, k)).astype(np.float32)
    y = ops.Linear(w, None, dtype=dtype)(x)
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))
    y1 = ops.Linear(w, None, dtype=dtype)(x[:1])
    np.testing.assert_array_equal(y1, y[:1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_input(rng, dtype):
    x = randn(rng, 6, 90)[:, 5:75]
    w, b = randn(rng, 40, 70), randn(rng, 40)
    check(np.ascontiguousarray(x), w, dtype, b)
    y = ops.Linear(w, b, dtype=dtype)(x)
    np.testing.assert_array_equal(y, ops.Linear(w, b, dtype=dtype)(np.ascontiguousarray(x)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 300), (3, 300), (100, 300), (100, 320)])
def test_threads_agree(rng, dtype, m, k):
    # Threads split the output columns (or rows), never one dot product: the same sums every time.
    x, w, b = randn(rng, m, k), randn(rng, 200, k), randn(rng, 200)
    lin = ops.Linear(w, b, "relu", dtype=dtype)
    assert_threads_agree(lin, x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 300), (5, 300), (40, 300), (40, 320)])
def test_nonfinite_weights_propagate(rng, dtype, m, k):
    n = 70
    x, w = randn(rng, m, k), randn(rng, n, k)
    w[3, 10] = np.nan
    w[40, k - 1] = np.inf
    w[65, 0] = -np.inf
    w[66, 5] = 1e6 if dtype == "float16" else np.finfo(np.float32).max  # rounds to inf in 16 bits
    y = ops.Linear(w, None, dtype=dtype)(x)
    assert np.isnan(y[:, 3]).all()
    sign = np.sign(x[:, k - 1])
    assert np.all(np.isinf(y[:, 40]) & (np.sign(y[:, 40]) == sign))
    assert np.all(np.isinf(y[:, 65]) & (np.sign(y[:, 65]) == -np.sign(x[:, 0])))
    assert np.all(np.isinf(y[:, 66]))
    others = np.setdiff1d(np.arange(n), [3, 40, 65, 66])
    assert np.isfinite(y[:, others]).all()
    check(x, np.delete(w, [3, 40, 65, 66], axis=0), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_weights_round_as_the_reference(rng, dtype):
    # Packing rounds float32 weights to 16 bits at the level's vector width
    # (quantize_weights_inl.h): the bits of the scalar reference (ops.to_float16_bits /
    # to_bfloat16_bits) at ties, just off them, in float16's subnormal range and up to its overflow
    # boundary. With x = I each output is one weight, exactly (y = W^T).
    n, k = 37, 67
    low = rng.choice(np.array([0, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x0800, 0x17FF], dtype=np.uint32), n * k)
    if dtype == "float16":
        # float16 normals and subnormals: float32 exponents 103 (2^-24) to 142 (2^15)
        exponent = rng.integers(103, 143, n * k).astype(np.uint32)
    else:
        exponent = rng.integers(1, 250, n * k).astype(np.uint32)  # float32 normals (vdpbf16ps flushes the rest)
    mantissa = (rng.integers(0, 1 << 10, n * k).astype(np.uint32) << 13) | low
    sign = rng.integers(0, 2, n * k).astype(np.uint32) << 31
    bits = sign | (exponent << 23) | mantissa
    if dtype == "float16":
        bits[:4] = [0x477FEFFF, 0x477FE000, 0x477FE001, 0x33000001]  # below 65520; 2^-25 just above a tie
    w = bits.view(np.float32).reshape(n, k)
    y = ops.Linear(w, None, dtype=dtype)(np.eye(k, dtype=np.float32))
    np.testing.assert_array_equal(y.T, widened(w, dtype))


def test_float16_subnormal_weights(rng):
    # Subnormal float16 weights widen exactly (F16C handles them; a shift would not).
    m, k, n = 9, 200, 40
    x = randn(rng, m, k)
    w = (randn(rng, n, k) * np.float32(3e-6)).astype(np.float32)  # mostly subnormal in float16
    y = check(x, w, "float16")
    assert np.abs(y).max() > 0
    ref = x.astype(np.float64) @ w.astype(np.float16).astype(np.float64).T
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-9)


def test_bfloat16_activation_rounding():
    # 1 + 2^-12 is not a bfloat16 value: vdpbf16ps multiplies 1 (nearest even), the widening
    # kernels the float32 value itself. Either way the result is exact.
    x = np.full((3, 4), 1 + 2.0 ** -12, dtype=np.float32)
    w = np.eye(4, dtype=np.float32)
    y = ops.Linear(w, None, dtype="bfloat16")(x)
    expected = np.float32(1.0) if bf16_dot_product() else np.float32(1 + 2.0 ** -12)
    np.testing.assert_array_equal(y, np.full((3, 4), expected, dtype=np.float32))


@pytest.mark.skipif(not bf16_dot_product(), reason="vdpbf16ps is used only at avx512 with AVX512-BF16")
def test_without_bf16_dot_product():
    # The same tests with AVX512-BF16 hidden: the avx512 widening kernel runs for bfloat16.
    info = rerun_with_features_hidden(__file__, "avx512_bf16", "without_bf16")
    assert "avx512_bf16" not in info and "'isa': 'avx512'" in info


@pytest.mark.skipif(not cf.cpu_info()["matmul"]["bfloat16"].startswith("amx_bf16"),
                    reason="bfloat16 GEMMs do not run on AMX here (no AMX-BF16, or a lower CPUFORMER_ISA)")
def test_without_amx_tiles():
    # The same tests with AMX-BF16 hidden: vdpbf16ps runs the shapes that took the tiles.
    info = rerun_with_features_hidden(__file__, "amx_bf16", "without_")
    assert "amx_bf16" not in info and "avx512_bf16 vdpbf16ps" in info
