"""Vectorised elementary functions (csrc/kernels/vector_math) against float64 references.

They run through the private test hook ``_core._vector_math`` at the active ISA level
(tests/test_runtime.py repeats this file at every lower level). The tolerances are the errors
stated in vector_math_avx512.h, measured there over every float input, with a little headroom.
"""

import math

import numpy as np
import pytest

from cpuformer import _core

FUNCTIONS = ["exp", "exp_nan_propagating", "erf", "tanh", "sigmoid"]
SIZES = [1, 3, 7, 17, 33, 65, 127, 4097]


def vector_math(name, x):
    return _core._vector_math(name, np.ascontiguousarray(x, dtype=np.float32))


def finite_inputs(rng):
    """Dense around the interesting range, plus magnitudes from 1e-30 to 1e30 of both signs."""
    dense = np.linspace(-20.0, 20.0, 200_001, dtype=np.float32)
    magnitudes = (10.0 ** rng.uniform(-30, 30, 20_000)).astype(np.float32)
    return np.concatenate([dense, magnitudes, -magnitudes, np.float32([0.0, -0.0])])


_erf = np.frompyfunc(math.erf, 1, 1)


def reference(name, x):
    d = x.astype(np.float64)
    with np.errstate(over="ignore"):
        if name in ("exp", "exp_nan_propagating"):
            return np.exp(d)
        if name == "erf":
            return _erf(d).astype(np.float64)
        if name == "tanh":
            return np.tanh(d)
        return 1.0 / (1.0 + np.exp(-d))


def max_errors(got, ref):
    err = np.abs(got.astype(np.float64) - ref)
    rel = err[np.abs(ref) > 1e-30] / np.abs(ref[np.abs(ref) > 1e-30])
    return err.max(), rel.max()


def test_exp_accuracy(rng):
    # Where e^x is a normal float and below the AVX2 clamp (88.376): relative error <= 2.3e-7.
    x = finite_inputs(rng)
    x = x[(x > -87.3) & (x < 88.3)]
    for name in ("exp", "exp_nan_propagating"):
        _, rel = max_errors(vector_math(name, x), reference(name, x))
        assert rel <= 2.5e-7, f"{name}: max relative error {rel:.3g}"


def test_exp_underflow_and_nan():
    x = np.float32([-np.inf, -1e30, -104.0, -88.0, -87.5])
    for name in ("exp", "exp_nan_propagating"):
        got = vector_math(name, x)
        # The SIMD versions flush to exactly 0 below -87.34; the reference's denormals are < 1e-37.
        assert np.all(got >= 0.0) and np.all(got < 1e-37), (name, got)
    assert np.isnan(vector_math("exp_nan_propagating", np.float32([np.nan]))[0])


@pytest.mark.parametrize("name,abs_tol,rel_tol", [
    ("erf", 4.5e-7, 4.5e-7),
    ("tanh", 4.5e-7, 4.5e-7),
    ("sigmoid", 1.2e-7, 3.5e-7),
])
def test_accuracy(rng, name, abs_tol, rel_tol):
    x = finite_inputs(rng)
    got = vector_math(name, x)
    abs_err, rel_err = max_errors(got, reference(name, x))
    assert abs_err <= abs_tol, f"{name}: max absolute error {abs_err:.3g}"
    assert rel_err <= rel_tol, f"{name}: max relative error {rel_err:.3g}"


def test_saturation_is_exact():
    # erf and tanh round to ±1 in float beyond 3.85 and 9: the result must be exactly ±1, so that
    # 1 + erf(x) in GELU cancels to exactly 0 instead of leaving a residue that grows with |x|.
    for name, start in (("erf", 4.0), ("tanh", 9.5)):
        big = np.float32([start, start + 0.5, 100.0, 1e10, 3e38, np.inf])
        np.testing.assert_array_equal(vector_math(name, big), np.ones_like(big))
        np.testing.assert_array_equal(vector_math(name, -big), -np.ones_like(big))
    np.testing.assert_array_equal(vector_math("sigmoid", np.float32([20.0, 100.0, 3e38, np.inf])), 1.0)
    tail = vector_math("sigmoid", np.float32([-100.0, -1e10, -3e38, -np.inf]))
    assert np.all(tail >= 0.0) and np.all(tail < 1e-40)


def test_tiny_inputs_keep_relative_accuracy():
    x = np.float32([1e-30, -1e-20, 1e-10, 3e-5])
    np.testing.assert_allclose(vector_math("erf", x), 2.0 / math.sqrt(math.pi) * x.astype(np.float64), rtol=4e-7)
    np.testing.assert_allclose(vector_math("tanh", x), x, rtol=2e-7)


@pytest.mark.parametrize("name", ["exp_nan_propagating", "erf", "tanh", "sigmoid"])
def test_nan_propagates(name):
    x = np.float32([1.0, np.nan, -2.0, np.nan])
    got = vector_math(name, x)
    np.testing.assert_array_equal(np.isnan(got), [False, True, False, True])


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_length_matches_elementwise(rng, name):
    # Full vectors and masked tails must give the same values element by element.
    x = rng.uniform(-10, 10, max(SIZES)).astype(np.float32)
    whole = vector_math(name, x)
    for n in SIZES:
        np.testing.assert_array_equal(vector_math(name, x[:n]), whole[:n])
        np.testing.assert_array_equal(vector_math(name, x[-n:]), whole[-n:])


def test_shape_is_kept():
    x = np.zeros((2, 3, 5), np.float32)
    assert vector_math("tanh", x).shape == (2, 3, 5)
    assert _core._vector_math("erf", np.zeros((0,), np.float32)).shape == (0,)


def test_errors():
    with pytest.raises(ValueError, match=r"function must be one of exp, exp_nan_propagating, erf, tanh, sigmoid, "
                                         r"got 'cosh'"):
        _core._vector_math("cosh", np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="x must have dtype float32, got float64"):
        _core._vector_math("erf", np.zeros(3))
    with pytest.raises(TypeError, match="x must be a numpy.ndarray of float32, got list"):
        _core._vector_math("erf", [1.0])


# ---- row reductions (beam search's log-softmax and top-k scan) ------------------------------------

def _find_greater(x, offset, threshold):
    hits = np.nonzero((x + np.float32(offset)).astype(np.float32) > np.float32(threshold))[0]
    return int(hits[0]) if hits.size else x.size


@pytest.mark.parametrize("n", [0, 1, 7, 8, 15, 16, 17, 31, 33, 58101])
def test_row_reductions(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    shift = float(x.max()) if n else 0.0
    m, s, _ = _core._row_reductions(x, shift, 0.0, 0.0)
    assert m == (x.max() if n else -np.inf)
    # Each exp term to the vector exp's accuracy (a few ulp), summed in double.
    ref = float(np.exp(x.astype(np.float64) - np.float32(shift)).sum())
    assert abs(s - ref) <= 1e-6 * ref + 1e-300
    # find_greater: the first index whose float32 x + offset beats the threshold, at every position
    # (the tail of a vector and the scalar remainder included).
    for offset in (0.0, -1.5, 3.25):
        for threshold in (-np.inf, 0.0, 5.0, 1e30):
            assert _core._row_reductions(x, 0.0, offset, threshold)[2] == _find_greater(x, offset, threshold)
    for position in {0, n // 2, n - 1} if n else ():
        y = np.full(n, -2.0, np.float32)
        y[position] = 1.0
        assert _core._row_reductions(y, 0.0, 0.5, 1.0)[2] == position
        assert _core._row_reductions(y, 0.0, 0.0, 1.0)[2] == n  # equal is not greater


def test_row_reductions_rounding_and_special_values():
    # x + offset rounds exactly as float32: 1 + 2**-24 rounds to 1 (not greater than 1).
    x = np.float32([1.0, 1.0, 1.0, 2.0])
    assert _core._row_reductions(x, 0.0, 2.0**-24, 1.0)[2] == 3
    assert _core._row_reductions(x, 0.0, 2.0**-23, 1.0)[2] == 0
    # NaN is skipped by the max and never greater; all-NaN gives -inf; inf is the max.
    y = np.full(37, np.nan, np.float32)
    m, _, index = _core._row_reductions(y, 0.0, 0.0, -np.inf)
    assert (m, index) == (-np.inf, 37)
    y[20] = -3.0
    assert _core._row_reductions(y, 0.0, 0.0, -4.0)[0] == -3.0
    assert _core._row_reductions(y, 0.0, 0.0, -4.0)[2] == 20
    y[5] = np.inf
    assert _core._row_reductions(y, 0.0, 0.0, 0.0)[0] == np.inf
    # -inf entries add nothing to the sum.
    z = np.float32([-np.inf] * 20 + [0.0])
    assert _core._row_reductions(z, 0.0, 0.0, 0.0)[1] == 1.0
