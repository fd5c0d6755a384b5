"""Activations, softmax and SwiGLU against float64 NumPy references.

Tolerances: element-wise activations |got - ref| <= 2e-6 + 1e-6·|ref| (float32 evaluation of the
reference formulas); softmax relative 1e-5 + 1e-8 absolute (a float32 sum over up to 4097 terms);
silu_mul (2e-6 + 1e-6·|silu|)·|up|. quick_gelu is x·σ(1.702·x) (CLIP). Special values (NaN, ±inf) must match exactly.
"""

import math

import numpy as np
import pytest

import cpuformer as cf

SIZES = [1, 3, 7, 17, 33, 65, 127, 4097]
SPECIALS = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0])
_erf = np.frompyfunc(math.erf, 1, 1)


def reference(name, x):
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "relu":
            return np.where(d < 0, 0.0, d)  # NaN stays NaN
        if name == "gelu":
            return 0.5 * d * (1.0 + _erf(d / math.sqrt(2.0)).astype(np.float64))
        if name == "gelu_tanh":
            return 0.5 * d * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (d + 0.044715 * d ** 3)))
        if name == "quick_gelu":
            return d / (1.0 + np.exp(-1.702 * d))
        return d / (1.0 + np.exp(-d))  # silu


def run(name, x):
    if name == "gelu_tanh":
        return cf.ops.gelu(x, approximate="tanh")
    return getattr(cf.ops, name)(x)


def assert_close(got, ref, atol=2e-6, rtol=1e-6):
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    finite = ~np.isnan(ref)
    np.testing.assert_array_equal(np.isinf(got[finite]), np.isinf(ref[finite]))
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    ok = finite & ~np.isinf(ref)
    err = np.abs(got[ok].astype(np.float64) - ref[ok])
    bound = atol + rtol * np.abs(ref[ok])
    worst = np.argmax(err - bound) if err.size else 0
    assert np.all(err <= bound), f"error {err[worst]:.3g} > {bound[worst]:.3g} at x={got[ok][worst]}"


def wide_inputs(rng):
    dense = np.linspace(-12.0, 12.0, 100_001, dtype=np.float32)
    magnitudes = (10.0 ** rng.uniform(-30, 38, 10_000)).astype(np.float32)
    return np.concatenate([dense, magnitudes, -magnitudes, SPECIALS])


NAMES = ["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"]


@pytest.mark.parametrize("name", NAMES)
def test_wide_range(rng, name):
    x = wide_inputs(rng)
    assert_close(run(name, x), reference(name, x))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("n", SIZES)
def test_lengths(rng, name, n):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    assert_close(run(name, x), reference(name, x))


@pytest.mark.parametrize("name", NAMES)
def test_multithreaded_and_shapes(rng, name):
    # 3 × 33 335 elements: above the per-thread minimum, so the range is split over threads.
    x = (rng.standard_normal((3, 5, 6667)) * 3).astype(np.float32)
    got = run(name, x)
    assert got.shape == x.shape
    assert_close(got, reference(name, x))
    # A non-contiguous view is copied, not misread.
    assert_close(run(name, x[:, ::2, ::3]), reference(name, x[:, ::2, ::3]))


def test_special_values():
    x = np.float32([np.nan, np.inf, -np.inf])
    np.testing.assert_array_equal(cf.ops.relu(x), [np.nan, np.inf, 0.0])
    for name in ("gelu", "gelu_tanh", "silu", "quick_gelu"):
        # +inf·1 = +inf; -inf gives NaN as in the reference (-inf·0) and PyTorch.
        np.testing.assert_array_equal(run(name, x), [np.nan, np.inf, np.nan])


def test_saturation():
    # Large negative inputs give ±0 (never a residue of 1 + erf(x) that grows with |x|), large
    # positive inputs give x itself.
    for name in ("gelu", "gelu_tanh", "silu", "quick_gelu", "relu"):
        neg = np.float32([-100.0, -1e10, -1e30, -3e38] + ([] if name in ("silu", "quick_gelu") else [-10.0]))
        got = run(name, neg)
        assert np.all(np.abs(got) < 1e-30), (name, got)
        pos = -neg
        np.testing.assert_array_equal(run(name, pos), pos)


def test_gelu_exact_and_tanh_differ(rng):
    x = np.linspace(-4, 4, 1001, dtype=np.float32)
    diff = np.abs(cf.ops.gelu(x).astype(np.float64) - cf.ops.gelu(x, approximate="tanh"))
    # The tanh approximation is off by up to ~4.7e-4 from the exact GELU.
    assert 1e-4 < diff.max() < 1e-3
    np.testing.assert_array_equal(cf.ops.gelu(x, approximate="none"), cf.ops.gelu(x))


def test_empty_input():
    for name in NAMES:
        assert run(name, np.zeros((0, 3), np.float32)).shape == (0, 3)


def softmax_reference(x):
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        m = np.max(np.where(np.isnan(d), -np.inf, d), axis=-1, keepdims=True)
        e = np.exp(d - m)
        out = e / e.sum(axis=-1, keepdims=True)
    return np.where(np.isneginf(m), 0.0, out)


def assert_softmax_close(got, ref):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("n", SIZES)
def test_softmax(rng, n):
    x = (rng.standard_normal((4, n)) * 5).astype(np.float32)
    x[1, rng.random(n) < 0.3] = -np.inf  # masked entries
    x[1, 0] = 0.0  # keep row 1 partly unmasked
    x[2, :] = -np.inf  # fully masked row -> zeros
    got = cf.ops.softmax(x)
    assert_softmax_close(got, softmax_reference(x))
    np.testing.assert_array_equal(got[2], 0.0)
    assert np.all(got[1][np.isneginf(x[1])] == 0.0)
    np.testing.assert_allclose(got[[0, 1, 3]].sum(axis=-1, dtype=np.float64), 1.0, rtol=1e-5)


def test_softmax_large_values_and_shapes(rng):
    # Max subtraction: logits around ±1e4 must not overflow. [2, 3, 40, 300]: several threads.
    x = (rng.standard_normal((2, 3, 40, 300)) * 30 + 1e4).astype(np.float32)
    assert_softmax_close(cf.ops.softmax(x), softmax_reference(x))
    assert_softmax_close(cf.ops.softmax(-x), softmax_reference(-x))
    assert cf.ops.softmax(np.float32([3.0])).tolist() == [1.0]


def test_softmax_special_values():
    x = np.float32([
        [np.nan, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0],
        [np.inf, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0],
        [np.nan] + [-np.inf] * 17,
        [-np.inf] * 17 + [1e30],
    ])
    got = cf.ops.softmax(x)
    assert np.all(np.isnan(got[0])) and np.all(np.isnan(got[1]))  # NaN / +inf poison the row
    np.testing.assert_array_equal(got[2], 0.0)  # no entry above -inf
    np.testing.assert_array_equal(got[3], [0.0] * 17 + [1.0])


@pytest.mark.parametrize("n", SIZES + [100_003])
def test_silu_mul(rng, n):
    gate = (rng.standard_normal(n) * 4).astype(np.float32)
    up = (rng.standard_normal(n) * 2).astype(np.float32)
    got = cf.ops.silu_mul(gate, up)
    silu = reference("silu", gate)
    ref = silu * up.astype(np.float64)
    bound = (2e-6 + 1e-6 * np.abs(silu)) * np.abs(up.astype(np.float64))
    assert np.all(np.abs(got - ref) <= bound)


def test_silu_mul_special_values():
    gate = np.float32([np.nan, 1.0, -np.inf, np.inf, -200.0, 2.0])
    up = np.float32([1.0, np.nan, 1.0, 2.0, 3.0, -np.inf])
    np.testing.assert_array_equal(cf.ops.silu_mul(gate, up), [np.nan, np.nan, np.nan, np.inf, -0.0, -np.inf])
    x = np.ones((2, 3), np.float32)
    assert cf.ops.silu_mul(x, x).shape == (2, 3)


def test_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh', got 'erf'"):
        cf.ops.gelu(x, approximate="erf")
    for fn in (cf.ops.gelu, cf.ops.silu, cf.ops.relu, cf.ops.softmax):
        with pytest.raises(TypeError, match="x must have dtype float32, got float64"):
            fn(np.zeros(3))
        with pytest.raises(TypeError, match="x must be a numpy.ndarray of float32, got list"):
            fn([1.0, 2.0])
    with pytest.raises(ValueError, match=r"x must have at least 1 dimension \[\.\.\., N\], got a scalar"):
        cf.ops.softmax(np.array(1.0, np.float32))
    with pytest.raises(ValueError, match=r"x must not have an empty dimension, got shape \[2, 0\]"):
        cf.ops.softmax(np.zeros((2, 0), np.float32))
    with pytest.raises(ValueError, match=r"up must have the shape of gate \[2, 3\], got \[3, 2\]"):
        cf.ops.silu_mul(x, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"up must have the shape of gate \[2, 3\], got \[6\]"):
        cf.ops.silu_mul(x, np.zeros(6, np.float32))
    with pytest.raises(TypeError, match="gate must have dtype float32, got int64"):
        cf.ops.silu_mul(np.zeros(3, np.int64), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="up must be a numpy.ndarray of float32, got tuple"):
        cf.ops.silu_mul(np.zeros(3, np.float32), (1.0, 2.0, 3.0))


def test_numpy_scalar_is_named_by_its_type():
    import cpuformer as cf
    with pytest.raises(TypeError, match=r"x must be a numpy.ndarray of float32, got numpy.float32$"):
        cf.ops.relu(np.float32(1.0))
