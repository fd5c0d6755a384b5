"""benchmarks/bench_decode_rounds.py's bookkeeping: the bytes a decode step reads, and one cpuformer
timing child on a tiny model (llama.cpp and the `gguf` package are benchmark peers, not test
dependencies: the benchmark itself is run by hand)."""

import importlib.util
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_decode_rounds",
                                                  os.path.join(ROOT, "benchmarks", "bench_decode_rounds.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_weight_bytes_leave_out_the_token_embedding(tmp_path):
    from safetensors.numpy import save_file

    bench = _bench()
    save_file({"model.embed_tokens.weight": np.zeros((100, 8), np.int8),
               "model.embed_tokens.weight_scale": np.zeros(100, np.float32),
               "model.layers.0.mlp.up_proj.weight": np.zeros((16, 8), np.int8),
               "model.layers.0.mlp.up_proj.weight_scale": np.zeros(16, np.float32),
               "lm_head.weight": np.zeros((100, 8), np.int8)}, str(tmp_path / "model.safetensors"))
    assert bench.safetensors_bytes(str(tmp_path / "model.safetensors")) == 16 * 8 + 16 * 4 + 100 * 8


def test_cpuformer_child_times_a_decode(tmp_path):
    import argparse

    import torch
    import transformers

    bench = _bench()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(str(tmp_path))
    args = argparse.Namespace(threads=1, prompt=4, new=6, repeats=1)
    assert bench.run_ours(str(tmp_path), args) > 0
