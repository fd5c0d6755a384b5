"""Decoder and seq2seq models keep the KV cache and scratch memory of a generation run for their
next call, and encoders their scratch space (csrc/models/kept_memory.h): every call must give what
a model that never ran gives, whatever the earlier calls left in that memory (larger and smaller
batches, prompts and max_new_tokens, other KV cache dtypes, beams, logits() and encode()); at most
one set is kept, up to the limit; concurrent calls on one model each get their own memory."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core

from .test_registry import _build

pytest.importorskip("torch")
pytest.importorskip("transformers")

FAMILIES = ["gpt2", "llama", "marian", "t5"]


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        out[family] = tmp_path_factory.mktemp(family)
        _build(family, out[family])
    return out


def _prompts(vocab, batch, length, seed):
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(3, vocab - 2, length - (i % 3))] for i in range(batch)]


# Calls in an order that leaves larger and other-typed memory behind each smaller one.
CALLS = [
    dict(batch=4, length=12, max_new_tokens=24),
    dict(batch=1, length=5, max_new_tokens=6),
    dict(batch=2, length=9, max_new_tokens=10, kv_cache_dtype="int8"),
    dict(batch=3, length=7, max_new_tokens=8, num_beams=3),
    dict(batch=1, length=20, max_new_tokens=4, kv_cache_dtype="float16"),
    dict(batch=2, length=6, max_new_tokens=12, do_sample=True, seed=7),
]


def _call(model, call, seed):
    call = dict(call)
    prompts = _prompts(model.vocab_size, call.pop("batch"), call.pop("length"), seed)
    return model.generate(prompts, eos_token_id=[], return_log_probs=True, **call)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_call_gives_what_a_fresh_model_gives(directories, family):
    kept = cf.load(directories[family])
    fresh = [cf.load(directories[family]) for _ in CALLS]
    for i, call in enumerate(CALLS):
        tokens, log_probs = _call(kept, call, seed=i)
        assert kept._model._kept_memory_bytes > 0, (family, i)
        ref_tokens, ref_log_probs = _call(fresh[i], call, seed=i)
        assert tokens == ref_tokens, (family, call)
        np.testing.assert_array_equal(np.concatenate(log_probs), np.concatenate(ref_log_probs), err_msg=str(call))
    # logits() (and encode()) use the same memory; they too match a fresh model's after generation.
    prompt = _prompts(kept.vocab_size, 2, 9, seed=99)
    ids = np.array([p[:7] for p in prompt], dtype=np.int64)
    if family in ("gpt2", "llama"):
        np.testing.assert_array_equal(kept.logits(ids), fresh[0].logits(ids))
    else:
        np.testing.assert_array_equal(kept.encode(ids), fresh[0].encode(ids))
        np.testing.assert_array_equal(kept.logits(ids, ids[:, :4]), fresh[0].logits(ids, ids[:, :4]))
    for model in [kept, *fresh]:
        model.close()


@pytest.mark.parametrize("family", ["gpt2", "marian"])
def test_memory_above_the_limit_is_freed(directories, family):
    model = cf.load(directories[family])
    call = CALLS[0]
    _call(model, call, seed=0)
    held = model._model._kept_memory_bytes
    assert held > 0
    previous = _core._set_kept_memory_limit(held - 1)
    try:
        _call(model, call, seed=0)  # takes the kept set, which is now above the limit
        assert model._model._kept_memory_bytes == 0
        _core._set_kept_memory_limit(held)
        _call(model, call, seed=0)
        assert model._model._kept_memory_bytes == held
    finally:
        _core._set_kept_memory_limit(previous)
    model.close()


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_concurrent_calls_on_one_model(directories, family):
    model = cf.load(directories[family], num_threads=1)
    reference = [_call(model, call, seed=i) for i, call in enumerate(CALLS)]
    results = [None] * (3 * len(CALLS))
    errors = []

    def run(j):
        try:
            results[j] = _call(model, CALLS[j % len(CALLS)], seed=j % len(CALLS))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(j,)) for j in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for j, result in enumerate(results):
        assert result[0] == reference[j % len(CALLS)][0], j
    # At most one set is kept, whichever run gave its memory back first.
    assert 0 < model._model._kept_memory_bytes
    model.close()


@pytest.mark.parametrize("family", ["bert", "deberta-v2", "xlnet"])
def test_encoder_scratch_space_is_kept_up_to_the_limit(tmp_path, family):
    _build(family, tmp_path)
    model = cf.load(tmp_path)
    fresh = cf.load(tmp_path)
    rng = np.random.default_rng(3)
    vocab = model.config["vocab_size"]
    big = rng.integers(5, vocab - 2, (6, 40)).astype(np.int64)
    small = rng.integers(5, vocab - 2, (2, 9)).astype(np.int64)
    np.testing.assert_array_equal(model(big), fresh(big))
    held = model._model._kept_memory_bytes
    assert held > 0
    np.testing.assert_array_equal(model(small), fresh(small))
    assert model._model._kept_memory_bytes == held  # buffers only grow
    previous = _core._set_kept_memory_limit(held - 1)
    try:
        np.testing.assert_array_equal(model(big), fresh(big))
        assert model._model._kept_memory_bytes == 0  # freed after the call
        np.testing.assert_array_equal(model(small), fresh(small))
    finally:
        _core._set_kept_memory_limit(previous)
    model.close()
    fresh.close()
