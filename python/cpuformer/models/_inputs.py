"""Checks and conversions of the token ids the generation APIs take (shared by Generator and Seq2Seq)."""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from .._arguments import integer_array, token_id_range_error


def token_ids(value, index: int, noun: str, vocab_size: int) -> List[int]:
    """Prompt (or source) ``index`` as a list of token ids in [0, vocab_size): checked here, so that
    no id beyond int64 reaches the C++ conversion."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{noun} {index} must be a 1-D sequence of token ids, got shape {list(value.shape)}")
        if value.dtype.kind not in "iu":
            raise TypeError(f"{noun} {index} must hold integer token ids, got dtype {value.dtype}")
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{noun} {index} must be a string or a list of token ids, got {type(value).__name__}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{noun} {index} must hold integer token ids, got {type(v).__name__} {v!r}")
    if len(value) == 0:
        raise ValueError(f"{noun} {index} is empty; every {noun} needs at least one token")
    ids = [int(v) for v in value]
    for v in ids:
        if not 0 <= v < vocab_size:
            raise token_id_range_error(f"{noun} token ids", v, vocab_size)
    return ids


def as_2d(value, name: str, allow_bool: bool = False, vocab_size: Optional[int] = None) -> np.ndarray:
    """int64 [batch, seq_len] (a 1-D sequence becomes one row); vocab_size words a value beyond
    int64 as an out-of-range token id (the range itself is checked in C++)."""
    array = integer_array(value, name, vocab_size=vocab_size, allow_bool=allow_bool)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"{name} must have 2 dimensions [batch, seq_len], got shape {list(array.shape)}")
    return array
