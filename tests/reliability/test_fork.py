"""A process forked after cpuformer ran (os.fork, multiprocessing's "fork" start method, gunicorn
--preload) computes in the child with its own threads, and gets the parent's results.

Each scenario runs in a subprocess (the "parent" below) that loads models, uses them or not, and
forks; every forked child has a deadline after which the parent kills it and reports a hang, so a
hang fails the test instead of stalling the suite. Mechanism: docs/reliability.md, "fork() and files
changing after load".
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PARENT = textwrap.dedent(r"""
    import json, os, select, signal, sys, time
    if sys.argv[1] == "loaded":
        import torch  # before cpuformer: see the scenario
    import numpy as np
    import cpuformer as cf

    scenario, decoder_path, encoder_path = sys.argv[1], sys.argv[2], sys.argv[3]
    DEADLINE = 30.0  # the work of one child takes about a second
    PROMPT = [5, 6, 7, 8]

    def in_fork(work):
        # Runs work() in a forked child; returns its JSON-able result, or {"hang": ...} if the child
        # does not finish within the deadline, or {"error": ...} if it raised or died.
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)  # its own group: a hung child is killed with whatever it forked
            os.close(read_end)
            try:
                payload = json.dumps({"result": work()})
            except BaseException as error:
                payload = json.dumps({"error": f"{type(error).__name__}: {error}"})
            os.write(write_end, payload.encode())
            os._exit(0)
        os.close(write_end)
        chunks, start = [], time.monotonic()
        while True:
            left = DEADLINE - (time.monotonic() - start)
            if left <= 0:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"hang": f"the forked child did not finish within {DEADLINE:.0f} s"}
            ready, _, _ = select.select([read_end], [], [], left)
            if ready:
                chunk = os.read(read_end, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        if not chunks:
            return {"error": f"the forked child died (wait status {status})"}
        return json.loads(b"".join(chunks))

    def decoder_results(model):
        return dict(greedy=model.generate([PROMPT], max_new_tokens=6),
                    sampled=model.generate([PROMPT], max_new_tokens=6, do_sample=True, top_k=20, seed=3),
                    stream=list(model.stream(PROMPT, max_new_tokens=6)),
                    logits=model.logits([PROMPT * 8]).round(4).tolist())  # 32 tokens: a 2-thread GEMM

    def encoder_results(model):
        return model([list(range(2, 42))]).round(4).tolist()

    def ops_results():
        rng = np.random.default_rng(0)
        x = rng.standard_normal((96, 200)).astype(np.float32)
        w = rng.standard_normal((150, 200)).astype(np.float32)
        q = rng.standard_normal((2, 4, 40, 16)).astype(np.float32)
        return dict(linear=cf.ops.linear(x, w).round(3).tolist(),
                    attention=cf.ops.attention(q, q, q, causal=True).round(4).tolist(),
                    layer_norm=cf.ops.layer_norm(x, np.ones(200, np.float32), np.zeros(200, np.float32), 1e-5)
                    .round(4).tolist())

    def threads_now():
        return len(os.listdir("/proc/self/task"))

    report = {}
    if scenario == "loaded":
        # The models are loaded, never run. What left a pool behind is PyTorch (imported first, as a
        # script that builds or exports the model with transformers would): its libgomp pool of the
        # main thread. cpuformer links no OpenMP runtime, so the child computes on its own pool.
        import torch
        torch.set_num_threads(2)
        torch.ones(1 << 22).exp().sum()
        decoder = cf.Generator(decoder_path, num_threads=2)
        encoder = cf.Encoder(encoder_path, num_threads=2)
        report["child"] = in_fork(lambda: dict(decoder=decoder_results(decoder), encoder=encoder_results(encoder)))
        report["parent"] = dict(decoder=decoder_results(decoder), encoder=encoder_results(encoder))
    elif scenario == "ran":
        decoder = cf.Generator(decoder_path, num_threads=2, dtype="int8")
        report["parent"] = decoder_results(decoder)
        report["child"] = in_fork(lambda: decoder_results(decoder))
        report["parent_after"] = decoder_results(decoder)
    elif scenario == "pool":
        import multiprocessing
        decoder = cf.Generator(decoder_path, num_threads=2)
        report["parent"] = [decoder.generate([PROMPT[:n]], max_new_tokens=5) for n in range(1, 5)]

        def run(n):
            return decoder.generate([PROMPT[:n]], max_new_tokens=5)

        def pool():
            with multiprocessing.get_context("fork").Pool(2) as workers:
                return workers.map(run, range(1, 5))

        # The pool runs from a forked child so that the deadline covers it too.
        report["child"] = in_fork(pool)
    elif scenario == "ops":
        cf.set_num_threads(2)
        report["parent"] = ops_results()
        report["child"] = in_fork(ops_results)
    elif scenario == "threads":
        models = {n: cf.Generator(decoder_path, num_threads=n) for n in (1, 2)}
        for model in models.values():
            model.generate([PROMPT], max_new_tokens=2)

        def count():
            counts = [threads_now()]  # the child has only the thread that forked
            for n in (1, 2):
                models[n].logits([PROMPT * 8])
                counts.append(threads_now())
            return counts

        report["child"] = in_fork(count)
    elif scenario == "busy":
        # Another parent thread is inside a call holding every compute slot at fork time.
        capacity = cf._core._compute_slots()["capacity"]
        wide = cf.Generator(decoder_path, num_threads=capacity)
        narrow = cf.Generator(decoder_path, num_threads=1)
        report["parent"] = narrow.generate([PROMPT], max_new_tokens=6)
        tokens = wide.stream(PROMPT, max_new_tokens=1000, min_new_tokens=1000)
        next(tokens)
        report["slots_at_fork"] = cf._core._compute_slots()["in_use"]
        report["child"] = in_fork(lambda: narrow.generate([PROMPT], max_new_tokens=6))
        tokens.close()
    elif scenario == "stream":
        # A stream running in the parent at fork time: the child cannot continue it (its worker
        # thread is the parent's) and gets a clear error instead of waiting forever; a new stream
        # in the child works, and the parent's stream goes on.
        decoder = cf.Generator(decoder_path, num_threads=2)
        report["parent"] = decoder.generate([PROMPT], max_new_tokens=6)[0]
        running = decoder.stream(PROMPT, max_new_tokens=1000, min_new_tokens=1000)
        first = next(running)

        def child():
            try:
                next(running)
                error = None
            except RuntimeError as caught:
                error = str(caught)
            return dict(error=error, fresh=list(decoder.stream(PROMPT, max_new_tokens=6)))

        report["child"] = in_fork(child)
        report["parent_continues"] = [first, next(running)] == decoder.generate(
            [PROMPT], max_new_tokens=2, min_new_tokens=2)[0]
        running.close()
    print(json.dumps(report))
""")


def build_gpt2(directory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    # Wide enough that load and compute open parallel regions of 2 threads.
    config = transformers.GPT2Config(vocab_size=1000, n_positions=1100, n_embd=256, n_layer=2, n_head=4,
                                    bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(directory, safe_serialization=True)


def build_bert(directory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=512, max_position_embeddings=64)
    transformers.BertModel(config).eval().save_pretrained(directory, safe_serialization=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    decoder, encoder = tmp_path_factory.mktemp("fork_gpt2"), tmp_path_factory.mktemp("fork_bert")
    build_gpt2(decoder)
    build_bert(encoder)
    return str(decoder), str(encoder)


def run_parent(models, scenario):
    parent = subprocess.run([sys.executable, "-c", PARENT, scenario, *models], capture_output=True, text=True,
                            timeout=300)
    assert parent.returncode == 0, parent.stderr[-3000:]
    report = json.loads(parent.stdout.strip().splitlines()[-1])
    child = report["child"]
    assert "hang" not in child and "error" not in child, child
    return report, child["result"]


def test_fork_after_load_only(models):
    report, child = run_parent(models, "loaded")
    assert child == report["parent"]


def test_fork_after_the_model_ran(models):
    report, child = run_parent(models, "ran")
    assert child == report["parent"]
    assert report["parent_after"] == report["parent"], "the parent changed after the fork"


def test_fork_worker_pool(models):
    report, child = run_parent(models, "pool")
    assert child == report["parent"]


def test_ops_in_forked_child(models):
    report, child = run_parent(models, "ops")
    assert child == report["parent"]


def test_child_uses_its_own_threads(models):
    _, child = run_parent(models, "threads")
    # Only the forking thread exists in the child; num_threads=1 adds no thread, 2 one pool worker.
    assert child == [1, 1, 2]


def test_fork_while_another_thread_computes(models):
    report, child = run_parent(models, "busy")
    assert report["slots_at_fork"] > 0
    assert child == report["parent"]


def test_stream_running_at_fork(models):
    report, child = run_parent(models, "stream")
    assert child["error"] is not None and "started before os.fork()" in child["error"], child
    assert "start a new stream in the child" in child["error"]
    assert child["fresh"] == report["parent"]
    assert report["parent_continues"]
