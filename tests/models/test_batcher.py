"""Continuous batching (Generator.batcher(), csrc/models/batch_decoder.h): requests submitted at
different steps share every forward pass, and each gets exactly the tokens generate() gives it
alone — greedy, sampling with a seed, the logits processors, every decoder family (learned
positions, RoPE, GQA, a sliding window, q/k norms), int8 weights and reduced-precision KV caches,
with chunked prefill and prefix reuse."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from models.test_decoder import SMALL, _build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    out = {}
    for i, name in enumerate(FAMILIES):
        model_class, config_class, config = SMALL[name]
        directory = tmp_path_factory.mktemp(name)
        _build(directory, model_class, config_class, seed=40 + i, **config)
        out[name] = str(directory)
    return out


@pytest.fixture(scope="module")
def gens(dirs):
    return {name: cf.Generator(d) for name, d in dirs.items()}


def _prompts(vocab, count, seed, longest=40, shared=()):
    rng = np.random.default_rng(seed)
    return [list(shared) + [int(t) for t in rng.integers(3, vocab, int(n))]
            for n in rng.integers(1, longest, count)]


def _staggered(batcher, prompts, options, arrivals):
    """Submits prompt i after arrivals[i] steps (while others run); the tokens of each, in order."""
    tokens = {}
    ids = {}
    step = 0
    pending = list(range(len(prompts)))
    while pending or batcher.running or batcher.waiting:
        for i in [i for i in pending if arrivals[i] <= step]:
            ids[batcher.submit(prompts[i], **options[i])] = i
            tokens[i] = []
            pending.remove(i)
        for event in batcher.step():
            tokens[ids[event.request]].append(event.token)
        step += 1
        assert step < 10_000
    return [tokens[i] for i in range(len(prompts))]


@pytest.mark.parametrize("name", FAMILIES)
def test_staggered_requests_equal_each_alone(gens, name):
    gen = gens[name]
    prompts = _prompts(gen.vocab_size, 10, seed=1)
    rng = np.random.default_rng(2)
    options = [dict(max_new_tokens=int(rng.integers(1, 30)), eos_token_id=[]) for _ in prompts]
    options[3].update(do_sample=True, seed=7, temperature=0.9, top_k=20, top_p=0.9)
    options[4].update(repetition_penalty=1.4, no_repeat_ngram_size=2)
    options[5].update(min_new_tokens=3, eos_token_id=[5, 6])
    options[6].update(do_sample=True, seed=11)
    arrivals = [int(a) for a in rng.integers(0, 25, len(prompts))]
    batcher = gen.batcher(capacity=3, prefill_chunk=5)
    got = _staggered(batcher, prompts, options, arrivals)
    for i, (p, o) in enumerate(zip(prompts, options)):
        assert got[i] == gen.generate(p, **o)[0], (i, o)
    stats = batcher.stats()
    assert stats["prefill_tokens"] + stats["reused_tokens"] == sum(len(p) for p in prompts)
    assert stats["decode_tokens"] == sum(len(t) for t in got) - len(got)
    assert batcher.running == batcher.waiting == 0


def test_log_probs_and_finish_reasons(gens):
    gen = gens["llama"]
    prompts = _prompts(gen.vocab_size, 4, seed=3)
    batcher = gen.batcher(capacity=4)
    requests = [batcher.submit(p, max_new_tokens=12, eos_token_id=[7, 9], return_log_probs=True) for p in prompts]
    events = {r: [] for r in requests}
    while batcher.running or batcher.waiting:
        for e in batcher.step():
            events[e.request].append(e)
    for r, p in zip(requests, prompts):
        (tokens,), (log_probs,) = gen.generate(p, max_new_tokens=12, eos_token_id=[7, 9], return_log_probs=True)
        assert [e.token for e in events[r]] == tokens
        np.testing.assert_allclose([e.log_prob for e in events[r]], log_probs, rtol=1e-4, atol=1e-4)
        assert all(e.finish_reason is None for e in events[r][:-1])
        assert events[r][-1].finish_reason == ("eos" if tokens[-1] in (7, 9) else "length")
    plain = batcher.submit(prompts[0], max_new_tokens=2)
    assert all(e.log_prob is None for e in batcher.step() + batcher.step() if e.request == plain)


@pytest.mark.parametrize("dtype,kv", [("int8", None), ("float32", "int8"), ("float32", "float16")])
def test_quantized_weights_and_kv_caches(dirs, dtype, kv):
    gen = cf.Generator(dirs["llama"], dtype=dtype)
    prompts = _prompts(gen.vocab_size, 6, seed=4)
    got = gen.batcher(capacity=4, prefill_chunk=8, kv_cache_dtype=kv).run(prompts, max_new_tokens=15,
                                                                          eos_token_id=[])
    for p, t in zip(prompts, got):
        assert t == gen.generate(p, max_new_tokens=15, eos_token_id=[], kv_cache_dtype=kv)[0]


@pytest.mark.parametrize("kv", [None, "int8", "bfloat16"])
def test_shared_prefix_is_reused_not_recomputed(gens, kv):
    gen = gens["qwen2"]
    system = [int(t) for t in np.random.default_rng(6).integers(3, gen.vocab_size, 60)]
    prompts = _prompts(gen.vocab_size, 5, seed=7, longest=6, shared=system)
    batcher = gen.batcher(capacity=3, prefill_chunk=16, kv_cache_dtype=kv)
    # Concurrent: the later requests wait for the first one's prefix, then copy it.
    got = batcher.run(prompts[:3], max_new_tokens=8)
    stats = batcher.stats()
    assert stats["copied_tokens"] >= 2 * len(system)
    assert stats["prefill_tokens"] == sum(len(p) for p in prompts[:3]) - stats["reused_tokens"]
    # Later: a finished request's slot still holds the prefix.
    got += batcher.run(prompts[3:], max_new_tokens=8)
    assert batcher.stats()["reused_tokens"] >= 4 * len(system)
    for p, t in zip(prompts, got):
        assert t == gen.generate(p, max_new_tokens=8, kv_cache_dtype=kv)[0]
    # Without reuse, every prompt token is computed, with the same tokens out.
    plain = gen.batcher(capacity=3, prefill_chunk=16, prefix_reuse=False, kv_cache_dtype=kv)
    assert plain.run(prompts, max_new_tokens=8) == got
    assert plain.stats()["reused_tokens"] == 0
    assert plain.stats()["prefill_tokens"] == sum(len(p) for p in prompts)


def test_a_prompt_identical_to_a_cached_one_recomputes_its_last_token(gens):
    gen = gens["gpt2"]
    prompt = _prompts(gen.vocab_size, 1, seed=8, longest=30)[0] + [4, 5]
    batcher = gen.batcher(capacity=1)
    first = batcher.run([prompt], max_new_tokens=6)
    second = batcher.run([prompt], max_new_tokens=6)
    assert first == second == [gen.generate(prompt, max_new_tokens=6)[0]]
    assert batcher.stats()["reused_tokens"] == len(prompt) - 1


def test_cancel_frees_the_slot_and_waiting_requests_run(gens):
    gen = gens["llama"]
    prompts = _prompts(gen.vocab_size, 3, seed=9)
    batcher = gen.batcher(capacity=1)
    a = batcher.submit(prompts[0], max_new_tokens=50, eos_token_id=[])
    b = batcher.submit(prompts[1], max_new_tokens=5, eos_token_id=[])
    c = batcher.submit(prompts[2], max_new_tokens=5, eos_token_id=[])
    batcher.step()
    assert (batcher.running, batcher.waiting) == (1, 2)
    assert batcher.cancel(c) and not batcher.cancel(c)
    assert batcher.cancel(a)
    assert (batcher.running, batcher.waiting) == (0, 1)
    tokens = []
    while batcher.running or batcher.waiting:
        tokens += [e.token for e in batcher.step() if e.request == b]
    assert tokens == gen.generate(prompts[1], max_new_tokens=5, eos_token_id=[])[0]
    assert batcher.step() == []
    assert not batcher.cancel(12345)


def test_threads_submit_while_another_steps(gens):
    import threading

    gen = gens["llama"]
    prompts = _prompts(gen.vocab_size, 24, seed=12)
    batcher = gen.batcher(capacity=4, prefill_chunk=6)
    ids = {}
    lock = threading.Lock()

    def submitter(part):
        for i in part:
            with lock:  # (the id is recorded before the main thread can see its tokens)
                ids[batcher.submit(prompts[i], max_new_tokens=5 + i % 7, eos_token_id=[])] = i

    threads = [threading.Thread(target=submitter, args=(range(k, 24, 3),)) for k in range(3)]
    for t in threads:
        t.start()
    tokens = {i: [] for i in range(24)}
    ended = 0
    while ended < 24:
        for event in batcher.step():
            with lock:
                i = ids[event.request]
            tokens[i].append(event.token)
            ended += event.finish_reason is not None
    for t in threads:
        t.join()
    assert len(ids) == 24
    for i, p in enumerate(prompts):
        assert tokens[i] == gen.generate(p, max_new_tokens=5 + i % 7, eos_token_id=[])[0]


def test_strings_in(gens, tmp_path):
    from cpuformer import _bench

    directory = _bench.build_model("decoder", dict(name="tiny-gpt2", vocab_size=300, n_embd=32, n_layer=2,
                                                   n_head=4, n_positions=64), str(tmp_path / "tiny"))
    gen = cf.load(directory)
    batcher = gen.batcher(capacity=2)
    assert batcher.run(["hello there", "the cat"], max_new_tokens=4) == \
        [gen.generate(gen.tokenizer.encode("hello there"), max_new_tokens=4)[0],
         gen.generate(gen.tokenizer.encode("the cat"), max_new_tokens=4)[0]]


def _run_to_the_end(batcher, tokens):
    """Steps until nothing runs, appending each request's tokens to tokens[request]; (the step's
    prompt-token budget, prompt tokens computed) of each step that computed some."""
    trace = []
    while batcher.running:
        before = batcher.stats()["prefill_tokens"]
        for event in batcher.step():
            tokens[event.request].append(event.token)
        stats = batcher.stats()
        if stats["prefill_tokens"] > before:
            trace.append((stats["prefill_budget"], stats["prefill_tokens"] - before))
    return trace


def test_prefill_slowdown_shrinks_the_prompt_tokens_of_busy_steps(gens):
    # prefill_slowdown=1: once the batcher has timed a decode-only step and a step with prompt
    # tokens, steps with sequences decoding take the floor of 4 prompt tokens (a step may then last
    # about one decode-only step of the two requests present, one more token than the decoding one
    # alone); before that, and when nothing decodes, up to prefill_chunk.
    # prefill_slowdown=0 keeps prefill_chunk. Tokens stay those of generate() alone either way.
    gen = gens["gpt2"]  # max_positions 96
    rng = np.random.default_rng(5)
    for slowdown in (1, 0):
        batcher = gen.batcher(capacity=2, prefill_chunk=40, prefill_slowdown=slowdown)
        budgets, chunks = set(), []
        for _ in range(10):
            short = [int(t) for t in rng.integers(3, gen.vocab_size, 4)]
            long = [int(t) for t in rng.integers(3, gen.vocab_size, 70)]
            tokens = {batcher.submit(short, max_new_tokens=20, eos_token_id=[]): []}
            for _ in range(5):  # the short request decodes alone: decode-only steps
                for event in batcher.step():
                    tokens[event.request].append(event.token)
            tokens[batcher.submit(long, max_new_tokens=3, eos_token_id=[])] = []
            for budget, chunk in _run_to_the_end(batcher, tokens):
                budgets.add(budget)
                chunks.append(chunk)
            got = list(tokens.values())
            assert got[0] == gen.generate(short, max_new_tokens=20, eos_token_id=[])[0]
            assert got[1] == gen.generate(long, max_new_tokens=3, eos_token_id=[])[0]
        if slowdown == 0:
            assert budgets == {40} and max(chunks) == 40
        else:
            assert budgets <= {4, 40} and 4 in budgets, budgets
            assert 4 in chunks and max(chunks) <= 40
    for bad in (0.5, -1, float("inf"), float("nan"), True, "2"):
        with pytest.raises(ValueError, match=r"prefill_slowdown must be 0 \(off\) or a finite number >= 1"):
            gen.batcher(prefill_slowdown=bad)


def test_prefill_budget_grows_with_the_requests_not_yet_decoding(gens):
    # The budget is (s - 1) × decode step ÷ prompt-token cost + s × (requests present, up to the
    # capacity, that are not decoding): with s = 1, one sequence decoding and six prompts queued
    # behind it, a step takes 6 prompt tokens, then 5 once the first prompt decodes, and so on
    # down to the floor of 4 (prefill_chunk until both costs have been timed, which one-token
    # requests next to the decoding one do first). Tokens stay those of generate() alone.
    gen = gens["gpt2"]  # max_positions 96
    rng = np.random.default_rng(7)
    batcher = gen.batcher(capacity=8, prefill_chunk=40, prefill_slowdown=1)
    short = [int(t) for t in rng.integers(3, gen.vocab_size, 4)]
    warm = [int(t) for t in rng.integers(3, gen.vocab_size, 3)]
    prompts = [[int(t) for t in rng.integers(3, gen.vocab_size, 30)] for _ in range(6)]
    tokens = {batcher.submit(short, max_new_tokens=90, eos_token_id=[]): []}
    for _ in range(5):  # the short request decodes alone: decode-only steps
        for event in batcher.step():
            tokens[event.request].append(event.token)
    for _ in range(15):  # a one-token request next to it: a step with prompt tokens, timed
        batcher.submit(warm, max_new_tokens=1, eos_token_id=[])
        for _ in range(2):
            for event in batcher.step():
                tokens.setdefault(event.request, []).append(event.token)
        if batcher.stats()["prefill_budget"] != 40:
            break
    tokens = {request: out for request, out in tokens.items() if len(out) > 1}  # the short one
    for p in prompts:
        tokens[batcher.submit(p, max_new_tokens=3, eos_token_id=[])] = []
    trace = _run_to_the_end(batcher, tokens)
    got = list(tokens.values())
    assert got[0] == gen.generate(short, max_new_tokens=90, eos_token_id=[])[0]
    for p, out in zip(prompts, got[1:]):
        assert out == gen.generate(p, max_new_tokens=3, eos_token_id=[])[0]
    budgets = [b for b, _ in trace]
    assert set(budgets) <= {4, 5, 6, 40} and 6 in budgets, trace
    assert all(chunk <= budget for budget, chunk in trace), trace
    timed = [b for b in budgets if b != 40]
    assert timed == sorted(timed, reverse=True), trace  # fewer prompts waiting: fewer tokens


def _reference_log_probs(directory, ids):
    """log_softmax of transformers' logits for one sequence [T, V] (float64)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def _check_token_log_prob(got, token, reference, n):
    # got: a TokenLogProb for `token` under reference [V]; its n alternatives are the n most likely
    # (compared by value: near-equal logits may order differently between two computations).
    assert got.token == token
    assert abs(got.log_prob - reference[token]) < 1e-4, (got.log_prob, reference[token])
    assert len(got.top) == n
    values = [lp for _, lp in got.top]
    assert values == sorted(values, reverse=True)
    for t, lp in got.top:
        assert abs(lp - reference[t]) < 1e-4
    np.testing.assert_allclose(values, np.sort(reference)[::-1][:n], atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_logprobs_are_the_models_raw_distribution(gens, dirs, name):
    # logprobs=n: each chosen token's log-probability under log_softmax of the raw logits, and the
    # n most likely tokens, against transformers on prompt + output; whatever processors chose
    # the token (repetition penalty, temperature, top-k) — and the tokens stay generate()'s.
    # prompt_logprobs=n: every prompt token after the first, on the first event, also when the
    # prompt's prefix is cached in a slot (it is then computed anyway) and when the prompt takes
    # several chunks next to decoding sequences.
    gen = gens[name]
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(3, gen.vocab_size, n)] for n in (20, 5, 37)]
    prompts.append(prompts[0][:12] + [int(t) for t in rng.integers(3, gen.vocab_size, 6)])  # a cached prefix
    options = [dict(max_new_tokens=6, logprobs=5, prompt_logprobs=3),
               dict(max_new_tokens=5, do_sample=True, temperature=0.7, top_k=40, repetition_penalty=1.3, seed=3,
                    logprobs=0),
               dict(max_new_tokens=4, prompt_logprobs=1),
               dict(max_new_tokens=3, logprobs=2, prompt_logprobs=2)]
    batcher = gen.batcher(capacity=2, prefill_chunk=8)
    events = {}
    ids = {}
    for i, (prompt, option) in enumerate(zip(prompts, options)):
        ids[batcher.submit(prompt, eos_token_id=[], **option)] = i
        events[i] = []
        if i in (1, 2):  # later arrivals join running sequences
            for event in batcher.step():
                events[ids[event.request]].append(event)
    while batcher.running or batcher.waiting:
        for event in batcher.step():
            events[ids[event.request]].append(event)
    for i, (prompt, option) in enumerate(zip(prompts, options)):
        got = events[i]
        tokens = [e.token for e in got]
        plain = {k: v for k, v in option.items() if "logprobs" not in k}
        assert tokens == gen.generate(prompt, eos_token_id=[], **plain)[0]
        reference = _reference_log_probs(dirs[name], prompt + tokens)
        n = option.get("logprobs")
        for k, event in enumerate(got):
            if n is None:
                assert event.logprobs is None
            else:
                _check_token_log_prob(event.logprobs, event.token, reference[len(prompt) - 1 + k], n)
        n = option.get("prompt_logprobs")
        if n is None:
            assert all(e.prompt_logprobs is None for e in got)
            continue
        assert all(e.prompt_logprobs is None for e in got[1:])
        scored = got[0].prompt_logprobs
        assert len(scored) == len(prompt) - 1
        for position, entry in enumerate(scored, start=1):
            _check_token_log_prob(entry, prompt[position], reference[position - 1], n)


def test_logprobs_bad_input(gens):
    batcher = gens["gpt2"].batcher(capacity=1)
    for name in ("logprobs", "prompt_logprobs"):
        for bad in (-1, 21, True, 1.0, "2"):
            with pytest.raises(ValueError, match=rf"{name} must be an integer >= 0(?: and <= 20)? or None, got "):
                batcher.submit([5, 6], **{name: bad})
    assert batcher.waiting == 0


def test_bad_input(gens, dirs):
    gen = gens["gpt2"]  # max_positions 96
    with pytest.raises(ValueError, match="capacity must be"):
        gen.batcher(capacity=0)
    with pytest.raises(ValueError, match=r"max_length must be at most the model's max_positions \(96\)"):
        gen.batcher(max_length=97)
    with pytest.raises(ValueError, match="prefill_chunk must be"):
        gen.batcher(prefill_chunk=0)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        gen.batcher(kv_cache_dtype="int4")
    batcher = gen.batcher(capacity=2, max_length=32)
    assert batcher.max_length == 32 and batcher.capacity == 2
    # GPT-2 here: 2 layers, 48 wide; keys and values of 2 slots × 32 positions, float32
    assert batcher.kv_cache_bytes == 2 * 2 * 2 * 32 * 48 * 4
    # int8: one byte per element and a float32 scale per row and head (3 heads)
    assert gen.batcher(capacity=2, max_length=32, kv_cache_dtype="int8").kv_cache_bytes == \
        2 * 2 * 2 * 32 * (48 + 3 * 4)
    with pytest.raises(ValueError, match=r"prompt length 30 \+ max_new_tokens 3 exceeds the batcher's max_length "
                                         r"of 32 tokens"):
        batcher.submit([3] * 30, max_new_tokens=3)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        batcher.submit([3], max_new_tokens=0)
    with pytest.raises(ValueError, match="out of range"):
        batcher.submit([3, 1000])
    with pytest.raises(ValueError, match="empty"):
        batcher.submit([])
    with pytest.raises(ValueError, match="one prompt"):
        batcher.submit([[3], [4]])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        batcher.submit([3], do_sample=True, temperature=0)
    assert batcher.running == batcher.waiting == 0  # nothing was queued by a refused request
    closed = cf.Generator(dirs["gpt2"])
    live = closed.batcher(capacity=1)
    live.submit([3, 4], max_new_tokens=2)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        live.step()
    with pytest.raises(ValueError, match="closed"):
        closed.batcher()


def test_long_contexts_side_by_side_equal_each_alone(tmp_path):
    """Decode entries of a step run their attention side by side, one thread each, with the key
    splits each has alone (a GQA head over 1,300+ cached keys is split by thread count): the
    tokens are generate()'s. (Log-probabilities agree to rounding: a step's projections multiply
    several rows at once, generate()'s one.)"""
    model_class, config_class, config = SMALL["llama"]
    _build(tmp_path, model_class, config_class, seed=5,
           **dict(config, num_key_value_heads=1, max_position_embeddings=1600))
    gen = cf.Generator(tmp_path, num_threads=2)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(3, gen.vocab_size, n)] for n in (1350, 1420, 1500)]
    batcher = gen.batcher(capacity=3, max_length=1560, prefill_chunk=2048)
    requests = [batcher.submit(p, max_new_tokens=6, eos_token_id=[], return_log_probs=True) for p in prompts]
    events = {r: [] for r in requests}
    while batcher.running or batcher.waiting:
        for event in batcher.step():
            events[event.request].append(event)
    for r, p in zip(requests, prompts):
        (tokens,), (log_probs,) = gen.generate(p, max_new_tokens=6, eos_token_id=[], return_log_probs=True)
        assert [e.token for e in events[r]] == tokens
        np.testing.assert_allclose([e.log_prob for e in events[r]], log_probs, rtol=1e-5, atol=1e-5)
