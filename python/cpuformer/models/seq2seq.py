"""``cpuformer.Seq2Seq``: encoder-decoder models (translation, summarisation, T5-style tasks).

The supported families are the registry's encoder-decoders (``cpuformer.arch``, kind "seq2seq");
loading (``weights.py``, ``models/_graph.py``) packs each layer's projections and releases the
layer's source pages right after. Generation is the C++ loop that Generator uses: the encoder
runs once per batch, cross-attention keys/values are projected once per source and layer, the
decoder's KV cache is written in place.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core
from .._model_dir import ModelDir
from ._base import Generated, ModelBase, Prompts, TokenIds
from ._inputs import as_2d
from ._languages import apply_languages
from ._result import GenerationStream, log_probs_needed
from ._speculative import speculation
from ._text import TextMixin
from .generator import Generator, check_bad_words, kv_cache_code, penalty_options, sequence_options

PathLike = Union[str, os.PathLike]

class Seq2Seq(TextMixin, ModelBase):
    """An encoder-decoder model loaded from a Hugging Face model directory.

    ``Seq2Seq(path, dtype=None, num_threads=None)``. ``s2s.encode(input_ids,
    attention_mask=None)`` gives the encoder output float32 [B, T, d_model];
    ``s2s.logits(input_ids, decoder_input_ids, attention_mask=None)`` the decoder logits
    [B, Td, V] (teacher forcing); ``s2s.generate(sources, ...)`` generates target tokens with
    Generator.generate's arguments plus num_return_sequences and no_repeat_ngram_size.
    """

    # The option checks are Generator's: one behaviour for both APIs (TextMixin: the prompts').
    _INPUT = "source"
    _generator_options = Generator._options
    _result = Generator._result
    _check_stop = Generator._check_stop
    _stop_watch = Generator._stop_watch
    _scored = Generator._scored
    _stream = Generator._stream
    _generated = Generator._generated

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, quantization: Optional[Mapping[str, Any]] = None,
                 draft_dtype: Optional[str] = None):
        self._tokenizer = None
        model_dir = self._open(path, dtype, num_threads, "seq2seq", quantization=quantization,
                               draft_dtype=draft_dtype)
        self._defaults(model_dir)

    def _defaults(self, md: ModelDir) -> None:
        """Generation defaults from generation_config.json, else config.json, as the C++ registry
        reads them for the C API too (csrc/models/arch/checkpoint.h: generation_defaults). Every id
        is checked there (type and range, naming file and key), so a value that would fail every
        generate() or reach the C++ loop unconverted fails at load; only eos ids are checked against
        the vocabulary at generate() time, because a call may pass its own eos_token_id."""
        defaults = _core.generation_defaults(os.fspath(md.path), md.config, md.generation_config)
        self._eos_source = defaults["eos_source"]
        self.eos_token_ids = defaults["eos_token_ids"]
        self.pad_token_id = defaults["pad_token_id"]
        self.decoder_start_token_id = defaults["decoder_start_token_id"]
        self.forced_bos_token_id = defaults["forced_bos_token_id"]
        self.forced_eos_token_id = defaults["forced_eos_token_id"]
        self.bad_words_ids = defaults["bad_words_ids"]

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def max_positions(self) -> Optional[int]:
        """Longest source / target the position table covers; None for T5 (relative positions)."""
        return self.config["max_positions"] or None

    # ---- forward ---------------------------------------------------------------------------

    def encode(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Encoder output float32 [B, T, d_model]; padded positions (mask 0) are masked as keys and
        carry no meaning: zero where the encoder skips them (docs/seq2seq.md), as computed for T5."""
        model = self._live()
        ids = as_2d(input_ids, "input_ids", vocab_size=self.vocab_size)
        mask = None if attention_mask is None else as_2d(attention_mask, "attention_mask", allow_bool=True)
        return model.encode(ids, mask, self.num_threads)

    def logits(self, input_ids: TokenIds, decoder_input_ids: TokenIds,
               attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Decoder logits float32 [B, Td, V] for the given decoder inputs (teacher forcing)."""
        model = self._live()
        ids = as_2d(input_ids, "input_ids", vocab_size=self.vocab_size)
        mask = None if attention_mask is None else as_2d(attention_mask, "attention_mask", allow_bool=True)
        tgt = as_2d(decoder_input_ids, "decoder_input_ids", vocab_size=self.vocab_size)
        if tgt.shape[0] != ids.shape[0]:
            raise ValueError(f"decoder_input_ids must have shape [batch, target_len] with batch {ids.shape[0]} "
                             f"(the batch of input_ids), got {list(tgt.shape)}")
        return model.logits(ids, tgt, mask, self.num_threads)

    # ---- generation ------------------------------------------------------------------------

    def _options(self, num_return_sequences, no_repeat_ngram_size, bad_words_ids=None, presence_penalty=0.0,
                 frequency_penalty=0.0, logit_bias=None, **kwargs) -> Dict[str, Any]:
        options = self._generator_options(**kwargs)
        sequence_options(options, num_return_sequences, no_repeat_ngram_size)
        penalty_options(options, self.vocab_size, presence_penalty, frequency_penalty, logit_bias)
        options.update(decoder_start_token_id=int(self.decoder_start_token_id),
                       forced_bos_token_id=self.forced_bos_token_id, forced_eos_token_id=self.forced_eos_token_id,
                       bad_words_ids=self.bad_words_ids + check_bad_words(bad_words_ids, self.vocab_size))
        return options

    def generate(self, sources: Prompts, max_new_tokens: int = 20, min_new_tokens: int = 0, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 num_beams: int = 1, length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
                 eos_token_id: Union[None, int, Sequence[int]] = None, seed: Optional[int] = None,
                 return_log_probs: bool = False, num_return_sequences: int = 1,
                 no_repeat_ngram_size: int = 0, assistant_model: Any = None,
                 num_assistant_tokens: Optional[int] = None, prompt_lookup_num_tokens: Optional[int] = None,
                 max_matching_ngram_size: Optional[int] = None, num_assistant_tokens_schedule: str = "heuristic",
                 kv_cache_dtype: Optional[str] = None, bad_words_ids: Optional[Sequence[Sequence[int]]] = None,
                 stop: Union[None, str, Sequence[str]] = None, return_stats: bool = False,
                 return_scores: bool = False, tgt_lang: Optional[str] = None,
                 src_lang: Optional[str] = None, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: Optional[Mapping[int, float]] = None) -> Generated:
        """Target tokens for each source (list[list[int]]; the decoder start token excluded, EOS
        included when produced), as transformers' generate() on the same model.

        sources: a list of token ids (one source), a list of token-id lists (a batch of any
        lengths), a string or a list of strings (needs tokenizer.json; the result is then text).
        Arguments as Generator.generate; num_return_sequences (≤ num_beams) returns that many
        best beams per source, consecutively; no_repeat_ngram_size bans repeated n-grams of the
        target. The model's generation_config.json supplies eos / pad / decoder start tokens,
        forced BOS/EOS tokens and bad_words_ids (a call's bad_words_ids add to them). Speculative decoding
        (assistant_model= a smaller Seq2Seq with the same vocabulary or a dtype name,
        prompt_lookup_num_tokens= n-gram lookup in the source and the output), return_stats and
        kv_cache_dtype (the decoder's self-attention cache) and stop strings as Generator.generate.
        num_return_sequences also takes n > 1 with sampling (n samples per source); return_scores=True
        returns a list of cpuformer.GenerationResult as Generator.generate does; presence_penalty,
        frequency_penalty and logit_bias as Generator.generate (over the target's new tokens).
        tgt_lang / src_lang: language codes of a multilingual translation model (NLLB "fra_Latn",
        mBART-50 "fr_XX", M2M100 "fr", Marian "fra"; models/_languages.py): tgt_lang forces the
        target language's token first (Marian: prefixes it to the source), src_lang encodes string
        sources with the source language's code, as the transformers tokenizer with src_lang set.
        """
        model, ids, kind, options, draft, stops = self._request(
            sources, max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
            num_beams, length_penalty, early_stopping, eos_token_id, seed, log_probs_needed(return_log_probs,
                                                                                         return_scores),
            num_return_sequences, no_repeat_ngram_size, assistant_model, num_assistant_tokens,
            prompt_lookup_num_tokens, max_matching_ngram_size, num_assistant_tokens_schedule, kv_cache_dtype,
            bad_words_ids, stop, tgt_lang, src_lang, presence_penalty, frequency_penalty, logit_bias)
        return self._generated(model, ids, kind, options, draft, stops, return_log_probs, return_stats, return_scores)

    def _request(self, sources: Prompts, max_new_tokens: int = 20, min_new_tokens: int = 0, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 num_beams: int = 1, length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
                 eos_token_id: Union[None, int, Sequence[int]] = None, seed: Optional[int] = None,
                 return_log_probs: bool = False, num_return_sequences: int = 1, no_repeat_ngram_size: int = 0,
                 assistant_model: Any = None, num_assistant_tokens: Optional[int] = None,
                 prompt_lookup_num_tokens: Optional[int] = None, max_matching_ngram_size: Optional[int] = None,
                 num_assistant_tokens_schedule: str = "heuristic", kv_cache_dtype: Optional[str] = None,
                 bad_words_ids: Optional[Sequence[Sequence[int]]] = None,
                 stop: Union[None, str, Sequence[str]] = None, tgt_lang: Optional[str] = None,
                 src_lang: Optional[str] = None, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 logit_bias: Optional[Mapping[int, float]] = None) -> Tuple[Any, List[List[int]], str, Dict[str, Any],
                                                                            Any, List[str]]:
        """(the native model, source ids, the input kind, C++ options, the draft, the stop strings)
        of a generate() or stream() call, checked."""
        model = self._live()
        ids, kind, forced_bos = apply_languages(self, sources, tgt_lang, src_lang)
        options = self._options(num_return_sequences, no_repeat_ngram_size, bad_words_ids, presence_penalty,
                                frequency_penalty, logit_bias, max_new_tokens=max_new_tokens,
                                min_new_tokens=min_new_tokens, do_sample=do_sample, temperature=temperature,
                                top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, num_beams=num_beams,
                                length_penalty=length_penalty, early_stopping=early_stopping,
                                eos_token_id=eos_token_id, seed=seed, return_log_probs=return_log_probs)
        if forced_bos is not None:
            options["forced_bos_token_id"] = forced_bos
        draft = speculation(self, ids, options, assistant_model, num_assistant_tokens, prompt_lookup_num_tokens,
                            max_matching_ngram_size, num_assistant_tokens_schedule)
        options["kv_cache_dtype"] = kv_cache_code(kv_cache_dtype)
        return model, ids, kind, options, draft, self._check_stop(stop)

    def stream(self, source: Prompts, **kwargs: Any) -> GenerationStream:
        """Yields the target tokens of one source as they are produced (greedy or sampling; beam
        search yields the best sequence at the end); given a string, text pieces instead, each once
        it is final, joining to generate()'s text. Takes generate()'s keyword arguments except
        return_log_probs, return_scores, return_stats and num_return_sequences. Closing or
        dropping the iterator stops the generation; its finish_reason is "eos", "stop" or "length"
        once it is exhausted."""
        for name in ("return_log_probs", "return_scores", "return_stats", "num_return_sequences"):
            if name in kwargs:
                raise TypeError(f"stream() yields one sequence's tokens; {name} is for generate()")
        unknown = set(kwargs) - set(inspect.signature(self._request).parameters)
        if unknown:
            raise TypeError(f"stream() got unexpected keyword arguments {sorted(unknown)}")
        model, ids, kind, options, draft, stops = self._request(source, **kwargs)
        if len(ids) != 1:
            raise ValueError(f"stream() takes one source, got {len(ids)}")
        return GenerationStream(lambda state: self._stream(model, ids, options, kind == "str", state, draft, stops))

    def _shape_text(self) -> str:
        c = self.config
        return (f"layers={c['num_layers']}+{c['num_decoder_layers']}, "
                f"d_model={c['hidden_size']}, heads={c['num_heads']}")


__all__ = ["Seq2Seq"]
