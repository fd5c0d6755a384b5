"""cpuformer.ops.Linear / linear (the fp32 GEMM) against a NumPy float64 reference.

Tolerance: fp32 accumulation over K terms in any order, so
|y - ref| <= 1e-5 * sqrt(K) * scale, where scale is the largest |value| among the pre-activation
reference and the residual (the activations are Lipschitz with constant <= 1.1).
The sizes cover the vector and tile tails of every ISA (AVX-512 tiles are 14 x 32, AVX2 6 x 16),
the few-row (GEMV) path (M <= 8), several K slices (K > 256), several row blocks (M > 336) and both
ways of sharing rows between threads (each thread its own rows for narrow N; the whole team on
each row block for wide N or few rows).
"""

import math
import re

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import ops

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu", "quick_gelu"]
_erf = np.vectorize(math.erf)


def reference(x, w, bias=None, activation=None, residual=None):
    """(y, scale): y in float64, scale = the magnitude the rounding error is relative to."""
    z = x.astype(np.float64) @ w.astype(np.float64).T
    if bias is not None:
        z = z + bias
    scale = float(np.abs(z).max()) if z.size else 0.0
    if activation == "relu":
        y = np.maximum(z, 0.0)
    elif activation == "gelu":
        y = 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    elif activation == "gelu_tanh":
        y = 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    elif activation == "silu":
        y = z / (1.0 + np.exp(-z))
    elif activation == "quick_gelu":
        y = z / (1.0 + np.exp(-1.702 * z))
    else:
        y = z
    if residual is not None:
        y = y + residual
        scale = max(scale, float(np.abs(residual).max()))
    return y, scale


def check(y, x, w, bias=None, activation=None, residual=None):
    k = w.shape[1]
    ref, scale = reference(x, w, bias, activation, residual)
    assert y.dtype == np.float32
    assert y.shape == ref.shape
    err = float(np.abs(y - ref).max())
    tol = 1e-5 * math.sqrt(k) * max(scale, 1e-30)
    assert err <= tol, f"max |err| {err:.3g} > {tol:.3g}"


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


# Every listed M with K and N walking through the tail sizes; large K only where M and N are small.
_MS = [1, 2, 3, 4, 5, 7, 8, 9, 17, 33, 65, 127, 256]
_KS = [1, 3, 7, 17, 33, 65, 127]
_NS = [1, 3, 7, 17, 33, 65, 127]
SHAPES = [(m, _KS[i % len(_KS)], _NS[(i + 3) % len(_NS)]) for i, m in enumerate(_MS)]
SHAPES += [(m, _KS[(i + 5) % len(_KS)], _NS[(i + 1) % len(_NS)]) for i, m in enumerate(_MS)]
SHAPES += [
    (1, 4097, 33), (3, 4097, 17), (9, 4097, 7), (17, 4097, 3),  # many K slices, GEMV and tile paths
    (8, 300, 1000), (1, 257, 513),  # GEMV over many panels, split across threads
    (14, 256, 32), (15, 257, 33), (28, 512, 64),  # exact tiles and one past them
    (65, 600, 300), (127, 513, 100), (256, 300, 200),  # float32: up to 256 rows on the GEMV kernel
    (257, 600, 300), (300, 513, 100),  # blocked: several K slices and panels
    (700, 64, 40), (1000, 33, 17),  # several row blocks, each thread its own rows
    (700, 40, 800), (130, 40, 1000),  # wide N: the team shares each row block
    (12, 700, 300), (64, 257, 130), (41, 4097, 130),  # 9+ rows: the GEMV kernel in row chunks
    (48, 100, 20),  # too few panels: blocked instead
    (16, 700, 300), (28, 1000, 130), (21, 129, 200),  # avx512: 15-28 rows in two chunks over K blocks
]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_shapes_with_bias(rng, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    check(ops.Linear(w, b)(x), x, w, b)


@pytest.mark.parametrize("m,k,n", [(1, 7, 3), (5, 65, 17), (33, 127, 65), (127, 300, 33)])
def test_shapes_without_bias(rng, m, k, n):
    x, w = randn(rng, m, k), randn(rng, n, k)
    check(ops.Linear(w)(x), x, w)


@pytest.mark.parametrize("activation", ACTIVATIONS[1:])
@pytest.mark.parametrize("m,k,n", [(1, 33, 17), (4, 300, 65), (9, 7, 3), (20, 600, 130), (33, 257, 127),
                                   (256, 600, 40)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_activations(rng, activation, m, k, n, with_bias):
    x, w = randn(rng, m, k), randn(rng, n, k) / np.float32(math.sqrt(k))  # pre-activations of order 1
    b = randn(rng, n) if with_bias else None
    check(ops.Linear(w, b, activation)(x), x, w, b, activation)


@pytest.mark.parametrize("activation", [None, "gelu", "silu"])
@pytest.mark.parametrize("m,k,n", [(1, 17, 33), (7, 600, 65), (17, 33, 7), (16, 700, 130), (28, 300, 200),
                                   (40, 300, 100), (65, 257, 100), (400, 600, 50)])
def test_residual_accumulates_in_place(rng, activation, m, k, n):
    # The binding copies the residual into the output and the GEMM accumulates onto it in place,
    # including when K is cut into several slices (k > 256) and the activation needs the full sum.
    x, w, b, r = randn(rng, m, k), randn(rng, n, k) / np.float32(math.sqrt(k)), randn(rng, n), randn(rng, m, n)
    r_before = r.copy()
    y = ops.Linear(w, b, activation)(x, residual=r)
    check(y, x, w, b, activation, r)
    np.testing.assert_array_equal(r, r_before)  # the caller's residual is untouched


def test_nd_input(rng):
    x, w, b = randn(rng, 2, 3, 5, 33), randn(rng, 17, 33), randn(rng, 17)
    y = ops.Linear(w, b, "relu")(x)
    assert y.shape == (2, 3, 5, 17)
    check(y.reshape(30, 17), x.reshape(30, 33), w, b, "relu")
    r = randn(rng, 2, 3, 5, 17)
    y = ops.Linear(w, b)(x, residual=r)
    check(y.reshape(30, 17), x.reshape(30, 33), w, b, None, r.reshape(30, 17))


def test_one_dimensional_input(rng):
    x, w = randn(rng, 65), randn(rng, 7, 65)
    y = ops.Linear(w)(x)
    assert y.shape == (7,)
    check(y[None], x[None], w)


def test_non_contiguous_inputs_are_copied(rng):
    big = randn(rng, 40, 2 * 33)
    x = big[:, ::2]  # strided rows
    w = randn(rng, 33, 17).T  # Fortran-ordered weight
    b = randn(rng, 34)[::2]
    r = randn(rng, 17, 40).T
    assert not (x.flags.c_contiguous or w.flags.c_contiguous or b.flags.c_contiguous or r.flags.c_contiguous)
    check(ops.Linear(w, b)(x, residual=r), np.ascontiguousarray(x), np.ascontiguousarray(w), b, None, r)


def test_linear_function_matches_module(rng):
    x, w, b = randn(rng, 9, 65), randn(rng, 33, 65), randn(rng, 33)
    np.testing.assert_array_equal(ops.linear(x, w, b, "silu"), ops.Linear(w, b, "silu")(x))
    check(ops.linear(x, w), x, w)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m,k,n", [(3, 300, 200), (65, 300, 200), (500, 40, 100)])
def test_thread_counts(rng, threads, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    before = cf.get_num_threads()
    try:
        cf.set_num_threads(threads)
        y = ops.Linear(w, b)(x)
    finally:
        cf.set_num_threads(before)
    check(y, x, w, b)


def test_concurrent_calls_from_python_threads(rng):
    # Each calling thread gets its own thread pool and its own packing scratch.
    import concurrent.futures

    w, b = randn(rng, 100, 300), randn(rng, 100)
    lin = ops.Linear(w, b, "relu")
    xs = [randn(rng, m, 300) for m in (3, 40, 65, 200)] * 2
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        ys = list(pool.map(lin, xs))
    for x, y in zip(xs, ys):
        check(y, x, w, b, "relu")


def test_weights_are_packed_once(rng):
    w, b = randn(rng, 33, 17), randn(rng, 33)
    w0, b0 = w.copy(), b.copy()
    lin = ops.Linear(w, b)
    w[:] = 0.0  # the packed copy must not see later changes
    b[:] = 0.0
    x = randn(rng, 5, 17)
    check(lin(x), x, w0, b0)
    assert (lin.in_features, lin.out_features) == (17, 33)
    assert repr(lin) == "Linear(in_features=17, out_features=33, dtype='float32')"


def test_special_values_propagate(rng):
    x, w = randn(rng, 20, 40), randn(rng, 50, 40)
    x[3, 5] = np.nan
    x[7, 1] = np.inf
    y = ops.Linear(w)(x)
    assert np.isnan(y[3]).all()
    assert not np.isfinite(y[7]).any()
    good = [i for i in range(20) if i not in (3, 7)]
    check(y[good], x[good], w)


# ---- error messages -------------------------------------------------------------------------

def test_error_weight_not_array():
    with pytest.raises(TypeError, match="w must be a numpy.ndarray of float32, got list"):
        ops.Linear([[1.0, 2.0]])


def test_error_weight_dtype():
    with pytest.raises(TypeError, match="w must have dtype float32, got float64"):
        ops.Linear(np.zeros((2, 3)))


def test_error_weight_ndim():
    with pytest.raises(ValueError, match=r"w must have 2 dimensions \[N, K\], got shape \[3\]"):
        ops.Linear(np.zeros(3, np.float32))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0)])
def test_error_weight_empty(shape):
    with pytest.raises(ValueError, match=r"w must not have an empty dimension, got shape \[%d, %d\]" % shape):
        ops.Linear(np.zeros(shape, np.float32))


def test_error_bias_shape():
    w = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match=r"bias must have shape \[4\] \(N of w\), got \[3\]"):
        ops.Linear(w, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"bias must have shape \[4\] \(N of w\), got \[1, 4\]"):
        ops.Linear(w, np.zeros((1, 4), np.float32))


def test_error_bias_type():
    w = np.zeros((4, 3), np.float32)
    with pytest.raises(TypeError, match="bias must have dtype float32, got int64"):
        ops.Linear(w, np.zeros(4, np.int64))
    with pytest.raises(TypeError, match="bias must be a numpy.ndarray of float32, got tuple"):
        ops.Linear(w, (0.0, 0.0, 0.0, 0.0))


def test_error_unknown_activation():
    w = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError,
                       match="activation must be one of None, 'relu', 'gelu', 'gelu_tanh', 'silu', 'quick_gelu', "
                             "got 'tanh'"):
        ops.Linear(w, None, "tanh")
    with pytest.raises(ValueError, match="activation must be one of .*, got 'GELU'"):
        ops.linear(np.zeros((1, 3), np.float32), w, None, "GELU")


def test_error_input_type():
    lin = ops.Linear(np.zeros((4, 3), np.float32))
    with pytest.raises(TypeError, match="x must be a numpy.ndarray of float32, got list"):
        lin([[1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match="x must have dtype float32, got float16"):
        lin(np.zeros((2, 3), np.float16))


@pytest.mark.parametrize("shape,text", [((2, 4), r"\[2, 4\]"), ((3,) * 0, r"\[\]"), ((3, 1), r"\[3, 1\]")])
def test_error_input_k_mismatch(shape, text):
    lin = ops.Linear(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 3\] \(K of w\), got " + text):
        lin(np.zeros(shape, np.float32))


def test_error_input_empty():
    lin = ops.Linear(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"x must not have an empty dimension, got shape \[0, 3\]"):
        lin(np.zeros((0, 3), np.float32))


def test_error_residual():
    lin = ops.Linear(np.zeros((4, 3), np.float32))
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"residual must have the output's shape \[2, 4\], got \[2, 3\]"):
        lin(x, residual=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"residual must have the output's shape \[2, 4\], got \[8\]"):
        lin(x, residual=np.zeros(8, np.float32))
    with pytest.raises(TypeError, match="residual must have dtype float32, got float64"):
        lin(x, residual=np.zeros((2, 4)))


# ---- compute peak (ops.peak_gops) -------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int8", "int4", "float16", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 2, 8])  # 8: more threads than this machine's CPUs
def test_peak_gops_measures_every_dtype(dtype, threads):
    before = cf.get_num_threads()
    try:
        cf.set_num_threads(threads)
        gops = ops.peak_gops(dtype, seconds=0.02)
    finally:
        cf.set_num_threads(before)
    assert isinstance(gops, float) and math.isfinite(gops) and gops > 0


@pytest.mark.parametrize("dtype,seconds,message", [
    ("int2", 0.1, "dtype must be 'float32', 'float16', 'bfloat16', 'int8' or 'int4', got 'int2'"),
    ("float32", 0.0, "seconds must be in \\(0, 60\\], got 0.0"),
    ("float32", -1.0, "seconds must be in \\(0, 60\\], got -1.0"),
    ("float32", 61.0, "seconds must be in \\(0, 60\\], got 61.0"),
    ("float32", float("nan"), "seconds must be in \\(0, 60\\], got nan"),
    ("float32", float("inf"), "seconds must be in \\(0, 60\\], got inf"),
])
def test_peak_gops_errors(dtype, seconds, message):
    with pytest.raises(ValueError, match=message):
        ops.peak_gops(dtype, seconds)


@pytest.mark.parametrize("seconds", ["0.1", None, True])
def test_peak_gops_seconds_of_another_type(seconds):
    with pytest.raises(TypeError, match=rf"^seconds must be a real number, got {re.escape(repr(seconds))}$"):
        ops.peak_gops("float32", seconds)


@pytest.mark.parametrize("dtype", ["int8", "int4", "bfloat16"])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 9])
def test_row_converting_gemms_same_result_at_every_thread_count(rng, dtype, m):
    # The GEMMs that convert the rows of A first (int8 and int4 quantize them, bfloat16 rounds them
    # on AVX512-BF16) let every thread convert all rows into a copy of its own up to 4 rows, and
    # split the rows between the threads above that: each output element's arithmetic is the same
    # either way, so every thread count gives the 1-thread result bit for bit. 1024 x 1024 gives
    # each of up to 8 threads enough multiply-adds to take part.
    x, w, b, r = randn(rng, m, 1024), randn(rng, 1024, 1024), randn(rng, 1024), randn(rng, m, 1024)
    lin = ops.Linear(w, b, "gelu", dtype=dtype)
    ys = [lin(x, r, num_threads=threads) for threads in (1, 2, 3, 8)]
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    want, scale = reference(x, w, b, "gelu", r)
    # A loose check that it is this product (4-bit weights of a normal distribution err by ~9 %).
    assert np.abs(ys[0] - want).max() < (0.15 if dtype == "int4" else 0.05) * scale


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int4", "bfloat16"])
@pytest.mark.parametrize("m", [1, 3, 300])
def test_panels_taken_over_by_a_faster_thread(rng, dtype, m):
    # The decode GEMVs of every dtype, and the float32 / float16 blocked GEMM's phases, share their
    # panels out with stealing (StealingRanges in runtime/thread_pool.h for the row-converting
    # kernels, the ranges of gemm_driver_inl.h for float32 and the widening kernels): a thread whose
    # own panels are done takes the last unclaimed one of another. More threads than this machine has
    # cores are descheduled at random moments, so over many calls panels change hands at every
    # point of the split; each must still be computed exactly once, the same way (1000 columns:
    # the last panel is partial). 300 rows: the blocked GEMM (float32) and the row blocks of the
    # row-converting GEMMs, whose static split must agree as well.
    x, w, b = randn(rng, m, 512), randn(rng, 1000, 512), randn(rng, 1000)
    lin = ops.Linear(w, b, None, dtype=dtype)
    want = lin(x, num_threads=1)
    for _ in range(20 if m <= 4 else 3):
        for threads in (3, 8):
            np.testing.assert_array_equal(lin(x, num_threads=threads), want)
