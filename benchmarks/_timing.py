"""The timing loop every benchmark script shares (no heavy imports: the llama.cpp child process
imports it without cpuformer)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def timed(fn: Callable[[], object], repeats: int) -> dict:
    """Median / min / max seconds of fn() over `repeats` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "min_s": min(times), "max_s": max(times)}
