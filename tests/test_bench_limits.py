"""benchmarks/bench_limits.py's accounting: the multiply-adds and bytes of each kind of call, and the
bound over its phases (the timing children are run by hand with the benchmark)."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _limits():
    spec = importlib.util.spec_from_file_location("bench_limits", os.path.join(ROOT, "benchmarks", "bench_limits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hparams(config):
    from cpuformer.arch import find

    arch, _ = find(config)
    return arch.hparams(config)


BERT = dict(architectures=["BertModel"], model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12,
            num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)
LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32000, hidden_size=2048,
             num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632,
             max_position_embeddings=2048, tie_word_embeddings=False)


def test_encoder_call():
    m = _limits()
    (p,) = m.call_phases(_hparams(BERT), "encoder", dict(batch=8, length=128), "float32")
    per_layer = 4 * 768 * 768 + 2 * 768 * 3072
    assert p["macs"] == 8 * 128 * 12 * per_layer + 2 * 768 * 128 * 128 * 12 * 8
    assert p["bytes"] == 12 * per_layer * 4
    (q,) = m.call_phases(_hparams(BERT), "encoder", dict(batch=8, length=128), "int8")
    rows_per_layer = 4 * 768 + 3072 + 768  # output rows: a float32 scale each
    assert q["bytes"] == 12 * (per_layer + 4 * rows_per_layer)


def test_decoder_call_with_grouped_kv_and_a_gated_ffn():
    m = _limits()
    h = _hparams(LLAMA)
    phases = m.call_phases(h, "decoder", dict(batch=1, prompt=16, new=4), "float32")
    assert len(phases) == 4  # the prefill gives the first token, then 3 steps
    per_token = 22 * (2048 * 2048 * 2 + 2 * 256 * 2048 + 3 * 2048 * 5632)
    head = 32000 * 2048
    assert phases[0]["macs"] == 16 * per_token + 2 * 2048 * (16 * 17 / 2) * 22 + head
    # Step 1: the new token is the 17th key; the 16 cached tokens' keys and values are read in float32.
    assert phases[1]["macs"] == per_token + 2 * 2048 * 17 * 22 + head
    assert phases[1]["bytes"] == 4 * (per_token + head) + 22 * 2 * 256 * 16 * 4
    assert phases[3]["bytes"] - phases[2]["bytes"] == 22 * 2 * 256 * 4
    assert m.units("decoder", dict(batch=1, prompt=16, new=4)) == (4, "tok/s")
    assert m.units("prefill", dict(batch=1, prompt=512)) == (512, "tok/s")


def test_bound_takes_the_slower_limit_of_each_phase():
    m = _limits()
    phases = [{"macs": 100.0, "bytes": 1.0}, {"macs": 1.0, "bytes": 1000.0}]
    # peak 200 ops/s (100 MAC/s), bandwidth 100 B/s: 1 s of compute, then 10 s of reading.
    assert m.bound_seconds(phases, 200.0, 100.0) == pytest.approx(1.0 + 10.0)


def test_int4_counts_nibbles_and_group_scales_and_an_int8_lm_head():
    m = _limits()
    assert m.weight_bytes(768, 3072, "int4") == 768 * (3072 // 2 + 2 * 3072 // 32)
    assert m.weight_bytes(768, 100, "int4") == 768 * 4 * (16 + 2)  # K padded to whole groups of 32
    h = _hparams(LLAMA)
    step = m.call_phases(h, "decoder", dict(batch=1, prompt=16, new=2), "int4")[1]
    layers = 22 * sum(m.weight_bytes(n, k, "int4") for n, k in m.layer_matrices(h))
    kv = 22 * 2 * 256 * 16 * 4
    assert step["bytes"] == layers + m.weight_bytes(32000, 2048, "int8") + kv
