"""Shared pieces of the reliability tests: the call budget, the outcome contract and hostile values."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
from hypothesis import HealthCheck, settings

# Under scripts/sanitize.sh everything runs 5-20x slower: the property budgets shrink by 10x there
# (the sanitizer's value is in the code paths, which a tenth of the cases still covers).
SANITIZED = os.environ.get("CPUFORMER_SANITIZED") == "1"
SCALE = 0.1 if SANITIZED else 1.0

# Each public entry point gets at least this many calls in total across its property tests.
CALLS_PER_ENTRY_POINT = int(2000 * SCALE)


def examples(n: int) -> int:
    return max(10, int(n * SCALE))


def property_settings(n: int):
    # derandomize: the same cases on every run and ISA level (a failure reproduces); the example
    # database would otherwise replay earlier failures first and change the budget's meaning.
    return settings(max_examples=examples(n), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class CallCounter:
    """Counts calls per entry point and enforces the contract: a call either returns or raises
    TypeError/ValueError. Any other exception propagates (and fails the test)."""

    def __init__(self) -> None:
        self.counts: Dict[str, int] = {}

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuple[Any, Optional[Exception]]:
        self.counts[name] = self.counts.get(name, 0) + 1
        try:
            return fn(*args, **kwargs), None
        except (TypeError, ValueError) as error:
            return None, error

    def ok(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A call that must succeed."""
        result, error = self.call(name, fn, *args, **kwargs)
        assert error is None, f"{name} raised {type(error).__name__}: {error}"
        return result

    def raises(self, name: str, kind: type, match: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Exception:
        """A call that must raise `kind` with a message containing `match`."""
        result, error = self.call(name, fn, *args, **kwargs)
        assert error is not None, f"{name} accepted a hostile argument and returned {type(result).__name__}"
        assert isinstance(error, kind), f"{name} raised {type(error).__name__} ({error}), expected {kind.__name__}"
        assert match in str(error), f"{name}: message {str(error)!r} lacks {match!r}"
        return error

    def require(self, name: str, minimum: int = CALLS_PER_ENTRY_POINT) -> None:
        got = self.counts.get(name, 0)
        assert got >= minimum, f"{name}: only {got} property-test calls (need {minimum})"


# dtypes that must be refused with TypeError where float32 is required.
WRONG_DTYPES = [np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_, np.complex64]
# Python objects that are not arrays at all.
NON_ARRAYS = [None, 1.5, 3, "x", [1.0, 2.0], (1.0,), b"\x00\x00\x80\x3f", np.float32(1.0)]
SPECIAL_FLOATS = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-45, -1e-45, 1e-38])


def random_floats(seed: int, shape, wild: bool, scale: float = 1.0) -> np.ndarray:
    """float32 data of `shape`: normal(0, scale), or with `wild` also NaN, ±inf, ±max, denormals
    sprinkled in (about one entry in four)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.standard_normal(shape) * scale, dtype=np.float32)  # a 0-d array, never a scalar
    if wild and x.size:
        flat = x.reshape(-1)
        pick = rng.random(flat.size) < 0.25
        flat[pick] = rng.choice(SPECIAL_FLOATS, size=int(pick.sum()))
    return x


def non_contiguous(x: np.ndarray) -> np.ndarray:
    """The same values as a non-C-contiguous view (every other element of a larger array)."""
    holder = np.empty(x.shape[:-1] + (2 * x.shape[-1],) if x.ndim else (2,), dtype=x.dtype)
    view = holder[..., ::2]
    if x.ndim == 0:
        return x  # 0-d arrays are always contiguous
    view[...] = x
    assert not view.flags.c_contiguous or x.size == 0 or x.shape[-1] <= 1
    return view


def with_dtype(x: np.ndarray, dtype) -> np.ndarray:
    """x converted to a (wrong) dtype; NaN/inf turning into garbage integers is fine here."""
    import warnings

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return x.astype(dtype)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Bitwise equal, except that a NaN's sign/payload may differ (it depends on which SIMD lane
    or tail path produced it, which is not part of the contract)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    nan = np.isnan(got)
    np.testing.assert_array_equal(nan, np.isnan(want))
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
