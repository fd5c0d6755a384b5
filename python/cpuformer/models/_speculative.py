"""Speculative decoding's arguments, one behaviour for Generator and Seq2Seq
(docs/decoders.md, "Speculative decoding").

A draft proposes tokens and the model checks them all in one forward pass over its KV cache,
keeping the longest agreeing prefix plus its own next token (csrc/models/generation.cc,
``speculative``). The draft is either a second, smaller model (``assistant_model``: a model of the
same class and vocabulary, or a dtype name for the model's own checkpoint at that dtype) or
n-gram lookup in the prompt and the output so far (``prompt_lookup_num_tokens``).
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from .._arguments import check_integer
from ..weights import check_dtype, check_quantization

_DRAFTS_LOCK = threading.Lock()

#: The longest draft a call may ask for (num_assistant_tokens, prompt_lookup_num_tokens,
#: max_matching_ngram_size): verification runs draft + 1 positions in one pass.
MAX_DRAFT_TOKENS = 64

# Bytes per weight, to refuse a draft that reads as much per token as the model it drafts for.
_BYTES_PER_WEIGHT = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5625}


def weight_bytes(model: Any) -> float:
    """The bytes of weights a model reads per decode step, estimated from its parameter count."""
    return model.num_parameters * _BYTES_PER_WEIGHT[model.dtype]


def _tokenizer_or_none(model: Any) -> Any:
    """The model's tokenizer; None when it has none or it cannot be read (token ids are then the
    only contract: a call on ids must not need the tokenizer's files or packages)."""
    try:
        return model._get_tokenizer()
    except (ValueError, ImportError):
        return None


def _different_tokenizers(model: Any, draft: Any) -> Any:
    """(the model's tokenizer, the draft's) when both directories have one and their vocabularies
    (added tokens included) differ; None otherwise."""
    if model._model_dir.path == draft._model_dir.path:
        return None
    a, b = _tokenizer_or_none(model), _tokenizer_or_none(draft)
    if a is None or b is None or a.get_vocab() == b.get_vocab():
        return None
    return a, b


def resolve_assistant(model: Any, assistant_model: Any) -> Any:
    """The draft model: ``assistant_model`` itself, or for a dtype name the model's own checkpoint
    loaded at that dtype (kept with the model and closed with it). Checks class, state,
    vocabulary, tokenizer and size."""
    cls = type(model)
    if isinstance(assistant_model, str):
        with _DRAFTS_LOCK:  # concurrent generate() calls load one draft
            drafts: Dict[str, Any] = model.__dict__.setdefault("_self_drafts", {})
            if assistant_model not in drafts:
                preloaded = model.__dict__.get("_preloaded_drafts", {}).pop(assistant_model, None)
                drafts[assistant_model] = (_sibling(model, assistant_model, *preloaded) if preloaded else
                                           cls(model._model_dir.path, dtype=assistant_model,
                                               num_threads=model.num_threads or None))
            draft = drafts[assistant_model]
    elif isinstance(assistant_model, cls):
        draft = assistant_model
    else:
        raise TypeError(f"assistant_model must be a cpuformer.{cls.__name__} or a dtype name for the model's own "
                        f"weights (e.g. 'int8'), got {type(assistant_model).__name__}")
    if draft is model:
        raise ValueError("assistant_model is the model itself; a draft must be a smaller model (or the same "
                         "checkpoint at a lower dtype, e.g. assistant_model='int8')")
    if draft.closed:
        raise ValueError(f"the assistant model is closed: {draft!r}")
    if draft.vocab_size != model.vocab_size:
        raise ValueError(f"the assistant model's vocabulary ({draft.vocab_size} tokens) differs from the model's "
                         f"({model.vocab_size}); the draft must share the model's tokenizer")
    different = _different_tokenizers(model, draft)
    if different:
        raise ValueError(f"the assistant model's tokenizer ({different[1].path}) maps tokens to "
                         f"other ids than the model's ({different[0].path}); the draft must share "
                         "the model's tokenizer")
    if weight_bytes(draft) >= weight_bytes(model):
        raise ValueError(f"the assistant model ({draft.architecture}, {draft.num_parameters:,} parameters at "
                         f"{draft.dtype}) is not smaller than the model ({model.num_parameters:,} at "
                         f"{model.dtype}): drafting with it cannot be faster than decoding alone")
    return draft


def preload_draft_settings(model: Any, draft_dtype: Any) -> Dict[str, Any]:
    """The quantization settings of a draft packed at load (``draft_dtype=``), after checking that
    it can be: a dtype name, and a checkpoint of float weights (a converted directory stores one
    dtype only)."""
    check_dtype(draft_dtype)
    if draft_dtype is None or not isinstance(draft_dtype, str):
        raise TypeError(f"draft_dtype must be a dtype name, got {draft_dtype!r}")
    if model._stored_dtype is not None:
        raise ValueError(f"draft_dtype needs a checkpoint of float weights; this directory was converted to "
                         f"{model._stored_dtype!r} (load the draft from the original checkpoint)")
    return check_quantization(None, draft_dtype)


def _sibling(model: Any, dtype: str, native: Any, settings: Dict[str, Any]) -> Any:
    """A model object like ``model`` (same class, directory, configuration and generation
    defaults) around the draft graph packed with it at load."""
    draft = type(model).__new__(type(model))
    draft.__dict__.update({key: value for key, value in model.__dict__.items()
                           if key not in ("_self_drafts", "_preloaded_drafts", "_tokenizer")})
    draft._model, draft.dtype, draft.quantization = native, dtype, settings
    draft._tokenizer = None
    return draft


def speculation(model: Any, ids: List[List[int]], options: Dict[str, Any], assistant_model: Any,
                num_assistant_tokens: Optional[int], prompt_lookup_num_tokens: Optional[int],
                max_matching_ngram_size: Optional[int], num_assistant_tokens_schedule: str = "heuristic"
                ) -> Optional[Any]:
    """Adds the speculative options to ``options`` (the C++ GenerationOptions fields) and returns
    the draft's native model, or None (prompt lookup, or no speculation)."""
    if num_assistant_tokens_schedule not in ("heuristic", "constant"):
        raise ValueError("num_assistant_tokens_schedule must be 'heuristic' or 'constant', got "
                         f"{num_assistant_tokens_schedule!r}")
    options["adaptive_draft"] = num_assistant_tokens_schedule == "heuristic"
    if assistant_model is None and prompt_lookup_num_tokens is None:
        for name, value in (("num_assistant_tokens", num_assistant_tokens),
                            ("max_matching_ngram_size", max_matching_ngram_size)):
            if value is not None:
                raise ValueError(f"{name} applies to speculative decoding; pass assistant_model= or "
                                 "prompt_lookup_num_tokens= with it")
        return None
    what = "speculative decoding (assistant_model, prompt_lookup_num_tokens)"
    if assistant_model is not None and prompt_lookup_num_tokens is not None:
        raise ValueError("pass assistant_model or prompt_lookup_num_tokens, not both")
    if len(ids) != 1:
        raise ValueError(f"{what} takes one {model._INPUT} at a time, got {len(ids)}")
    if options["num_beams"] > 1:
        raise ValueError(f"{what} does not combine with beam search (num_beams > 1): it runs greedy search or "
                         "sampling")
    if options.get("num_return_sequences", 1) > 1:
        raise ValueError(f"{what} gives one sequence; it does not combine with num_return_sequences > 1")
    if prompt_lookup_num_tokens is not None:
        if num_assistant_tokens is not None:
            raise ValueError("num_assistant_tokens applies to assistant_model; prompt lookup drafts "
                             "prompt_lookup_num_tokens tokens")
        options["prompt_lookup_num_tokens"] = check_integer("prompt_lookup_num_tokens", prompt_lookup_num_tokens, 1,
                                                            MAX_DRAFT_TOKENS)
        options["max_matching_ngram_size"] = check_integer(
            "max_matching_ngram_size", 2 if max_matching_ngram_size is None else max_matching_ngram_size, 1,
            MAX_DRAFT_TOKENS)
        return None
    if max_matching_ngram_size is not None:
        raise ValueError("max_matching_ngram_size applies to prompt_lookup_num_tokens, not to assistant_model")
    options["num_assistant_tokens"] = check_integer(
        "num_assistant_tokens", 5 if num_assistant_tokens is None else num_assistant_tokens, 1, MAX_DRAFT_TOKENS)
    return resolve_assistant(model, assistant_model)._live()


def close_drafts(model: Any) -> None:
    """Closes the self-drafts resolve_assistant() loaded for ``model``."""
    for draft in model.__dict__.pop("_self_drafts", {}).values():
        draft.close()
    model.__dict__.pop("_preloaded_drafts", None)


__all__ = ["MAX_DRAFT_TOKENS", "close_drafts", "preload_draft_settings", "resolve_assistant", "speculation",
           "weight_bytes"]
