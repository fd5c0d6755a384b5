"""layer_norm and rms_norm (with the fused residual add) against float64 NumPy references.

Tolerance: max |got - ref| <= 1e-5·max(1, |ref|) element-wise; the statistics are accumulated in
float32 (two-pass mean and centred variance), the reference in float64.
"""

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core

SIZES = [1, 3, 7, 17, 33, 65, 127, 4097]
ALIASINGS = ["none", "y=x", "y=residual", "sum=x", "sum=residual", "sum=x,y=residual", "sum=residual,y=x"]


def layer_norm_reference(x, weight, bias, eps, residual):
    s = x.astype(np.float64) + (0.0 if residual is None else residual.astype(np.float64))
    mean = s.mean(axis=-1, keepdims=True)
    var = ((s - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (s - mean) / np.sqrt(var + eps) * weight.astype(np.float64)
    return y + (0.0 if bias is None else bias.astype(np.float64))


def rms_norm_reference(x, weight, eps, residual):
    s = x.astype(np.float64) + (0.0 if residual is None else residual.astype(np.float64))
    return s / np.sqrt((s * s).mean(axis=-1, keepdims=True) + eps) * weight.astype(np.float64)


def assert_close(got, ref):
    assert got.dtype == np.float32 and got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref)
    bound = 1e-5 * np.maximum(1.0, np.abs(ref))
    assert np.all(err <= bound), f"max error {err.max():.3g} (bound {bound.flat[np.argmax(err - bound)]:.3g})"


def make(rng, shape, residual):
    n = shape[-1]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    r = (rng.standard_normal(shape) * 1.5 - 0.3).astype(np.float32) if residual else None
    w = (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)
    b = (0.5 * rng.standard_normal(n)).astype(np.float32)
    return x, r, w, b


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_layer_norm(rng, n, residual, with_bias):
    x, r, w, b = make(rng, (5, n), residual)
    b = b if with_bias else None
    for eps in (1e-5, 1e-12, 0.1):
        assert_close(cf.ops.layer_norm(x, w, b, eps=eps, residual=r), layer_norm_reference(x, w, b, eps, r))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(rng, n, residual):
    x, r, w, _ = make(rng, (5, n), residual)
    for eps in (1e-6, 1e-12, 0.1):
        assert_close(cf.ops.rms_norm(x, w, eps=eps, residual=r), rms_norm_reference(x, w, eps, r))


def test_default_eps(rng):
    x, r, w, b = make(rng, (3, 7), True)
    x *= 1e-3  # variance ~4e-6: eps matters
    assert_close(cf.ops.layer_norm(x, w), layer_norm_reference(x, w, None, 1e-5, None))
    assert_close(cf.ops.rms_norm(x, w), rms_norm_reference(x, w, 1e-6, None))


def test_offset_rows(rng):
    # A large common offset: the centred second pass keeps the variance accurate where
    # E[s²] - E[s]² would cancel.
    x = (rng.standard_normal((4, 768)) + 300.0).astype(np.float32)
    w = np.ones(768, np.float32)
    ref = layer_norm_reference(x, w, None, 1e-5, None)
    err = np.abs(cf.ops.layer_norm(x, w).astype(np.float64) - ref).max()
    # float32 sums of 768 values near 300 leave the mean off by up to ~3e-4 (the scalar reference's
    # sequential sum); E[s²] - E[s]² would lose the whole variance (≈1 against 9e4).
    assert err < 2e-3, err


def test_constant_rows_and_one_element():
    # Zero variance: y = bias (layer norm); rms_norm of a zero row is 0.
    x = np.full((2, 33), 3.0, np.float32)
    w = np.full(33, 2.0, np.float32)
    b = np.arange(33, dtype=np.float32)
    np.testing.assert_allclose(cf.ops.layer_norm(x, w, b), np.broadcast_to(b, x.shape), atol=1e-6)
    np.testing.assert_array_equal(cf.ops.rms_norm(np.zeros((2, 17), np.float32), w[:17]), 0.0)
    one = cf.ops.layer_norm(np.float32([[5.0], [-1.0]]), np.float32([2.0]), np.float32([0.25]))
    np.testing.assert_array_equal(one, [[0.25], [0.25]])


def test_shapes_threads_and_layouts(rng):
    # [2, 32, 768]: 64 rows, enough to split over threads; 1-D input; a non-contiguous view.
    x, r, w, b = make(rng, (2, 32, 768), True)
    assert_close(cf.ops.layer_norm(x, w, b, residual=r), layer_norm_reference(x, w, b, 1e-5, r))
    assert_close(cf.ops.rms_norm(x, w, residual=r), rms_norm_reference(x, w, 1e-6, r))
    assert_close(cf.ops.layer_norm(x[0, 0], w, b), layer_norm_reference(x[0, 0], w, b, 1e-5, None))
    xf = np.asfortranarray(x[0])  # not C order: copied by the binding
    assert not xf.flags.c_contiguous
    assert_close(cf.ops.rms_norm(xf, w), rms_norm_reference(xf, w, 1e-6, None))


def test_inputs_are_not_modified(rng):
    x, r, w, b = make(rng, (3, 65), True)
    copies = [a.copy() for a in (x, r, w, b)]
    cf.ops.layer_norm(x, w, b, residual=r)
    cf.ops.rms_norm(x, w, residual=r)
    for a, c in zip((x, r, w, b), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("aliasing", ALIASINGS)
@pytest.mark.parametrize("n", [7, 33, 4097])
def test_fused_sum_out_and_aliasing(rng, kind, aliasing, n):
    # sum_out = x + residual is written in the first pass, and y / sum_out may point into x or
    # residual (norm.h); the private hook runs exactly those layouts on copies.
    x, r, w, b = make(rng, (3, n), True)
    bias = b if kind == "layer_norm" else None
    y, s = _core._norm_fused(kind, x, w, bias, 1e-5, r, aliasing)
    ref = layer_norm_reference(x, w, bias, 1e-5, r) if kind == "layer_norm" else rms_norm_reference(x, w, 1e-5, r)
    assert_close(y, ref)
    np.testing.assert_array_equal(s, x + r)  # one float32 add, exactly


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("aliasing", ["none", "y=x", "sum=x"])
def test_fused_without_residual(rng, kind, aliasing):
    x, _, w, b = make(rng, (2, 65), False)
    y, s = _core._norm_fused(kind, x, w, None, 1e-5, None, aliasing)
    ref = layer_norm_reference(x, w, None, 1e-5, None) if kind == "layer_norm" else rms_norm_reference(x, w, 1e-5, None)
    assert_close(y, ref)
    if aliasing != "y=x":
        np.testing.assert_array_equal(s, x)


def test_errors():
    x = np.zeros((2, 4), np.float32)
    w = np.ones(4, np.float32)
    for fn in (cf.ops.layer_norm, cf.ops.rms_norm):
        with pytest.raises(TypeError, match="x must have dtype float32, got float64"):
            fn(np.zeros((2, 4)), w)
        with pytest.raises(TypeError, match="x must be a numpy.ndarray of float32, got list"):
            fn([[1.0, 2.0]], w)
        with pytest.raises(TypeError, match="weight must have dtype float32, got float16"):
            fn(x, w.astype(np.float16))
        with pytest.raises(ValueError, match=r"x must have at least 1 dimension \[\.\.\., N\], got a scalar"):
            fn(np.array(1.0, np.float32), w)
        with pytest.raises(ValueError, match=r"x must not have an empty dimension, got shape \[0, 4\]"):
            fn(np.zeros((0, 4), np.float32), w)
        with pytest.raises(ValueError, match=r"x must not have an empty dimension, got shape \[2, 0\]"):
            fn(np.zeros((2, 0), np.float32), w[:0])
        with pytest.raises(ValueError, match=r"weight must have shape \[4\] \(the last dimension of x\), got \[3\]"):
            fn(x, w[:3])
        with pytest.raises(ValueError, match=r"weight must have shape \[4\] \(the last dimension of x\), got \[1, 4\]"):
            fn(x, w[None])
        with pytest.raises(ValueError, match=r"residual must have the shape of x \[2, 4\], got \[4\]"):
            fn(x, w, residual=w)
        with pytest.raises(TypeError, match="residual must have dtype float32, got int32"):
            fn(x, w, residual=x.astype(np.int32))
        with pytest.raises(ValueError, match="eps must be >= 0, got -0.001"):
            fn(x, w, eps=-1e-3)
        with pytest.raises(ValueError, match="eps must be >= 0, got nan"):
            fn(x, w, eps=float("nan"))
    with pytest.raises(ValueError, match=r"bias must have shape \[4\] \(the last dimension of x\), got \[5\]"):
        cf.ops.layer_norm(x, w, np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="bias must be a numpy.ndarray of float32, got float"):
        cf.ops.layer_norm(x, w, 0.5)
    # The private test hook's own checks.
    with pytest.raises(ValueError, match="kind must be 'layer_norm' or 'rms_norm', got 'batch_norm'"):
        _core._norm_fused("batch_norm", x, w, None, 1e-5, None, "none")
    with pytest.raises(ValueError, match=r"aliasing must be one of none, y=x, y=residual, sum=x, sum=residual, "
                                         r"sum=x,y=residual, sum=residual,y=x, got 'y=w'"):
        _core._norm_fused("rms_norm", x, w, None, 1e-5, None, "y=w")
    with pytest.raises(ValueError, match="aliasing 'sum=residual' needs a residual"):
        _core._norm_fused("rms_norm", x, w, None, 1e-5, None, "sum=residual")
