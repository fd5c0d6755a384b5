"""Several Python threads sharing one Generator and one Seq2Seq (see test_concurrency.py for the
encoder and ops). 8 threads × 50 mixed calls — greedy, seeded sampling and beam-search generate
of ragged batches, stream, logits, encode — each compared with the same call made alone, with a
deadlock timeout and the compute-slot bound checked (docs/reliability.md, "Concurrency")."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core

from .test_concurrency import CALLS_PER_THREAD, THREADS, assert_bitwise, run_threads

VOCAB = 61


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    llama = tmp_path_factory.mktemp("conc_llama")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)).eval().save_pretrained(
        llama, safe_serialization=True)
    marian = tmp_path_factory.mktemp("conc_marian")
    transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
        pad_token_id=VOCAB - 1, eos_token_id=0, decoder_start_token_id=VOCAB - 1)).eval().save_pretrained(
        marian, safe_serialization=True)
    return str(llama), str(marian)


def plan(seed):
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(CALLS_PER_THREAD):
        prompts = [list(map(int, rng.integers(3, VOCAB - 1, size=int(rng.integers(1, 9)))))
                   for _ in range(int(rng.integers(1, 4)))]
        kind = ["greedy", "sample", "beam", "stream", "logits", "s2s_greedy", "s2s_beam", "s2s_logits",
                "encode"][i % 9]
        steps.append((kind, prompts, int(rng.integers(0, 2**32))))
    return steps


def run(generator, seq2seq, step):
    kind, prompts, seed = step
    if kind == "greedy":
        return generator.generate(prompts, max_new_tokens=6)
    if kind == "sample":
        return generator.generate(prompts, max_new_tokens=6, do_sample=True, top_k=8, seed=seed)
    if kind == "beam":
        return generator.generate(prompts, max_new_tokens=5, num_beams=3)
    if kind == "stream":
        return list(generator.stream(prompts[0], max_new_tokens=6))
    if kind == "s2s_greedy":
        return seq2seq.generate(prompts, max_new_tokens=6)
    if kind == "s2s_beam":
        return seq2seq.generate(prompts, max_new_tokens=5, num_beams=3, num_return_sequences=2)
    ids = np.array([p[:1] * 8 for p in prompts], np.int64)  # rectangular
    if kind == "logits":
        return generator.logits(ids)
    if kind == "s2s_logits":
        return seq2seq.logits(ids, ids[:, :3])
    return seq2seq.encode(ids)


def same(got, want, where):
    if isinstance(want, np.ndarray):
        assert_bitwise(got, want, where)
    else:
        assert got == want, f"{where}: differs from the sequential result"


@pytest.mark.parametrize("num_threads", [1, 2])
def test_threads_share_generators(models, num_threads):
    llama, marian = models
    generator, seq2seq = cf.Generator(llama, num_threads=num_threads), cf.Seq2Seq(marian, num_threads=num_threads)
    plans = [plan(200 + t) for t in range(THREADS)]
    sequential = [[run(generator, seq2seq, step) for step in p] for p in plans]

    _core._reset_compute_slots_peak()
    threaded = run_threads(lambda p: [run(generator, seq2seq, step) for step in p], plans)
    slots = _core._compute_slots()

    for t in range(THREADS):
        for i in range(CALLS_PER_THREAD):
            same(threaded[t][i], sequential[t][i], f"thread {t} call {i} ({plans[t][i][0]})")
    assert slots["in_use"] == 0
    assert 1 <= slots["peak"] <= max(slots["capacity"], num_threads), slots
    generator.close()
    seq2seq.close()
