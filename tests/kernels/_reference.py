"""Float64 references shared by the GEMM tests (test_gemm_int8.py, test_gemm_half.py)."""

import math

import numpy as np

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
    return z


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)
