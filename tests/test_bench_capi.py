"""benchmarks/bench_capi.py's bookkeeping: the wrapper twins' rows, and the Python-API timing
child on a twin model (the C-API child needs libcpuformer, which scripts/test-c-api.sh builds and
tests; the benchmark itself is run by hand)."""

import argparse
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_capi", os.path.join(ROOT, "benchmarks", "bench_capi.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_twin_rows_bound_the_overhead_by_the_full_request():
    bench = _bench()
    models = {"gpt2_decode/int8": "a", "gpt2_decode-twin/int8": "b"}
    seconds = {("gpt2_decode/int8", "python"): [0.5, 0.4, 0.6], ("gpt2_decode/int8", "c"): [0.5, 0.5, 0.5],
               ("gpt2_decode-twin/int8", "python"): [0.0010, 0.0012, 0.0011],
               ("gpt2_decode-twin/int8", "c"): [0.0013, 0.0014, 0.0015]}
    (row,) = bench._twin_rows(models, seconds)
    assert row["workload"] == "gpt2_decode-twin/int8" and row["full_workload"] == "gpt2_decode/int8"
    assert row["python_request_us"] == pytest.approx(1100) and row["c_request_us"] == pytest.approx(1400)
    assert row["c_minus_python_us"] == pytest.approx(300)
    assert row["overhead_bound"] == pytest.approx(0.0003 / 0.5)
    assert bench._twin_rows({"gpt2_decode/int8": "a"}, seconds) == []


@pytest.mark.parametrize("workload", ["gpt2_decode", "bert_8x128"])
def test_python_child_times_a_twin(tmp_path, workload):
    import cpuformer as cf
    from cpuformer import _bench as bench_models

    bench = _bench()
    kind, shape = bench.TWINS[workload]
    source = bench_models.build_model(kind, shape, str(tmp_path / "hf"))
    converted = str(tmp_path / "int8")
    cf.convert(source, converted, "int8", progress=False)
    result = tmp_path / "result.json"
    args = argparse.Namespace(workload=workload, engine="python", model=converted, threads=1, seconds=0.05,
                              result=str(result))
    bench._child(args)
    measured = json.loads(result.read_text())
    per_request = bench.NEW if workload == "gpt2_decode" else bench.BATCH
    assert measured["request_seconds"] > 0
    assert measured["rate"] == pytest.approx(per_request / measured["request_seconds"])
