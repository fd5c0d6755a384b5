"""ops.Linear(dtype="int8") against a NumPy integer model of the contract in gemm.h.

The model: q, scales = ops.quantize_int8(w); each row of x is quantized in float32 as the contract
says (amax, inv = 127 / amax, qa = rint(x · inv)), the dot products are taken exactly in int64
(and checked to fit int32), and the epilogue is evaluated in float32 in the reference's order:
(sa · scale) · float32(sum) + bias, then + residual. Every ISA level must reproduce this bit for
bit without an activation (the integer part is exact and the float operations are the same). With
an activation, the level's activation kernel may differ from the float64 one by its stated bound
(2e-6 absolute + 1e-6 relative, tests/kernels/test_activation.py), checked here with margin.

tests/test_runtime.py reruns this file at every lower ISA level; test_without_dot_product_extensions
reruns it with AVX512-VNNI and AVX-VNNI hidden, so the fallback kernel of each level runs too.
"""


import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import ops

from ._reference import assert_epilogue, assert_threads_agree, randn, rerun_with_features_hidden


def quantize_rows(x):
    """(qa int64 [M, K], sa float32 [M]) exactly as the kernels quantize A."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    amax = amax.astype(np.float32)
    nonzero = amax > 0
    inv = np.zeros_like(amax)
    inv[nonzero] = np.float32(127.0) / amax[nonzero]
    qa = np.rint(x * inv[:, None]).astype(np.int64)  # float32 product, round half to even
    sa = np.where(nonzero, amax / np.float32(127.0), np.float32(0.0)).astype(np.float32)
    return qa, sa


def preactivation(x, w, bias=None):
    """float32 [M, N]: sa · scale · Σ qa·q + bias, in the reference's float32 order."""
    q, scales = ops.quantize_int8(w)
    qa, sa = quantize_rows(x)
    isum = qa @ q.astype(np.int64).T
    assert np.abs(isum).max(initial=0) < 2**31
    y = (sa[:, None] * scales[None, :]).astype(np.float32) * isum.astype(np.float32)
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y.astype(np.float32)


def check(x, w, bias=None, activation=None, residual=None):
    lin = ops.Linear(w, bias, activation, dtype="int8")
    y = lin(x, residual.copy() if residual is not None else None)
    assert y.dtype == np.float32 and y.shape == (x.shape[0], w.shape[0])
    assert_epilogue(y, preactivation(x, w, bias), activation, residual)
    return y


# M walks through the tile and GEMV sizes, N through the panel tails (16, 64 columns), K through
# the groups of 4. With AMX-INT8, GEMMs of 8 rows or more whose K rounds up to a multiple of 64
# run on tiles of 32 rows × 64 features (M tails within and across blocks of 256 rows, K = 61
# padded within its last group of 4) and every other shape on vpdpbusd.
SHAPES = [
    (1, 1, 1), (1, 5, 3), (2, 7, 17), (3, 768, 130), (4, 33, 64), (5, 4, 65), (6, 100, 63),
    (7, 13, 129), (12, 3, 200), (13, 257, 31), (48, 66, 70), (49, 130, 300), (64, 4096, 40),
    (1, 4095, 100), (2, 4097, 9), (130, 515, 96), (300, 64, 17),
    (7, 128, 70), (8, 64, 65), (15, 64, 70), (16, 64, 1), (17, 61, 65), (31, 128, 16), (32, 192, 64),
    (33, 128, 130), (100, 768, 200),
    (257, 64, 70), (290, 256, 129),
]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_shapes_exact(rng, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k), randn(rng, n)
    check(x, w, b)
    check(x, w)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 70, 33), (9, 129, 100)])
def test_activations(rng, activation, m, k, n):
    x, w, b = randn(rng, m, k), randn(rng, n, k) * 0.3, randn(rng, n)
    check(x, w, b, activation)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("m,k,n", [(1, 64, 70), (7, 300, 65), (50, 33, 130), (40, 128, 100)])
def test_residual(rng, activation, m, k, n):
    # Linear adds the residual in place: the GEMM's residual aliases its output.
    x, w, b, r = randn(rng, m, k), randn(rng, n, k), randn(rng, n), randn(rng, m, n)
    check(x, w, b, activation, r)


ACTIVATION_OPS = {
    "relu": ops.relu, "gelu": ops.gelu, "gelu_tanh": lambda v: ops.gelu(v, approximate="tanh"), "silu": ops.silu,
    "quick_gelu": ops.quick_gelu,
}


@pytest.mark.parametrize("activation", sorted(ACTIVATION_OPS))
@pytest.mark.parametrize("m,k,n", [(1, 70, 33), (7, 129, 100), (13, 64, 200), (40, 128, 100)])
def test_epilogue_activation_is_the_levels_kernel(rng, activation, m, k, n):
    # The epilogue applies the activation in registers with the same lane-wise functions as the
    # level's activation kernel: the results agree bit for bit, residual included.
    x, w, b, r = randn(rng, m, k), randn(rng, n, k) * 0.3, randn(rng, n), randn(rng, m, n)
    x[0, :] *= 40.0  # large pre-activations reach the saturated ends of the activations
    z = ops.Linear(w, b, dtype="int8")(x)
    expected = ACTIVATION_OPS[activation](z)
    lin = ops.Linear(w, b, activation, dtype="int8")
    np.testing.assert_array_equal(lin(x), expected)
    np.testing.assert_array_equal(lin(x, r.copy()), (expected + r).astype(np.float32))


def test_zero_rows_and_columns(rng):
    m, k, n = 9, 37, 70
    x, w, b, r = randn(rng, m, k), randn(rng, n, k), randn(rng, n), randn(rng, m, n)
    x[[0, 4, 8]] = 0.0
    w[[1, 63, 64]] = 0.0
    y = check(x, w, b, None, r)
    np.testing.assert_array_equal(y[4], (b + r[4]).astype(np.float32))
    np.testing.assert_array_equal(ops.Linear(w, None, dtype="int8")(np.zeros((3, k), np.float32)), 0.0)


def test_extreme_values(rng):
    # Full-range codes everywhere: every qa and q is ±127, so the sums reach K · 127² (the largest
    # the int32 accumulators see) and every vpmaddubsw pair reaches 2 · 127².
    m, k, n = 7, 4099, 66
    signs_x = np.where(rng.random((m, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    signs_w = np.where(rng.random((n, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    x = signs_x * np.float32(3e4)
    w = signs_w * np.float32(1e-3)
    x[1] = 1e30  # all equal: qa = 127 for every k
    w[5] = -7.0
    y = check(x, w, randn(rng, n))
    assert np.isfinite(y).all()
    # Tiny and huge magnitudes (scales far from 1) and one dominant entry per row.
    x = randn(rng, m, k) * np.float32(1e-30)
    x[:, 3] = 1e-25
    check(x, randn(rng, n, k) * np.float32(1e20))
    # Values exactly halfway between codes: rint must round half to even like the kernels.
    x = np.tile(np.arange(-254, 255, dtype=np.float32) / 2, (3, 1))
    x[:, 0] = -127.0
    check(x, randn(rng, n, x.shape[1]))


def test_strided_input(rng):
    x = randn(rng, 6, 90)[:, 5:75]
    w, b = randn(rng, 40, 70), randn(rng, 40)
    check(np.ascontiguousarray(x), w, b)
    y = ops.Linear(w, b, dtype="int8")(x)
    np.testing.assert_array_equal(y, ops.Linear(w, b, dtype="int8")(np.ascontiguousarray(x)))


@pytest.mark.parametrize("k", [300, 256])  # K = 256: the AMX tiles where the CPU has them
def test_threads_agree(rng, k):
    x, w, b = randn(rng, 100, k), randn(rng, 200, k), randn(rng, 200)
    lin = ops.Linear(w, b, "relu", dtype="int8")
    assert_threads_agree(lin, x)


def test_amx_tiles_equal_vpdpbusd_bit_for_bit(rng):
    # TDPBUSD and vpdpbusd both sum u8 × s8 products into wrapping int32 and share the epilogue:
    # with AMX-INT8 hidden the VNNI kernel gives the same bits (NaN rows, full-range codes whose
    # sums wrap in the u8 form, activation and residual included).
    if not cf.cpu_info()["matmul"]["int8"].startswith("amx_int8"):
        pytest.skip("int8 GEMMs do not run on AMX here (no AMX-INT8, or a lower CPUFORMER_ISA)")
    # (600, 256, 200): several 32-row work tiles per thread and panel, a 24-row last one, so the epilogue
    # of each runs while the next one's tiles do (gemm_amx_driver_inl.h)
    shapes = [(8, 64, 64), (16, 64, 64), (45, 1024, 130), (300, 4096, 70), (600, 256, 200)]
    arrays = {}
    for i, (m, k, n) in enumerate(shapes):
        x, w, b, r = randn(rng, m, k), randn(rng, n, k), randn(rng, n), randn(rng, m, n)
        x[3] = np.float32(3e4)
        x[5, 7] = np.nan
        w[2] = np.float32(-7.0)
        arrays.update({f"x{i}": x, f"w{i}": w, f"b{i}": b, f"r{i}": r})
    code = ("import sys, numpy as np\n"
            "from cpuformer import ops\n"
            "a = dict(np.load(sys.argv[1]))\n"
            "out = {}\n"
            f"for i in range({len(shapes)}):\n"
            "    lin = ops.Linear(a[f'w{i}'], a[f'b{i}'], 'gelu', dtype='int8')\n"
            "    out[f'y{i}'] = lin(a[f'x{i}'], a[f'r{i}'].copy())\n"
            "np.savez(sys.argv[2], **out)\n")
    with tempfile.TemporaryDirectory() as tmp:
        inputs, vnni = os.path.join(tmp, "in.npz"), os.path.join(tmp, "vnni.npz")
        np.savez(inputs, **arrays)
        env = dict(os.environ, CPUFORMER_DISABLE_FEATURES="amx_int8")
        subprocess.run([sys.executable, "-c", code, inputs, vnni], env=env, check=True)
        expected = dict(np.load(vnni))
    for i in range(len(shapes)):
        lin = ops.Linear(arrays[f"w{i}"], arrays[f"b{i}"], "gelu", dtype="int8")
        np.testing.assert_array_equal(lin(arrays[f"x{i}"], arrays[f"r{i}"].copy()), expected[f"y{i}"])


def test_without_dot_product_extensions():
    # The same tests with AVX512-VNNI and AVX-VNNI hidden: the level's fallback kernel runs.
    info = rerun_with_features_hidden(__file__, "avx512_vnni,avx_vnni", "without_dot_product")
    features = info[info.index("'features'"):]
    assert "vnni" not in features and "avx2" in features or cf.cpu_info()["isa"] == "scalar"


def test_weight_quantization_is_the_contract_bit_for_bit(rng):
    # q = rint(w · (127 / amax)) in float32, round half to even, scale amax / 127, per row: the
    # load-time quantizer matches this NumPy model exactly, including rows whose scaled values land
    # on .5 ties, rows of ±0, a lone nonzero weight and tiny magnitudes.
    w = randn(rng, 40, 300)
    w[1] = 0.0
    w[2] = -0.0
    w[3] = np.round(w[3] * 8) / 8
    w[4] = (np.arange(300) - 150) * np.float32(127 / 150 / 2)  # many exact .5 steps after scaling
    w[5] = 0.0
    w[5, 17] = -3.0
    w[6] *= np.float32(1e-30)
    w[7, :] = np.float32(0.25)
    w[7, 9] = -0.25
    w = w.astype(np.float32)
    q, scales = ops.quantize_int8(w)
    amax = np.abs(w).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.float32(127) / amax
        want = np.clip(np.rint(w * inv[:, None]), -127, 127)
    want[amax == 0] = 0
    np.testing.assert_array_equal(q, want.astype(np.int8))
    np.testing.assert_array_equal(scales, np.where(amax > 0, amax / np.float32(127), 0).astype(np.float32))
