"""The quick kernel benchmark behind ``cpuformer bench``: needs nothing but NumPy.

Times ``ops.Linear`` (weights packed once, as a model holds them) against NumPy's BLAS and
``ops.attention`` against a NumPy two-GEMM softmax attention, on transformer-shaped problems.
Medians of several repeats after a warm-up; the full comparison with PyTorch lives in
benchmarks/bench_ops.py of the source tree.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List

import numpy as np

from . import cpu_info, ops


def median_seconds(fn: Callable[[], object], repeats: int, min_time: float = 0.05) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            fn()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        samples.append(elapsed / count)
    return float(np.median(samples))


def _numpy_attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def run_kernel_bench(quick: bool = True) -> List[Dict[str, object]]:
    rng = np.random.default_rng(0)
    repeats = 3 if quick else 7
    rows: List[Dict[str, object]] = []
    linear_shapes = [(1024, 768, 768), (1024, 768, 3072), (1, 768, 3072), (4, 2048, 5632)]
    if not quick:
        linear_shapes += [(1024, 3072, 768), (512, 2048, 5632), (1, 2048, 5632), (4, 768, 2304)]
    for m, k, n in linear_shapes:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        lin = ops.Linear(w)
        wt = np.ascontiguousarray(w.T)
        flops = 2.0 * m * k * n
        ours = median_seconds(lambda: lin(x), repeats)
        peer = median_seconds(lambda: x @ wt, repeats)
        rows.append({"op": f"linear M={m} K={k} N={n}", "cpuformer": flops / ours / 1e9,
                     "numpy": flops / peer / 1e9, "unit": "GFLOP/s"})
    for b, h, t, d in [(8, 12, 128, 64)] + ([] if quick else [(1, 12, 512, 64)]):
        q, k_, v = (rng.standard_normal((b, h, t, d), dtype=np.float32) for _ in range(3))
        flops = 4.0 * b * h * t * t * d
        ours = median_seconds(lambda: ops.attention(q, k_, v), repeats)
        peer = median_seconds(lambda: _numpy_attention(q, k_, v), repeats)
        rows.append({"op": f"attention B={b} H={h} T={t} D={d}", "cpuformer": flops / ours / 1e9,
                     "numpy": flops / peer / 1e9, "unit": "GFLOP/s"})
    return rows


def format_table(rows: List[Dict[str, object]]) -> str:
    info = cpu_info()
    lines = [f"cpuformer kernels — isa {info['isa']}, {info['num_threads']} threads (higher is better)",
             f"{'op':<34} {'cpuformer':>10} {'numpy':>10} {'ratio':>7}  unit"]
    for r in rows:
        ratio = float(r["cpuformer"]) / float(r["numpy"])
        lines.append(f"{r['op']:<34} {r['cpuformer']:>10.1f} {r['numpy']:>10.1f} {ratio:>6.2f}x  {r['unit']}")
    return "\n".join(lines)
