"""Prompts and text for the generating models: one behaviour for Generator and Seq2Seq (the
tokenizer, strings or token ids in, text or token ids out)."""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from .._tokenizer import load_tokenizer
from ._inputs import token_ids


class TextMixin:
    """Prompt handling for a model with ``_model_dir``, ``_tokenizer``, ``vocab_size`` and
    ``_INPUT`` (what the error messages call one input sequence: "prompt" or "source")."""

    _INPUT = "prompt"
    _tokenizer = None
    _model_dir = None
    vocab_size: int

    def _get_tokenizer(self):
        if self._tokenizer is None:
            path = self._model_dir.tokenizer_path
            if path is None:
                raise ValueError(f"the prompt is a string, but {self._model_dir.path} has no tokenizer.json; "
                                 "pass token ids instead")
            self._tokenizer = load_tokenizer(path)
        return self._tokenizer

    def _prompts(self, prompts) -> Tuple[List[List[int]], str]:
        """(token-id lists, kind): kind "str" (one string), "strs" (a list of strings) or "ids"."""
        if isinstance(prompts, str):
            return [self._encode(prompts, 0)], "str"
        if isinstance(prompts, np.ndarray):
            if prompts.dtype.kind not in "iu":
                raise TypeError(f"{self._INPUT}s must hold integer token ids, got dtype {prompts.dtype}")
            if prompts.ndim == 1:
                prompts = [prompts]
            elif prompts.ndim != 2:
                raise ValueError(f"{self._INPUT}s must be 1-D or 2-D, got shape {list(prompts.shape)}")
            return [token_ids(p, i, self._INPUT, self.vocab_size) for i, p in enumerate(prompts)], "ids"
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"{self._INPUT}s must be a string, a list of strings or token-id lists, got "
                            f"{type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError(f"{self._INPUT}s is empty: give at least one {self._INPUT}")
        if all(isinstance(p, str) for p in prompts):
            return [self._encode(p, i) for i, p in enumerate(prompts)], "strs"
        if not any(isinstance(p, (list, tuple, np.ndarray, str)) for p in prompts):
            return [token_ids(prompts, 0, self._INPUT, self.vocab_size)], "ids"  # one prompt (a flat list)
        return [token_ids(p, i, self._INPUT, self.vocab_size) for i, p in enumerate(prompts)], "ids"

    def _encode(self, text: str, index: int) -> List[int]:
        ids = self._get_tokenizer().encode(text).ids
        if not ids:
            raise ValueError(f"{self._INPUT} {index} is empty (it encodes to no tokens)")
        return list(ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._get_tokenizer().decode(list(ids), skip_special_tokens=True)
