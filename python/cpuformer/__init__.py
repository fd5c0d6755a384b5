"""cpuformer: fast CPU inference for transformer models.

The hot path is C++ (SIMD + OpenMP kernels, chosen at import for the CPU's instruction set),
exposed as ``cpuformer._core``; this package loads models and offers the user API.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version as _version

from . import _core

try:
    _core._select_isa()
except ValueError as error:
    raise ImportError(f"cpuformer: {error}") from None

from . import ops  # noqa: E402
from ._load import load  # noqa: E402
from .convert import convert  # noqa: E402
from .encoder import Encoder  # noqa: E402
from .generator import Generator  # noqa: E402
from .seq2seq import Seq2Seq  # noqa: E402

try:
    __version__ = _version("cpuformer")
except PackageNotFoundError:  # running from a source tree (PYTHONPATH=python)
    __version__ = "0+unknown"


def cpu_info() -> dict:
    """The ISA level in use (``isa``), the best one the CPU supports (``best_isa``), the CPU's
    SIMD ``features`` and the default ``num_threads``."""
    return _core.cpu_info()


def set_num_threads(n: int) -> None:
    """Default thread count for ``cpuformer.ops`` (models take their own ``num_threads``).
    0 restores the automatic default (OMP_NUM_THREADS, else the CPUs this process may use)."""
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    return _core.get_num_threads()


__all__ = ["Encoder", "Generator", "Seq2Seq", "__version__", "convert", "cpu_info", "get_num_threads", "load", "ops",
           "set_num_threads"]
