"""benchmarks/bench_serve.py's bookkeeping and tiny end-to-end runs against real `cpuformer serve`
processes (the numbers are not checked: timing belongs to the benchmark). llama.cpp's server is not
installed in CI (llama-cpp-python compiles llama.cpp); its rows are exercised by the benchmark's
own runs, and here only the text its clients send."""

import importlib.util
import json
import os
import sys

import pytest

from cpuformer import _bench as cf_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")


def _load(name):
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)  # bench_serve imports _llamacpp and bench_decoder from there
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench():
    module = _load("bench_serve")
    module.WARM_SECONDS = 0.0  # two warm-up requests per server, not two seconds of them
    return module


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return cf_bench.build_model("decoder", cf_bench.SHAPES["decoder"]["quick"] | dict(n_layer=1),
                                str(tmp_path_factory.mktemp("serve") / "m"))


def test_percentile():
    bench = _bench()
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bench._percentile(values, 50) == 3.0
    assert bench._percentile(values, 0) == 1.0 and bench._percentile(values, 100) == 5.0
    assert bench._percentile([7.0], 99) == 7.0
    assert bench._percentile([], 50) != bench._percentile([], 50)  # NaN for no samples


def test_metrics_parsing_and_deltas():
    bench = _bench()
    text = ("# HELP cpuformer_prompt_tokens_total Prompt tokens.\n# TYPE cpuformer_prompt_tokens_total counter\n"
            "cpuformer_prompt_tokens_total 40\ncpuformer_batch_size_sum 12\ncpuformer_batch_size_count 4\n"
            'cpuformer_requests_total{endpoint="/v1/completions",status="200"} 3\nnot_a_number x\n')
    before = bench.parse_metrics(text)
    assert before == {"cpuformer_prompt_tokens_total": 40.0, "cpuformer_batch_size_sum": 12.0,
                      "cpuformer_batch_size_count": 4.0,
                      'cpuformer_requests_total{endpoint="/v1/completions",status="200"}': 3.0}
    after = dict(before, cpuformer_prompt_tokens_total=90.0, cpuformer_prefix_reused_tokens_total=48.0)
    delta = bench.metrics_delta(before, after)
    assert delta["cpuformer_prompt_tokens_total"] == 50.0 and delta["cpuformer_batch_size_count"] == 0.0
    assert bench.reuse_counters(delta) == {"cpuformer_prefix_reused_tokens_total": 48.0}
    assert bench.metrics_delta(None, after) == {} and bench.reuse_counters(before) == {}


def test_mix_is_seeded_and_within_the_ranges():
    bench = _bench()
    work = bench.mix(1000, clients=3, requests=2, seed=5)
    assert work == bench.mix(1000, clients=3, requests=2, seed=5) != bench.mix(1000, 3, 2, seed=6)
    assert len(work) == 3 and all(len(jobs) == 2 for jobs in work)
    for prompt, new in (job for jobs in work for job in jobs):
        assert bench.PROMPT_TOKENS[0] <= len(prompt) <= bench.PROMPT_TOKENS[1]
        assert bench.NEW_TOKENS[0] <= new <= bench.NEW_TOKENS[1]
        assert all(100 <= t < 999 for t in prompt)  # the last id (end of text) is never in a prompt


def test_llamacpp_clients_send_the_text_of_the_token_ids():
    """llama.cpp's server takes text: each id is one character of the GGUF's chars vocabulary."""
    llamacpp = _load("_llamacpp")
    text = llamacpp.id_text([0, 5, 31999])
    assert [ord(c) - llamacpp.CHARS_BASE for c in text] == [0, 5, 31999]
    with pytest.raises(ValueError, match="token id -1 has no character"):
        llamacpp.id_text([-1])
    with pytest.raises(ValueError, match="has no character in the chars vocabulary"):
        llamacpp.id_text([llamacpp.CHARS_LIMIT])
    bench = _bench()
    server = object.__new__(bench.LlamaCppServer)  # the request body only: no process
    server.model_name = "m"
    body = server.body([7, 8], 3)
    assert body == {"model": "m", "prompt": llamacpp.id_text([7, 8]), "max_tokens": 3, "temperature": 0,
                    "stream": True}


def test_targets_from_rows():
    bench = _bench()
    result = {"decode": [{"clients": 1, "tokens_per_s": 10.0, "itl_p99_s": 0.02},
                         {"clients": 16, "tokens_per_s": 50.0, "itl_p99_s": 0.08}],
              "prefix": {"ratio_median": 0.1}, "embed": {"speedup": 4.0},
              "llamacpp": {"decode": [{"clients": 16, "tokens_per_s": 25.0}]}}
    out = bench.targets(result)
    assert out["decode_16_tokens_per_s_vs_1"] == {"value": 5.0, "goal": ">= 4", "met": True}
    assert out["decode_16_itl_p99_vs_1"] == {"value": 4.0, "goal": "<= 3", "met": False}
    assert out["prefix_ttft_second_vs_first"]["met"] and not out["embed_64_concurrent_speedup"]["met"]
    assert out["decode_16_tokens_per_s_vs_llamacpp"] == {"value": 2.0, "goal": ">= 1.5", "met": True}
    assert bench.targets({"decode": [{"clients": 1, "tokens_per_s": 10.0, "itl_p99_s": 0.02}]}) == {}


def test_decode_row_counts_every_request(tiny_gpt2):
    """Two clients with two requests each against a tiny decoder: every request streams its tokens,
    the row adds them up and reads the server's decode batches from /metrics."""
    bench = _bench()
    vocab = bench.vocab_of(tiny_gpt2)

    def start():
        return bench.CpuformerServer(tiny_gpt2, 1, max_queue=64, max_batch=4, dtype="int8", max_length=128,
                                     kv_cache_dtype="float16")

    row = bench.decode_row(start, vocab, clients=2, requests=2, seed=0)
    assert row["clients"] == 2 and row["requests"] == 4 and row["tokens_counted_from"] == ["usage"]
    assert 4 * 32 <= row["generated_tokens"] <= 4 * 64  # 32-64 new tokens per request
    assert row["tokens_per_s"] > 0 and row["ttft_p50_s"] <= row["ttft_p99_s"]
    assert row["batch_steps"] > 0 and 1.0 <= row["mean_batch"] <= 2.0
    assert row["server"] == {"threads": 1, "dtype": "int8", "max_batch": 4, "max_length": 128, "prefill_chunk": None,
                             "max_queue": 64, "kv_cache_dtype": "float16", "prefill_slowdown": None}


def test_prefix_row_times_both_requests(tiny_gpt2):
    bench = _bench()
    vocab = bench.vocab_of(tiny_gpt2)
    row = bench.prefix_row(lambda: bench.CpuformerServer(tiny_gpt2, 1, 64, 2, max_length=128), vocab, system=40,
                           suffix=4, new=3, rounds=2, seed=0)
    assert (row["system_tokens"], row["suffix_tokens"], row["new_tokens"], len(row["rounds"])) == (40, 4, 3, 2)
    for entry in row["rounds"]:
        assert entry["ttft_first_s"] > 0 and entry["ttft_second_s"] > 0
        assert entry["ratio"] == entry["ttft_second_s"] / entry["ttft_first_s"]
        assert entry["prompt_tokens_first"] == entry["prompt_tokens_second"] == 44  # the server's counter
    assert min(e["ratio"] for e in row["rounds"]) <= row["ratio_median"] <= max(e["ratio"] for e in row["rounds"])


def test_quick_run_of_the_llama_model(tmp_path):
    """main() end to end on the small Llama (built into --cache once), one client, decode and prefix
    rows, without the peer: the JSON has the settings, rows and targets."""
    bench = _bench()
    out = tmp_path / "serve.json"
    assert bench.main(["--quick", "--model", "llama", "--rows", "decode,prefix", "--clients", "1", "--requests", "1",
                       "--prefix-rounds", "1", "--threads", "1", "--no-llamacpp", "--cache", str(tmp_path / "cache"),
                       "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["model"] == "llama" and data["settings"]["decoder"].startswith("llama-tiny-")
    assert [r["clients"] for r in data["decode"]] == [1] and data["decode"][0]["requests"] == 1
    assert data["prefix"]["system_tokens"] == 200 and len(data["prefix"]["rounds"]) == 1
    assert data["embed"] is None and data["llamacpp"] == {"skipped": "--no-llamacpp"}
    assert set(data["targets"]) == {"prefix_ttft_second_vs_first"}


def test_bad_options(capsys):
    bench = _bench()
    for argv, message in ((["--clients", "1,x"], "--clients: comma-separated positive integers"),
                          (["--clients", "0"], "--clients: comma-separated positive integers"),
                          (["--rows", "decode,bogus"], "--rows: comma-separated from decode, prefix, embed"),
                          (["--requests", "-1"], "--requests must be at least 1")):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert message in capsys.readouterr().err
