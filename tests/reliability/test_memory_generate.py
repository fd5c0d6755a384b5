"""Resident memory of generation: 200 repeated generate calls (greedy, sampling, beam, stream) on a
Generator and on a Seq2Seq leave RSS flat after warm-up, and closing either model gives its memory
back. Measured in one fresh child process from /proc/self/statm (see test_memory.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

MB = 1 << 20
CALLS = 200
GROWTH_LIMIT = 5 * MB

CHILD = textwrap.dedent(r"""
    import gc, json, os, sys
    import numpy as np
    import cpuformer as cf

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE

    gpt2, t5, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(0)
    prompts = [[list(map(int, rng.integers(3, 400, size=n))) for n in sizes] for sizes in ([5], [3, 9], [1, 4, 7])]

    def step(model, i):
        p = prompts[i % len(prompts)]
        mode = i % 4
        if mode == 0:
            return model.generate(p, max_new_tokens=12)
        if mode == 1:
            return model.generate(p, max_new_tokens=12, do_sample=True, top_p=0.9, seed=i)
        if mode == 2:
            return model.generate(p, max_new_tokens=8, num_beams=4)
        if isinstance(model, cf.Generator):
            return list(model.stream(p[0], max_new_tokens=12))
        return model.logits(np.array([p[0]]), np.array([[0, 5, 6]]))

    # One untimed load / generate / close of each kind first: one-time process costs (thread pool
    # stacks, allocator arenas, lazily built tables) belong to neither model's baseline.
    for path, cls in ((gpt2, cf.Generator), (t5, cf.Seq2Seq)):
        with cls(path) as model:
            for i in range(8):
                step(model, i)
    out = {}
    for name, path, cls in (("decoder", gpt2, cf.Generator), ("seq2seq", t5, cf.Seq2Seq)):
        gc.collect()
        out[name + "_baseline"] = rss()
        model = cls(path)
        for i in range(40):  # warm-up
            step(model, i)
        gc.collect()
        out[name + "_warm"] = rss()
        for i in range(calls):
            step(model, i)
        gc.collect()
        out[name + "_after_calls"] = rss()
        model.close()
        del model
        gc.collect()
        out[name + "_released"] = rss()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def rss(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = tmp_path_factory.mktemp("mem_gpt2")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=512, n_positions=64, n_embd=384, n_layer=4, n_head=6, bos_token_id=1,
        eos_token_id=2)).eval().save_pretrained(gpt2, safe_serialization=True)
    t5 = tmp_path_factory.mktemp("mem_t5")
    transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=512, d_model=384, d_kv=64, d_ff=1024, num_layers=3, num_heads=6, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1)).eval().save_pretrained(t5, safe_serialization=True)
    child = subprocess.run([sys.executable, "-c", CHILD, str(gpt2), str(t5), str(CALLS)], capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_repeated_generate_keeps_memory_flat(rss, kind):
    growth = rss[kind + "_after_calls"] - rss[kind + "_warm"]
    assert growth < GROWTH_LIMIT, f"{kind}: RSS grew {growth / MB:.1f} MB over {CALLS} generate calls: {rss}"


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_closed_generator_releases_memory(rss, kind):
    held = rss[kind + "_warm"] - rss[kind + "_baseline"]
    assert held > 20 * MB, rss  # the model really was resident
    left = rss[kind + "_released"] - rss[kind + "_baseline"]
    assert left < 0.1 * held + 2 * MB, f"{kind}: {left / MB:.1f} MB of {held / MB:.1f} MB still resident: {rss}"
