"""Random schedules for the continuous batcher (Generator.batcher()): requests arrive, are
cancelled and finish at random steps; prompts repeat, extend and cut each other (prefix reuse
copies and shares cached positions); prompt plus new tokens reach the batcher's max_length;
capacity, prefill chunk, KV-cache dtype, prefix reuse and the prefill budget vary per schedule.
Whatever the schedule, every request that ran to its end has exactly generate()'s tokens for it
alone, a cancelled one a prefix of them, a refused submit leaves the batcher working, and the
batcher ends empty."""

from __future__ import annotations

import numpy as np
import pytest
from models.test_decoder import SMALL, _build

import cpuformer as cf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Learned positions (GPT-2), GQA with RoPE (Llama), one kv head and a sliding window of 8 (Mistral).
FAMILIES = ["gpt2", "llama", "mistral"]
SCHEDULES = 6  # per family


@pytest.fixture(scope="module")
def gens(tmp_path_factory):
    out = {}
    for i, name in enumerate(FAMILIES):
        model_class, config_class, config = SMALL[name]
        directory = tmp_path_factory.mktemp(f"schedule_{name}")
        _build(directory, model_class, config_class, seed=70 + i, **config)
        out[name] = cf.Generator(directory)
    return out


def _prompt_pool(rng, vocab, longest):
    """Prompts that share prefixes: fresh ones, exact repeats, extensions and cuts of earlier ones."""
    pool = []
    for _ in range(24):
        kind = rng.integers(4) if pool else 0
        if kind == 0:
            prompt = [int(t) for t in rng.integers(3, vocab, int(rng.integers(1, longest)))]
        else:
            base = pool[int(rng.integers(len(pool)))]
            if kind == 1:
                prompt = list(base)
            elif kind == 2:
                prompt = base + [int(t) for t in rng.integers(3, vocab, int(rng.integers(1, 9)))]
            else:
                prompt = base[:int(rng.integers(1, len(base) + 1))]
        pool.append(prompt[:longest])
    return pool


def _options(rng, prompt_len, max_length):
    room = max_length - prompt_len
    new = room if rng.random() < 0.2 else int(rng.integers(1, min(room, 24) + 1))
    options = dict(max_new_tokens=new, eos_token_id=[] if rng.random() < 0.7 else [int(rng.integers(3, 30))])
    if rng.random() < 0.4:
        options.update(do_sample=True, seed=int(rng.integers(1 << 30)), temperature=0.8, top_k=int(rng.integers(0, 30)))
    if rng.random() < 0.2:
        options.update(repetition_penalty=1.3)
    return options


def _run_schedule(gen, seed):
    rng = np.random.default_rng(seed)
    max_length = int(rng.integers(24, 64))
    kv = [None, "int8", "bfloat16"][int(rng.integers(3))]
    settings = dict(capacity=int(rng.integers(1, 5)), max_length=max_length, prefill_chunk=int(rng.integers(1, 17)),
                    kv_cache_dtype=kv, prefix_reuse=bool(rng.random() < 0.8),
                    prefill_slowdown=[0.0, 1.0, 2.0][int(rng.integers(3))])
    batcher = gen.batcher(**settings)
    pool = _prompt_pool(rng, gen.vocab_size, max_length - 1)
    requests = {}  # id -> (prompt, options, tokens so far, cancelled)
    live = []
    submitted = 0
    for _ in range(400):
        if submitted < 20 and rng.random() < 0.5:
            prompt = pool[int(rng.integers(len(pool)))]
            if rng.random() < 0.05:  # too long for the batcher: refused, nothing else changes
                with pytest.raises(ValueError):
                    batcher.submit(prompt, max_new_tokens=max_length - len(prompt) + 1, eos_token_id=[])
            else:
                options = _options(rng, len(prompt), max_length)
                request = batcher.submit(prompt, **options)
                requests[request] = (prompt, options, [], [False])
                live.append(request)
                submitted += 1
        if live and rng.random() < 0.08:
            victim = live[int(rng.integers(len(live)))]
            assert batcher.cancel(victim)
            requests[victim][3][0] = True
            live.remove(victim)
        for event in batcher.step():
            _, _, tokens, cancelled = requests[event.request]
            assert not cancelled[0], "a cancelled request got a token"
            tokens.append(event.token)
            if event.finish_reason is not None:
                live.remove(event.request)
        if submitted >= 20 and not live:
            break
    while batcher.running or batcher.waiting:  # the last submissions run to their end
        for event in batcher.step():
            requests[event.request][2].append(event.token)
            if event.finish_reason is not None:
                live.remove(event.request)
    assert not live and batcher.running == batcher.waiting == 0, settings
    assert batcher.step() == []
    for request, (prompt, options, tokens, cancelled) in requests.items():
        alone = gen.generate(prompt, kv_cache_dtype=kv, **options)[0]
        if cancelled[0]:
            assert tokens == alone[:len(tokens)], (request, settings, options)
        else:
            assert tokens == alone, (request, settings, options)
    return settings, batcher.stats()


@pytest.mark.parametrize("name", FAMILIES)
def test_random_schedules_give_each_request_its_tokens_alone(gens, name):
    seen = set()
    reused = copied = 0
    for seed in range(SCHEDULES):
        settings, stats = _run_schedule(gens[name], 1000 * FAMILIES.index(name) + seed)
        seen.add((settings["kv_cache_dtype"], settings["prefix_reuse"]))
        reused += stats["reused_tokens"]
        copied += stats["copied_tokens"]
    # The schedules cover more than one cache setting, and reuse cached prompts in place and by copy.
    assert len(seen) >= 2 and reused > 0 and copied > 0
