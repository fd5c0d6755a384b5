"""``cpuformer serve``: an OpenAI-compatible HTTP server for one model (docs/serving.md).

FastAPI + uvicorn, the optional extra ``pip install "cpuformer[serve]"``; they are imported only
when an app is built (create_app) or served (serve), so this module imports without them.

Shape: the HTTP handlers check and tokenize each request on the event loop's side and hand a job
to the Engine, which owns the model: one request queue (at most ``max_queue`` waiting requests; a
full queue is answered 429 at once) and one worker thread. A decoder's sequences run through a
continuous Batcher (the C++ BatchDecoder: up to ``max_batch`` sequences share every forward pass,
joining and leaving at token boundaries); an encoder's embedding jobs (a cross-encoder's rerank
jobs, an encoder-decoder's completions with the same options) that wait together run in one
Encoder.embed (Encoder.score, Seq2Seq.generate) call of up to ``max_batch`` inputs (dynamic
batching).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import math
import os
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ._logprobs import Offsets, Scored, TokenText, chat_logprobs, completion_logprobs
from ._tools import FORMATS, ToolCall, ToolStream, detect_format, parse_tool_calls
from .models import Encoder, Generator, Seq2Seq
from .models._batcher import MAX_LOGPROBS
from .models._text import StopWatch, TextPieces, cut_at_stop

#: Default request-body limit in bytes (--max-body).
MAX_BODY = 10 * 1024 * 1024
_RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
_CLASSIFY_PATHS = ("/classify", "/v1/classify")
_ENDPOINTS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings",
              "/tokenize", "/detokenize", *_RERANK_PATHS, *_CLASSIFY_PATHS)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
_INSTALL = 'cpuformer serve needs FastAPI and uvicorn: pip install "cpuformer[serve]"'


def _require() -> Tuple[Any, Any]:
    """(fastapi, uvicorn); ImportError naming the extra when one is missing."""
    try:
        import fastapi
        import uvicorn
    except ImportError as error:
        raise ImportError(f"{_INSTALL} ({error})") from None
    return fastapi, uvicorn


class APIError(Exception):
    """A request answered with an HTTP error and the OpenAI error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ---- metrics -------------------------------------------------------------------------------------

class _Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> List[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{_num(b)}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{suffix} {_num(self.sum)}", f"{name}_count{suffix} {self.count}"]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Metrics:
    """The server's counters, rendered in the Prometheus text format (version 0.0.4) by render()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Dict[Tuple[str, int], int] = collections.defaultdict(int)
        self.latency: Dict[str, _Histogram] = {}
        self.batch = _Histogram(_BATCH_BUCKETS)
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.cancelled = 0
        self.rejected = 0
        self.prefix_reused_tokens = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            self.latency.setdefault(endpoint, _Histogram(_LATENCY_BUCKETS)).observe(seconds)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def observe_batch(self, size: int) -> None:
        with self._lock:
            self.batch.observe(size)

    def render(self, queue_depth: int, busy: bool) -> str:
        with self._lock:
            lines = ["# HELP cpuformer_queue_depth Jobs waiting for the worker.", "# TYPE cpuformer_queue_depth gauge",
                     f"cpuformer_queue_depth {queue_depth}",
                     "# HELP cpuformer_worker_busy 1 while the worker runs a job.",
                     "# TYPE cpuformer_worker_busy gauge",
                     f"cpuformer_worker_busy {int(busy)}",
                     "# HELP cpuformer_batch_size Sequences per model call (embeddings, rerank: inputs per call).",
                     "# TYPE cpuformer_batch_size histogram", *self.batch.lines("cpuformer_batch_size")]
            for name, value, text in (
                    ("cpuformer_generated_tokens_total", self.generated_tokens, "Tokens generated."),
                    ("cpuformer_prompt_tokens_total", self.prompt_tokens, "Prompt (embedding, rerank input) tokens."),
                    ("cpuformer_cancelled_total", self.cancelled, "Generations stopped by a client disconnect."),
                    ("cpuformer_rejected_total", self.rejected, "Requests refused with 429 (queue full)."),
                    ("cpuformer_prefix_reused_tokens_total", self.prefix_reused_tokens,
                     "Prompt tokens whose keys and values came from a cached prefix instead of being computed.")):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
            lines += ["# HELP cpuformer_requests_total HTTP requests by endpoint and status.",
                      "# TYPE cpuformer_requests_total counter"]
            for (endpoint, status), value in sorted(self.requests.items()):
                lines.append(f'cpuformer_requests_total{{endpoint="{endpoint}",status="{status}"}} {value}')
            lines += ["# HELP cpuformer_request_duration_seconds Request latency (streams: until the last byte).",
                      "# TYPE cpuformer_request_duration_seconds histogram"]
            for endpoint, histogram in sorted(self.latency.items()):
                lines += histogram.lines("cpuformer_request_duration_seconds", f'endpoint="{endpoint}"')
        return "\n".join(lines) + "\n"


# ---- the engine: one queue, one worker thread that owns the model ----------------------------------

class _Job:
    def __init__(self, kind: str, run: Optional[Callable[[], Any]] = None, inputs: Optional[List[Any]] = None,
                 ids: Optional[List[int]] = None, options: Optional[Dict[str, Any]] = None,
                 put: Optional[Callable[[Any], None]] = None):
        # "generate": one sequence (ids, generate() options with stop) through the Batcher; its
        # result is (text, finish_reason, completion tokens, scored tokens or None), or with put,
        # put(piece) per text piece (a _Piece with logprobs) then put((finish_reason, completion
        # tokens)). "embed": inputs, batched; "score": (query, document) pairs, batched;
        # "translate": an encoder-decoder's sources (options: Seq2Seq.generate's), batched with
        # the waiting ones of the same options; its result, a GenerationResult per output.
        # "run": run().
        self.kind = kind
        self.run = run
        self.inputs = inputs or []
        self.ids = ids or []
        self.options = options or {}
        self.put = put
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.callbacks: List[Callable[[], None]] = []

    def key(self) -> Any:
        """Jobs of one batched call share this: the kind, strings or token ids, and (translate)
        the generation options."""
        options = json.dumps(self.options, sort_keys=True) if self.kind == "translate" else None
        return self.kind, isinstance(self.inputs[0], str), options


_BATCHED = ("embed", "score", "classify", "translate")  # job kinds whose waiting jobs run in one call


class _Piece:
    """A streamed text piece with the log-probabilities of the tokens that arrived with it (not
    a tuple: a stream's last item, (finish_reason, tokens), is one)."""

    def __init__(self, text: str, scored: List[Scored]) -> None:
        self.text, self.scored = text, scored


class _Sequence:
    """A generate job in the Batcher: its text so far and its stop strings; with ``logprobs``, its
    tokens scored (docs/serving.md, "Log-probabilities"); with ``echo``, its prompt first."""

    def __init__(self, job: _Job, decode: Callable[[List[int]], str], text: Optional[TokenText]) -> None:
        self.job = job
        self.decode = decode
        self.stops = job.options.get("stop") or ()
        self.tokens: List[int] = []
        # Streams cut text pieces as tokens arrive; a whole answer only watches for a stop string.
        self.pieces = TextPieces(decode, self.stops) if job.put is not None else None
        self.watch = StopWatch(decode, self.stops) if job.put is None and self.stops else None
        self.echo = bool(job.options.get("echo"))
        self.prompt_text = ""
        self.text = text if job.options.get("logprobs") is not None else None
        self.offsets = Offsets(decode) if self.text is not None else None
        self.scored: List[Scored] = []  # a whole answer's (the echoed prompt's first)
        self.pending: List[Scored] = []  # a stream's, not yet sent

    def add(self, event: Any) -> bool:
        """Takes the next token (a BatchEvent); True when a stop string has ended the text."""
        token = event.token
        if not self.tokens and self.echo:
            self._echo(event.prompt_logprobs)
        self.tokens.append(token)
        if self.text is not None and self.offsets is not None and event.logprobs is not None:
            entry = self.text.scored(token, event.logprobs.log_prob, event.logprobs.top, self.offsets.next(token))
            (self.scored if self.pieces is None else self.pending).append(entry)
        if self.pieces is not None:
            piece = self.pieces.add(token)
            if piece:
                self._put(piece)
            return self.pieces.stopped
        return self.watch is not None and self.watch.add(token)

    def _echo(self, prompt_logprobs: Optional[List[Any]]) -> None:
        ids = self.job.ids
        self.prompt_text = self.decode(ids)
        scored: List[Scored] = []
        if self.text is not None and self.offsets is not None:
            offsets = Offsets(self.decode)
            first = self.text.scored(ids[0], None, [], offsets.next(ids[0]))
            scored = [first] + [self.text.scored(e.token, e.log_prob, e.top, offsets.next(e.token))
                                for e in prompt_logprobs or []]
            self.offsets.start = len(self.prompt_text)
        if self.pieces is not None:
            self.pending = scored
            self._put(self.prompt_text)
        else:
            self.scored = scored

    def _put(self, piece: str) -> None:
        assert self.job.put is not None
        if self.text is None:
            self.job.put(piece)
        else:
            self.job.put(_Piece(piece, self.pending))
            self.pending = []

    def rest(self) -> None:
        """A stream's last piece (the text held back, and scored tokens not sent yet)."""
        assert self.pieces is not None
        piece = self.pieces.finish()
        if piece or self.pending:
            self._put(piece)

    def answer(self) -> Tuple[str, Optional[List[Scored]]]:
        """A whole answer's text (cut at a stop string; the prompt first with echo) and its
        scored tokens (those that begin before a stop string's cut), or None without logprobs."""
        text = self.decode(self.tokens)
        cut = False
        if self.stops:
            text, cut = cut_at_stop(text, self.stops)
        text = self.prompt_text + text
        if self.text is None:
            return text, None
        if cut:  # the echoed prompt's tokens stay; generated ones that begin at or after the cut go
            prompt = len(self.job.ids) if self.echo else 0
            return text, self.scored[:prompt] + [s for s in self.scored[prompt:] if s.offset < len(text)]
        return text, self.scored


class Engine:
    """Owns the model on one worker thread (docs/serving.md, "Scheduling"). A decoder's generate
    jobs run through a continuous Batcher: up to ``max_batch`` sequences share every forward pass,
    new ones join at token boundaries and finished ones leave. An encoder's embed jobs that wait
    together are embedded in one call of up to ``max_batch`` inputs."""

    def __init__(self, model: Any, max_batch: int = 32, max_queue: int = 64, metrics: Optional[Metrics] = None,
                 max_length: Optional[int] = None, prefill_chunk: int = 64, kv_cache_dtype: Optional[str] = None,
                 prefill_slowdown: float = 2.0):
        self.model = model
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.busy = False
        self.batcher = model.batcher(capacity=max_batch, max_length=max_length, prefill_chunk=prefill_chunk,
                                     kv_cache_dtype=kv_cache_dtype, prefill_slowdown=prefill_slowdown) \
            if isinstance(model, Generator) else None
        self._running: Dict[int, _Sequence] = {}
        self.token_text: Optional[TokenText] = None  # logprobs' token texts (a tokenizer is needed)
        if self.batcher is not None:
            try:
                self.token_text = TokenText(model.tokenizer)
            except ValueError:
                pass
        self._waiting = 0  # requests in the Batcher's queue (read by other threads; the worker writes it)
        self._jobs: "collections.deque[_Job]" = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._current: List[_Job] = []
        self._thread = threading.Thread(target=self._loop, name="cpuformer-serve", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Requests waiting for the model (not yet in the running batch)."""
        return len(self._jobs) + self._waiting

    def submit(self, *jobs: _Job) -> _Job:
        """Queues the jobs (all or none; returns the first); APIError 429 when they do not fit
        behind the requests already waiting (max_queue)."""
        with self._cond:
            if self._closed:
                raise APIError(503, "the server is shutting down", "server_error", code="shutting_down")
            if self.depth + len(jobs) > self.max_queue:
                self.metrics.add(rejected=1)
                raise APIError(429, f"the server is busy: {self.depth} requests are waiting (--max-queue "
                               f"{self.max_queue}); retry later", "rate_limit_error", code="queue_full")
            self._jobs.extend(jobs)
            self._cond.notify()
        return jobs[0]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in list(self._jobs) + self._current:  # a running stream stops at its next piece
                job.cancelled.set()
            self._cond.notify()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._running and not self._closed:
                    self._cond.wait()
                if self._closed:
                    pending, self._jobs = list(self._jobs), collections.deque()
                    shutting_down = APIError(503, "the server is shutting down", "server_error")
                    for job in pending + [seq.job for seq in self._running.values()]:
                        self._finish(job, error=shutting_down)
                    self._running.clear()
                    return
                if self.batcher is not None:  # every queued sequence joins the batch (or its queue)
                    jobs, self._jobs = list(self._jobs), collections.deque()
                else:
                    jobs = [self._jobs.popleft()]
                    if jobs[0].kind in _BATCHED:  # dynamic batching: the jobs that wait and go together
                        size = len(jobs[0].inputs)
                        while self._jobs and self._jobs[0].key() == jobs[0].key() \
                                and size + len(self._jobs[0].inputs) <= self.max_batch:
                            size += len(self._jobs[0].inputs)
                            jobs.append(self._jobs.popleft())
                self.busy = True
            self._current = jobs
            try:
                if self.batcher is not None:
                    self._generation_step(jobs)
                elif jobs[0].kind in _BATCHED:
                    self._run_batched([j for j in jobs if not j.cancelled.is_set()])
                else:
                    self._run_one(jobs[0])
            finally:
                self.busy = False
                self._current = []

    def _generation_step(self, jobs: List[_Job]) -> None:
        """Admits the new generate jobs, drops the cancelled ones, runs one batch step and hands
        out its tokens."""
        batcher = self.batcher
        assert batcher is not None
        for job in jobs:
            if job.cancelled.is_set():
                self._finish(job)
                continue
            options = {k: v for k, v in job.options.items() if k not in ("stop", "echo", "score_only")}
            try:
                request = batcher.submit(job.ids, **options)
            except Exception as error:  # handed to the request
                self._finish(job, error=error)
                continue
            self._running[request] = _Sequence(job, self.model._decode, self.token_text)
        for request, seq in list(self._running.items()):
            if seq.job.cancelled.is_set():  # the client went away
                batcher.cancel(request)
                del self._running[request]
                self.metrics.add(cancelled=1, generated_tokens=len(seq.tokens), prompt_tokens=len(seq.job.ids))
                self._finish(seq.job)
        self._waiting = batcher.waiting
        if not self._running:
            return
        try:
            events = batcher.step()
        except BaseException as error:  # the step failed: every running request gets the error
            for request, seq in list(self._running.items()):
                batcher.cancel(request)
                self._finish(seq.job, error=error)
            self._running.clear()
            return
        finally:
            self._waiting = batcher.waiting
        stats = batcher.stats()
        self.metrics.observe_batch(stats["last_batch"])
        self.metrics.prefix_reused_tokens = stats["reused_tokens"]
        for event in events:
            seq = self._running[event.request]
            reason = "stop" if seq.add(event) else event.finish_reason
            if reason is None:
                continue
            if event.finish_reason is None:
                batcher.cancel(event.request)
            del self._running[event.request]
            self.metrics.add(generated_tokens=len(seq.tokens), prompt_tokens=len(seq.job.ids))
            finish = _FINISH.get(reason, reason)
            if seq.pieces is not None:
                seq.rest()
                assert seq.job.put is not None
                seq.job.put((finish, len(seq.tokens)))
                self._finish(seq.job)
            else:
                text, scored = seq.answer()
                self._finish(seq.job, result=(text, finish, len(seq.tokens), scored))

    def _run_one(self, job: _Job) -> None:
        if job.cancelled.is_set():
            return self._finish(job)
        try:
            assert job.run is not None
            self._finish(job, result=job.run())
        except BaseException as error:  # handed to the request
            self._finish(job, error=error)

    def _run_batched(self, jobs: List[_Job]) -> None:
        """The inputs of every job in one Encoder.embed (embed jobs) or Encoder.score (score jobs)
        call; each job gets its rows."""
        if not jobs:
            return
        kind, options, batch = jobs[0].kind, jobs[0].options, max(self.max_batch, 1)

        def call(inputs: List[Any]) -> Any:
            if kind == "embed":
                return self.model.embed(inputs, batch_size=batch)
            if kind == "score":
                return self.model.score(inputs, batch_size=batch)
            if kind == "classify":
                return self.model.classify(inputs, top_k=None, batch_size=batch)
            out: List[Any] = []  # translate: at most max_batch sources per generate call (bounded memory)
            for start in range(0, len(inputs), batch):
                out += self.model.generate(inputs[start:start + batch], return_scores=True, **options)
            return out

        per_input = options.get("num_return_sequences", 1) if kind == "translate" else 1
        inputs = [x for job in jobs for x in job.inputs]
        self.metrics.observe_batch(len(inputs))
        try:
            outputs = call(inputs)
        except BaseException as error:
            if len(jobs) == 1:
                return self._finish(jobs[0], error=error)
            for job in jobs:  # one bad input must not fail the others: run each alone
                self._run_one(_with_run(job, lambda job=job: call(job.inputs)))
            return
        start = 0
        for job in jobs:
            self._finish(job, result=outputs[start:start + len(job.inputs) * per_input])
            start += len(job.inputs) * per_input

    @staticmethod
    def _finish(job: _Job, result: Any = None, error: Optional[BaseException] = None) -> None:
        job.result, job.error = result, error
        job.done.set()
        for callback in job.callbacks:
            callback()


def _seeded(options: Dict[str, Any], offset: int) -> Dict[str, Any]:
    """The options of a request's offset-th sequence (n > 1): its own seed, the given one + offset."""
    if options.get("seed") is None or offset == 0:
        return options
    return dict(options, seed=options["seed"] + offset)


def _with_run(job: _Job, run: Callable[[], Any]) -> _Job:
    job.run = run
    return job


async def _wait(job: _Job) -> Any:
    """The job's result, awaited on the event loop (its error raised); a cancelled request (the
    client went away) cancels the job."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def wake() -> None:
        loop.call_soon_threadsafe(lambda: future.done() or future.set_result(None))

    job.callbacks.append(wake)
    if job.done.is_set():
        wake()
    try:
        await future
    except asyncio.CancelledError:
        job.cancelled.set()
        raise
    if job.error is not None:
        raise job.error
    return job.result


async def _cancel_on_disconnect(request: Any, jobs: List[_Job], every: float = 0.1) -> None:
    """Cancels the jobs of a request whose client closes the connection before they end (a
    non-streaming answer: nothing is sent until the end, so the connection is polled)."""
    while not all(job.done.is_set() for job in jobs):
        if await request.is_disconnected():
            for job in jobs:
                job.cancelled.set()
            return
        await asyncio.sleep(every)


# ---- request parsing -------------------------------------------------------------------------------

def _bad(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _shown(value: Any, limit: int = 100) -> str:
    """A request value as an error message quotes it: its repr, cut to ``limit`` characters (a
    large body must not come back in full)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _integer(body: Dict[str, Any], key: str, default: Any, low: Optional[int] = None) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{key} must be an integer, got {_shown(value)}", key)
    if low is not None and value < low:
        raise _bad(f"{key} must be >= {low}, got {value}", key)
    return value


def _float(body: Dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{key} must be a number, got {_shown(value)}", key)
    return float(value)


def _token_list(value: Any, vocab_size: int, param: str) -> List[int]:
    if not value or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise _bad(f"{param} must be a non-empty string, a list of token ids or a list of those", param)
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise _bad(f"token id {bad[0]} in {param} is out of range [0, {vocab_size})", param)
    return list(value)


class _Server:
    """The request handlers' logic, independent of FastAPI's request objects."""

    def __init__(self, model: Any, model_name: str, max_batch: int, max_queue: int, tool_call_parser: str = "auto",
                 **engine: Any) -> None:
        if tool_call_parser not in ("auto", "none") + FORMATS:
            raise ValueError(f"tool_call_parser must be 'auto', 'none' or one of {', '.join(FORMATS)}, "
                             f"got {tool_call_parser!r}")
        self.model = model
        self.model_name = model_name
        self.tool_call_parser = tool_call_parser
        self._detected_format: Optional[str] = None  # tool_format()'s reading of the template, once
        self.decoder = isinstance(model, Generator)
        self.encoder = isinstance(model, Encoder)
        self.seq2seq = isinstance(model, Seq2Seq)
        if not (self.decoder or self.encoder or self.seq2seq):
            raise ValueError(f"cpuformer serve serves decoders (cpuformer.Generator: completions, chat), "
                             f"encoder-decoders (cpuformer.Seq2Seq: completions) and encoders (cpuformer.Encoder: "
                             f"embeddings), not a {type(model).__name__}")
        if self.decoder or self.seq2seq:
            try:
                _ = model.tokenizer
            except ValueError as error:
                raise ValueError(f"cpuformer serve needs a decoder's tokenizer (the API answers with text): {error}") \
                    from None
        probe = model.embed([[0]]) if self.encoder else np.zeros((1, 0), np.float32)  # one token
        self.dimensions = int(probe.shape[1])  # the output width
        # Unit-length outputs (a Normalize module): a shortened vector (dimensions) is normalized again.
        self.normalized = bool(self.encoder and abs(float(np.linalg.norm(probe[0])) - 1.0) < 1e-3)
        # A sequence classifier answers /classify; a cross-encoder (one score per pair) /v1/rerank too.
        self.classifier = self.encoder and model.task == "sequence_classification"
        self.reranker = self.classifier and len(model.labels) == 1
        self.metrics = Metrics()
        try:
            self.engine = Engine(model, max_batch, max_queue, self.metrics, **engine)
        except ValueError as error:
            if "too large" not in str(error):
                raise
            raise ValueError(f"{error}: serve fewer sequences at once (--max-batch) or shorter ones (--max-length), "
                             "or store the cache in fewer bytes (--kv-cache-dtype)") from None
        # A request's prompt + completion fits in a batcher slot (--max-length).
        self.context = self.engine.batcher.max_length if self.engine.batcher is not None else 0
        self.created = int(time.time())

    def check_model(self, body: Dict[str, Any], endpoint: str) -> None:
        name = body.get("model")
        if name is None:
            raise _bad("you must provide a model parameter", "model")
        if name != self.model_name:
            raise APIError(404, f"the model {_shown(name)} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")
        other = "/v1/completions and /v1/chat/completions" if self.decoder else "/v1/completions" if self.seq2seq \
            else "/v1/embeddings, /v1/rerank and /classify" if self.reranker \
            else "/v1/embeddings and /classify" if self.classifier else "/v1/embeddings"
        heads = ((_CLASSIFY_PATHS, self.classifier, "a sequence classifier (a ...ForSequenceClassification "
                  "checkpoint)", "a sequence-classification head"),
                 (_RERANK_PATHS, self.reranker, "a cross-encoder (a ...ForSequenceClassification checkpoint with "
                  "one label)", "a one-label sequence-classification head"))
        for paths, fits, wants, head in heads:  # the endpoints of an encoder's task head
            if endpoint in paths:
                if not fits:
                    what = f"an Encoder without {head}" if self.encoder else f"a {type(self.model).__name__}"
                    raise _bad(f"{endpoint} needs {wants}; {self.model_name!r} is {what} (use {other})", "model",
                               code="wrong_model_kind")
                return
        wants = "an encoder (embedding) model" if endpoint == "/v1/embeddings" else "a decoder (text generation) model"
        fits = self.encoder if endpoint == "/v1/embeddings" else self.decoder or (
            self.seq2seq and endpoint == "/v1/completions")
        if not fits:
            raise _bad(f"{endpoint} needs {wants}; {self.model_name!r} is a {type(self.model).__name__} "
                       f"(use {other})", "model", code="wrong_model_kind")

    # -- generation ----------------------------------------------------------------------------

    def generation_options(self, body: Dict[str, Any], chat: bool, prompt_len: int) -> Dict[str, Any]:
        unsupported = [("suffix", None), ("best_of", 1)]
        for key, default in unsupported + ([("echo", False)] if chat else [("tools", None)]):
            value = body.get(key)
            if value is not None and value != default:
                raise _bad(f"{key} is not supported by cpuformer serve", key, code="unsupported_parameter")
        response_format = body.get("response_format")
        if response_format is not None and response_format != {"type": "text"}:
            raise _bad(f"response_format {_shown(response_format)} is not supported by cpuformer serve (it needs "
                       "constrained decoding); only {'type': 'text'}", "response_format", code="unsupported_parameter")
        logprobs, echo = self.logprob_options(body, chat)
        room = self.context - prompt_len
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = _integer(body, key, room if chat else 16)
        score_only = max_tokens == 0 and echo  # the prompt's text and log-probabilities, nothing generated
        if max_tokens <= 0 and not score_only:
            raise _bad(f"{key} must be at least 1 (0 only with echo: true), got {max_tokens}", key)
        temperature = _float(body, "temperature", 1.0)
        if temperature < 0:
            raise _bad(f"temperature must be >= 0, got {temperature}", "temperature")
        top_p = _float(body, "top_p", 1.0)
        if not 0 < top_p <= 1:
            raise _bad(f"top_p must be in (0, 1], got {top_p}", "top_p")
        top_k = _integer(body, "top_k", 0, 0)
        seed = _integer(body, "seed", None, 0)
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
            raise _bad(f"stop must be a non-empty string or a list of them, got {_shown(stop)}", "stop")
        options: Dict[str, Any] = dict(max_new_tokens=max(max_tokens, 1), stop=stop or None)
        if score_only:  # one token is chosen (the batcher's unit of work) and left out of the answer
            options["score_only"] = True
        if temperature > 0:
            options.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        for name in ("presence_penalty", "frequency_penalty"):
            penalty = _float(body, name, 0.0)
            if not -2 <= penalty <= 2:
                raise _bad(f"{name} must be in [-2, 2], got {penalty}", name)
            if penalty:
                options[name] = penalty
        bias = self.logit_bias(body.get("logit_bias"))
        if bias:
            options["logit_bias"] = bias
        # vLLM's extensions of the same names
        repetition = _float(body, "repetition_penalty", 1.0)
        if repetition <= 0:
            raise _bad(f"repetition_penalty must be > 0, got {repetition}", "repetition_penalty")
        if repetition != 1.0:
            options["repetition_penalty"] = repetition
        min_tokens = _integer(body, "min_tokens", 0, 0)
        if min_tokens > max_tokens:
            raise _bad(f"min_tokens ({min_tokens}) must be at most {key} ({max_tokens})", "min_tokens")
        if min_tokens:
            options["min_new_tokens"] = min_tokens
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise _bad(f"ignore_eos must be true or false, got {_shown(ignore_eos)}", "ignore_eos")
        if ignore_eos:
            options["eos_token_id"] = []
        if echo:
            options["echo"] = True
        if logprobs is not None:
            self.tokenizer()  # token texts need it (400 without one)
            options["logprobs"] = logprobs
            if echo:
                options["prompt_logprobs"] = logprobs
        return options

    def translation_request(self, body: Dict[str, Any]) -> Tuple[List[Any], int, Dict[str, Any], int]:
        """(sources, n, Seq2Seq.generate options, source tokens) of a completions request to an
        encoder-decoder model (docs/serving.md, "Encoder-decoder models"): the prompt is the
        source; max_tokens defaults to 256 (at most the model's positions); num_beams, tgt_lang and
        src_lang are extensions."""
        for key in ("logprobs", "echo"):
            if body.get(key) not in (None, False):
                raise _bad(f"{key} is not supported for encoder-decoder models", key, code="unsupported_parameter")
        if body.get("max_tokens") is None:
            body = dict(body, max_tokens=min(256, (self.model.max_positions or 257) - 1))  # (after the start token)
        options = self.generation_options(body, False, 0)
        prompt = body.get("prompt")
        sources = [prompt] if isinstance(prompt, str) or (
            isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt)) else prompt
        if not isinstance(sources, list) or not sources or not all(
                (isinstance(x, str) and x) or (isinstance(x, list) and x) for x in sources):
            raise _bad("prompt must be a non-empty string, a list of token ids or a list of those", "prompt")
        sources = [x if isinstance(x, str) else _token_list(x, self.model.vocab_size, "prompt") for x in sources]
        limit = self.model.max_positions  # (None: relative positions, no limit)
        if limit and options["max_new_tokens"] > limit - 1:
            raise _bad(f"max_tokens {options['max_new_tokens']} exceeds this model's maximum of {limit - 1} target "
                       "tokens (after the decoder start token)", "max_tokens", code="context_length_exceeded")
        lengths = [len(self.tokenizer().encode(x)) if isinstance(x, str) else len(x) for x in sources]
        for length in lengths:
            if limit and length > limit:
                raise _bad(f"this model's maximum source length is {limit} tokens; a prompt has {length}",
                           "prompt", code="context_length_exceeded")
        n = _integer(body, "n", 1, 1)
        beams = _integer(body, "num_beams", 1, 1)
        if beams > 1 and options.get("do_sample"):
            raise _bad("num_beams > 1 is beam search: it needs temperature: 0", "num_beams")
        if beams > 1 and n > beams:
            raise _bad(f"n ({n}) must be at most num_beams ({beams}): the n best beams", "n")
        generate: Dict[str, Any] = {k: v for k, v in options.items() if k not in ("logprobs", "echo", "score_only")}
        generate.update(num_beams=beams, num_return_sequences=n if beams > 1 or options.get("do_sample") else 1)
        for key in ("tgt_lang", "src_lang"):
            value = body.get(key)
            if value is not None and not isinstance(value, str):
                raise _bad(f"{key} must be a language code string, got {_shown(value)}", key)
            if value is not None:
                generate[key] = value
        return sources, n, generate, sum(lengths)

    def logit_bias(self, value: Any) -> Dict[int, float]:
        """OpenAI's ``logit_bias``: an object of token ids (as strings: JSON's keys) to biases in
        [-100, 100], added to those tokens' logits at every step."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise _bad(f"logit_bias must be an object of token ids to numbers, got {_shown(value)}", "logit_bias")
        bias: Dict[int, float] = {}
        vocab = self.model.vocab_size
        for key, number in value.items():
            if not (key.isascii() and key.isdigit()):
                raise _bad(f"logit_bias keys must be token ids (digits), got {_shown(key)}", "logit_bias")
            token = int(key)
            if token >= vocab:
                raise _bad(f"logit_bias token id {token} is out of range [0, {vocab})", "logit_bias")
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not -100 <= number <= 100:
                raise _bad(f"logit_bias of token {token} must be a number in [-100, 100], got {_shown(number)}",
                           "logit_bias")
            bias[token] = float(number)
        return bias

    def logprob_options(self, body: Dict[str, Any], chat: bool) -> Tuple[Optional[int], bool]:
        """(alternatives per token, or None for no log-probabilities; echo). Completions:
        ``logprobs`` 0..20 and ``echo``; chat: ``logprobs: true`` with ``top_logprobs`` 0..20."""
        if chat:
            wanted = body.get("logprobs")
            if wanted is not None and not isinstance(wanted, bool):
                raise _bad(f"logprobs must be true or false, got {_shown(wanted)}", "logprobs")
            top = _integer(body, "top_logprobs", None, 0)
            if top is not None and top > MAX_LOGPROBS:
                raise _bad(f"top_logprobs must be <= {MAX_LOGPROBS}, got {top}", "top_logprobs")
            if top is not None and not wanted:
                raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
            return ((top or 0) if wanted else None), False
        logprobs = _integer(body, "logprobs", None, 0)
        if logprobs is not None and logprobs > MAX_LOGPROBS:
            raise _bad(f"logprobs must be <= {MAX_LOGPROBS}, got {logprobs}", "logprobs")
        echo = body.get("echo")
        if echo is not None and not isinstance(echo, bool):
            raise _bad(f"echo must be true or false, got {_shown(echo)}", "echo")
        return logprobs, bool(echo)

    def check_context(self, ids: List[int], param: str) -> None:
        limit = self.context
        if len(ids) >= limit:
            raise _bad(f"this model's maximum context length is {limit} tokens; the {param} has {len(ids)} "
                       "tokens, which leaves no room for a completion", param, code="context_length_exceeded")

    def completion_prompts(self, body: Dict[str, Any]) -> List[List[int]]:
        if "prompt" not in body:
            raise _bad("you must provide a prompt parameter", "prompt")
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompts: List[Any] = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            prompts = prompt
        else:
            raise _bad("prompt must be a non-empty string, a list of token ids or a list of those", "prompt")
        out = []
        for p in prompts:
            if isinstance(p, str):
                ids = self.tokenizer().encode(p)
                if not ids:
                    raise _bad("the prompt is empty (it encodes to no tokens)", "prompt")
            else:
                ids = _token_list(p, self.model.vocab_size, "prompt")
            self.check_context(ids, "prompt")
            out.append(ids)
        return out

    def tool_request(self, body: Dict[str, Any]) -> Tuple[Optional[List[Dict[str, Any]]], Optional[str], bool]:
        """(the tools to render in the prompt or None, the format to read calls back in or None,
        parallel_tool_calls) of a chat request (docs/serving.md, "Tool calls")."""
        tools, choice = body.get("tools"), body.get("tool_choice")
        parallel = body.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise _bad(f"parallel_tool_calls must be true or false, got {_shown(parallel)}", "parallel_tool_calls")
        if tools is None:
            if choice not in (None, "none", "auto"):
                raise _bad("tool_choice needs tools", "tool_choice")
            return None, None, parallel
        if not isinstance(tools, list) or not tools:
            raise _bad(f"tools must be a non-empty list of {{type: function, function: {{name, ...}}}} objects, "
                       f"got {_shown(tools)}", "tools")
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
                raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}, got {_shown(tool)}",
                           "tools")
            if not isinstance(function.get("name"), str) or not function["name"]:
                raise _bad(f"tools[{i}].function.name must be a non-empty string", "tools")
            if not isinstance(function.get("parameters", {}), dict):
                raise _bad(f"tools[{i}].function.parameters must be a JSON-schema object", "tools")
        if choice == "none":
            return None, None, parallel
        if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function"):
            raise _bad(f"tool_choice {_shown(choice)} is not supported (it needs decoding constrained to a call, which "
                       "cpuformer serve does not do); use 'auto' or 'none'", "tool_choice",
                       code="unsupported_parameter")
        if choice not in (None, "auto"):
            raise _bad(f"tool_choice must be 'auto', 'none', 'required' or {{\"type\": \"function\", ...}}, got "
                       f"{_shown(choice)}", "tool_choice")
        return tools, self.tool_format(tools), parallel

    def tool_format(self, tools: List[Dict[str, Any]]) -> str:
        """The format the model writes tool calls in: --tool-call-parser, or read off the chat
        template's tool instructions."""
        if self.tool_call_parser in FORMATS:
            return self.tool_call_parser
        if self.tool_call_parser == "none":
            raise _bad("tools are turned off on this server (--tool-call-parser none)", "tools",
                       code="unsupported_parameter")
        if self._detected_format is None:
            from .models._chat import ChatTemplate

            try:  # (the template chosen with tools does not depend on which tools)
                self._detected_format = detect_format(
                    ChatTemplate.from_directory(self.model._model_dir.path).template(tools)) or ""
            except ValueError:
                self._detected_format = ""
        fmt = self._detected_format
        if not fmt:
            raise _bad("tools need a chat template that asks for tool calls in a format cpuformer serve reads "
                       f"({', '.join(FORMATS)}); this model's does not name one; start the server with "
                       "--tool-call-parser FORMAT if its model writes one of them", "tools",
                       code="unsupported_parameter")
        return fmt

    def chat_prompt(self, body: Dict[str, Any], tools: Optional[List[Dict[str, Any]]] = None,
                    check: bool = True) -> List[int]:
        messages = body.get("messages")
        if messages is None:
            raise _bad("you must provide a messages parameter", "messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
        for m in messages:  # OpenAI's content parts: text parts only
            if isinstance(m, dict) and isinstance(m.get("content"), list):
                if not all(isinstance(p, dict) and p.get("type") == "text" for p in m["content"]):
                    raise _bad("only text content parts are supported", "messages")
                m["content"] = "".join(str(p.get("text", "")) for p in m["content"])
        for i, m in enumerate(messages):  # an assistant turn's calls, as chat templates read them
            if isinstance(m, dict) and m.get("tool_calls") is not None:
                m["tool_calls"] = [_template_call(c, i) for c in _listed_calls(m["tool_calls"], i)]
        try:
            text = self.model.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
        except ImportError as error:
            raise APIError(500, str(error), "server_error") from None
        ids = self.tokenizer().encode(text, add_special_tokens=False)
        if not ids:
            raise _bad("the chat template rendered the messages as empty text", "messages")
        if check:
            self.check_context(ids, "messages")
        return ids

    def tokenizer(self) -> Any:
        try:
            return self.model.tokenizer
        except ValueError as error:
            raise _bad(f"this model has no tokenizer: send token ids ({error})", "prompt") from None

    def decode(self, ids: Sequence[int]) -> str:
        return self.model.tokenizer.decode(list(ids), skip_special_tokens=True)

    # -- embeddings ------------------------------------------------------------------------------

    def embedding_inputs(self, body: Dict[str, Any]) -> Tuple[List[Any], int, int]:
        if "input" not in body:
            raise _bad("you must provide an input parameter", "input")
        value = body["input"]
        if isinstance(value, str):
            inputs: List[Any] = [value]
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            inputs = [value]
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            inputs = value
        elif isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            inputs = value
        else:
            raise _bad("input must be a non-empty string, a list of strings, a list of token ids or a list of those",
                       "input")
        if len(inputs) > 2048:
            raise _bad(f"input holds {len(inputs)} items; at most 2048 per request", "input")
        if isinstance(inputs[0], str):
            if any(s == "" for s in inputs):
                raise _bad("input strings must not be empty", "input")
            tokenizer = self.tokenizer()
            tokens = sum(min(len(ids), self.model.max_tokens) for ids in tokenizer.encode_batch(inputs))
        else:
            inputs = [_token_list(v, self.model.config["vocab_size"], "input") for v in inputs]
            for ids in inputs:
                if len(ids) > self.model.max_seq_len:
                    raise _bad(f"an input has {len(ids)} tokens; this model's maximum is {self.model.max_seq_len}",
                               "input", code="context_length_exceeded")
            tokens = sum(len(ids) for ids in inputs)
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise _bad(f"encoding_format must be 'float' or 'base64', got {_shown(encoding)}", "encoding_format")
        dimensions = _integer(body, "dimensions", self.dimensions, 1)
        if dimensions > self.dimensions:
            raise _bad(f"dimensions must be at most {self.dimensions} (the model's), got {dimensions}", "dimensions")
        return inputs, tokens, dimensions


    # -- tokenize --------------------------------------------------------------------------------

    def tokenize(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """/tokenize: the token ids a completions ``prompt`` (or embeddings input) or a chat's
        ``messages`` become, as the other endpoints encode them (vLLM's shape)."""
        if "messages" in body:
            if not self.decoder:
                raise _bad("messages need a decoder with a chat template", "messages")
            ids = self.chat_prompt(dict(body), None, check=False)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise _bad(f"prompt must be a string (or send messages), got {_shown(prompt)}", "prompt")
            ids = self.tokenizer().encode(prompt)
        limit = self.context if self.decoder else (
            self.model.max_positions if self.seq2seq else self.model.max_tokens)
        return {"tokens": list(ids), "count": len(ids), "max_model_len": limit}

    def detokenize(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """/detokenize: the text of token ids, special tokens left out (as completions' text)."""
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise _bad(f"tokens must be a list of token ids, got {_shown(tokens)}", "tokens")
        vocab = self.model.vocab_size if not self.encoder else self.model.config["vocab_size"]
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise _bad(f"token id {bad[0]} in tokens is out of range [0, {vocab})", "tokens")
        return {"prompt": self.tokenizer().decode(tokens, skip_special_tokens=True)}

    # -- classify --------------------------------------------------------------------------------

    def classify_inputs(self, body: Dict[str, Any]) -> Tuple[List[str], int]:
        """(the texts, their tokens) of a /classify request: ``input`` a string or a list of them."""
        value = body.get("input")
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise _bad(f"input must be a non-empty string or a list of them, got {_shown(value)}", "input")
        if len(texts) > 2048:
            raise _bad(f"input holds {len(texts)} items; at most 2048 per request", "input")
        tokens = sum(min(len(ids), self.model.max_tokens) for ids in self.tokenizer().encode_batch(texts))
        return texts, tokens

    # -- rerank ----------------------------------------------------------------------------------

    def rerank_inputs(self, body: Dict[str, Any]) -> Tuple[List[Tuple[str, str]], Optional[int], bool, int]:
        """(the (query, document) pairs, top_n or None, return_documents, tokens) of a rerank
        request: ``query`` a string, ``documents`` strings or {"text": ...} objects (Cohere's and
        Jina's shapes)."""
        query = body.get("query")
        if not isinstance(query, str) or not query:
            raise _bad(f"query must be a non-empty string, got {_shown(query)}", "query")
        documents = body.get("documents")
        if not isinstance(documents, list) or not documents:
            raise _bad("documents must be a non-empty list of strings", "documents")
        if len(documents) > 2048:
            raise _bad(f"documents holds {len(documents)} items; at most 2048 per request", "documents")
        texts = []
        for i, document in enumerate(documents):
            text = document.get("text") if isinstance(document, dict) else document
            if not isinstance(text, str) or not text:
                raise _bad(f"documents[{i}] must be a non-empty string or an object with a non-empty 'text', "
                           f"got {_shown(document)}", "documents")
            texts.append(text)
        top_n = _integer(body, "top_n", None, 1)
        returned = body.get("return_documents", True)
        if not isinstance(returned, bool):
            raise _bad(f"return_documents must be true or false, got {_shown(returned)}", "return_documents")
        pairs = [(query, text) for text in texts]
        tokens = sum(min(len(ids), self.model.max_tokens) for ids in self.tokenizer().encode_batch(pairs))
        return pairs, top_n, returned, tokens


def _listed_calls(calls: Any, index: int) -> List[Dict[str, Any]]:
    """A message's ``tool_calls``: a list of {"type": "function", "function": {"name", "arguments"}}."""
    if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
            and c["function"]["name"] and isinstance(c["function"].get("arguments", "{}"), (str, dict)) for c in calls):
        raise _bad(f"messages[{index}].tool_calls must be a list of {{\"type\": \"function\", \"function\": "
                   f"{{\"name\", \"arguments\"}}}} objects, got {_shown(calls)}", "messages")
    return calls


def _template_call(call: Dict[str, Any], index: int) -> Dict[str, Any]:
    """An OpenAI tool call of an assistant message as chat templates expect it: the function's
    ``arguments`` JSON text parsed into an object (templates write it with ``tojson``)."""
    function = call["function"]
    if not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        raise _bad(f"messages[{index}]: a tool call's function.arguments must be JSON text, got "
                   f"{_shown(function['arguments'])}", "messages") from None
    return dict(call, function=dict(function, arguments=arguments))


def _tool_calls(calls: List[ToolCall], parallel: bool) -> List[Dict[str, Any]]:
    """OpenAI's ``tool_calls`` of a message (the first call alone without parallel_tool_calls)."""
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls[:None if parallel else 1]]


async def _read_body(request: Any, max_body: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed max_body bytes."""
    length = request.headers.get("content-length")
    too_big = APIError(413, f"the request body is larger than {max_body} bytes (--max-body)",
                       code="request_too_large")
    if length is not None and length.isdigit() and int(length) > max_body:
        raise too_big
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(raw: bytes) -> Dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise _bad(f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


@contextlib.contextmanager
def _bad_input(model_path: str, model_name: str) -> Iterator[None]:
    """The library's errors for bad input (ValueError, TypeError, NotImplementedError: a chat
    message without a role, a template that refuses the conversation) as 400; the model
    directory's path in a message is replaced by the served model name (clients do not learn
    where the model lives on the server)."""
    try:
        yield
    except (ValueError, TypeError, NotImplementedError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        if model_path:
            message = message.replace(model_path, model_name)
        raise _bad(message) from None


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def create_app(model: Any, model_name: Optional[str] = None, max_batch: int = 32, max_queue: int = 64,
               max_body: int = MAX_BODY, max_length: Optional[int] = None, prefill_chunk: int = 64,
               kv_cache_dtype: Optional[str] = None, prefill_slowdown: float = 2.0,
               tool_call_parser: str = "auto") -> Any:
    """A FastAPI app serving ``model`` (a loaded Generator, Seq2Seq or Encoder; docs/serving.md).
    ``app.state.engine`` is its Engine; ``app.state.close()`` stops the worker. A decoder's
    sequences run in a continuous Batcher of max_batch slots of max_length positions (default:
    the model's context), computing at most prefill_chunk prompt tokens per step, and while
    sequences decode only as many as keep a step within about prefill_slowdown times a
    decode-only step (0: off). tool_call_parser: the format chat replies write tool calls in
    ("hermes", "llama3_json", "mistral"), "auto" (read off the chat template) or "none"."""
    fastapi, _ = _require()
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException

    if max_batch < 1 or max_queue < 1 or max_body < 1:
        raise ValueError("max_batch, max_queue and max_body must be >= 1")
    if model_name is None:
        model_name = os.path.basename(os.path.normpath(str(model._model_dir.path)))
    engine: Dict[str, Any] = {}
    if isinstance(model, Generator):
        engine = dict(max_length=max_length, prefill_chunk=prefill_chunk, kv_cache_dtype=kv_cache_dtype,
                      prefill_slowdown=prefill_slowdown)
    server = _Server(model, model_name, max_batch, max_queue, tool_call_parser, **engine)
    model_path = str(model._model_dir.path)
    app = fastapi.FastAPI(title="cpuformer", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.state.engine = server.engine
    app.state.close = server.engine.close

    @app.exception_handler(APIError)
    async def api_error(_request: Any, error: APIError) -> Any:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Any, error: Any) -> Any:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(error.status_code, str(error.detail), kind).body(), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def server_error(_request: Any, error: Exception) -> Any:  # a bug: 500, and uvicorn logs it
        return JSONResponse(APIError(500, f"{type(error).__name__}: {error}", "server_error").body(), status_code=500)

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": server.created,
                                            "owned_by": "cpuformer"}]}

    @app.get("/metrics")
    async def metrics() -> Any:
        return PlainTextResponse(server.metrics.render(server.engine.depth, server.engine.busy),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    def prepare(raw: bytes, chat: bool) -> Tuple[Dict[str, Any], List[List[int]], int, Dict[str, Any], bool,
                                                 Tuple[Optional[str], bool]]:
        """Parses, checks and tokenizes a generation request (in a thread: a large body does not hold
        up the event loop); the last item is (the tool-call format to read replies in or None,
        parallel_tool_calls)."""
        body = _parse_json(raw)
        server.check_model(body, "/v1/chat/completions" if chat else "/v1/completions")
        tools, tool_format, parallel = server.tool_request(body) if chat else (None, None, True)
        prompts = [server.chat_prompt(body, tools)] if chat else server.completion_prompts(body)
        n = _integer(body, "n", 1, 1)
        options = server.generation_options(body, chat, max(len(p) for p in prompts))
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _bad(f"stream must be true or false, got {_shown(stream)}", "stream")
        if stream and tool_format is not None and options.get("logprobs") is not None:
            raise _bad("logprobs with tools are not supported with stream: true", "logprobs")
        return body, prompts, n, options, stream, (tool_format, parallel)

    async def generation(request: Any, chat: bool) -> Any:
        body, prompts, n, options, stream, tools = await run_in_threadpool(
            prepare, await _read_body(request, max_body), chat)
        kind = "chat.completion" if chat else "text_completion"
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        if stream:
            if n != 1 or len(prompts) != 1:
                raise _bad("stream: true takes one prompt and n = 1", "n" if n != 1 else "prompt")
            if options.get("score_only"):
                raise _bad("max_tokens: 0 (scoring the prompt) is not supported with stream: true", "max_tokens")
            return streamed(request, prompts[0], options, chat, ident, created, body, tools)
        if len(prompts) * n > max_queue:
            raise _bad(f"this request asks for {len(prompts) * n} completions (prompts × n); at most {max_queue} "
                       "(--max-queue)", "n")
        jobs = [_Job("generate", ids=ids, options=_seeded(options, j)) for ids in prompts for j in range(n)]
        server.engine.submit(*jobs)
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, jobs))
        try:
            answers = [await _wait(job) for job in jobs]
        finally:
            watcher.cancel()
        if any(answer is None for answer in answers):  # cancelled: the client has gone
            raise APIError(499, "the client closed the connection", code="client_disconnected")
        if options.get("score_only"):  # the prompt alone: drop the one token chosen after it
            answers = [(server.model._decode(job.ids), "length", 0, None if scored is None else scored[:len(job.ids)])
                       for job, (_text, _reason, _count, scored) in zip(jobs, answers)]
        choices = []
        completion = 0
        for index, (text, reason, count, scored) in enumerate(answers):
            completion += count
            logprobs = None if scored is None else chat_logprobs(scored) if chat else completion_logprobs(scored)
            if chat:
                message: Dict[str, Any] = {"role": "assistant", "content": text}
                content, calls = parse_tool_calls(tools[0], text) if tools[0] is not None else (text, [])
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": _tool_calls(calls, tools[1])}
                    reason = "tool_calls"
                choices.append({"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason})
            else:
                choices.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason})
        prompt_tokens = sum(len(p) for p in prompts) * n
        return {"id": ident, "object": kind, "created": created, "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                          "total_tokens": prompt_tokens + completion}}

    def streamed(request: Any, ids: List[int], options: Dict[str, Any], chat: bool, ident: str, created: int,
                 body: Dict[str, Any], tools: Tuple[Optional[str], bool] = (None, True)) -> Any:
        loop = asyncio.get_running_loop()
        queue: "asyncio.Queue[Any]" = asyncio.Queue()
        job = _Job("generate", ids=ids, options=options, put=lambda x: loop.call_soon_threadsafe(queue.put_nowait, x))
        job.callbacks.append(lambda: loop.call_soon_threadsafe(queue.put_nowait, job))
        server.engine.submit(job)
        stream_options = body.get("stream_options") or {}
        usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: Dict[str, Any]) -> bytes:
            head = {"id": ident, "object": kind, "created": created, "model": model_name, "choices": [choice]}
            return _sse(dict(head, usage=None) if usage else head)

        held = ToolStream(tools[0]) if tools[0] is not None else None

        async def events() -> Any:
            try:
                if chat:
                    yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None})
                while True:
                    item = await queue.get()
                    if item is job:  # the job ended without a final item: an error
                        if job.error is not None:
                            error = job.error
                            status = error.status if isinstance(error, APIError) else 500
                            yield _sse(APIError(status, str(error), "server_error").body())
                        break
                    if isinstance(item, tuple):
                        reason, count = item
                        if held is not None:  # the held end of the reply: content, or the tool calls
                            rest, calls = held.finish()
                            if rest:
                                yield chunk({"index": 0, "delta": {"content": rest}, "logprobs": None,
                                             "finish_reason": None})
                            if calls:
                                deltas = [dict(call, index=i) for i, call in enumerate(_tool_calls(calls, tools[1]))]
                                yield chunk({"index": 0, "delta": {"tool_calls": deltas}, "logprobs": None,
                                             "finish_reason": None})
                                reason = "tool_calls"
                        end = {"index": 0, "logprobs": None, "finish_reason": reason}
                        yield chunk(dict(end, delta={}) if chat else dict(end, text=""))
                        if usage:
                            yield _sse({"id": ident, "object": kind, "created": created, "model": model_name,
                                        "choices": [], "usage": {"prompt_tokens": len(ids),
                                                                 "completion_tokens": count,
                                                                 "total_tokens": len(ids) + count}})
                        continue
                    logprobs = None
                    if isinstance(item, _Piece):
                        item, scored = item.text, item.scored
                        logprobs = chat_logprobs(scored) if chat else completion_logprobs(scored)
                    if held is not None:  # (no logprobs with tools in a stream)
                        item = held.feed(item)
                        if not item:
                            continue
                    if chat:
                        yield chunk({"index": 0, "delta": {"content": item}, "logprobs": logprobs,
                                     "finish_reason": None})
                    else:
                        yield chunk({"index": 0, "text": item, "logprobs": logprobs, "finish_reason": None})
                    if await request.is_disconnected():
                        break
                yield b"data: [DONE]\n\n"
            finally:
                job.cancelled.set()  # a client that went away stops the generation at its next piece

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def completions(request: Any) -> Any:
        with _bad_input(model_path, model_name):
            if server.seq2seq:
                return await translation(request)
            return await generation(request, False)

    async def translation(request: Any) -> Any:
        """/v1/completions on an encoder-decoder model: each prompt a source, its completion the
        model's output (requests with the same options that wait together share one generate call)."""
        def prepare_sources(raw: bytes) -> Tuple[Dict[str, Any], List[Any], int, Dict[str, Any], bool, int]:
            body = _parse_json(raw)
            server.check_model(body, "/v1/completions")
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise _bad(f"stream must be true or false, got {_shown(stream)}", "stream")
            sources, n, options, tokens = server.translation_request(body)
            if len(sources) > max_queue * server.engine.max_batch:
                raise _bad(f"prompt holds {len(sources)} sources; at most {max_queue * server.engine.max_batch}",
                           "prompt")
            return body, sources, n, options, stream, tokens

        body, sources, n, options, stream, tokens = await run_in_threadpool(prepare_sources,
                                                                            await _read_body(request, max_body))
        ident, created = "cmpl-" + uuid.uuid4().hex, int(time.time())
        if stream and n == 1 and len(sources) == 1 and isinstance(sources[0], str):
            # The stream's request is checked here (a bad tgt_lang is a 400, not an error event);
            # its generation starts when the worker takes the first piece.
            pieces = await run_in_threadpool(lambda: server.model.stream(
                sources[0], **{k: v for k, v in options.items() if k != "num_return_sequences"}))
            return streamed_translation(request, body, pieces, ident, created, tokens)
        job = server.engine.submit(_Job("translate", inputs=sources, options=options))
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, [job]))
        try:
            results = await _wait(job)
        finally:
            watcher.cancel()
        if results is None:
            raise APIError(499, "the client closed the connection", code="client_disconnected")
        per_source = options["num_return_sequences"]
        outputs = [results[i * per_source + (j if per_source > 1 else 0)] for i in range(len(sources))
                   for j in range(n)]
        prompt_tokens = tokens * n
        completion = sum(len(r.token_ids) for r in outputs)
        server.metrics.add(generated_tokens=completion, prompt_tokens=prompt_tokens)
        choices = [{"index": i, "text": r.text if r.text is not None else server.decode(r.token_ids), "logprobs": None,
                    "finish_reason": _FINISH.get(r.finish_reason, r.finish_reason)} for i, r in enumerate(outputs)]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion}
        answer = {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                  "choices": choices, "usage": usage}
        if not stream:
            return answer
        stream_options = body.get("stream_options") or {}
        include = isinstance(stream_options, dict) and stream_options.get("include_usage") is True

        def chunks() -> Iterator[bytes]:  # the whole output in one chunk per choice, then the end
            head = {"id": ident, "object": "text_completion", "created": created, "model": model_name}
            for c in choices:
                yield _sse(dict(head, choices=[dict(c, finish_reason=None)], **({"usage": None} if include else {})))
                yield _sse(dict(head, choices=[dict(c, text="")], **({"usage": None} if include else {})))
            if include:
                yield _sse(dict(head, choices=[], usage=usage))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def chat_completions(request: Any) -> Any:
        with _bad_input(model_path, model_name):
            return await generation(request, True)

    async def embeddings(request: Any) -> Any:
        with _bad_input(model_path, model_name):
            return await embedding(request)

    async def embedding(request: Any) -> Any:
        def prepare(raw: bytes) -> Tuple[Dict[str, Any], List[Any], int, int]:
            body = _parse_json(raw)
            server.check_model(body, "/v1/embeddings")
            return (body, *server.embedding_inputs(body))

        body, inputs, tokens, dimensions = await run_in_threadpool(prepare, await _read_body(request, max_body))
        vectors = await _wait(server.engine.submit(_Job("embed", inputs=inputs)))
        if dimensions < server.dimensions:  # the first components (Matryoshka), at unit length if the model's are
            vectors = np.asarray(vectors, np.float32)[:, :dimensions]
            if server.normalized:
                vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        server.metrics.add(prompt_tokens=tokens)
        base64_out = body.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() if base64_out
                 else np.asarray(v, np.float32).tolist()} for i, v in enumerate(vectors)]
        # Serialized here: FastAPI's generic encoder walks every float of the vectors (~0.3 ms each).
        return Response(json.dumps({"object": "list", "data": data, "model": model_name,
                                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                                   separators=(",", ":")), media_type="application/json")

    def streamed_translation(request: Any, body: Dict[str, Any], pieces: Any, ident: str, created: int,
                             prompt_tokens: int) -> Any:
        """One source's completion as its Seq2Seq.stream's text pieces (the worker runs the stream,
        alone, while the client reads it)."""
        loop = asyncio.get_running_loop()
        queue: "asyncio.Queue[Any]" = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> Tuple[Optional[str], int]:
            try:
                for piece in pieces:
                    if job.cancelled.is_set():
                        break
                    put(piece)
            finally:
                pieces.close()
            return pieces.finish_reason, pieces.num_tokens

        job = _Job("run", run)
        job.callbacks.append(lambda: put(job))
        server.engine.submit(job)
        stream_options = body.get("stream_options") or {}
        include = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
        head = {"id": ident, "object": "text_completion", "created": created, "model": model_name}

        def chunk(text: str, reason: Optional[str]) -> bytes:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            return _sse(dict(head, choices=[choice], **({"usage": None} if include else {})))

        async def events() -> Any:
            try:
                while True:
                    item = await queue.get()
                    if item is job:
                        if job.error is not None:
                            status = job.error.status if isinstance(job.error, APIError) else 400 if isinstance(
                                job.error, (ValueError, TypeError)) else 500
                            yield _sse(APIError(status, str(job.error), "server_error").body())
                        elif job.result is not None:
                            reason, count = job.result
                            server.metrics.add(generated_tokens=count, prompt_tokens=prompt_tokens)
                            yield chunk("", _FINISH.get(reason or "stop", reason))
                            if include:
                                yield _sse(dict(head, choices=[], usage={
                                    "prompt_tokens": prompt_tokens, "completion_tokens": count,
                                    "total_tokens": prompt_tokens + count}))
                        break
                    yield chunk(item, None)
                    if await request.is_disconnected():
                        break
                yield b"data: [DONE]\n\n"
            finally:
                job.cancelled.set()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def tokenize(request: Any) -> Any:
        with _bad_input(model_path, model_name):
            return await run_in_threadpool(lambda raw: server.tokenize(_checked(raw)), await _read_body(request,
                                                                                                        max_body))

    async def detokenize(request: Any) -> Any:
        with _bad_input(model_path, model_name):
            return await run_in_threadpool(lambda raw: server.detokenize(_checked(raw)), await _read_body(request,
                                                                                                          max_body))

    def _checked(raw: bytes) -> Dict[str, Any]:
        """The body, its model checked if it names one (vLLM's /tokenize makes it optional)."""
        body = _parse_json(raw)
        if body.get("model") is not None and body["model"] != model_name:
            server.check_model(body, "/tokenize")
        return body

    async def classify(request: Any) -> Any:
        with _bad_input(model_path, model_name):
            def prepare(raw: bytes) -> Tuple[List[str], int]:
                body = _parse_json(raw)
                server.check_model(body, "/classify")
                return server.classify_inputs(body)

            texts, tokens = await run_in_threadpool(prepare, await _read_body(request, max_body))
            results = await _wait(server.engine.submit(_Job("classify", inputs=texts)))
            server.metrics.add(prompt_tokens=tokens)
            labels = list(server.model.labels)
            data = []
            for i, ranked in enumerate(results):
                scores = {r["label"]: r["score"] for r in ranked}
                data.append({"index": i, "label": ranked[0]["label"], "probs": [scores[label] for label in labels],
                             "num_classes": len(labels)})
            return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                    "model": model_name, "data": data,
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def reranker(path: str) -> Callable[[Any], Any]:
        async def rerank(request: Any) -> Any:
            with _bad_input(model_path, model_name):
                return await reranking(request, path)
        return rerank

    async def reranking(request: Any, path: str) -> Any:
        def prepare(raw: bytes) -> Tuple[List[Tuple[str, str]], Optional[int], bool, int]:
            body = _parse_json(raw)
            server.check_model(body, path)
            return server.rerank_inputs(body)

        pairs, top_n, returned, tokens = await run_in_threadpool(prepare, await _read_body(request, max_body))
        scores = await _wait(server.engine.submit(_Job("score", inputs=pairs)))
        server.metrics.add(prompt_tokens=tokens)
        order = sorted(range(len(pairs)), key=lambda i: -float(scores[i]))[:top_n]
        results = [dict({"index": i, "relevance_score": float(scores[i])},
                        **({"document": {"text": pairs[i][1]}} if returned else {})) for i in order]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": model_name, "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    # The annotation FastAPI reads to pass the Request (this module's annotations are strings).
    for path, handler in (("/v1/completions", completions), ("/v1/chat/completions", chat_completions),
                          ("/v1/embeddings", embeddings), ("/tokenize", tokenize), ("/detokenize", detokenize),
                          *((p, reranker(p)) for p in _RERANK_PATHS), *((p, classify) for p in _CLASSIFY_PATHS)):
        handler.__annotations__["request"] = fastapi.Request
        app.post(path)(handler)
    return _Timed(app, server.metrics)


class _Timed:
    """ASGI wrapper: counts requests by endpoint and status and times them (until the last byte)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.state = app.state
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [500]

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        endpoint = scope["path"] if scope["path"] in _ENDPOINTS else "other"
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.request(endpoint, status[0], time.perf_counter() - start)


def serve(model: Any, host: str = "127.0.0.1", port: int = 8000, model_name: Optional[str] = None,
          max_batch: int = 32, max_queue: int = 64, max_body: int = MAX_BODY, log_level: str = "info",
          max_length: Optional[int] = None, prefill_chunk: int = 64, kv_cache_dtype: Optional[str] = None,
          prefill_slowdown: float = 2.0, tool_call_parser: str = "auto") -> None:
    """Serves ``model`` with uvicorn until interrupted (``cpuformer serve``)."""
    _, uvicorn = _require()
    app = create_app(model, model_name, max_batch, max_queue, max_body, max_length, prefill_chunk, kv_cache_dtype,
                     prefill_slowdown, tool_call_parser)
    # The worker thread takes the GIL back after every step, while the event loop's thread sends
    # the step's tokens: a 1 ms switch interval (not 5) keeps that wait short. (Process-wide,
    # hence here, in the server's own process, and not in create_app.)
    sys.setswitchinterval(0.001)
    batcher = app.state.engine.batcher
    if batcher is not None:  # what the server holds from its start on
        print(f"cpuformer serve: {batcher.capacity} sequences × {batcher.max_length} positions; KV cache "
              f"{kv_cache_dtype or 'float32'}, {batcher.kv_cache_bytes / 2 ** 20:.0f} MiB (--max-batch, --max-length, "
              "--kv-cache-dtype)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    finally:
        app.state.close()


__all__ = ["APIError", "Engine", "MAX_BODY", "Metrics", "create_app", "serve"]
