"""Several Python threads sharing one loaded model (and one ops.Linear).

Compute releases the GIL, so the threads really overlap. Required: every call's result is
bitwise the result of the same call made alone, no call deadlocks (each run has a timeout), and
the process never runs more compute threads than it has cores — a call holds
``num_threads`` slots of the process-wide bound (``_core._compute_slots()``; see
docs/reliability.md, "Concurrency"), so the peak stays at max(capacity, num_threads).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core

THREADS = 8
CALLS_PER_THREAD = 50
TIMEOUT = 300.0  # seconds for the whole threaded run; only reached on a deadlock


def encoder_plan(seed, vocab, max_len):
    """CALLS_PER_THREAD mixed calls: __call__ with and without padding, return_pooler, embed."""
    rng = np.random.default_rng(seed)
    plan = []
    for i in range(CALLS_PER_THREAD):
        B = int(rng.integers(1, 5))
        T = int(rng.integers(1, max_len + 1))
        ids = rng.integers(0, vocab, size=(B, T))
        kind = ["call", "masked", "pooler", "embed"][i % 4]
        if kind == "embed":
            plan.append(("embed", [list(map(int, ids[b, :rng.integers(1, T + 1)])) for b in range(B)]))
        elif kind == "masked":
            lengths = rng.integers(1, T + 1, size=B)
            plan.append(("masked", ids, (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)))
        else:
            plan.append((kind, ids))
    return plan


def run_encoder_call(enc, step):
    kind = step[0]
    if kind == "embed":
        return enc.embed(step[1], batch_size=3)
    if kind == "masked":
        return enc(step[1], step[2])
    if kind == "pooler":
        return np.concatenate([a.reshape(-1) for a in enc(step[1], return_pooler=True)])
    return enc(step[1])


def run_threads(work, plans):
    """Runs work(plan) for each plan on its own thread, all released together; returns the results."""
    results = [None] * len(plans)
    errors = []
    start = threading.Barrier(len(plans))

    def target(i):
        try:
            start.wait()
            results[i] = work(plans[i])
        except BaseException as error:  # reported below, with the thread's index
            errors.append((i, error))

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"threads {stuck} did not finish within {TIMEOUT} s (deadlock?)"
    assert not errors, f"thread errors: {errors}"
    return results


def assert_bitwise(got, want, where):
    assert got.dtype == want.dtype and got.shape == want.shape, where
    assert got.tobytes() == want.tobytes(), f"{where}: differs from the sequential result"


@pytest.mark.parametrize("num_threads", [1, 2])
def test_threads_share_an_encoder(tiny_bert, num_threads):
    # Teams of 2 from 8 Python threads on a 2-core machine: cpuformer's waiting threads yield their
    # CPU (runtime/thread_pool.h), so oversubscription costs time slices, not spins (libgomp's
    # default spin-waiting took 6-50 s for these calls, against 0.2 s passive).
    directory, _, config = tiny_bert
    enc = cf.Encoder(directory, num_threads=num_threads)
    plans = [encoder_plan(100 + t, config.vocab_size, enc.max_seq_len) for t in range(THREADS)]
    sequential = [[run_encoder_call(enc, step) for step in plan] for plan in plans]

    _core._reset_compute_slots_peak()
    threaded = run_threads(lambda plan: [run_encoder_call(enc, step) for step in plan], plans)
    slots = _core._compute_slots()

    for t in range(THREADS):
        for i in range(CALLS_PER_THREAD):
            assert_bitwise(threaded[t][i], sequential[t][i], f"thread {t} call {i} ({plans[t][i][0]})")
    assert slots["in_use"] == 0
    assert 1 <= slots["peak"] <= max(slots["capacity"], num_threads), slots
    enc.close()


def test_results_do_not_depend_on_the_thread_count(tiny_bert):
    """GEMM, attention and norms split work by rows/heads, never inside a dot product, so the
    same call gives the same bits with 1 or 2 threads (and so with any contention)."""
    directory, _, config = tiny_bert
    one, two = cf.Encoder(directory, num_threads=1), cf.Encoder(directory, num_threads=2)
    for step in encoder_plan(7, config.vocab_size, one.max_seq_len):
        assert_bitwise(run_encoder_call(two, step), run_encoder_call(one, step), step[0])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 65)).astype(np.float32)
    w = rng.standard_normal((127, 65)).astype(np.float32)
    q = rng.standard_normal((2, 4, 17, 16)).astype(np.float32)
    kv = rng.standard_normal((2, 2, 33, 16)).astype(np.float32)
    outputs = []
    for n in (1, 2):
        cf.set_num_threads(n)
        try:
            outputs.append((cf.ops.linear(x, w, activation="gelu"), cf.ops.attention(q, kv, kv, causal=True),
                            cf.ops.layer_norm(x, np.ones(65, np.float32)), cf.ops.softmax(x)))
        finally:
            cf.set_num_threads(0)
    for a, b in zip(*outputs):
        assert_bitwise(b, a, "ops with 2 threads vs 1")
    one.close()
    two.close()


def test_threads_share_ops(rng):
    """One packed ops.Linear and the functional ops, called from 8 threads at once."""
    w = rng.standard_normal((65, 33)).astype(np.float32)
    layer = cf.ops.Linear(w, rng.standard_normal(65).astype(np.float32), activation="silu")
    inputs = [[rng.standard_normal((int(rng.integers(1, 40)), 33)).astype(np.float32) for _ in range(CALLS_PER_THREAD)]
              for _ in range(THREADS)]

    def work(xs):
        out = []
        for x in xs:
            y = layer(x)
            q = y[None, None, :, :32].copy()
            out.append((y, cf.ops.softmax(y), cf.ops.layer_norm(y, np.ones(65, np.float32)),
                        cf.ops.attention(q, q, q, causal=True), cf.ops.silu_mul(y, y), cf.ops.gelu(y)))
        return out

    sequential = [work(xs) for xs in inputs]
    _core._reset_compute_slots_peak()
    threaded = run_threads(work, inputs)
    slots = _core._compute_slots()
    for t in range(THREADS):
        for i in range(CALLS_PER_THREAD):
            for a, b in zip(threaded[t][i], sequential[t][i]):
                assert_bitwise(a, b, f"thread {t} call {i}")
    assert slots["in_use"] == 0
    assert 1 <= slots["peak"] <= max(slots["capacity"], cf.get_num_threads()), slots


def test_compute_slots_report():
    slots = _core._compute_slots()
    assert slots["capacity"] >= 1 and slots["in_use"] == 0
    assert slots["capacity"] == len(os.sched_getaffinity(0))
