"""Float64 references and helpers shared by the GEMM tests (test_gemm_int8.py, test_gemm_int4.py, test_gemm_half.py)."""

import math
import os
import subprocess
import sys

import numpy as np

import cpuformer as cf

_erf = np.vectorize(math.erf)


def activate(z, activation):
    """The epilogue activations in float64 (the kernels' contract: activation.h)."""
    z = np.asarray(z, dtype=np.float64)
    if activation == "relu":
        return np.maximum(z, 0.0)
    if activation == "gelu":
        return 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    if activation == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    if activation == "silu":
        return z / (1.0 + np.exp(-z))
    if activation == "quick_gelu":
        return z / (1.0 + np.exp(-1.702 * z))
    return z


def assert_epilogue(y, z, activation=None, residual=None):
    """y (a quantized GEMM's output) against its float32 pre-activation model z: bit for bit
    without an activation (residual added in float32), else within the activation kernels' stated
    bound (2e-6 absolute + 1e-6 relative, with margin) plus the float32 rounding of the residual."""
    if activation is None:
        ref = z if residual is None else (z + residual).astype(np.float32)
        np.testing.assert_array_equal(y, ref)
        return
    ref = activate(z, activation)
    if residual is not None:
        ref = ref + residual
    tol = 4e-6 + 3e-6 * np.abs(ref)
    if residual is not None:
        tol = tol + 1.2e-7 * np.abs(residual)  # the float32 rounding of the final add
    err = np.abs(y - ref)
    assert np.all(err <= tol), f"max excess {float((err - tol).max()):.3g}"


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def rerun_with_features_hidden(test_file, features, deselect):
    """Runs test_file's tests (but the ones matching `deselect`) in a child process with the CPU
    features hidden (CPUFORMER_DISABLE_FEATURES), asserts they pass, and returns the child's
    cpu_info() as printed text."""
    env = dict(os.environ, CPUFORMER_DISABLE_FEATURES=features)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, "-k", f"not {deselect}"],
        env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "passed" in out.stdout and "failed" not in out.stdout
    probe = subprocess.run([sys.executable, "-c", "import cpuformer as cf; print(cf.cpu_info())"],
                           env=env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return probe.stdout


def assert_threads_agree(lin, x):
    """lin(x) on one thread and on two gives the same bits: threads split output columns (or
    rows), never one dot product."""
    before = cf.get_num_threads()
    try:
        cf.set_num_threads(1)
        y1 = lin(x)
        cf.set_num_threads(2)
        y2 = lin(x)
    finally:
        cf.set_num_threads(before)
    np.testing.assert_array_equal(y1, y2)
