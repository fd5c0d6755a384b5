"""benchmarks/report.py on small synthetic result files (needs matplotlib for the plots)."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report_module():
    spec = importlib.util.spec_from_file_location("bench_report", os.path.join(ROOT, "benchmarks", "report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MACHINE = {"cpu": "Test CPU", "cores": 2, "isa": "avx2", "threads": 2, "date": "2026-11-20T10:00:00"}


def _write(directory, name, data):
    with open(os.path.join(directory, name), "w") as f:
        json.dump(data, f)


def test_report_tables_and_plots(tmp_path):
    report = _report_module()
    _write(tmp_path, "decoder_2026-11-19.json", {"machine": MACHINE, "results": {"gpt2": {
        "decode_b1": {"cpuformer": {"tok_per_s": 1.0}}}}})  # older: replaced by the next file
    _write(tmp_path, "decoder_2026-11-20.json", {"machine": MACHINE, "quick": True, "results": {
        "read_bandwidth_gb_s": 20.0,
        "gpt2": {"decode_b1": {"cpuformer": {"tok_per_s": 50.0}, "pytorch": {"tok_per_s": 40.0},
                               "ctranslate2_fp32": {"tok_per_s": 25.0}},
                 "flatness": {"steps": 10, "ratio": 1.0},
                 "decode_vs_length": {"lengths": [16, 256], "new_tokens": 8,
                                      "ms_per_token": {"cpuformer": [20.0, 22.0], "pytorch": [25.0, 31.0]}}}}})
    _write(tmp_path, "encoder_2026-11-20.json", {"machine": MACHINE, "results": {
        "bert_base_8x128": {"cpuformer": {"seq_per_s": 10.0}, "pytorch": {"seq_per_s": 8.0}},
        "minilm_embed": {"cpuformer": {"seq_per_s": 400.0}, "sentence_transformers": {"seq_per_s": 320.0}}}})
    _write(tmp_path, "bench_cli.json", {"cpuformer": "0.1.0", "machine": {"isa": "avx2", "num_threads": 2},
                                        "quick": True, "rows": [
        {"kind": "seq2seq", "model": "marian-small", "engine": "cpuformer", "dtype": "int8",
         "workload": "4 sources", "tok_per_s": 900.0, "seq_per_s": 56.0},
        {"kind": "seq2seq", "model": "marian-small", "engine": "torch", "dtype": "float32",
         "workload": "4 sources", "skipped": "not installed"}]})
    out = tmp_path / "out"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "decoder_2026-11-19.json" not in text and "## decoder_2026-11-20.json" in text
    assert "| decoder | gpt2 decode_b1 | float32 | 50.00 | 40.00 | 25.00 | 1.25× | 2.00× |" in text
    # encoder: tokens/s from sequences/s × 128; the embed workload has no token count
    assert "| encoder | bert_base_8x128 | float32 | 1,280 | 1,024 | - | 1.25× | - |" in text
    assert "| encoder | minilm_embed | float32 | (400 seq/s) | - | (320 seq/s) | - | 1.25× |" in text
    assert "| seq2seq | marian-small 4 sources | int8 | 900 |" in text
    assert "| PyTorch | 25.00 | 31.00 |" in text and "Test CPU, 2 cores, 2 threads, isa avx2" in text
    for png in ("throughput.png", "decode_latency.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{png}]({png})" in text


def test_report_without_decode_curves_and_no_plots(tmp_path):
    report = _report_module()
    _write(tmp_path, "seq2seq_2026-11-20.json", {"machine": MACHINE, "results": {"marian": {
        "beam1": {"cpuformer": {"tok_per_s": 700.0}, "ctranslate2": {"tok_per_s": 250.0}}}}})
    assert report.main(["--results", str(tmp_path), "--no-plots"]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    assert "| seq2seq | marian beam1 | float32 | 700 | 250 | 2.80× |" in text
    assert not (tmp_path / "throughput.png").exists() and "decode time" not in text.lower()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report.main(["--results", str(empty)]) == 1


def test_report_vision_tables_and_plot(tmp_path):
    report = _report_module()
    _write(tmp_path, "vision_2026-11-26.json", {"machine": MACHINE, "peak_gops": {"float32": 500.0, "int8": 2000.0},
                                                "results": {
        "vit_b16_b8": {"model": "ViT-B/16", "batch": 8, "gflop_per_image": 35.0,
                       "cpuformer": {"img_per_s": 12.0, "dtype": "float32", "of_peak": 0.84},
                       "cpuformer_int8": {"img_per_s": 30.0, "dtype": "int8", "of_peak": 0.53},
                       "pytorch": {"img_per_s": 5.0, "dtype": "float32"},
                       "onnxruntime_fp32": {"img_per_s": 8.0, "dtype": "float32"},
                       "onnxruntime_int8": {"img_per_s": 20.0, "dtype": "int8"},
                       "ratios": {"cpuformer/pytorch": 2.4}, "onnxruntime_build": {"fused_operators": {}}},
        "swin_t_b8": {"model": "Swin-T", "batch": 8,
                      "cpuformer": {"dtype": "float32", "not_supported": "ValueError: unknown architecture"},
                      "pytorch": {"img_per_s": 10.0, "dtype": "float32"}},
        "clip_b32_preprocess_b32": {"model": "CLIP ViT-B/32 embed_images", "batch": 32, "target_share": 0.2,
                                    "model_only": {"img_per_s": 100.0}, "end_to_end_arrays": {"img_per_s": 90.0},
                                    "end_to_end_jpeg": {"img_per_s": 80.0}, "preprocess_share_arrays": 0.1,
                                    "preprocess_share_jpeg": 0.2, "preprocess_alone_share_arrays": 0.08,
                                    "preprocess_alone_share_jpeg": 0.19}}})
    out = tmp_path / "out"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "Compute peak measured by `ops.peak_gops`: float32 500 GOP/s, int8 2,000 GOP/s." in text
    assert "| ViT-B/16 | 8 | float32 | 12.00 | 5.00 | 8.00 | 2.40× | 1.50× | 84 % |" in text
    assert "| ViT-B/16 | 8 | int8 | 30.00 | - | 20.00 | - | 1.50× | 53 % |" in text
    assert "| Swin-T | 8 | float32 | not supported | 10.00 | - | - | - | - |" in text
    assert ("Preprocessing share of end-to-end (1 − end-to-end / model only): arrays 10 %, jpeg 20 % (target ≤ 20 %); "
            "preprocess alone over end-to-end: arrays 8 %, jpeg 19 %.") in text
    assert (out / "vision.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![vision.png](vision.png)" in text
    assert not (out / "throughput.png").exists()  # no token rows


def _serve_row(clients, rate, itl_p99, batch=None):
    row = {"clients": clients, "requests": 4 * clients, "generated_tokens": 100, "wall_s": 1.0, "tokens_per_s": rate,
           "ttft_p50_s": 0.05, "ttft_p99_s": 0.08, "itl_p50_s": itl_p99 / 2, "itl_p99_s": itl_p99}
    return row if batch is None else dict(row, mean_batch=batch)


def test_report_serve_tables_and_plot(tmp_path):
    report = _report_module()
    prefix = {"system_tokens": 500, "suffix_tokens": 16, "new_tokens": 8, "rounds": [{}, {}, {}],
              "ttft_first_median_s": 0.5, "ttft_second_median_s": 0.05, "ratio_median": 0.1}
    _write(tmp_path, "serve_gpt2_int8_2026-11-27.json", {
        "machine": MACHINE,
        "settings": {"model": "gpt2", "dtype": "int8", "decoder": "gpt2-124m-abc", "requests_per_client": 4,
                     "mix": {"prompt_tokens": [16, 64], "new_tokens": [32, 64]},
                     "server": {"max_batch": 64, "prefill_chunk": 64}},
        "decode": [_serve_row(1, 20.0, 0.05, 1.0), _serve_row(16, 100.0, 0.1, 12.5)],
        "prefix": prefix, "embed": {"requests": 64, "sequential_s": 1.0, "concurrent_s": 0.25, "speedup": 4.0},
        "llamacpp": {"format": "Q8_0", "version": {"llama_cpp_python": "0.3.16"},
                     "server": {"n_threads": 2, "interrupt_requests": False},
                     "decode": [_serve_row(1, 25.0, 0.04), _serve_row(16, 25.0, 0.05)],
                     "prefix": dict(prefix, ttft_second_median_s=0.1, ratio_median=0.2)},
        "targets": {"decode_16_tokens_per_s_vs_1": {"value": 5.0, "goal": ">= 4", "met": True},
                    "decode_16_tokens_per_s_vs_llamacpp": {"value": 4.0, "goal": ">= 1.5", "met": True},
                    "embed_64_concurrent_speedup": {"value": 4.0, "goal": ">= 5", "met": False}}})
    # a file from before --model / --dtype (one request at a time, no peer): GPT-2 float32
    _write(tmp_path, "serve_2026-11-26.json", {"machine": MACHINE, "settings": {"requests_per_client": 4},
                                               "decode": [_serve_row(1, 27.0, 0.05)],
                                               "llamacpp": {"skipped": "llama-cpp-python does not import"}})
    out = tmp_path / "out"
    assert report.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert ("gpt2 (gpt2-124m-abc), int8: each client streams 4 requests of 16-64 prompt tokens for 32-64 new tokens, "
            "temperature 0; cpuformer serve --max-batch 64 --prefill-chunk 64.") in text
    assert "| 1 | cpuformer int8 | 20.00 | 1.00× | 0.80× | 50.0 | 80.0 | 25.0 | 50.0 | 1.0 |" in text
    assert "| 16 | cpuformer int8 | 100 | 5.00× | 4.00× | 50.0 | 80.0 | 50.0 | 100.0 | 12.5 |" in text
    assert "| 16 | llama.cpp Q8_0 | 25.00 | 1.00× | - | 50.0 | 80.0 | 25.0 | 50.0 | - |" in text
    assert ("Shared system prompt (cpuformer): 500 tokens + a 16-token suffix, 3 rounds (medians): time to first "
            "token of request 1 500.0 ms, of request 2 (same system prompt, another suffix) 50.0 ms: 10 % of the "
            "first.") in text
    assert "Shared system prompt (llama.cpp): 500 tokens" in text and "100.0 ms: 20 % of the first." in text
    assert "Embeddings: 64 single-sentence requests one by one 1.00 s, all at once 0.25 s: 4.00×." in text
    assert "llama.cpp: llama-cpp-python 0.3.16 server, Q8_0 GGUF of the same weights, n_threads 2" in text
    assert "| decode 16 tokens per s vs llamacpp | 4.00 | >= 1.5 | yes |" in text
    assert "| embed 64 concurrent speedup | 4.00 | >= 5 | no |" in text
    assert "gpt2 (?), float32: each client streams 4 requests" in text
    assert "| 1 | cpuformer float32 | 27.00 | 1.00× | - |" in text
    assert "llama.cpp skipped: llama-cpp-python does not import" in text
    assert (out / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![serve.png](serve.png)" in text
    assert not (out / "throughput.png").exists()  # no token rows of the other kinds


def test_serve_series_skips_missing_rows():
    report = _report_module()
    assert report.serve_series({"decode": [], "llamacpp": {"error": "no server"}}) == []
    assert [s["engine"] for s in report.serve_series({"decode": [_serve_row(1, 1.0, 0.1)]})] == ["cpuformer"]
