"""benchmarks/bench_serve.py's bookkeeping and one tiny end-to-end run against a real
`cpuformer serve` process (the numbers are not checked: timing belongs to the benchmark)."""

import importlib.util
import os

import pytest

from cpuformer import _bench as cf_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("fastapi")
pytest.importorskip("httpx")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_serve", os.path.join(ROOT, "benchmarks", "bench_serve.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_percentile():
    bench = _bench()
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bench._percentile(values, 50) == 3.0
    assert bench._percentile(values, 0) == 1.0 and bench._percentile(values, 100) == 5.0
    assert bench._percentile([7.0], 99) == 7.0
    assert bench._percentile([], 50) != bench._percentile([], 50)  # NaN for no samples


def test_decode_row_counts_every_request(tmp_path):
    """Two clients with two requests each against a tiny decoder: every request streams its tokens
    and the row adds them up (the server is the installed cpuformer's `cpuformer serve`)."""
    bench = _bench()
    directory = cf_bench.build_model("decoder", cf_bench.SHAPES["decoder"]["quick"] | dict(n_layer=1),
                                     str(tmp_path / "m"))
    row = bench.decode_row(directory, clients=2, requests=2, threads=1, seed=0)
    assert row["clients"] == 2 and row["requests"] == 4
    assert 4 * 32 <= row["generated_tokens"] <= 4 * 64  # 32-64 new tokens per request
    assert row["tokens_per_s"] > 0 and row["ttft_p50_s"] <= row["ttft_p99_s"]
