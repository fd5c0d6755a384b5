"""Resident memory: repeated encoder calls leave it flat, and a deleted model gives it back.

Both measurements run in one fresh child process (a clean baseline, no pytest/hypothesis
garbage), reading RSS from /proc/self/statm:
- a small random BERT answers 2,000 mixed calls (__call__ with padding, return_pooler, embed)
  after a 200-call warm-up; RSS may grow by less than 5 MB (an output is up to [3, 16, 64]
  float32 = 12 KB, so leaking outputs, or 2.5 KB per call, would exceed it);
- a larger one (~28 MB of packed weights) is loaded, called, closed and deleted: RSS must fall
  back to within 10% of what the model held (plus 2 MB of allocator slack) of the baseline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .conftest import build_bert

MB = 1 << 20
CALLS = 2000
GROWTH_LIMIT = 5 * MB

CHILD = textwrap.dedent(r"""
    import gc, json, os, sys
    import numpy as np
    import cpuformer as cf

    PAGE = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE

    small, large, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(0)
    # Inputs made before any measurement, so only the models and the calls show up.
    variants = []
    for B, T in [(1, 1), (2, 8), (1, 16), (3, 5), (1, 3), (3, 16)]:
        ids = rng.integers(0, 500, size=(B, T))
        mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, size=(B, 1))).astype(np.int64)
        variants.append((ids, mask))
    sentences = [list(map(int, rng.integers(0, 500, size=n))) for n in (3, 16, 12, 1, 7)]

    def step(enc, i):
        if i % 10 == 9:
            return enc.embed(sentences, batch_size=2)
        if i % 10 == 4:
            return enc(variants[i % len(variants)][0], return_pooler=True)
        return enc(*variants[i % len(variants)])

    out = {}
    enc = cf.Encoder(small)
    for i in range(200):  # warm-up: workspaces, thread pool, allocator pools reach their size
        step(enc, i)
    gc.collect()
    out["warm"] = rss()
    for i in range(calls):
        step(enc, i)
    gc.collect()
    out["after_calls"] = rss()
    enc.close()
    del enc
    gc.collect()

    out["baseline"] = rss()
    enc = cf.Encoder(large)
    for i in range(10):
        step(enc, i)
    gc.collect()
    out["loaded"] = rss()
    enc.close()
    del enc
    gc.collect()
    out["released"] = rss()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def rss(tmp_path_factory):
    small = tmp_path_factory.mktemp("small_bert")
    build_bert(small, seed=5, vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, max_position_embeddings=16)
    large = tmp_path_factory.mktemp("large_bert")
    build_bert(large, seed=6, vocab_size=500, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
               intermediate_size=1536, max_position_embeddings=16)
    child = subprocess.run([sys.executable, "-c", CHILD, str(small), str(large), str(CALLS)], capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_repeated_calls_keep_memory_flat(rss):
    growth = rss["after_calls"] - rss["warm"]
    assert growth < GROWTH_LIMIT, f"RSS grew {growth / MB:.1f} MB over {CALLS} calls after warm-up: {rss}"


def test_deleted_model_releases_memory(rss):
    held = rss["loaded"] - rss["baseline"]
    assert held > 25 * MB, rss  # the model really was resident (the measurement can see it)
    left = rss["released"] - rss["baseline"]
    assert left < 0.1 * held + 2 * MB, f"{left / MB:.1f} MB of {held / MB:.1f} MB still resident after close: {rss}"
