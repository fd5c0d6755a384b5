"""benchmarks/bench_load.py on a tiny converted Llama: both variants are built from the source
without changing it, each child reports whether the packed-weights file was used, and the
summary has a median per variant (the timings themselves are not checked)."""

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_load", os.path.join(ROOT, "benchmarks", "bench_load.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_load_times_both_variants(tmp_path):
    import torch
    import transformers

    import cpuformer as cf
    from cpuformer.models._packed import packed_file_name

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=32)).save_pretrained(tmp_path / "hf")
    src = tmp_path / "int8"
    cf.convert(tmp_path / "hf", src, "int8", progress=False, pack=False)
    before = sorted(os.listdir(src))
    out = tmp_path / "result.json"
    assert _bench().main([str(src), "--rounds", "2", "--decode", "2", "--work", str(tmp_path / "work"),
                          "--output", str(out)]) == 0
    assert sorted(os.listdir(src)) == before  # the source is not changed
    assert (tmp_path / "work" / "int8-packed" / packed_file_name()).is_file()
    assert not (tmp_path / "work" / "int8-plain" / packed_file_name()).exists()
    result = json.loads(out.read_text())[str(src)]
    for name in ("plain", "packed"):
        assert [row["packed"] for row in result["rounds"][name]] == [name == "packed"] * 2
        assert set(result["medians"][name]) == {"load_s", "first_token_s", "tok_per_s"}
