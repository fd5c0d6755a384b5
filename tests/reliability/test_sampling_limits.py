"""Sampling at temperatures far outside float32's range tends to the right limit.

temperature is any finite number > 0. A tiny one samples the argmax (greedy's token), a huge one
samples uniformly from the tokens top-k / top-p keep, and no NaN reaches the result (the
probabilities are computed as exp((logit - max) / temperature)). Before, logit / temperature
overflowed float32 below ~1e-38 and the sampler returned the last token with a positive logit.
Semantics: docs/reliability.md, "Streams and sampling limits".
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import cpuformer as cf

# 101 tokens: a top-p cut of a uniform distribution never falls exactly on a token boundary.
VOCAB = 101
PROMPT = [5, 9, 11, 2]


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    directory = tmp_path_factory.mktemp("sampling_llama")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)
    return cf.Generator(directory)


def step_logits(gen, tokens):
    """The logits [len(tokens), V] that chose each of `tokens` after PROMPT."""
    row = gen.logits(np.array([PROMPT + tokens]))[0]
    return row[len(PROMPT) - 1:len(PROMPT) - 1 + len(tokens)]


@pytest.mark.parametrize("temperature", [1e-42, 1e-45, 1e-50, 1e-300, 5e-324])
def test_tiny_temperature_samples_the_argmax(gen, temperature):
    greedy = gen.generate(PROMPT, max_new_tokens=8, eos_token_id=[])[0]
    for seed in range(12):
        for extra in ({}, dict(top_k=7), dict(top_p=0.9), dict(repetition_penalty=1.3)):
            expected = greedy if not extra.get("repetition_penalty") else \
                gen.generate(PROMPT, max_new_tokens=8, eos_token_id=[], **extra)[0]
            tokens, log_probs = gen.generate(PROMPT, max_new_tokens=8, eos_token_id=[], do_sample=True,
                                             temperature=temperature, seed=seed, return_log_probs=True, **extra)
            assert tokens[0] == expected, (seed, extra)
            # All the probability on the argmax: log-probability 0, never NaN.
            assert log_probs[0] == [0.0] * 8, (seed, extra)


@pytest.mark.parametrize("temperature", [1e30, 1e39, 1e300, 1.7e308, 10 ** 300], ids="{:.1e}".format)
def test_huge_temperature_samples_uniformly_from_the_kept_tokens(gen, temperature):
    chosen = set()
    for seed in range(20):
        tokens, log_probs = gen.generate(PROMPT, max_new_tokens=6, eos_token_id=[], do_sample=True,
                                         temperature=temperature, seed=seed, return_log_probs=True)
        assert all(0 <= t < VOCAB for t in tokens[0])
        np.testing.assert_allclose(log_probs[0], -math.log(VOCAB), rtol=1e-6)
        chosen.update(tokens[0])
    assert len(chosen) > 40  # 120 draws from 101 equally likely tokens
    for seed in range(10):
        # top-k keeps the 5 largest logits, as at any temperature; uniform among them.
        tokens, log_probs = gen.generate(PROMPT, max_new_tokens=6, eos_token_id=[], do_sample=True, top_k=5,
                                         temperature=temperature, seed=seed, return_log_probs=True)
        for token, logits in zip(tokens[0], step_logits(gen, tokens[0])):
            assert token in np.argsort(logits)[-5:]
        np.testing.assert_allclose(log_probs[0], -math.log(5), rtol=1e-6)
        # top-p on a uniform distribution drops the least likely 70 of 101 tokens (cumulative
        # probability 70/101 <= 1 - 0.3), in the order of the logits: the 31 largest remain.
        tokens, log_probs = gen.generate(PROMPT, max_new_tokens=6, eos_token_id=[], do_sample=True, top_p=0.3,
                                         temperature=temperature, seed=seed, return_log_probs=True)
        for token, logits in zip(tokens[0], step_logits(gen, tokens[0])):
            assert token in np.argsort(logits, kind="stable")[-31:]
        np.testing.assert_allclose(log_probs[0], -math.log(31), rtol=1e-6)


def test_ordinary_temperatures_are_unchanged(gen):
    """Between the limits, the sampled token's log-probability is log_softmax(logits / temperature)."""
    for temperature in (0.05, 0.7, 1.0, 3.0, 1e4):
        tokens, log_probs = gen.generate(PROMPT, max_new_tokens=6, eos_token_id=[], do_sample=True,
                                         temperature=temperature, seed=3, return_log_probs=True)
        for token, logits, got in zip(tokens[0], step_logits(gen, tokens[0]), log_probs[0]):
            z = logits.astype(np.float64) / temperature
            expected = z[token] - (z.max() + math.log(np.exp(z - z.max()).sum()))
            assert abs(got - expected) < 1e-4 * max(1.0, abs(expected))


@pytest.mark.parametrize("temperature, message", [
    (0.0, "temperature must be > 0 when sampling, got 0.0"),
    (1e-400, "temperature must be > 0 when sampling, got 0.0"),  # rounds to 0.0 in Python already
    (-1e-300, "temperature must be > 0 when sampling, got -1e-300"),
    (float("inf"), "temperature must be a finite number, got inf"),
    (10 ** 400, "temperature must be a finite number, got 1000"),  # beyond any float
], ids=["zero", "underflows_to_zero", "negative", "inf", "int_beyond_float"])
def test_temperatures_outside_the_range_are_refused(gen, temperature, message):
    with pytest.raises(ValueError, match=message):
        gen.generate(PROMPT, do_sample=True, temperature=temperature)
    with pytest.raises(ValueError, match=message):
        gen.stream(PROMPT, do_sample=True, temperature=temperature)
