"""benchmarks/bench_vision.py's bookkeeping (no engine runs here: the benchmark itself is run by hand)."""

import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_vision", os.path.join(ROOT, "benchmarks", "bench_vision.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engines_of_each_row():
    bench = _bench()
    assert [k for k, _, _ in bench.engines_of("vit", ["pytorch", "onnxruntime"])] == [
        "cpuformer", "cpuformer_int8", "pytorch", "onnxruntime_fp32", "onnxruntime_int8"]
    assert bench.engines_of("swin", ["pytorch", "onnxruntime"]) == [
        ("cpuformer", "cpuformer", "float32"), ("pytorch", "pytorch", "float32"),
        ("onnxruntime_fp32", "onnxruntime", "float32")]
    assert [k for k, _, _ in bench.engines_of("clip", ["pytorch"])] == ["cpuformer", "pytorch"]
    assert bench.engines_of("preprocess", ["pytorch", "onnxruntime"]) == [("cpuformer", "cpuformer", "float32")]
    assert [bench.result_name(row, b) for row in bench.ROWS for b in bench.BATCHES[row]] == [
        "vit_b16_b1", "vit_b16_b8", "swin_t_b8", "clip_b32_image_b32", "clip_b32_preprocess_b32"]


def test_ratios_and_like_for_like():
    bench = _bench()
    entry = {"model": "ViT-B/16", "cpuformer": {"img_per_s": 12.0, "dtype": "float32"},
             "cpuformer_int8": {"img_per_s": 30.0, "dtype": "int8"},
             "pytorch": {"img_per_s": 4.0, "dtype": "float32"},
             "onnxruntime_int8": {"img_per_s": 20.0, "dtype": "int8"},
             "onnxruntime_fp32": {"dtype": "float32", "error": "failed"}}
    bench._ratios(entry)
    assert entry["ratios"] == {"cpuformer/pytorch": 3.0, "cpuformer/onnxruntime_int8": 0.6,
                               "cpuformer_int8/pytorch": 7.5, "cpuformer_int8/onnxruntime_int8": 1.5}
    assert bench.like_for_like("onnxruntime_int8", entry) == "1.50x"
    assert bench.like_for_like("pytorch", entry) == "3.00x"
    assert bench.like_for_like("onnxruntime_fp32", entry) == "-"
    swin = {"cpuformer": {"dtype": "float32", "not_supported": "ValueError: unknown architecture"},
            "pytorch": {"img_per_s": 4.0, "dtype": "float32"}}
    bench._ratios(swin)
    assert "ratios" not in swin and bench.like_for_like("pytorch", swin) == "-"


def test_correctness_against_pytorch():
    bench = _bench()
    reference = np.array([[2.0, -4.0], [1.0, 0.5]])
    outputs = {"pytorch": {"b2": reference}, "cpuformer": {"b2": reference + np.array([[0.0, 0.4], [0.0, 0.0]])},
               "onnxruntime_fp32": {"b2": -reference}}
    ours = bench.correctness("cpuformer", outputs, "b2")
    assert ours["max_rel_error_vs_pytorch"] == pytest.approx(0.1) and 0.99 < ours["min_cosine_vs_pytorch"] < 1
    assert bench.correctness("onnxruntime_fp32", outputs, "b2")["min_cosine_vs_pytorch"] == pytest.approx(-1)
    assert bench.correctness("pytorch", outputs, "b2") == {} and bench.correctness("cpuformer", outputs, "b8") == {}
    with pytest.raises(ValueError, match=r"output shape \(2,\) differs from the reference's \(2, 2\)"):
        bench.max_relative_error(np.zeros(2), reference)


def test_preprocess_entry_shares():
    bench = _bench()
    entry = bench._preprocess_entry({"model_only": [90.0, 100.0, 110.0], "end_to_end_arrays": [80.0],
                                     "end_to_end_jpeg": [50.0, 40.0, 60.0], "preprocess_arrays": [400.0],
                                     "preprocess_jpeg": [100.0]}, {"version": "0.1.0"})
    assert entry["model_only"] == {"img_per_s": 100.0, "best": 110.0, "rounds": [90.0, 100.0, 110.0]}
    # end to end 1/80 s per image, the model 1/100 s: the other 20 % is preprocessing
    assert entry["preprocess_share_arrays"] == pytest.approx(0.2)
    assert entry["preprocess_share_jpeg"] == pytest.approx(0.5)
    assert entry["preprocess_alone_share_arrays"] == pytest.approx(0.2)
    assert entry["preprocess_alone_share_jpeg"] == pytest.approx(0.5)
    assert entry["target_share"] == 0.2 and entry["batch"] == 32 and entry["version"] == "0.1.0"
    assert "preprocess_share_arrays" not in bench._preprocess_entry({"end_to_end_arrays": [80.0]}, {})


def test_measure_interleaved_calls_in_turn():
    bench = _bench()
    calls = []
    rates = bench.measure_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 4, 0.0)
    assert calls == ["a", "b"] * 3  # a warm-up each, then cycles until each label has 2 timed calls
    assert set(rates) == {"a", "b"} and all(rate > 0 for rate in rates.values())
    calls.clear()
    bench.measure_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 4, 0.0,
                              warm_up=("b",))
    assert calls == ["b", "a", "b", "a", "b"]


def test_synthetic_images_are_deterministic_and_distinct():
    bench = _bench()
    first = bench.synthetic_image(0, 48, 64)
    assert first.shape == (48, 64, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, bench.synthetic_image(0, 48, 64))
    assert not np.array_equal(first, bench.synthetic_image(1, 48, 64)) and first.std() > 20


def test_unknown_rows_are_named(capsys):
    with pytest.raises(SystemExit):
        _bench().main(["--rows", "vit,resnet"])
    assert "--rows: unknown resnet; choose from vit, swin, clip, preprocess" in capsys.readouterr().err
