"""``cpuformer.Generator``: decoder-only causal language models and text generation.

The supported families are the registry's decoders (``cpuformer.arch``, kind "decoder").
Loading (``weights.py``, ``models/_graph.py``) packs each layer's projections and releases the
layer's source pages right after. The embedding tables are copied into memory the C++ model owns
and the weights maps are closed when loading ends, so a loaded model does not depend on its files.

Generation runs entirely in C++ (prefill, decode steps with an in-place KV cache, logits
processing, sampling and beam bookkeeping); Python is only called per token to stream.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from .._arguments import INT64_MAX, check_integer, check_prefill_slowdown
from .._model_dir import ModelDir, _describe
from ._base import Generated, ModelBase, Prompts, TokenIds
from ._batcher import Batcher
from ._inputs import as_2d
from ._result import GenerationResult, GenerationStream, StreamState, log_probs_needed, results
from ._speculative import speculation
from ._text import StopWatch, TextMixin, check_stop, cut_at_stop, text_pieces

PathLike = Union[str, os.PathLike]


#: kv_cache_dtype names and the C++ KvType codes (kernels/attention/attention.h).
KV_CACHE_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}


def kv_cache_code(kv_cache_dtype: Optional[str]) -> int:
    """The KvType code of a kv_cache_dtype argument (None: float32)."""
    if kv_cache_dtype is None:
        return 0
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)} or None, got {kv_cache_dtype!r}")
    return KV_CACHE_DTYPES[kv_cache_dtype]


def check_bad_words(value: Any, vocab_size: int, source: str = "") -> List[List[int]]:
    """bad_words_ids: a list of non-empty token-id lists (transformers' NoBadWordsLogitsProcessor:
    a list's last token is banned right after the others; a one-token list everywhere)."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(word, (list, tuple)) and word and
            all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < vocab_size for t in word)
            for word in value):
        raise ValueError(f"{source}'bad_words_ids' must be a list of non-empty lists of token ids (integers in "
                         f"[0, {vocab_size})), got {_describe(value)}")
    return [[int(t) for t in word] for word in value]


def _option_error(name: str, value: Any, bound: str = "") -> ValueError:
    """The error for a generation option that is not a value of its C++ type, worded with the
    option's rule from the C++ checks (_core.generation_option_rule), as their own messages are.
    `bound` goes before the rule's note in parentheses: "an integer >= 0 and <= 2**63 - 1 (0 disables
    it)", as every integer option beyond int64 is worded (_arguments.check_integer)."""
    rule = _core.generation_option_rule(name)
    head, note = (rule.split(" (", 1) + [""])[:2]
    return ValueError(f"{name} must be {head}{bound}{' (' + note if note else ''}, got {value!r}")


def option_integer(name: str, value: Any) -> int:
    """A generation option that the C++ checks read as an int64: an int (not a bool) within int64.
    Its range is checked there (_core.check_generation_request)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < -INT64_MAX - 1:
        raise _option_error(name, value)
    if value > INT64_MAX:
        raise _option_error(name, value, " and <= 2**63 - 1")
    return int(value)


def option_number(name: str, value: Any) -> float:
    """A generation option that the C++ checks read as a double: an int or float that converts to
    a float (an int beyond ~1.8e308 does not). Finiteness and range are checked there."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise _option_error(name, value)
    try:
        return float(value)
    except OverflowError:
        raise _option_error(name, value) from None


def sequence_options(options: Dict[str, Any], num_return_sequences: Any, no_repeat_ngram_size: Any) -> None:
    """Checks num_return_sequences (beam search: at most num_beams; sampling: samples per input;
    greedy search: 1, as transformers) and no_repeat_ngram_size, and adds them to options."""
    n = check_integer("num_return_sequences", num_return_sequences, 0)
    ngram = option_integer("no_repeat_ngram_size", no_repeat_ngram_size)
    _core.check_generation_request(no_repeat_ngram_size=ngram)
    beams = options["num_beams"]
    if beams > 1 and not 1 <= n <= beams:
        raise ValueError(f"num_return_sequences ({n}) must be between 1 and num_beams ({beams})")
    if beams == 1 and n < 1:
        raise ValueError(f"num_return_sequences must be >= 1, got {n}")
    if beams == 1 and n > 1 and not options["do_sample"]:
        raise ValueError(f"num_return_sequences ({n}) > 1 needs beam search (num_beams > 1) or sampling "
                         "(do_sample=True): greedy search gives one sequence per input")
    options.update(num_return_sequences=int(n), no_repeat_ngram_size=int(ngram))


def penalty_options(options: Dict[str, Any], vocab_size: int, presence_penalty: Any, frequency_penalty: Any,
                    logit_bias: Optional[Mapping[int, float]]) -> None:
    """Adds OpenAI's presence / frequency penalties and logit_bias ({token id: bias}) to options;
    their ranges ([-2, 2]; ids in the vocabulary, biases in [-100, 100]) are the C++ checks'
    (_core.check_penalties_and_bias), which every generating call repeats."""
    ids: List[int] = []
    values: List[float] = []
    if logit_bias is not None:
        if not isinstance(logit_bias, Mapping):
            raise TypeError(f"logit_bias must be a dict of token id -> bias, got {type(logit_bias).__name__}")
        for token, bias in logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or \
                    not -INT64_MAX - 1 <= token <= INT64_MAX:
                raise ValueError(f"logit_bias keys must be token ids (integers), got {token!r}")
            try:
                if isinstance(bias, bool) or not isinstance(bias, (int, float, np.floating, np.integer)):
                    raise TypeError
                values.append(float(bias))  # (its range: the C++ check below)
            except (TypeError, OverflowError):
                raise ValueError(f"logit_bias of token {token} must be a number in [-100, 100], got {bias!r}") \
                    from None
            ids.append(int(token))
    presence = option_number("presence_penalty", presence_penalty)
    frequency = option_number("frequency_penalty", frequency_penalty)
    _core.check_penalties_and_bias(presence, frequency, ids, values, vocab_size)
    options.update(presence_penalty=presence, frequency_penalty=frequency, logit_bias_ids=ids,
                   logit_bias_values=values)


class Generator(TextMixin, ModelBase):
    """A decoder-only causal LM loaded from a Hugging Face model directory.

    ``Generator(path, dtype=None, num_threads=None, quantization=None, draft_dtype=None)``
    (draft_dtype: also pack the weights in that dtype from the same read, as the draft that
    ``generate(assistant_model=draft_dtype)`` uses). ``gen.logits(input_ids,
    attention_mask=None)`` gives float32 [B, T, V]; ``gen.generate(prompts, ...)`` generates
    (arguments named as in Hugging Face's generate()); ``gen.stream(prompt, ...)`` yields tokens as
    they are produced.
    """

    _INPUT = "prompt"  # what the error messages call one input sequence

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, quantization: Optional[Mapping[str, Any]] = None,
                 draft_dtype: Optional[str] = None):
        self._tokenizer = None
        model_dir = self._open(path, dtype, num_threads, "decoder", quantization=quantization,
                               draft_dtype=draft_dtype)
        self._defaults(model_dir)

    def _defaults(self, md: ModelDir) -> None:
        # The C++ registry's reading of the config files (csrc/models/arch/checkpoint.h:
        # generation_defaults), as the C API's: ids checked for type and int64 range, naming file and
        # key; eos ids against the vocabulary when generate() uses them (a call can pass its own
        # eos_token_id), and a pad id outside [0, vocab_size) means no pad token, as the C++ loop
        # treats it.
        defaults = _core.generation_defaults(os.fspath(md.path), md.config, md.generation_config)
        self._eos_source = defaults["eos_source"]
        self.eos_token_ids = defaults["eos_token_ids"]
        self.pad_token_id = defaults["pad_token_id"]
        self.bad_words_ids = defaults["bad_words_ids"]

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    # ---- forward ---------------------------------------------------------------------------

    def logits(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Next-token logits at every position, float32 [B, T, V]. Positions follow the mask like
        Hugging Face's generate() (cumsum(mask) - 1), so a left-padded row gives the logits it
        gives alone; rows at padded positions carry no meaning."""
        model = self._live()
        ids = as_2d(input_ids, "input_ids", vocab_size=self.vocab_size)
        mask = None if attention_mask is None else as_2d(attention_mask, "attention_mask", allow_bool=True)
        return model.logits(ids, mask, self.num_threads)

    # ---- generation ------------------------------------------------------------------------

    def _options(self, max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
                 num_beams, length_penalty, early_stopping, eos_token_id, seed, return_log_probs) -> Dict[str, Any]:
        # Python's values become the C++ types here (the Python-only part: types, ints beyond
        # int64, beyond float); the rules and their messages are the C API's, in one place
        # (csrc/models/request_checks.h; NotImplementedError for beam sampling).
        max_new_tokens = option_integer("max_new_tokens", max_new_tokens)
        min_new_tokens = option_integer("min_new_tokens", min_new_tokens)
        temperature = option_number("temperature", temperature)
        top_p = option_number("top_p", top_p)
        repetition_penalty = option_number("repetition_penalty", repetition_penalty)
        length_penalty = option_number("length_penalty", length_penalty)
        top_k = option_integer("top_k", top_k)
        num_beams = option_integer("num_beams", num_beams)
        _core.check_generation_request(max_new_tokens, min_new_tokens, bool(do_sample), temperature, top_k, top_p,
                                       repetition_penalty, num_beams, length_penalty)
        # Python-only options: the C API has no early_stopping, takes eos ids as a typed array
        # and any uint64 seed.
        if early_stopping not in (False, True, "never"):
            raise ValueError(f"early_stopping must be False, True or 'never', got {early_stopping!r}")
        if eos_token_id is None:
            eos = list(self.eos_token_ids)
            for v in eos:
                if not 0 <= v < self.vocab_size:
                    raise ValueError(f"the default eos_token_id {v} (from {self._eos_source}) is out of range; "
                                     f"token ids must be in [0, {self.vocab_size}) (vocab_size); pass eos_token_id=")
        else:
            values = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
            eos = []
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise TypeError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
                if not 0 <= v < self.vocab_size:
                    raise ValueError(f"eos_token_id {v} is out of range; token ids must be in "
                                     f"[0, {self.vocab_size}) (vocab_size)")
                eos.append(int(v))
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be an integer in [0, 2**64) or None, got {seed!r}")
        return dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=bool(do_sample),
                    temperature=temperature if do_sample else 1.0, top_k=top_k if do_sample else 0,
                    top_p=top_p if do_sample else 1.0, repetition_penalty=repetition_penalty, num_beams=num_beams,
                    length_penalty=length_penalty,
                    early_stopping={False: 0, True: 1, "never": 2}[early_stopping], eos_token_ids=eos,
                    pad_token_id=int(self.pad_token_id), seed=int(seed), return_log_probs=bool(return_log_probs))

    def generate(self, prompts: Prompts, max_new_tokens: int = 20, min_new_tokens: int = 0, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 num_beams: int = 1, length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
                 eos_token_id: Union[None, int, Sequence[int]] = None, seed: Optional[int] = None,
                 return_log_probs: bool = False, assistant_model: Any = None,
                 num_assistant_tokens: Optional[int] = None, prompt_lookup_num_tokens: Optional[int] = None,
                 max_matching_ngram_size: Optional[int] = None, num_assistant_tokens_schedule: str = "heuristic",
                 kv_cache_dtype: Optional[str] = None, bad_words_ids: Optional[Sequence[Sequence[int]]] = None,
                 stop: Union[None, str, Sequence[str]] = None, return_stats: bool = False,
                 num_return_sequences: int = 1, no_repeat_ngram_size: int = 0,
                 return_scores: bool = False, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: Optional[Mapping[int, float]] = None) -> Generated:
        """New tokens for each prompt (list[list[int]]; EOS included when produced).

        prompts: a list of token ids (one prompt), a list of token-id lists (a batch; left-padded
        internally, each stops on its own EOS), a string or a list of strings (needs
        tokenizer.json; the result is then a string or a list of strings). Greedy by default;
        do_sample with temperature / top_k / top_p (reproducible for a given seed); num_beams > 1
        is beam search as in transformers. eos_token_id defaults to generation_config.json, else
        config.json. return_log_probs=True returns (tokens, log_probs), the log-probability of each
        chosen token under the processed distribution (for beams: the step's beam score increment).

        Speculative decoding (one prompt, greedy or sampling; docs/decoders.md): assistant_model= a
        smaller Generator with the same tokenizer, or a dtype name ('int8', 'int4') for this
        checkpoint's own weights at that dtype, drafts num_assistant_tokens tokens (5 at first,
        adapted as it runs) that the model verifies in one pass; prompt_lookup_num_tokens=k drafts
        up to k tokens that followed the last max_matching_ngram_size (2) tokens earlier in the
        prompt or output. Greedy output equals plain decoding token for token; sampling keeps the
        model's distribution; num_assistant_tokens_schedule="constant" keeps the draft length fixed.
        return_stats=True appends a dict (target_passes, draft_tokens, accepted_tokens; None
        without speculation) to the result. kv_cache_dtype: the KV cache's element type,
        "float32" (default), "float16", "bfloat16" or "int8" (docs/decoders.md). bad_words_ids:
        token-id sequences never to generate (with generation_config.json's), as transformers'.
        stop: a string or strings that end a sequence once its text holds one (needs tokenizer.json;
        text results are cut before it, token results end with the token that completed it; beam
        search cuts its final text only).
        num_return_sequences: beam search, the n best beams (n ≤ num_beams); sampling, n samples per
        prompt; prompt i's sequences are results [i·n, i·n + n) (a list of texts even for one
        string prompt when n > 1). no_repeat_ngram_size: bans a token that would repeat an n-gram
        of the prompt and output (transformers' NoRepeatNGramLogitsProcessor).
        presence_penalty / frequency_penalty (in [-2, 2], OpenAI's): each token's logit loses
        presence_penalty once it has been generated and frequency_penalty for every time it has
        (the prompt does not count); logit_bias: {token id: bias in [-100, 100]} added to the
        logits at every step (docs/decoders.md, "Penalties and logit bias").
        return_scores=True returns a list of cpuformer.GenerationResult, one per returned sequence
        (token_ids, text, finish_reason, log_probs, score) instead of the tokens or texts
        (docs/decoders.md, "Results, scores and finish reasons"); with return_stats, (results, stats).
        """
        model = self._live()
        ids, kind = self._prompts(prompts)
        options = self._options(max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
                                repetition_penalty, num_beams, length_penalty, early_stopping, eos_token_id, seed,
                                log_probs_needed(return_log_probs, return_scores))
        sequence_options(options, num_return_sequences, no_repeat_ngram_size)
        penalty_options(options, self.vocab_size, presence_penalty, frequency_penalty, logit_bias)
        draft = speculation(self, ids, options, assistant_model, num_assistant_tokens, prompt_lookup_num_tokens,
                            max_matching_ngram_size, num_assistant_tokens_schedule)
        self._add_options(options, kv_cache_dtype, bad_words_ids)
        return self._generated(model, ids, kind, options, draft, stop, return_log_probs, return_stats, return_scores)

    def _generated(self, model, ids, kind, options, draft, stop, return_log_probs, return_stats,
                   return_scores) -> Generated:
        """Runs a checked generate() request (its stop strings watched) and shapes its return value."""
        stops, on_token = self._stop_watch(stop, len(ids) * options["num_return_sequences"])
        tokens, log_probs, stats, reasons, beam_scores = model.generate(ids, options, on_token, self.num_threads,
                                                                        draft)
        if return_scores:
            return self._scored(tokens, kind, log_probs, reasons, beam_scores, stops, stats, return_stats)
        return self._result(tokens, kind, log_probs if return_log_probs else None, stats, return_stats,
                            one_text=options["num_return_sequences"] == 1, stops=stops)

    def batcher(self, capacity: int = 8, max_length: Optional[int] = None, prefill_chunk: int = 256,
                kv_cache_dtype: Optional[str] = None, prefix_reuse: bool = True,
                prefill_slowdown: float = 0.0) -> Batcher:
        """A continuous batcher over this model (cpuformer.Batcher; docs/decoders.md,
        "Continuous batching"): requests submitted at any time share every forward pass, and
        each gets the tokens generate() gives it alone."""
        model = self._live()
        capacity = check_integer("capacity", capacity, 1)
        max_length = self.max_positions if max_length is None else check_integer("max_length", max_length, 1)
        if max_length > self.max_positions:
            raise ValueError(f"max_length must be at most the model's max_positions ({self.max_positions}), "
                             f"got {max_length}")
        prefill_chunk = check_integer("prefill_chunk", prefill_chunk, 1)
        prefill_slowdown = check_prefill_slowdown(prefill_slowdown)
        batch = _core.BatchDecoder(model, capacity, max_length, prefill_chunk, kv_cache_code(kv_cache_dtype),
                                   bool(prefix_reuse), self.num_threads, prefill_slowdown)
        return Batcher(self, batch)

    def _request(self, prompt, max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
                 repetition_penalty, eos_token_id, seed, return_log_probs, bad_words_ids,
                 no_repeat_ngram_size, presence_penalty=0.0, frequency_penalty=0.0,
                 logit_bias=None) -> Tuple[List[int], Dict[str, Any]]:
        """One Batcher request's token ids and C++ options (greedy search or sampling, checked)."""
        self._live()
        ids, _ = self._prompts(prompt)
        if len(ids) != 1:
            raise ValueError(f"submit() takes one prompt, got {len(ids)}")
        options = self._options(max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
                                repetition_penalty, 1, 1.0, False, eos_token_id, seed, return_log_probs)
        if options["max_new_tokens"] < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sequence_options(options, 1, no_repeat_ngram_size)
        penalty_options(options, self.vocab_size, presence_penalty, frequency_penalty, logit_bias)
        self._add_options(options, None, bad_words_ids)  # (the batcher's cache has its own type)
        return ids[0], options

    def _add_options(self, options: Dict[str, Any], kv_cache_dtype: Optional[str],
                     bad_words_ids: Optional[Sequence[Sequence[int]]]) -> None:
        """The KV-cache type code and the banned words (generation_config.json's and the call's)."""
        options["kv_cache_dtype"] = kv_cache_code(kv_cache_dtype)
        options["bad_words_ids"] = self.bad_words_ids + check_bad_words(bad_words_ids, self.vocab_size)

    def _scored(self, tokens: List[List[int]], kind: str, log_probs: List[List[float]], reasons: List[str],
                beam_scores: Optional[List[float]], stops: Sequence[str], stats: Optional[Dict[str, int]],
                return_stats: bool) -> Any:
        """generate(return_scores=True)'s return value: a GenerationResult per sequence (and stats)."""
        texts: Optional[List[str]] = None
        stopped: Optional[List[bool]] = None
        if kind in ("str", "strs") or stops:
            cuts = [cut_at_stop(self._decode(t), stops) for t in tokens]
            stopped = [found for _, found in cuts]
            texts = [text for text, _ in cuts] if kind in ("str", "strs") else None
        out: List[GenerationResult] = results(tokens, log_probs, reasons, beam_scores, texts, stopped)
        return (out, stats) if return_stats else out

    def _result(self, tokens: List[List[int]], kind: str, log_probs: Optional[List[List[float]]],
                stats: Optional[Dict[str, int]], return_stats: bool, one_text: bool = True,
                stops: Sequence[str] = ()) -> Generated:
        """generate()'s return value: tokens or text (cut before the first stop string), then
        log_probs and stats when asked for."""
        def text(t: List[int]) -> str:
            return cut_at_stop(self._decode(t), stops)[0] if stops else self._decode(t)

        if kind == "str" and one_text:
            out: Any = text(tokens[0])
        elif kind in ("str", "strs"):
            out = [text(t) for t in tokens]
        else:
            out = tokens
        extra = ([log_probs] if log_probs is not None else []) + ([stats] if return_stats else [])
        return tuple([out] + extra) if extra else out  # type: ignore[return-value]

    def stream(self, prompt: Prompts, **kwargs: Any) -> GenerationStream:
        """Yields the new tokens of one prompt as they are produced (greedy or sampling; beam search
        yields the best sequence at the end). Given a string (and tokenizer.json), yields text
        pieces instead, each once it is final (one token behind), joining to generate()'s text.
        Takes generate()'s keyword arguments except return_log_probs, return_scores and
        num_return_sequences. Closing or dropping the iterator stops the generation. The iterator's
        finish_reason is "eos", "stop" or "length" once it is exhausted (None before, and after
        close())."""
        model = self._live()
        for name in ("return_log_probs", "return_scores"):
            if name in kwargs:
                raise TypeError(f"stream() does not return log-probabilities or scores; use generate({name}=True)")
        ids, kind = self._prompts(prompt)
        if len(ids) != 1:
            raise ValueError(f"stream() takes one prompt, got {len(ids)}")
        defaults = dict(max_new_tokens=20, min_new_tokens=0, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
                        repetition_penalty=1.0, num_beams=1, length_penalty=1.0, early_stopping=False,
                        eos_token_id=None, seed=None)
        speculative: Dict[str, Any] = dict(assistant_model=None, num_assistant_tokens=None,
                                           prompt_lookup_num_tokens=None, max_matching_ngram_size=None,
                                           num_assistant_tokens_schedule="heuristic")
        penalties = dict(presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None)
        unknown = set(kwargs) - set(defaults) - set(speculative) - set(penalties) - {
            "kv_cache_dtype", "bad_words_ids", "stop", "no_repeat_ngram_size"}
        if unknown:
            raise TypeError(f"stream() got unexpected keyword arguments {sorted(unknown)}")
        for group in (speculative, penalties):
            for key in group:
                group[key] = kwargs.pop(key, group[key])
        kv_cache_dtype = kwargs.pop("kv_cache_dtype", None)
        bad_words_ids = kwargs.pop("bad_words_ids", None)
        stops = self._check_stop(kwargs.pop("stop", None))
        no_repeat_ngram_size = kwargs.pop("no_repeat_ngram_size", 0)
        defaults.update(kwargs)
        options = self._options(return_log_probs=False, **defaults)
        sequence_options(options, 1, no_repeat_ngram_size)
        penalty_options(options, self.vocab_size, **penalties)
        draft = speculation(self, ids, options, **speculative)
        self._add_options(options, kv_cache_dtype, bad_words_ids)
        return GenerationStream(lambda state: self._stream(model, ids, options, kind == "str", state, draft, stops))

    def _stream(self, model, ids, options, text: bool, state: StreamState, draft=None,
                stops: Sequence[str] = ()) -> Iterator[Union[int, str]]:
        worker = _StreamWorker(model, ids, options, self.num_threads, draft)

        def counted() -> Iterator[int]:
            for token in worker.tokens():
                state.num_tokens += 1
                yield token

        try:
            if not text:
                watch = StopWatch(self._decode, stops) if stops else None
                for token in counted():
                    yield token
                    if watch is not None and watch.add(token):
                        state.finish_reason = "stop"
                        return  # the stop string is complete (finally: the worker stops)
                state.finish_reason = worker.finish_reason
                return
            stopped: List[bool] = []
            yield from text_pieces(counted(), self._decode, stops, on_stop=lambda: stopped.append(True))
            state.finish_reason = "stop" if stopped else worker.finish_reason
        finally:
            # Reached on exhaustion, on close() or garbage collection of an abandoned iterator and
            # on an exception in the consumer (KeyboardInterrupt while waiting for a token): the
            # worker stops at its next token, so no generation keeps running (and holding compute
            # slots) behind our back.
            worker.stop()

    def _check_stop(self, stop: Any) -> List[str]:
        """The stop strings (check_stop), after checking that the model has a tokenizer to read them."""
        stops = check_stop(stop)
        if stops:
            self._get_tokenizer("stop strings need the model's tokenizer to read the text")
        return stops

    def _stop_watch(self, stop: Any, count: int) -> Tuple[List[str], Any]:
        """(the stop strings, the C++ loop's token callback that ends a sequence at one, or None)."""
        stops = self._check_stop(stop)
        if not stops:
            return stops, None
        watches = [StopWatch(self._decode, stops) for _ in range(count)]
        return stops, lambda index, token: watches[index].add(token)

    def _shape_text(self) -> str:
        c = self.config
        return (f"layers={c['num_layers']}, hidden={c['hidden_size']}, "
                f"heads={c['num_heads']}/{c['num_kv_heads']}")

    # ---- chat (models/_chat.py; docs/decoders.md, "Chat") -------------------------------------

    _chat_template = None

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                            tools: Optional[Sequence[Mapping[str, Any]]] = None,
                            documents: Optional[Sequence[Mapping[str, Any]]] = None, **template_kwargs: Any) -> str:
        """The conversation as prompt text, rendered with the checkpoint's chat template as
        transformers' ``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` renders it.
        messages: a list of {"role": "system"|"user"|"assistant"|"tool", "content": str} dicts. Needs
        jinja2 (``pip install 'cpuformer[chat]'``)."""
        from ._chat import ChatTemplate

        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_directory(self._model_dir.path)
        return self._chat_template.render(messages, add_generation_prompt, tools=tools, documents=documents,
                                          **template_kwargs)

    def _chat_ids(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                  tools: Optional[Sequence[Mapping[str, Any]]] = None) -> List[int]:
        # The template writes BOS and the turn markers itself (apply_chat_template(tokenize=True)
        # encodes without adding special tokens).
        text = self.apply_chat_template(messages, add_generation_prompt, tools=tools)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError("the chat template rendered the messages as empty text")
        return ids

    def chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
             tools: Optional[Sequence[Mapping[str, Any]]] = None, **generate_kwargs: Any) -> str:
        """The model's reply to a conversation (its text, without special tokens): the messages are
        rendered with the checkpoint's chat template (apply_chat_template, with ``tools``: JSON
        schemas of functions the template describes to the model), encoded and passed to
        generate() as token ids with ``generate_kwargs`` (max_new_tokens, do_sample, stop, ...).
        A reply that calls a tool is text in the template's format (docs/decoders.md, "Chat")."""
        for key in ("return_log_probs", "return_stats"):
            if generate_kwargs.get(key):
                raise TypeError(f"chat() returns the reply text; for {key}=True call generate() on "
                                "tokenizer.encode(apply_chat_template(...), add_special_tokens=False)")
        stops = self._check_stop(generate_kwargs.get("stop"))
        ids = self._chat_ids(messages, add_generation_prompt, tools)
        text = self._decode(self.generate(ids, **generate_kwargs)[0])
        return cut_at_stop(text, stops)[0] if stops else text

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    tools: Optional[Sequence[Mapping[str, Any]]] = None, **kwargs: Any) -> Iterator[str]:
        """chat() streamed: yields the reply's text pieces as they are produced (joining to chat()'s
        text). Takes stream()'s keyword arguments; closing the iterator stops the generation."""
        stops = self._check_stop(kwargs.get("stop"))
        ids = self._chat_ids(messages, add_generation_prompt, tools)
        return text_pieces(self.stream(ids, **kwargs), self._decode, stops)


class _StreamCancelled(Exception):
    """Raised inside stream()'s token callback to stop an abandoned generation."""


class _StreamWorker:
    """The thread that runs one stream()'s generation and hands its tokens to the consumer.

    The generation runs in native code with the GIL released and calls back into Python once per
    token. A daemon thread (so a half-consumed stream does not make the interpreter wait for the
    whole generation at exit), stopped by stop(): the next token callback raises, the native loop
    unwinds and the thread ends. Live workers are also stopped by an atexit hook, which runs while
    the interpreter is still whole; left running into finalization, the thread would be killed
    inside native code when its callback asks for the GIL (std::terminate, SIGABRT).
    """

    def __init__(self, model, ids, options, num_threads, draft=None) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._failure: List[BaseException] = []
        self._cancelled = threading.Event()
        self._at_exit = False
        self.finish_reason: Optional[str] = None  # the C++ loop's, once it has returned

        def on_token(_index: int, token: int) -> None:
            if self._cancelled.is_set():
                raise _StreamCancelled()  # unwinds the native loop; the thread then ends
            self._queue.put(token)

        def run() -> None:
            try:
                self.finish_reason = model.generate(ids, options, on_token, num_threads, draft)[3][0]
            except _StreamCancelled:
                pass
            except BaseException as error:  # handed to the consuming thread
                self._failure.append(error)
            finally:
                self._queue.put(_STREAM_DONE)

        self._thread = threading.Thread(target=run, name="cpuformer-stream", daemon=True)
        self._current_thread = threading.current_thread
        self._is_finalizing = sys.is_finalizing
        self._live = _LIVE_STREAMS
        self._live.add(self)
        self._thread.start()

    def tokens(self) -> Iterator[int]:
        while True:
            token = self._queue.get()
            if token is _STREAM_DONE:
                break
            yield token
        if self._failure:
            raise self._failure[0]
        if self._at_exit:
            raise RuntimeError("stream() was stopped because the interpreter is exiting")

    def stop(self, at_exit: bool = False) -> None:
        self._at_exit = self._at_exit or at_exit
        self._cancelled.set()
        # While the interpreter finalizes (a stream collected at the very end, when module globals
        # may already be cleared: hence the bound functions), the thread cannot run Python any more:
        # the native side parks it at its next token (bindings/gil.h), so a join would wait forever.
        if self._thread is not self._current_thread() and not self._is_finalizing():
            self._thread.join()
        self._live.discard(self)

    def orphan_after_fork(self) -> None:
        """In a child forked while this stream ran: its worker thread exists only in the parent, so
        the child's consumer would wait for tokens forever (and the queue's lock may have been held
        by that thread at fork time). A fresh queue ends the stream with a clear error instead."""
        self._queue = queue.Queue()
        self._failure[:] = [RuntimeError("this stream() was started before os.fork(): its generation runs in the "
                                         "parent process and cannot continue in the child; start a new stream "
                                         "in the child")]
        self._queue.put(_STREAM_DONE)
        self._live.discard(self)


_STREAM_DONE = object()
_LIVE_STREAMS: "set[_StreamWorker]" = set()


@atexit.register
def _stop_live_streams() -> None:
    for worker in list(_LIVE_STREAMS):
        worker.stop(at_exit=True)


def _orphan_live_streams() -> None:
    for worker in list(_LIVE_STREAMS):
        worker.orphan_after_fork()


os.register_at_fork(after_in_child=_orphan_live_streams)


__all__ = ["Generator", "KV_CACHE_DTYPES", "check_bad_words", "kv_cache_code", "sequence_options"]
