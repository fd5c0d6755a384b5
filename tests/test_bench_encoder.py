"""benchmarks/bench_encoder.py's bookkeeping (no engine runs here: the benchmark itself is run by hand)."""

import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_encoder", os.path.join(ROOT, "benchmarks", "bench_encoder.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LSCPU = """Architecture:            x86_64
CPU(s):                  2
Model name:              AMD EPYC 7B13
Flags:                   fpu sse4_2 avx f16c avx2 fma bmi2 avx512f avx512bw
"""


def test_parse_lscpu_model_name_and_simd_flags():
    info = _bench().parse_lscpu(LSCPU)
    assert info == {"model_name": "AMD EPYC 7B13", "cpus": "2",
                    "simd_flags": ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw"], "flag_count": 9}
    assert _bench().parse_lscpu("")["model_name"] == "unknown"


def test_max_relative_error_is_relative_to_the_reference_scale():
    bench = _bench()
    reference = np.array([[2.0, -4.0], [1.0, 0.5]])
    assert bench.max_relative_error(reference + np.array([[0.0, 0.4], [0.0, 0.0]]), reference) == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"output shape \(2,\) differs from the reference's \(2, 2\)"):
        bench.max_relative_error(np.zeros(2), reference)


def test_engines_of_each_workload():
    bench = _bench()
    keys = [key for key, _, _ in bench.engines_of("classifier", ["float32", "int8"], ["onnxruntime", "ctranslate2"])]
    assert keys == ["cpuformer", "cpuformer_int8", "pytorch", "onnxruntime_fp32", "onnxruntime_int8",
                    "ctranslate2_fp32", "ctranslate2_int8"]
    # CTranslate2 has no DeBERTa; the rerank workload compares with sentence-transformers only
    assert [k for k, _, _ in bench.engines_of("deberta", ["float32"], ["onnxruntime", "ctranslate2"])] == [
        "cpuformer", "pytorch", "onnxruntime_fp32"]
    assert [k for k, _, _ in bench.engines_of("rerank", ["float32", "int8", "bfloat16"], ["onnxruntime"])] == [
        "cpuformer", "cpuformer_int8", "sentence_transformers"]
    assert [k for k, _, _ in bench.engines_of("bert_base", ["float32", "bfloat16"], [])] == [
        "cpuformer", "cpuformer_bfloat16", "pytorch"]


def test_ratios_and_like_for_like_columns():
    bench = _bench()
    entry = {"cpuformer": {"seq_per_s": 20.0, "dtype": "float32"},
             "cpuformer_int8": {"seq_per_s": 40.0, "dtype": "int8"},
             "onnxruntime_fp32": {"seq_per_s": 10.0, "dtype": "float32"},
             "onnxruntime_int8": {"seq_per_s": 80.0, "dtype": "int8"},
             "ctranslate2_fp32": {"dtype": "float32", "error": "failed"}}
    bench._ratios(entry)
    assert entry["ratios"] == {"cpuformer/onnxruntime_fp32": 2.0, "cpuformer/onnxruntime_int8": 0.25,
                               "cpuformer_int8/onnxruntime_fp32": 4.0, "cpuformer_int8/onnxruntime_int8": 0.5}
    assert bench.like_for_like("onnxruntime_int8", entry) == "0.50x"
    assert bench.like_for_like("onnxruntime_fp32", entry) == "2.00x"
    assert bench.like_for_like("cpuformer_int8", entry) == "2.00x fp32"
    assert bench.like_for_like("ctranslate2_fp32", entry) == "-"


def test_correctness_compares_ct2_classifier_rows_on_hidden_states():
    bench = _bench()
    hidden = np.ones((1, 4, 3), dtype=np.float32)
    outputs = {"pytorch": {"1x4/out": np.array([[1.0, -1.0]]), "1x4/hidden": hidden},
               "ctranslate2_fp32": {"1x4/out": hidden * 1.01},
               "onnxruntime_fp32": {"1x4/out": np.array([[1.0, -1.5]])}}
    ct2 = bench.correctness("classifier", "ctranslate2_fp32", "ctranslate2", outputs, "1x4")
    assert ct2["compared"] == "last_hidden_state" and ct2["max_rel_error_vs_pytorch"] == pytest.approx(0.01, rel=1e-4)
    ort = bench.correctness("classifier", "onnxruntime_fp32", "onnxruntime", outputs, "1x4")
    assert ort == {"max_rel_error_vs_pytorch": 0.5, "compared": "logits"}


@pytest.mark.parametrize("argv, message", [
    (["--workloads", "classifier,gpt2"], "--workloads: unknown gpt2; choose from bert_base, classifier"),
    (["--dtypes", "int8"], "--dtypes must include float32"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        _bench().main(argv)
    assert message in capsys.readouterr().err


def test_mixed_length_batches_and_labels(tmp_path):
    """The 8x128_mixed inputs: lengths in MIXED_LENGTHS, the first the longest, [cls] ... [sep] then id 0
    padding under a zero mask; labels and result names follow the shapes; the prepared file reads back."""
    bench = _bench()
    ids, mask = bench.mixed_batch(np.random.default_rng(0), 8, 128, 101, 102)
    lengths = mask.sum(axis=1)
    assert ids.shape == mask.shape == (8, 128) and lengths[0] == 128
    assert lengths.min() >= bench.MIXED_LENGTHS[0] and len(set(lengths.tolist())) > 1
    assert (ids[:, 0] == 101).all() and (ids[np.arange(8), lengths - 1] == 102).all()
    assert (ids[mask == 0] == 0).all() and (ids[mask == 1] != 0).all()
    assert bench._labels("classifier") == ["8x128", "1x16", "8x128_mixed"]
    assert bench._shape_names("classifier")[-1] == "bert_base_classifier_8x128_mixed"
    assert bench._labels("deberta") == ["8x128"]
    (tmp_path / "classifier").mkdir()
    np.savez(tmp_path / "classifier" / "inputs.npz", ids_1x16=np.ones((1, 16), np.int64), ids_8x128_mixed=ids,
             mask_8x128_mixed=mask)
    inputs = bench._token_inputs(str(tmp_path), "classifier")
    assert sorted(inputs) == ["1x16", "8x128_mixed"]
    np.testing.assert_array_equal(inputs["1x16"][1], np.ones((1, 16), np.int64))
    np.testing.assert_array_equal(inputs["8x128_mixed"][1], mask)
