"""Checks of the public API's integer arguments, made before a value reaches the C++ core.

pybind11 converts Python ints into the C++ fields they feed (int64 for token ids, lengths, counts
and sizes; int for thread counts) and reports a value that does not fit as "Unable to cast Python
instance ..." or as a dump of the function's signature, naming no argument. Every integer
argument of Encoder, Generator, Seq2Seq and ``set_num_threads`` is therefore checked here against
the range of its field, and the error names the argument and the range.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

INT64_MAX = 2 ** 63 - 1
# num_threads is an int in C++ and the size of a thread pool team. A fixed cap (far above any CPU's
# core count today) keeps a typo such as 2**40 from being accepted at load and failing on every call.
MAX_NUM_THREADS = 1024


def _bound_text(value: int) -> str:
    return "2**63 - 1" if value == INT64_MAX else str(value)


def check_integer(name: str, value: Any, minimum: int, maximum: int = INT64_MAX, note: str = "") -> int:
    """``value`` as an int in [minimum, maximum]; otherwise ValueError such as
    "max_new_tokens must be an integer >= 0, got -1" or, above the maximum, "max_new_tokens must be
    an integer >= 0 and <= 2**63 - 1, got 18446744073709551616" (the config_int convention).
    bool is refused (it is an int in Python, not a count); NumPy integers are accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}{note}, got {value!r}")
    if value > maximum:
        raise ValueError(f"{name} must be an integer >= {minimum} and <= {_bound_text(maximum)}{note}, "
                         f"got {value!r}")
    return int(value)


def check_num_threads(value: Any) -> int:
    """A model's ``num_threads``: None (the process default, returned as 0) or 1..MAX_NUM_THREADS."""
    if value is None:
        return 0
    return check_integer("num_threads", value, 1, MAX_NUM_THREADS, " or None")


def check_prefill_slowdown(value: Any) -> float:
    """Batcher's prefill_slowdown: 0 (off) or a finite number >= 1."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not (value == 0 or (np.isfinite(value) and value >= 1)):
        raise ValueError(f"prefill_slowdown must be 0 (off) or a finite number >= 1, got {value!r}")
    return float(value)


def token_id_range_error(name: str, value: int, vocab_size: Optional[int]) -> ValueError:
    """The error for a value of an integer array that is out of range (beyond int64 included)."""
    if vocab_size is None:
        return ValueError(f"{name}: value {value} is beyond int64")
    return ValueError(f"{name}: token id {value} is out of range; token ids must be in [0, {vocab_size}) "
                      "(vocab_size)")


def _int_beyond_int64(value: Any) -> Optional[int]:
    """The first Python int outside int64 in nested lists / tuples, else None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            return item
    return None


def integer_array(value: Any, name: str, *, vocab_size: Optional[int] = None, allow_bool: bool = False) -> np.ndarray:
    """``value`` (a NumPy array or nested lists) as a C-contiguous int64 array of any rank.

    Refuses with a message naming ``name``: ragged nested lists (ValueError), non-integer dtypes
    (TypeError; bool too unless ``allow_bool``), values beyond int64 (ValueError; with
    ``vocab_size`` worded as an out-of-range token id). Nested lists that hold no element at all
    (``[[]]``, which NumPy makes float64) become an empty int64 array, so the caller's shape check
    reports the empty sequence instead of a dtype.
    """
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (ValueError, TypeError, OverflowError):  # ragged nested lists, unconvertible objects
        raise ValueError(f"{name} must be a rectangular [batch, seq_len] array of integers") from None
    if not isinstance(value, np.ndarray) and array.dtype.kind in "fO":
        # Lists holding Python ints beyond int64 become float64 ([[1, 2**63]]: int64 and uint64
        # meet) or object arrays: name the value, not a dtype or the shape.
        beyond = _int_beyond_int64(value)
        if beyond is not None:
            raise token_id_range_error(name, beyond, vocab_size)
    if array.dtype == object:
        raise ValueError(f"{name} must be a rectangular [batch, seq_len] array of integers")
    if array.size == 0 and not isinstance(value, np.ndarray):
        return np.zeros(array.shape, dtype=np.int64)
    if array.dtype.kind == "b" and allow_bool:
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and int(array.max()) > INT64_MAX:
        raise token_id_range_error(name, int(array.max()), vocab_size)
    return np.ascontiguousarray(array, dtype=np.int64)


__all__ = ["INT64_MAX", "MAX_NUM_THREADS", "check_integer", "check_num_threads", "integer_array",
           "token_id_range_error"]
