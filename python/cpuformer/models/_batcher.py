"""``Generator.batcher()``: continuous batching (docs/decoders.md, "Continuous batching").

Requests of different lengths and arrival times share every forward pass of one decoder: the
C++ ``BatchDecoder`` (csrc/models/batch_decoder.h) admits them into free KV-cache slots, feeds
each running sequence one token per step together with chunks of newly admitted prompts, and
retires sequences as they end. Each request's tokens are the ones ``generate()`` gives it alone.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from .._arguments import check_integer

#: Most alternatives ``logprobs`` / ``prompt_logprobs`` report per token (OpenAI's top_logprobs limit).
MAX_LOGPROBS = 20


class TokenLogProb(NamedTuple):
    """A token's log-probability under the model's own distribution (log_softmax of the raw
    logits: before repetition penalty, temperature, top-k / top-p or any other processor) and the
    ``top`` most likely tokens of that distribution as (token, log-probability), most likely first
    (equal values: lower id first)."""
    token: int
    log_prob: float
    top: List[Tuple[int, float]]


class BatchEvent(NamedTuple):
    """A token chosen for a request by Batcher.step(). finish_reason: None while the request
    runs, "eos" or "length" when this token ended it. logprobs: with submit(logprobs=n), the
    token's TokenLogProb (n alternatives). prompt_logprobs: with submit(prompt_logprobs=n), on the
    request's first event, a TokenLogProb for each prompt token after the first (each under the
    distribution of the positions before it)."""
    request: int
    token: int
    log_prob: Optional[float]
    finish_reason: Optional[str]
    logprobs: Optional[TokenLogProb] = None
    prompt_logprobs: Optional[List[TokenLogProb]] = None


class Batcher:
    """Continuous batching over one Generator: ``submit()`` requests at any time, call ``step()``
    to run one forward pass over all of them, ``cancel()`` to drop one. Threads may share a
    Batcher: its calls take turns, and ``step()`` releases the GIL while it computes (a
    ``submit()`` from another thread waits for the running step). ``cpuformer serve`` drives one
    from its worker thread.

    capacity: the sequences that run together (KV-cache slots); more requests wait, first come
    first served. max_length: the longest prompt + max_new_tokens of a request (default: the
    model's max_positions); the KV cache holds capacity × max_length positions, allocated once.
    prefill_chunk: the prompt tokens one step computes at most (a long prompt takes several steps,
    so running sequences keep producing tokens meanwhile). prefill_slowdown: 0 (the default), or s
    >= 1: while sequences are decoding, a step computes only as many prompt tokens as keep it
    within about s times a decode-only step of every request present, as measured while the
    batcher runs (at least 4, at most prefill_chunk; the tokens of every request are unchanged).
    kv_cache_dtype as generate()'s.
    prefix_reuse: a request whose prompt begins like the tokens cached in a slot (a finished
    request's, or a running one's) reuses their keys and values instead of computing them.
    """

    def __init__(self, generator: Any, batch: Any) -> None:
        self._gen = generator  # made by Generator.batcher(), which checks the arguments
        self._core = batch
        self._ids = itertools.count()  # next() is atomic: threads may submit at once
        self._log_probs: Dict[int, bool] = {}

    @property
    def capacity(self) -> int:
        return self._core.capacity

    @property
    def max_length(self) -> int:
        return self._core.max_len

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the KV cache (capacity × max_length positions), allocated and written when
        the batcher was made."""
        return self._core.kv_bytes

    @property
    def waiting(self) -> int:
        """Requests queued for a free slot."""
        return self._core.waiting

    @property
    def running(self) -> int:
        """Requests in the batch (prefilling or decoding)."""
        return self._core.running

    def stats(self) -> Dict[str, int]:
        """Counters since creation: steps (forward passes), decode_tokens, prefill_tokens (prompt
        tokens computed), reused_tokens (prompt tokens taken from cached prefixes), copied_tokens
        (of those, copied from a running request's slot), last_batch (sequences in the last step),
        prefill_budget (the prompt tokens the last step could take)."""
        return dict(self._core.stats())

    def submit(self, prompt: Union[str, Sequence[int]], max_new_tokens: int = 20, min_new_tokens: int = 0,
               do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               repetition_penalty: float = 1.0, eos_token_id: Union[None, int, Sequence[int]] = None,
               seed: Optional[int] = None, return_log_probs: bool = False,
               bad_words_ids: Optional[Sequence[Sequence[int]]] = None, no_repeat_ngram_size: int = 0,
               logprobs: Optional[int] = None, prompt_logprobs: Optional[int] = None,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
               logit_bias: Optional[Mapping[int, float]] = None) -> int:
        """Queues one prompt (token ids, or a string with tokenizer.json) with generate()'s options
        for greedy search or sampling; returns the request's id (an int, unique in this Batcher).
        logprobs / prompt_logprobs (0..20, None: off): each event's BatchEvent.logprobs, and the
        first event's BatchEvent.prompt_logprobs, with that many alternatives per token (a request
        with prompt_logprobs computes its whole prompt: no prefix reuse). presence_penalty,
        frequency_penalty and logit_bias as in generate()."""
        wants = [-1 if n is None else check_integer(name, n, 0, MAX_LOGPROBS, " or None")
                 for name, n in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs))]
        ids, options = self._gen._request(prompt, max_new_tokens, min_new_tokens, do_sample, temperature, top_k,
                                          top_p, repetition_penalty, eos_token_id, seed, return_log_probs,
                                          bad_words_ids, no_repeat_ngram_size, presence_penalty,
                                          frequency_penalty, logit_bias)
        if len(ids) + options["max_new_tokens"] > self.max_length:
            raise ValueError(f"prompt length {len(ids)} + max_new_tokens {options['max_new_tokens']} exceeds "
                             f"the batcher's max_length of {self.max_length} tokens")
        request = next(self._ids)
        self._log_probs[request] = bool(return_log_probs)
        try:
            self._core.add(request, ids, options, *wants)
        except BaseException:
            self._log_probs.pop(request, None)
            raise
        return request

    def cancel(self, request: int) -> bool:
        """Ends a waiting or running request now (its slot is free for the next one); False if it
        is not here (already ended, or never submitted)."""
        self._log_probs.pop(request, None)
        return bool(self._core.cancel(int(request)))

    def step(self) -> List[BatchEvent]:
        """One forward pass over the running requests (admitting waiting ones first); the tokens it
        chose, in no particular order (empty when there is nothing to run)."""
        self._gen._live()
        out = []
        for request, token, log_prob, reason, logprobs, prompt in self._core.step():
            wants = self._log_probs.get(request, False)
            if reason is not None:
                self._log_probs.pop(request, None)
            out.append(BatchEvent(request, token, log_prob if wants else None, reason,
                                  None if logprobs is None else TokenLogProb(token, *logprobs),
                                  None if prompt is None else [TokenLogProb(*p) for p in prompt]))
        return out

    def run(self, prompts: Sequence[Union[str, Sequence[int]]], **options: Any) -> List[List[int]]:
        """Submits every prompt with the same options (a seed is used as given for each) and steps
        until all have ended; the new tokens of each prompt, in order (EOS included when produced)."""
        requests = [self.submit(p, **options) for p in prompts]
        tokens: Dict[int, List[int]] = {r: [] for r in requests}
        left = set(requests)
        while left:
            for event in self.step():
                if event.request in tokens:
                    tokens[event.request].append(event.token)
                    if event.finish_reason is not None:
                        left.discard(event.request)
        return [tokens[r] for r in requests]


__all__ = ["BatchEvent", "Batcher"]
