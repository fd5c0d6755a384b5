"""cpuformer: fast CPU inference for transformer models.

The hot path is C++ (SIMD kernels on cpuformer's own threads, chosen at import for the CPU's instruction set),
exposed as ``cpuformer._core``; this package loads models and offers the user API.
"""

from __future__ import annotations

import os as _os


def _load_core():
    """``from . import _core``, with an ImportError that says what is wrong instead of a bare
    dlopen message: the module missing (a source tree that was not built, an incomplete install),
    a library it needs missing (the C++ runtime, libstdc++ / libgcc_s, which the system provides:
    cpuformer links no OpenMP runtime), or a damaged file."""
    try:
        from . import _core
    except ImportError as error:
        _raise_core_error(error)
    return _core


def _raise_core_error(error: ImportError):
    from importlib.machinery import EXTENSION_SUFFIXES

    here = _os.path.dirname(__file__)
    if not any(_os.path.exists(_os.path.join(here, "_core" + suffix)) for suffix in EXTENSION_SUFFIXES):
        raise ImportError(
            f"cpuformer: its compiled core (cpuformer/_core*.so) is missing from {here}: the "
            "installation is incomplete (reinstall: pip install --force-reinstall cpuformer) or this is a source tree "
            "that was not built (docs/contributing.md, 'Build incrementally')") from None
    message = str(error)
    if "cannot open shared object file" in message:
        library = message.split(":", 1)[0].strip()
        raise ImportError(
            f"cpuformer: its compiled core needs {library}, which is missing ({message}). cpuformer uses the "
            "system's C++ runtime (libstdc++.so.6 and libgcc_s.so.1 of GCC): install it (e.g. apt-get install "
            "libstdc++6, dnf install libstdc++), or reinstall cpuformer (pip install --force-reinstall cpuformer) "
            "if the library belongs to it") from None
    raise ImportError(
        f"cpuformer: its compiled core could not be loaded ({message}); the file may be damaged or built for "
        "another platform or Python: reinstall (pip install --force-reinstall cpuformer)") from None


def _check_spin_setting() -> None:
    """CPUFORMER_SPIN_US (docs/runtime.md, "Waiting threads"): the core reads it once and falls back
    to its default for a value it cannot use; say so rather than ignore it silently."""
    value = _os.environ.get("CPUFORMER_SPIN_US")
    if value is None or value == "" or (value.isascii() and value.isdigit() and int(value) <= 1_000_000):
        return
    import warnings

    warnings.warn(f"CPUFORMER_SPIN_US={value!r} is not a whole number of microseconds in [0, 1000000]; "
                  "cpuformer's waiting threads use the default (200)", RuntimeWarning, stacklevel=3)


_check_spin_setting()
_core = _load_core()

try:
    _core._select_isa()
except ValueError as error:
    raise ImportError(f"cpuformer: {error}") from None

from . import ops  # noqa: E402
from ._tokenizer import Tokenizer  # noqa: E402
from .api import convert, load  # noqa: E402
from .models import CLIP, CLIPText, CLIPVision, Encoder, Generator, ImageClassifier, ImageEncoder, Seq2Seq  # noqa: E402
from .models._batcher import Batcher, BatchEvent, TokenLogProb  # noqa: E402
from .models._result import GenerationResult, GenerationStream  # noqa: E402

# One version string, pyproject.toml's, compiled into _core (CMakeLists.txt): the same in a source
# tree (PYTHONPATH=python) as in the installed package's metadata (tests/test_release.py).
__version__: str = _core.__version__


def cpu_info() -> dict:
    """The ISA level in use (``isa``), the best one the CPU supports (``best_isa``), the CPU's
    SIMD ``features``, the default ``num_threads``, the CPU limit of the process's control group
    (``cpu_limit``: a container's ``--cpus``, which caps the default; None without one) and the
    ``matmul`` kernel of each weight dtype."""
    return _core.cpu_info()


def set_num_threads(n: int) -> None:
    """Default thread count for ``cpuformer.ops`` (models take their own ``num_threads``).
    0 restores the automatic default (OMP_NUM_THREADS, else the CPUs this process may use); at most
    1024 (ValueError otherwise)."""
    from ._arguments import MAX_NUM_THREADS, check_integer

    _core.set_num_threads(check_integer("num_threads", n, 0, MAX_NUM_THREADS, " (0: the automatic default)"))


def get_num_threads() -> int:
    return _core.get_num_threads()


def set_float32_matmul_precision(precision: str) -> None:
    """How float32 weights are multiplied, process-wide (PyTorch's names and meaning):
    ``"highest"`` (the default) in float32 with FMA; ``"high"`` lets a CPU with AMX-BF16 run
    matmuls of 32 rows or more on bfloat16 tiles with each float32 operand split into two bfloat16
    (16 significant bits instead of 24; about 2× the float32 speed of encoders and prefill; the
    error bound is in docs/precision.md). Without AMX-BF16, ``"high"`` computes what ``"highest"``
    does. The environment variable CPUFORMER_FLOAT32_MATMUL_PRECISION sets it at import."""
    if not isinstance(precision, str):
        raise ValueError(f"float32 matmul precision must be 'highest' or 'high', got {precision!r}")
    _core.set_float32_matmul_precision(precision)


def get_float32_matmul_precision() -> str:
    return _core.get_float32_matmul_precision()


_env_precision = _os.environ.get("CPUFORMER_FLOAT32_MATMUL_PRECISION")
if _env_precision:
    try:
        _core.set_float32_matmul_precision(_env_precision)
    except ValueError as error:
        raise ImportError(f"cpuformer: CPUFORMER_FLOAT32_MATMUL_PRECISION: {error}") from None


__all__ = ["BatchEvent", "Batcher", "CLIP", "CLIPText", "CLIPVision", "Encoder", "GenerationResult",
           "GenerationStream", "Generator", "ImageClassifier", "ImageEncoder", "Seq2Seq", "Tokenizer", "__version__",
           "convert", "cpu_info", "get_float32_matmul_precision", "get_num_threads", "load", "ops",
           "set_float32_matmul_precision", "set_num_threads", "TokenLogProb"]
