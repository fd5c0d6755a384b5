"""Kernel-level operations on float32 NumPy arrays.

Every function takes ``numpy.ndarray`` inputs of dtype float32 (other dtypes raise TypeError;
non-contiguous arrays are copied) and returns new float32 arrays. Compute releases the GIL and
uses ``cpuformer.get_num_threads()`` threads.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _core
from ._arguments import MAX_NUM_THREADS, check_integer

__all__ = ["Linear", "linear", "peak_gops", "quantize_int8", "quantize_int4", "to_float16_bits", "to_bfloat16_bits",
           "attention", "layer_norm", "rms_norm", "gelu", "silu", "relu", "quick_gelu", "softmax", "silu_mul"]


def _threads(num_threads: int) -> int:
    """An op's ``num_threads`` checked here (pybind11 would report an int beyond C++'s, or a float,
    by dumping the call's signature and arrays): an integer in [0, 1024], 0 the calling thread's
    count."""
    return check_integer("num_threads", num_threads, 0, MAX_NUM_THREADS, " (0: the calling thread's count)")


def _int4_options(group_size: int, zero_point: bool) -> Tuple[int, bool]:
    """int4's group_size and zero_point checked for their type here (the core checks the values)."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise ValueError(f"group_size must be 32, 64 or 128, got {group_size!r}")
    if not isinstance(zero_point, (bool, np.bool_)):
        raise TypeError(f"zero_point must be True or False, got {zero_point!r}")
    return int(group_size), bool(zero_point)


class Linear:
    """y = activation(x · wᵀ + bias) with ``w`` [N, K] in PyTorch ``nn.Linear`` layout, packed once
    for the GEMM microkernel. ``activation`` is None, "relu", "gelu" (erf), "gelu_tanh", "silu" or
    "quick_gelu" (x·σ(1.702·x), CLIP's).
    Calling it maps x [..., K] to [..., N]; ``residual`` [..., N], if given, is added after the
    activation (fused into the GEMM's epilogue).

    ``dtype`` is how the weight is stored: "float32", "float16", "bfloat16", "int8" (symmetric
    per-output-channel scales, activations quantized per row on the fly) or "int4" (one float16
    scale per ``group_size`` (32, 64 or 128) input channels, symmetric or with a zero point per
    group when ``zero_point``; activations as for int8). See docs/precision.md."""

    def __init__(self, w: np.ndarray, bias: Optional[np.ndarray] = None, activation: Optional[str] = None,
                 dtype: str = "float32", group_size: int = 32, zero_point: bool = False):
        self._impl = _core.Linear(w, bias, activation, dtype, *_int4_options(group_size, zero_point))

    @property
    def in_features(self) -> int:
        return self._impl.in_features

    @property
    def out_features(self) -> int:
        return self._impl.out_features

    @property
    def dtype(self) -> str:
        return self._impl.dtype

    @property
    def group_size(self) -> int:
        """Input channels per scale of an int4 weight (0 for the other dtypes)."""
        return self._impl.group_size

    @property
    def zero_point(self) -> bool:
        """Whether an int4 weight's groups have zero points."""
        return self._impl.zero_point

    def __call__(self, x: np.ndarray, residual: Optional[np.ndarray] = None, num_threads: int = 0) -> np.ndarray:
        """``x @ w.T + bias`` (then the activation) ``+ residual``; ``num_threads`` threads (0: the
        calling thread's count, ``get_num_threads()``)."""
        return self._impl(x, residual, _threads(num_threads))

    def __repr__(self) -> str:
        return f"Linear(in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype!r})"


def linear(x: np.ndarray, w: np.ndarray, bias: Optional[np.ndarray] = None, activation: Optional[str] = None,
           dtype: str = "float32") -> np.ndarray:
    """One-shot ``Linear(w, bias, activation, dtype)(x)``: packs ``w`` on every call (models hold a Linear)."""
    return _core.Linear(w, bias, activation, dtype)(x)


def peak_gops(dtype: str = "float32", seconds: float = 0.3) -> float:
    """The compute peak of the matmul kernel for weights of ``dtype``, in GOP/s (a multiply-add
    counts as 2 operations), on ``cpuformer.get_num_threads()`` threads: the rate at which the
    instruction the kernel multiplies with (``cpu_info()["matmul"][dtype]``: FMA, ``vpdpbusd``,
    ``vdpbf16ps`` or the ``vpmaddubsw`` sequence) runs with every operand in a register. No GEMM of
    that dtype can exceed it; the benchmarks state GEMM speed as a fraction of it.

    Measured, not computed: it runs the instruction for about ``seconds`` (in (0, 60]) and returns
    the best of three passes. A per-core width times the clock is unreliable (cpuinfo reports a
    nominal clock; Zen 4 runs 512-bit instructions on 256-bit units). On a shared or throttled
    machine the result moves like any timing."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)):
        raise TypeError(f"seconds must be a real number, got {seconds!r}")
    return _core.peak_gops(dtype, float(seconds))


def quantize_int4(w: np.ndarray, group_size: int = 32,
                  zero_point: bool = False) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """The int4 weight quantization cpuformer applies at load: w [N, K] float32 → (u uint8
    [N, Kp / 2], scales float16 [N, groups], zeros uint8 [N, groups] or None), Kp = groups ·
    group_size (K padded with zero weights). Byte b of row j holds u[j][2b] in its low nibble and
    u[j][2b + 1] in its high one; w[j][k] ≈ scales[j][g] · (u[j][k] − z) with g = k // group_size
    and z = zeros[j][g], or 8 when symmetric (the default). Rounding and the choice of scale:
    docs/precision.md."""
    return _core.quantize_int4(w, *_int4_options(group_size, zero_point))


def quantize_int8(w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The int8 weight quantization cpuformer applies at load: w [N, K] float32 → (q int8 [N, K],
    scales float32 [N]) with q = round_half_even(w · 127 / max|w[j]|) and w ≈ q · scales[:, None]."""
    return _core.quantize_int8(w)


def to_float16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → IEEE binary16 bit patterns (uint16), rounded to nearest even."""
    return _core.float32_to_float16_bits(x)


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16: the upper half of the float32), rounded to nearest even."""
    return _core.float32_to_bfloat16_bits(x)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
              mask: Optional[np.ndarray] = None, scale: Optional[float] = None, num_threads: int = 0) -> np.ndarray:
    """Fused attention. q [B, H, Tq, D]; k, v [B, Hkv, Tk, D] with Hkv dividing H (grouped-query).
    ``causal`` aligns the triangle to the end (query i sees keys j <= i + Tk - Tq).
    ``mask``: additive float32 or boolean (True = attend), broadcastable to [B, 1|H, Tq, Tk].
    ``scale`` defaults to 1/sqrt(D). A query that sees no key returns zeros. A key a query does not
    see (causal, or a -inf / False mask value) never affects it, even if its k or v hold NaN or inf.
    ``num_threads``: 0 uses the calling thread's count (``get_num_threads()``).
    q, k and v whose last dimension is contiguous (transposed slices of a fused projection, a KV
    cache sliced to its length) are read in place; other layouts are copied first."""
    return _core.attention(q, k, v, bool(causal), mask, scale, _threads(num_threads))


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: Optional[np.ndarray] = None, eps: float = 1e-5,
               residual: Optional[np.ndarray] = None, num_threads: int = 0) -> np.ndarray:
    """LayerNorm over the last dimension of ``x + residual`` (residual optional, fused);
    ``num_threads`` as for ``attention``."""
    return _core.layer_norm(x, weight, bias, float(eps), residual, _threads(num_threads))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6, residual: Optional[np.ndarray] = None) -> np.ndarray:
    """RMSNorm over the last dimension of ``x + residual`` (residual optional, fused)."""
    return _core.rms_norm(x, weight, float(eps), residual)


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU: ``approximate="none"`` uses the exact erf form, ``"tanh"`` the tanh approximation."""
    return _core.gelu(x, approximate)


def silu(x: np.ndarray) -> np.ndarray:
    return _core.silu(x)


def relu(x: np.ndarray) -> np.ndarray:
    return _core.relu(x)


def quick_gelu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(1.702 · x), transformers' "quick_gelu" (CLIP)."""
    return _core.quick_gelu(x)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last dimension; rows that are all -inf give zeros."""
    return _core.softmax(x)


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, the SwiGLU combination."""
    return _core.silu_mul(gate, up)
