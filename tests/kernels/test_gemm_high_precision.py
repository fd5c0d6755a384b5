"""float32 weights at float32 matmul precision "high" (cpuformer.set_float32_matmul_precision).

The contract (gemm.h, docs/precision.md): on a CPU with AMX-BF16, at the avx512 level, GEMMs of 32
rows or more (and 32·768 row-k products or more) split each float32 operand x into hi = bf16(x) and
lo = bf16(x − hi) and sum a_hi·w_hi + a_lo·w_hi + a_hi·w_lo on TDPBF16PS tiles: each product is off
by at most 3·2^-18 of |a·w|, plus float32 summation error. Everywhere else "high" runs the float32
FMA kernel, bit for bit what "highest" gives. Each test checks whichever applies on this machine and
ISA level (tests/test_runtime.py reruns tests/kernels at every lower level, where "high" must equal
"highest").
"""

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import ops

from ._reference import activate, assert_threads_agree, randn

PRODUCT_BOUND = 3 * 2.0 ** -18  # per product, of |a·w|
SUM_BOUND = 1e-5  # float32 summation, of Σ|a·w| (as test_gemm_half.py)


@pytest.fixture
def high():
    before = cf.get_float32_matmul_precision()
    cf.set_float32_matmul_precision("high")
    yield
    cf.set_float32_matmul_precision(before)


def on_tiles(m, k):
    """True when a GEMM of m rows and depth k takes the bfloat16x3 tiles here."""
    return cf.cpu_info()["matmul"]["float32"].endswith("(bfloat16x3)") and m >= 32 and m * k >= 32 * 768


def highest(lin, x, residual=None):
    cf.set_float32_matmul_precision("highest")
    try:
        return lin(x, None if residual is None else residual.copy())
    finally:
        cf.set_float32_matmul_precision("high")


def check(x, w, bias=None, activation=None, residual=None):
    lin = ops.Linear(w, bias, activation)
    y = lin(x, None if residual is None else residual.copy())
    if not on_tiles(*x.shape):
        np.testing.assert_array_equal(y, highest(lin, x, residual))
        return y
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z = x64 @ w64.T
    scale = np.abs(x64) @ np.abs(w64).T
    if bias is not None:
        z, scale = z + bias, scale + np.abs(bias)
    ref = activate(z, activation)
    tol = (PRODUCT_BOUND + SUM_BOUND) * scale * (1.13 if activation else 1.0) + 1e-6
    if activation is not None:
        tol = tol + 4e-6 + 3e-6 * np.abs(ref)  # the activation kernel's own bound
    if residual is not None:
        ref = ref + residual
        tol = tol + 1.2e-7 * (np.abs(ref) + np.abs(residual))
    err = np.abs(y - ref)
    assert np.all(err <= tol), f"max excess {float((err - tol).max()):.3g}, max err {float(err.max()):.3g}"
    return y


def test_precision_setting():
    before = cf.get_float32_matmul_precision()
    assert before == "highest"  # the default
    try:
        cf.set_float32_matmul_precision("high")
        assert cf.get_float32_matmul_precision() == "high"
        expected = ("amx_bf16 tdpbf16ps (bfloat16x3)"
                    if cf.cpu_info()["isa"] == "avx512" and "amx_bf16" in cf.cpu_info()["features"]
                    else None)
        if expected:
            assert cf.cpu_info()["matmul"]["float32"] == expected
        else:
            assert cf.cpu_info()["matmul"]["float32"].endswith("fma") or cf.cpu_info()["isa"] == "scalar"
        cf.set_float32_matmul_precision("highest")
        assert cf.get_float32_matmul_precision() == "highest"
        assert "bfloat16x3" not in cf.cpu_info()["matmul"]["float32"]
    finally:
        cf.set_float32_matmul_precision(before)


@pytest.mark.parametrize("value", ["medium", "HIGH", "", None, 1])
def test_bad_precision(value):
    with pytest.raises(ValueError, match=r"float32 matmul precision must be 'highest' or 'high', got "):
        cf.set_float32_matmul_precision(value)
    assert cf.get_float32_matmul_precision() == "highest"


# Rows through the tile sizes (16-row tiles, 256-row work items, a last partial tile), N through
# the 64-feature work panels and the 32-feature float32 panels (tails of 1, 31, 33, 63), K through
# the 32-k tile steps (tails) and the thresholds (31 rows; 32 rows with K < 768).
SHAPES = [
    (32, 768, 64), (33, 800, 65), (47, 1000, 1), (64, 384, 97), (100, 300, 200), (257, 129, 127),
    (300, 96, 64), (520, 70, 33), (48, 3072, 130),
    (31, 1000, 50), (32, 700, 64), (40, 300, 50), (1, 768, 64), (16, 768, 64),
]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_shapes(rng, high, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    check(x, w, b)
    check(x, w)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"])
def test_activations(rng, high, activation):
    x, w, b = randn(rng, 70, 600), randn(rng, 130, 600) * 0.1, randn(rng, 130)
    check(x, w, b, activation)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("m,k,n", [(64, 768, 100), (40, 1000, 65)])
def test_residual(rng, high, activation, m, k, n):
    # Linear adds the residual in place: the GEMM's residual aliases its output.
    x, w, b, r = randn(rng, m, k), randn(rng, n, k) * 0.1, randn(rng, n), randn(rng, m, n)
    check(x, w, b, activation, r)


def test_error_is_below_bfloat16_and_above_float32(rng, high):
    # The split keeps 16 significant bits: far better than one bfloat16 rounding, not float32.
    m, k, n = 64, 768, 256
    x, w = randn(rng, m, k), randn(rng, n, k)
    y = check(x, w)
    if not on_tiles(m, k):
        pytest.skip("float32 FMA here: no bfloat16x3 tiles")
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    rel = np.abs(y - ref) / scale
    y16 = ops.Linear(w, None, dtype="bfloat16")(x)
    assert rel.max() < 0.05 * (np.abs(y16 - ref) / scale).max()
    assert rel.max() > 0.5 * (np.abs(highest(ops.Linear(w), x) - ref) / scale).max()


def test_threads_agree(rng, high):
    x, w, b = randn(rng, 100, 800), randn(rng, 300, 800), randn(rng, 300)
    assert_threads_agree(ops.Linear(w, b, "relu"), x)


def test_nonfinite_values_propagate(rng, high):
    # On the tiles an infinite value's lo part is inf − inf = NaN: every output it reaches is NaN
    # (docs/precision.md); float32 FMA gives ±inf there. Either way nothing else changes.
    m, k, n = 40, 800, 70
    x, w = randn(rng, m, k), randn(rng, n, k)
    w[3, 10] = np.nan
    w[40, k - 1] = np.inf
    w[65, 0] = -np.inf
    w[66, 5] = np.finfo(np.float32).max  # rounds to inf in bfloat16
    x[7, 20] = np.nan
    y = ops.Linear(w)(x)
    assert np.isnan(y[:, 3]).all() and np.isnan(y[7]).all()
    rows = np.setdiff1d(np.arange(m), [7])
    if on_tiles(m, k):
        assert np.isnan(y[:, [40, 65, 66]]).all()
    else:
        assert np.all(np.isinf(y[rows, 40]) & (np.sign(y[rows, 40]) == np.sign(x[rows, k - 1])))
        assert np.all(np.isinf(y[rows, 65]) & (np.sign(y[rows, 65]) == -np.sign(x[rows, 0])))
    others = np.setdiff1d(np.arange(n), [3, 40, 65, 66])
    assert np.isfinite(y[np.ix_(rows, others)]).all()


def test_exact_small_integers(rng, high):
    # Small integers are bfloat16 values (lo = 0) and every float32 partial sum of them is exact.
    m, k, n = 64, 800, 50
    x = rng.integers(-8, 9, (m, k)).astype(np.float32)
    w = rng.integers(-8, 9, (n, k)).astype(np.float32)
    y = ops.Linear(w)(x)
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32))
