"""Hostile arguments to every ``cpuformer.ops`` entry point (hypothesis property tests).

Contract: a call either works — and then the result matches a float64 NumPy reference (and the
result for a non-contiguous copy of the input is bitwise the same) — or raises the documented
TypeError (wrong type / dtype) or ValueError (wrong shape, empty dimension, bad option value).
Any other exception fails the test; a crash fails the run. Inputs are small (so that thousands of
cases run in seconds); ``wild`` cases sprinkle NaN, ±inf, ±3.4e38 and denormals into the data and
then require the outputs that do not depend on a special value (other elements of an elementwise
op, other rows of a row-wise op) to be unaffected.

Each entry point gets at least 2,000 calls (``_support.CALLS_PER_ENTRY_POINT``; a tenth under the
sanitizer build).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cpuformer as cf

from ._support import (
    NON_ARRAYS,
    WRONG_DTYPES,
    CallCounter,
    assert_same,
    non_contiguous,
    property_settings,
    random_floats,
    with_dtype,
)

ops = cf.ops
_erf = np.frompyfunc(math.erf, 1, 1)

seeds = st.integers(0, 2**32 - 1)
shapes_any = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)  # 0-d .. 4-d, zero-length dims
hostile_dtypes = st.sampled_from(WRONG_DTYPES)
non_arrays = st.sampled_from(NON_ARRAYS)
two_dtypes = st.lists(hostile_dtypes, min_size=2, max_size=2, unique=True)


@pytest.fixture(autouse=True)
def one_thread():
    """The argument contract does not depend on the thread count, and these inputs are tiny: one
    thread keeps thousands of calls cheap on a loaded machine (a thread pool team's barriers are slow
    when its cores are busy). tests/reliability/test_concurrency.py covers the threaded paths."""
    cf.set_num_threads(1)
    yield
    cf.set_num_threads(0)  # the automatic default, which the rest of the suite runs with


def tame(x: np.ndarray) -> np.ndarray:
    """Entries an op must handle like ordinary numbers (no special value, no overflow of x² in float32)."""
    a = np.abs(x.astype(np.float64))
    return np.isfinite(a) & ((a == 0) | ((a > 1e-15) & (a < 1e15)))


def elementwise_reference(name: str, x: np.ndarray) -> np.ndarray:
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "relu":
            return np.where(d < 0, 0.0, d)
        if name == "gelu":
            return 0.5 * d * (1.0 + np.asarray(_erf(d / math.sqrt(2.0)), dtype=np.float64))
        if name == "gelu_tanh":
            return 0.5 * d * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (d + 0.044715 * d ** 3)))
        return d / (1.0 + np.exp(-d))  # silu


def assert_matches(got, ref, where, rtol, atol):
    assert got.dtype == np.float32 and got.shape == ref.shape
    g, r = got[where].astype(np.float64), ref[where]
    np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def row_tame(x: np.ndarray) -> np.ndarray:
    return np.all(tame(x), axis=-1)


# ---- elementwise activations --------------------------------------------------------------------

ELEMENTWISE = {
    "relu": lambda x: ops.relu(x),
    "silu": lambda x: ops.silu(x),
    "gelu": lambda x: ops.gelu(x),
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
}
ENTRY = {"relu": "relu", "silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu"}


@pytest.mark.parametrize("entry", ["relu", "silu", "gelu"])
def test_elementwise(entry):
    calls = CallCounter()
    names = [n for n, e in ENTRY.items() if e == entry]

    @property_settings(360)
    @given(shape=shapes_any, seed=seeds, wild=st.booleans(), variant=st.sampled_from(names),
           bad_dtypes=two_dtypes, bad_object=non_arrays)
    def check(shape, seed, wild, variant, bad_dtypes, bad_object):
        fn = ELEMENTWISE[variant]
        x = random_floats(seed, shape, wild, scale=4.0)
        y = calls.ok(entry, fn, x)
        ref = elementwise_reference(variant, x)
        where = tame(x)
        assert_matches(y, ref, where, rtol=2e-5, atol=2e-6)
        # Elementwise ops are exact on the structure: non-contiguous input gives the same bits.
        y2 = calls.ok(entry, fn, non_contiguous(x))
        assert_same(y2, y)
        y3 = calls.ok(entry, fn, x.T)  # a transposed (Fortran-order) view
        assert_same(y3, y.T)
        for bad_dtype in bad_dtypes:
            calls.raises(entry, TypeError, "must have dtype float32", fn, with_dtype(x, bad_dtype))
        calls.raises(entry, TypeError, "must be a numpy.ndarray of float32", fn, bad_object)
        if entry == "gelu":
            calls.raises(entry, ValueError, "approximate must be 'none' or 'tanh'", ops.gelu, x, approximate="erf")
            calls.raises(entry, TypeError, "", ops.gelu, x, approximate=None)

    check()
    calls.require(entry)


# ---- softmax -------------------------------------------------------------------------------------

def softmax_reference(x):
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        m = np.max(np.where(np.isnan(d), -np.inf, d), axis=-1, keepdims=True)
        e = np.exp(d - m)
        out = e / e.sum(axis=-1, keepdims=True)
    return np.where(np.isneginf(m), 0.0, out)


def test_softmax():
    calls = CallCounter()

    @property_settings(480)
    @given(shape=shapes_any, seed=seeds, wild=st.booleans(), masked=st.floats(0, 1),
           bad_dtypes=two_dtypes, bad_object=non_arrays)
    def check(shape, seed, wild, masked, bad_dtypes, bad_object):
        x = random_floats(seed, shape, wild, scale=5.0)
        if x.ndim >= 1 and x.size:
            x[np.random.default_rng(seed).random(x.shape) < masked] = -np.inf  # attention-style masking
        if x.ndim == 0:
            calls.raises("softmax", ValueError, "at least 1 dimension", ops.softmax, x)
        elif x.size == 0:
            calls.raises("softmax", ValueError, "must not have an empty dimension", ops.softmax, x)
            calls.raises("softmax", ValueError, "must not have an empty dimension", ops.softmax, non_contiguous(x))
        else:
            y = calls.ok("softmax", ops.softmax, x)
            ref = softmax_reference(x)
            rows = np.broadcast_to(row_tame(np.where(np.isneginf(x), 0.0, x))[..., None], x.shape)
            assert_matches(y, ref, rows, rtol=1e-5, atol=1e-7)
            y2 = calls.ok("softmax", ops.softmax, non_contiguous(x))
            assert_same(y2, y)
        for bad_dtype in bad_dtypes:
            calls.raises("softmax", TypeError, "must have dtype float32", ops.softmax, with_dtype(x, bad_dtype))
        calls.raises("softmax", TypeError, "must be a numpy.ndarray of float32", ops.softmax, bad_object)

    check()
    calls.require("softmax")


# ---- silu_mul ------------------------------------------------------------------------------------

def test_silu_mul():
    calls = CallCounter()

    @property_settings(360)
    @given(shape=shapes_any, seed=seeds, wild=st.booleans(), bad_dtype=hostile_dtypes, bad_object=non_arrays,
           extra=st.integers(1, 3))
    def check(shape, seed, wild, bad_dtype, bad_object, extra):
        gate = random_floats(seed, shape, wild, scale=4.0)
        up = random_floats(seed + 1, shape, wild, scale=2.0)
        y = calls.ok("silu_mul", ops.silu_mul, gate, up)
        with np.errstate(all="ignore"):
            ref = elementwise_reference("silu", gate) * up.astype(np.float64)
        where = tame(gate) & tame(up)
        assert_matches(y, ref, where, rtol=2e-5, atol=2e-6 * max(1.0, float(np.max(np.abs(up[where]), initial=0))))
        y2 = calls.ok("silu_mul", ops.silu_mul, non_contiguous(gate), non_contiguous(up))
        assert_same(y2, y)
        calls.raises("silu_mul", TypeError, "gate must have dtype float32", ops.silu_mul, with_dtype(gate, bad_dtype),
                     up)
        calls.raises("silu_mul", TypeError, "up must have dtype float32", ops.silu_mul, gate, with_dtype(up, bad_dtype))
        calls.raises("silu_mul", TypeError, "up must be a numpy.ndarray of float32", ops.silu_mul, gate, bad_object)
        calls.raises("silu_mul", TypeError, "gate must be a numpy.ndarray of float32", ops.silu_mul, bad_object, up)
        other = np.zeros(shape + (extra,), np.float32)
        calls.raises("silu_mul", ValueError, "up must have the shape of gate", ops.silu_mul, gate, other)

    check()
    calls.require("silu_mul")


# ---- layer_norm / rms_norm -----------------------------------------------------------------------

norm_shapes = st.tuples(st.lists(st.integers(0, 4), max_size=2).map(tuple), st.integers(0, 40))
epsilons = st.sampled_from([1e-12, 1e-6, 1e-5, 0.1])


def norm_reference(kind, x, w, b, eps, residual):
    with np.errstate(all="ignore"):
        s = x.astype(np.float64) + (0.0 if residual is None else residual.astype(np.float64))
        if kind == "layer_norm":
            centred = s - s.mean(axis=-1, keepdims=True)
            y = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps) * w
            return y + (0.0 if b is None else b)
        return s / np.sqrt((s ** 2).mean(axis=-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_norm(kind):
    calls = CallCounter()
    fn = getattr(ops, kind)

    @property_settings(400)
    @given(shape=norm_shapes, seed=seeds, wild=st.booleans(), eps=epsilons, use_bias=st.booleans(),
           use_residual=st.booleans(), bad_dtype=hostile_dtypes, bad_object=non_arrays,
           hostiles=st.lists(st.sampled_from(["weight_shape", "residual_shape", "eps", "weight_dtype", "residual_dtype",
                                              "x_object", "scalar"]), min_size=3, max_size=3, unique=True))
    def check(shape, seed, wild, eps, use_bias, use_residual, bad_dtype, bad_object, hostiles):
        lead, n = shape
        x = random_floats(seed, lead + (n,), wild, scale=3.0) + np.float32(np.random.default_rng(seed).normal())
        w = random_floats(seed + 1, (n,), False) + np.float32(1.0)
        b = random_floats(seed + 2, (n,), False) if use_bias else None
        r = random_floats(seed + 3, x.shape, wild) if use_residual else None
        kwargs = dict(eps=eps, residual=r)
        if kind == "layer_norm":
            kwargs["bias"] = b
        if x.size == 0:
            calls.raises(kind, ValueError, "must not have an empty dimension", fn, x, w, **kwargs)
            calls.raises(kind, ValueError, "must not have an empty dimension", fn, non_contiguous(x), w, **kwargs)
        else:
            y = calls.ok(kind, fn, x, w, **kwargs)
            ref = norm_reference(kind, x, w, b if kind == "layer_norm" else None, eps, r)
            rows = row_tame(x) if r is None else row_tame(x) & row_tame(r)
            scale = 1.0 + float(np.abs(w).max()) * math.sqrt(n) + (float(np.abs(b).max()) if b is not None else 0.0)
            assert_matches(y, ref, np.broadcast_to(rows[..., None], x.shape), rtol=1e-4, atol=2e-5 * scale)
            kwargs_nc = dict(kwargs, residual=None if r is None else non_contiguous(r))
            y2 = calls.ok(kind, fn, non_contiguous(x), w, **kwargs_nc)
            assert_same(y2, y)
        if x.size == 0:  # hostile calls on an ordinary x, so that the expected message is the argument's
            n = max(n, 1)
            x, w = np.ones((2, n), np.float32), np.ones(n, np.float32)
            kwargs = dict(eps=eps, residual=None if r is None else np.ones((2, n), np.float32))
            if kind == "layer_norm":
                kwargs["bias"] = None if b is None else np.ones(n, np.float32)
        for hostile in hostiles:
            if hostile == "weight_shape":
                calls.raises(kind, ValueError, "weight must have shape", fn, x, np.ones(n + 1, np.float32), **kwargs)
            elif hostile == "residual_shape":
                calls.raises(kind, ValueError, "residual must have the shape of x",
                             fn, x, w, **dict(kwargs, residual=np.ones(x.shape + (1,), np.float32)))
            elif hostile == "eps":
                calls.raises(kind, ValueError, "eps must be >= 0", fn, x, w, **dict(kwargs, eps=-abs(eps)))
                calls.raises(kind, ValueError, "eps must be >= 0, got nan", fn, x, w, **dict(kwargs, eps=float("nan")))
            elif hostile == "weight_dtype":
                calls.raises(kind, TypeError, "weight must have dtype float32", fn, x, with_dtype(w, bad_dtype),
                             **kwargs)
            elif hostile == "residual_dtype":
                calls.raises(kind, TypeError, "residual must have dtype float32",
                             fn, x, w, **dict(kwargs, residual=with_dtype(x, bad_dtype)))
            elif hostile == "x_object":
                calls.raises(kind, TypeError, "x must be a numpy.ndarray of float32", fn, bad_object, w, **kwargs)
            else:
                calls.raises(kind, ValueError, "at least 1 dimension", fn, np.array(1.0, np.float32), w, **kwargs)

    check()
    calls.require(kind)


# ---- attention -----------------------------------------------------------------------------------

def attention_reference(q, k, v, causal, mask, scale):
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    group = H // Hkv
    kk = np.repeat(k.astype(np.float64), group, axis=1)
    vv = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), kk) * scale
    if mask is not None:
        m = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask.astype(np.float64)
        s = s + np.broadcast_to(m, s.shape)
    if causal:
        i = np.arange(Tq)[:, None]
        j = np.arange(Tk)[None, :]
        s = np.where(j <= i + Tk - Tq, s, -np.inf)
    with np.errstate(all="ignore"):
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        p = p / p.sum(axis=-1, keepdims=True)
        out = np.einsum("bhqk,bhkd->bhqd", np.where(np.isneginf(m), 0.0, p), vv)
    return out


@st.composite
def attention_cases(draw):
    B = draw(st.integers(1, 2))
    Hkv = draw(st.integers(1, 3))
    H = Hkv * draw(st.integers(1, 3))
    Tq = draw(st.integers(1, 5))
    Tk = draw(st.integers(1, 6))
    D = draw(st.sampled_from([1, 2, 3, 7, 8, 9, 16, 17]))
    full = (B, H, Tq, Tk)
    mask_kind = draw(st.sampled_from(["none", "bool", "additive"]))
    mask_shape = None
    if mask_kind != "none":
        ndim = draw(st.integers(1, 4))
        mask_shape = tuple(draw(st.sampled_from([1, size])) for size in full[4 - ndim:])
    scale = draw(st.one_of(st.none(), st.floats(-2.0, 2.0, allow_nan=False)))
    return dict(B=B, H=H, Hkv=Hkv, Tq=Tq, Tk=Tk, D=D, causal=draw(st.booleans()), mask_kind=mask_kind,
                mask_shape=mask_shape, scale=scale, seed=draw(seeds), wild=draw(st.integers(0, 4)) == 0,
                hostiles=draw(st.lists(st.sampled_from(["q_dtype", "v_object", "mask_dtype", "mask_object",
                                                        "mask_shape", "heads", "head_dim", "v_shape", "ndim", "empty",
                                                        "scale"]), min_size=3, max_size=3, unique=True)),
                bad_dtype=draw(hostile_dtypes), bad_object=draw(non_arrays))


def test_attention():
    calls = CallCounter()

    @property_settings(400)
    @given(case=attention_cases())
    def check(case):
        B, H, Hkv, Tq, Tk, D = (case[k] for k in ("B", "H", "Hkv", "Tq", "Tk", "D"))
        seed, wild = case["seed"], case["wild"]
        q = random_floats(seed, (B, H, Tq, D), wild)
        k = random_floats(seed + 1, (B, Hkv, Tk, D), wild)
        v = random_floats(seed + 2, (B, Hkv, Tk, D), wild)
        rng = np.random.default_rng(seed)
        mask = None
        if case["mask_kind"] == "bool":
            mask = rng.random(case["mask_shape"]) < 0.7
        elif case["mask_kind"] == "additive":
            mask = np.where(rng.random(case["mask_shape"]) < 0.7, rng.standard_normal(case["mask_shape"]),
                            -np.inf).astype(np.float32)
        kw = dict(causal=case["causal"], mask=mask, scale=case["scale"])
        y = calls.ok("attention", ops.attention, q, k, v, **kw)
        assert y.shape == (B, H, Tq, D) and y.dtype == np.float32
        if not wild:
            scale = 1.0 / math.sqrt(D) if case["scale"] is None else np.float32(case["scale"])
            ref = attention_reference(q, k, v, case["causal"], mask, float(scale))
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=2e-5)
        nc = calls.ok("attention", ops.attention, non_contiguous(q), non_contiguous(k), non_contiguous(v), **kw)
        assert_same(nc, y)
        bad_dtype = case["bad_dtype"]
        for hostile in case["hostiles"]:
            if hostile == "q_dtype":
                calls.raises("attention", TypeError, "q must have dtype float32", ops.attention,
                             with_dtype(q, bad_dtype), k, v, **kw)
            elif hostile == "v_object":
                calls.raises("attention", TypeError, "v must be a numpy.ndarray of float32", ops.attention, q, k,
                             case["bad_object"], **kw)
            elif hostile == "mask_dtype":
                bad = bad_dtype if bad_dtype != np.bool_ else np.float64
                calls.raises("attention", TypeError, "mask must have dtype float32", ops.attention, q, k, v,
                             **dict(kw, mask=np.zeros((Tq, Tk), bad)))
            elif hostile == "mask_object":
                if case["bad_object"] is not None:
                    calls.raises("attention", TypeError, "mask must be a numpy.ndarray", ops.attention, q, k, v,
                                 **dict(kw, mask=case["bad_object"]))
                else:  # None is "no mask"
                    calls.ok("attention", ops.attention, q, k, v, **dict(kw, mask=None))
            elif hostile == "mask_shape":
                calls.raises("attention", ValueError, "mask must be broadcastable", ops.attention, q, k, v,
                             **dict(kw, mask=np.zeros((Tq + 1, Tk), np.float32)))
                calls.raises("attention", ValueError, "mask must be broadcastable", ops.attention, q, k, v,
                             **dict(kw, mask=np.zeros((1, 1, 1, 1, Tk), np.float32)))
            elif hostile == "heads":
                k_more, v_more = np.concatenate([k, k[:, :1]], axis=1), np.concatenate([v, v[:, :1]], axis=1)
                if H % (Hkv + 1):
                    calls.raises("attention", ValueError, "must be a multiple of the number of key/value heads",
                                 ops.attention, q, k_more, v_more, **kw)
                else:
                    calls.ok("attention", ops.attention, q, k_more, v_more, **kw)
            elif hostile == "head_dim":
                calls.raises("attention", ValueError, "k must have shape", ops.attention, q,
                             k[..., :D - 1] if D > 1 else np.zeros((B, Hkv, Tk, 2), np.float32), v, **kw)
            elif hostile == "v_shape":
                calls.raises("attention", ValueError, "v must have the shape of k", ops.attention, q, k, v[:, :, :0] if
                             Tk else v, **kw)
            elif hostile == "ndim":
                calls.raises("attention", ValueError, "q must have 4 dimensions", ops.attention, q[0], k, v, **kw)
            elif hostile == "empty":
                calls.raises("attention", ValueError, "must not have an empty dimension", ops.attention, q[:, :, :0],
                             k, v, **kw)
                calls.raises("attention", ValueError, "must not have an empty dimension", ops.attention, q, k[:, :, :0],
                             v[:, :, :0], **kw)
            else:
                calls.raises("attention", TypeError, "scale must be a real number", ops.attention, q, k, v,
                             **dict(kw, scale="0.5"))

    check()
    calls.require("attention")


# ---- Linear / linear -----------------------------------------------------------------------------

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]


def linear_reference(x, w, b, activation):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    if b is not None:
        y = y + b
    name = {None: None, "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "silu": "silu"}[activation]
    return y if name is None else elementwise_reference(name, y)


@st.composite
def linear_cases(draw):
    return dict(N=draw(st.sampled_from([1, 2, 3, 7, 16, 17, 33])), K=draw(st.sampled_from([1, 3, 8, 17, 33, 65])),
                lead=tuple(draw(st.lists(st.integers(0, 4), max_size=2))), bias=draw(st.booleans()),
                activation=draw(st.sampled_from(ACTIVATIONS)), seed=draw(seeds), wild=draw(st.integers(0, 4)) == 0,
                hostiles=draw(st.lists(st.sampled_from(["x_dtype", "x_object", "x_shape", "w_ndim", "w_empty",
                                                        "bias_shape", "bias_dtype", "activation", "scalar"]),
                                       min_size=3, max_size=3, unique=True)),
                bad_dtype=draw(hostile_dtypes), bad_object=draw(non_arrays))


def linear_hostile(calls, name, case, hostile, x, w, b):
    """One hostile call to Linear (fn=None: construct + call) or linear."""
    K = case["K"]
    act = case["activation"]

    def run(x_, w_, b_=b, act_=act):
        if name == "linear":
            return ops.linear(x_, w_, b_, act_)
        layer = ops.Linear(w_, b_, act_)
        return layer(x_)

    if hostile == "x_dtype":
        calls.raises(name, TypeError, "x must have dtype float32", run, with_dtype(x, case["bad_dtype"]), w)
    elif hostile == "x_object":
        calls.raises(name, TypeError, "x must be a numpy.ndarray of float32", run, case["bad_object"], w)
    elif hostile == "x_shape":
        calls.raises(name, ValueError, f"x must have shape [..., {K}]", run, np.zeros(x.shape[:-1] + (K + 1,),
                                                                                       np.float32), w)
    elif hostile == "w_ndim":
        calls.raises(name, ValueError, "w must have 2 dimensions", run, x, w.reshape(-1))
    elif hostile == "w_empty":
        calls.raises(name, ValueError, "w must not have an empty dimension", run, x, w[:0])
    elif hostile == "bias_shape":
        calls.raises(name, ValueError, "bias must have shape", run, x, w, np.zeros(w.shape[0] + 1, np.float32))
    elif hostile == "bias_dtype":
        calls.raises(name, TypeError, "bias must have dtype float32", run, x, w,
                     np.zeros(w.shape[0], case["bad_dtype"]))
    elif hostile == "activation":
        calls.raises(name, ValueError, "activation must be one of", run, x, w, b, "tanh")
    else:
        calls.raises(name, ValueError, f"x must have shape [..., {K}]", run, np.array(1.0, np.float32), w)


@pytest.mark.parametrize("name", ["Linear", "linear"])
def test_linear(name):
    calls = CallCounter()

    @property_settings(440)
    @given(case=linear_cases())
    def check(case):
        N, K, seed, wild = case["N"], case["K"], case["seed"], case["wild"]
        x = random_floats(seed, case["lead"] + (K,), wild)
        w = random_floats(seed + 1, (N, K), False, scale=1.0 / math.sqrt(K))
        b = random_floats(seed + 2, (N,), False) if case["bias"] else None
        act = case["activation"]
        if name == "Linear":
            layer = calls.ok(name, ops.Linear, w, b, act)
            assert (layer.in_features, layer.out_features) == (K, N)
            fn = layer
        else:
            def fn(x_):
                return ops.linear(x_, w, b, act)
        if x.size == 0:
            calls.raises(name, ValueError, "x must not have an empty dimension", fn, x)
        else:
            y = calls.ok(name, fn, x)
            assert y.shape == x.shape[:-1] + (N,) and y.dtype == np.float32
            if not wild:
                ref = linear_reference(x, w, b, act)
                np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * math.sqrt(K))
            else:  # rows without a special value are unaffected by the other rows' specials
                rows = row_tame(x)
                ref = linear_reference(x[rows], w, b, act)
                np.testing.assert_allclose(y[rows], ref, rtol=1e-4, atol=1e-5 * math.sqrt(K) * max(
                    1.0, float(np.abs(x[rows]).max(initial=0))))
            y2 = calls.ok(name, fn, non_contiguous(x))
            assert_same(y2, y)
        for hostile in case["hostiles"]:
            linear_hostile(calls, name, case, hostile, x if x.size else np.ones((1, K), np.float32), w, b)

    check()
    calls.require(name)

