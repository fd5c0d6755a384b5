"""A stream() that is still generating when it is abandoned, closed or outlived by the interpreter.

stream() generates on a worker thread that calls into Python once per token. Each case runs in a
child process (a failure must not kill pytest) with a generation far longer than the timeout, and
checks that the process ends by itself, without SIGABRT ("terminate called without an active
exception": the worker killed inside native code at interpreter exit) and without a leftover
thread. Mechanism: docs/reliability.md, "Streams and sampling limits".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

# Far more tokens than a child has time for (minutes of decoding): a child that waits for the
# generation to end instead of stopping it hits the timeout.
LONG = 30000
TIMEOUT = 120


def build_gpt2(directory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=200, n_positions=LONG + 16, n_embd=128, n_layer=4, n_head=4,
                                    bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(directory, safe_serialization=True)
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(200)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.save(os.path.join(directory, "tokenizer.json"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("stream_gpt2")
    build_gpt2(str(directory))
    return str(directory)


def run_child(args, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=env, **kwargs)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the child did not exit within {TIMEOUT} s (it waited for the generation or hung): "
                    f"{error.stderr}")


def assert_no_abort(result):
    assert result.returncode != -signal.SIGABRT, f"SIGABRT at exit; stderr: {result.stderr[-2000:]}"
    assert "terminate called" not in result.stderr, result.stderr[-2000:]
    assert result.returncode >= 0, f"killed by signal {-result.returncode}; stderr: {result.stderr[-2000:]}"


PRELUDE = textwrap.dedent("""
    import gc, sys, threading
    import cpuformer as cf
    gen = cf.Generator(sys.argv[1])
    LONG = dict(max_new_tokens=int(sys.argv[2]), eos_token_id=[])
""")

# Each ends with the interpreter exiting while (unless the case stops it) the worker generates.
CASES = {
    # next() once, then exit with the stream alive in a global.
    "half_consumed": """
        stream = gen.stream([5, 6, 7], **LONG)
        next(stream)
        print("ok")
    """,
    "half_consumed_text": """
        stream = gen.stream("t5 t6 t7", **LONG)
        next(stream)
        print("ok")
    """,
    # An exception escapes a for loop over a stream held in a global: the traceback and the global
    # keep the iterator alive into interpreter shutdown.
    "exception_in_loop_global": """
        stream = gen.stream([5, 6, 7], **LONG)
        print("ok")
        for token in stream:
            raise RuntimeError("raised inside the loop")
    """,
    "exception_in_loop": """
        print("ok")
        for piece in gen.stream("t5 t6", **LONG):
            raise RuntimeError("raised inside the loop")
    """,
    # The consumer is a daemon thread, still iterating when the main thread exits.
    "daemon_consumer": """
        started = threading.Event()
        def consume():
            for token in gen.stream([5, 6, 7], **LONG):
                started.set()
        threading.Thread(target=consume, daemon=True).start()
        started.wait()
        print("ok")
    """,
    # A stream started by an exit hook that runs after cpuformer's own (atexit runs the hook
    # registered last first) and left in a global: its worker is still in native code when
    # finalization begins, and the iterator is collected during finalization.
    "stream_started_at_exit": """
        import atexit
        import cpuformer.models.generator
        def start_late():
            global late
            late = gen.stream([5, 6, 7], **LONG)
            next(late)
        atexit.unregister(cpuformer.models.generator._stop_live_streams)
        atexit.register(start_late)
        atexit.register(cpuformer.models.generator._stop_live_streams)
        print("ok")
    """,
    # Daemon threads in a loop of other native calls (logits, ops) while the main thread exits: a
    # call that ends after finalization began must not retake the GIL (every binding releases it
    # through bindings/gil.h). Before, 7 of 8 runs of this case aborted.
    "daemon_native_calls": """
        import numpy as np
        ids = [[5, 6, 7] * 30]
        x = np.ones((64, 512), np.float32)
        w = np.ones((64, 512), np.float32)
        calls = [lambda: gen.logits(ids), lambda: cf.ops.linear(x, w), lambda: cf.ops.softmax(x),
                 lambda: cf.ops.layer_norm(x, x[0], x[0], 1e-5)]
        started = threading.Barrier(len(calls) + 1)
        def loop(call):
            started.wait()
            while True:
                call()
        for call in calls:
            threading.Thread(target=loop, args=(call,), daemon=True).start()
        started.wait()
        print("ok")
    """,
    # close() and garbage collection stop and join the worker before returning.
    "close_and_collect": """
        stream = gen.stream([5, 6, 7], **LONG)
        next(stream)
        stream.close()
        assert threading.active_count() == 1, threading.enumerate()
        stream = gen.stream("t5 t6", **LONG)
        next(stream)
        del stream
        gc.collect()
        assert threading.active_count() == 1, threading.enumerate()
        tokens = gen.generate([5, 6, 7], max_new_tokens=5, eos_token_id=[])[0]
        assert list(gen.stream([5, 6, 7], max_new_tokens=5, eos_token_id=[])) == tokens
        print("ok")
    """,
}


@pytest.mark.parametrize("case", sorted(CASES) + ["daemon_native_calls"] * 2)  # racy case: three runs
def test_interpreter_exit_with_a_running_stream(model_dir, case):
    script = PRELUDE + textwrap.dedent(CASES[case])
    result = run_child([sys.executable, "-c", script, model_dir, str(LONG)])
    assert_no_abort(result)
    assert result.stdout.startswith("ok"), f"stdout {result.stdout!r}, stderr {result.stderr[-2000:]}"
    if case.startswith("exception_in_loop"):
        assert result.returncode == 1 and "RuntimeError: raised inside the loop" in result.stderr
    else:
        assert result.returncode == 0, result.stderr[-2000:]


def test_cli_generate_into_a_pipe_closed_early(model_dir):
    """`cpuformer generate ... | head -c 1`: the reader goes away after one byte."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    child = subprocess.Popen([sys.executable, "-m", "cpuformer", "generate", model_dir, "t5 t6",
                              "--max-new-tokens", str(LONG)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
    try:
        assert child.stdout.read(1)
        child.stdout.close()
        _, stderr = child.communicate(timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    result = subprocess.CompletedProcess(child.args, child.returncode, "", stderr.decode())
    assert_no_abort(result)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]


def test_cli_generate_with_stdout_closed(model_dir):
    """`cpuformer generate ... >&-`: one line on stderr, exit code 1 (as cat and ls do)."""
    command = f'exec "{sys.executable}" -m cpuformer generate "{model_dir}" "t5 t6" --max-new-tokens {LONG} >&-'
    result = run_child(["sh", "-c", command])
    assert_no_abort(result)
    assert result.returncode == 1
    assert result.stderr == "cpuformer generate: error: [Errno 9] stdout is closed; nothing can be written\n"
