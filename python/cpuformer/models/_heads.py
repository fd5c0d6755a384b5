"""Runs a task head (``arch.heads.Head``) on the encoder's output.

The heads are a few small layers on top of the encoder; they run as NumPy plus cpuformer's own
kernels (``ops.Linear`` packed once at load in the model's dtype, ``ops.layer_norm``), so a masked
LM's vocabulary projection uses the same GEMM as the encoder. Only the rows a head needs are
computed: a sequence classifier projects the first token of each sequence, not all of them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import numpy as np

from .. import _core
from ..arch.heads import Head

#: Activations the GEMM epilogue applies (others run as NumPy after it).
_FUSED = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}


class TaskHead:
    """A head's steps, with its weights packed: ``head(hidden, pooled)`` -> logits."""

    def __init__(self, head: Head, arrays: Dict[str, np.ndarray], dtype: str, group_size: int = 32,
                 zero_point: bool = False):
        self.task, self.labels, self.uses_pooler = head.task, head.labels, head.uses_pooler
        self.reads_first_token = head.reads_first_token
        self._steps: List[Callable[..., np.ndarray]] = []
        steps = list(head.steps)
        i = 0
        while i < len(steps):
            step = steps[i]
            if step[0] == "dense":
                # An activation right after a dense layer runs in the GEMM's epilogue.
                fused = None
                if i + 1 < len(steps) and steps[i + 1][0] == "act" and steps[i + 1][1] in _FUSED:
                    fused = _FUSED[steps[i + 1][1]]
                    i += 1
                self._steps.append(_dense(arrays[step[1]], arrays.get(step[1] + ".bias"), fused, dtype, group_size,
                                          zero_point))
            elif step[0] == "act":
                self._steps.append(_activation(step[1]))
            elif step[0] == "norm":
                self._steps.append(_norm(arrays[step[1]], arrays.get(step[1] + ".bias"), step[2]))
            elif step[0] == "first":
                self._steps.append(lambda x, pooled, mask, threads: np.ascontiguousarray(x[:, 0]))
            elif step[0] == "last":
                self._steps.append(_last_token)
            elif step[0] == "mean":
                self._steps.append(_masked_mean)
            elif step[0] == "pooler":
                self._steps.append(lambda x, pooled, mask, threads: pooled)
            else:  # pragma: no cover - the declarations are checked by the tests
                raise AssertionError(f"unknown head step {step!r}")
            i += 1

    def __call__(self, hidden: np.ndarray, pooled: Optional[np.ndarray] = None,
                 mask: Optional[np.ndarray] = None, num_threads: int = 0) -> np.ndarray:
        """hidden [B, T, H]; pooled [B, H] (heads on the pooler); mask [B, T] (0 at padding; None:
        no padding); the GEMMs and norms on ``num_threads`` threads (0: the calling thread's count)."""
        x = hidden
        for step in self._steps:
            x = step(x, pooled, mask, num_threads)
        return x


def _last_token(x: np.ndarray, pooled: Any, mask: Optional[np.ndarray], threads: int) -> np.ndarray:
    """Each sequence's last unpadded token (the last position without a mask, or for a row with no
    token at all)."""
    if mask is None:
        return np.ascontiguousarray(x[:, -1])
    last = x.shape[1] - 1 - np.argmax(mask[:, ::-1] != 0, axis=1)
    return np.ascontiguousarray(x[np.arange(x.shape[0]), last])


def _masked_mean(x: np.ndarray, pooled: Any, mask: Optional[np.ndarray], threads: int) -> np.ndarray:
    """The mean over each sequence's unpadded tokens (padded rows are selected out, never multiplied
    by 0: a padded row may hold anything)."""
    if mask is None:
        return x.mean(axis=1, dtype=np.float32)
    keep = mask.astype(bool)[:, :, None]
    total = np.where(keep, x, np.float32(0)).sum(axis=1)
    return (total / np.maximum(keep.sum(axis=1), 1)).astype(np.float32)


def _dense(weight: np.ndarray, bias: Optional[np.ndarray], activation: Optional[str], dtype: str, group_size: int,
           zero_point: bool) -> Callable[..., np.ndarray]:
    linear = _core.Linear(np.ascontiguousarray(weight, dtype=np.float32),
                          None if bias is None else np.ascontiguousarray(bias, dtype=np.float32), activation, dtype,
                          group_size, zero_point)
    return lambda x, pooled, mask, threads: linear(x, None, threads)


def _activation(name: str) -> Callable[..., np.ndarray]:
    if name == "tanh":
        return lambda x, pooled, mask, threads: np.tanh(x)
    kernel = {"gelu": lambda x: _core.gelu(x, "none"), "gelu_tanh": lambda x: _core.gelu(x, "tanh"),
              "relu": _core.relu, "silu": _core.silu}[name]
    return lambda x, pooled, mask, threads: kernel(np.ascontiguousarray(x))


def _norm(weight: np.ndarray, bias: Optional[np.ndarray], eps: float) -> Callable[..., np.ndarray]:
    return lambda x, pooled, mask, threads: _core.layer_norm(x, weight, bias, float(eps), None, threads)


__all__ = ["TaskHead"]
