"""What every model class shares: opening a model directory, ``repr()``, the parameter count,
``closed`` and ``with`` support.

Each model class (Encoder, Generator, Seq2Seq) keeps its C++ graph in ``self._model`` (None once
``close()`` has run), its opened directory in ``self._model_dir`` and its ``num_threads`` (0: the
process default), and describes its shape in ``_shape_text()``; this mixin adds the rest.
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from .. import _core
from .._arguments import check_num_threads
from .._model_dir import ModelDir
from ..arch import Arch, Hparams, find, wrong_kind
from ..arch.heads import Head, task_of
from ..weights import Checkpoint, check_dtype, graph_format, resolve_dtype
from . import _graph
from ._heads import TaskHead
from ._result import GenerationResult
from ._speculative import close_drafts, preload_draft_settings

#: Token ids: a NumPy integer array or (nested) lists of ints.
TokenIds = npt.ArrayLike
#: What generate() / stream() take: a string, a list of strings, a list of token ids or a list of such lists.
Prompts = Union[str, Sequence[str], Sequence[int], Sequence[Sequence[int]], np.ndarray]
#: What generate() returns: a string, a list of strings or token-id lists; with return_log_probs, a pair;
#: with return_scores, a list of GenerationResult.
Generated = Union[str, List[str], List[List[int]], Tuple[Any, List[List[float]]], List[GenerationResult]]


def _count(shape: Tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def format_count(n: int) -> str:
    """1234 -> "1.2K", 124_439_808 -> "124.4M", 1_100_048_384 -> "1.10B"."""
    if n >= 1_000_000_000:
        return f"{n / 1e9:.2f}B"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}K"
    return str(n)


def _task_head(arch: Arch, name: str, config: Any, hp: Hparams) -> Optional[Head]:
    """The head the checkpoint class ``name`` declares, None for a base model; NotImplementedError
    for a task head the family does not have."""
    task = task_of(name)
    if task is None:
        return None
    head = arch.head(config, hp, task) if task else None
    if head is None:
        what = name[name.index("For") + 3:] if "For" in name else "language-model"
        raise NotImplementedError(f"{name}: cpuformer does not run the {what} head of "
                                  f"{arch.title} checkpoints; cpuformer.Encoder(path, head=False) opens the encoder "
                                  "without its head")
    return head


class ModelBase:
    """Mixin for the model classes: ``repr()`` showing architecture, shape, dtype, parameter
    count, ISA level and threads; ``closed``; ``with cpuformer.load(path) as model: ...`` closes
    the model (frees its packed weights and tables) when the block ends."""

    _model: Any
    _model_dir: Any
    _arch: Arch
    hparams: Hparams
    num_threads: int
    dtype: str
    architecture: str
    _num_parameters: Optional[int] = None
    _head: Any = None

    def _open(self, path: Union[str, "os.PathLike[str]", ModelDir], dtype: Optional[str], num_threads: Optional[int],
              kind: str, head: bool = False, quantization: Optional[Mapping[str, Any]] = None,
              draft_dtype: Optional[str] = None) -> ModelDir:
        """The constructors' common part: checks dtype and num_threads, opens the directory (or
        takes an opened ModelDir), resolves the dtype against a converted directory's, finds the
        architecture, checks the model kind and builds the C++ model (``self._model``); then closes
        the directory's maps, loaded or not.
        num_threads: None (0 here: the process default) or 1..MAX_NUM_THREADS (_arguments.py).
        head: also load the task head the checkpoint's class names (encoders; see arch/heads.py).
        quantization: int4 group size and zero points, the LM head's dtype (weights.check_quantization).
        draft_dtype: also pack the weights in this dtype, from the same read, as the model's
        speculative-decoding draft (models/_speculative.py; a plain checkpoint only).
        Sets num_threads, dtype, quantization, _stored_dtype, architecture, family, config, _arch,
        _model_dir and _head (a models._heads.TaskHead or None)."""
        check_dtype(dtype)
        self.num_threads = check_num_threads(num_threads)
        model_dir = path if isinstance(path, ModelDir) else ModelDir(path)
        try:
            arch, name, settings = self._settings(model_dir, dtype, quantization, kind)
            declared = _task_head(arch, name, model_dir.config, self.hparams) if head else None
            checkpoint = Checkpoint(model_dir, arch, self.hparams, self._stored_dtype, declared, settings)
            if draft_dtype is None:
                self._model = _graph.build(checkpoint, graph_format(self.dtype, settings))
            else:
                draft_settings = preload_draft_settings(self, draft_dtype)
                self._model, draft = _graph.build(checkpoint, graph_format(self.dtype, settings),
                                                  graph_format(draft_dtype, draft_settings))
                self._preloaded_drafts = {draft_dtype: (draft, draft_settings)}
            self._head = None
            if declared is not None:
                if declared.uses_pooler and not self._model.has_pooler:
                    raise ValueError(f"{model_dir.path}: the {name} head classifies the pooler output, but the "
                                     "checkpoint has no pooler weights")
                self._head = TaskHead(declared, checkpoint.read_head(), settings["lm_head"], settings["group_size"],
                                      settings["zero_point"])
        finally:
            # Loaded (or failed): nothing the model computes with refers to the weights files any
            # more (the C++ model packed or copied every tensor), so the maps are dropped now and
            # a file truncated or rewritten later cannot affect the model. The headers stay
            # readable (num_parameters). (A converted directory's packed-weights file, which the
            # C++ model maps instead of packing, is the exception: docs/reliability.md.)
            model_dir.close()
        self._model_dir = model_dir
        return model_dir

    def _settings(self, model_dir: ModelDir, dtype: Optional[str], quantization: Optional[Mapping[str, Any]],
                  kind: str) -> Tuple[Arch, str, Any]:
        """What _open takes from the directory's config before building anything: sets dtype,
        _stored_dtype, quantization, architecture, family, _arch, hparams and config; returns
        (the family, the architecture's name, the quantization settings)."""
        self.dtype, self._stored_dtype, settings = resolve_dtype(dtype, model_dir.config, quantization)
        #: The quantization settings in effect: {"group_size", "zero_point", "lm_head"} (the
        #: LM head's and task heads' dtype; docs/precision.md).
        self.quantization = settings
        arch, name = find(model_dir.config)
        if arch.kind != kind:
            raise wrong_kind(arch.kind, name)
        self.architecture, self.family, self._arch = name, arch.family, arch
        self.hparams = arch.hparams(model_dir.config)
        #: The model's hyperparameters in cpuformer's names (arch.Hparams as a dict).
        self.config = self.hparams.as_dict()
        return arch, name, settings

    @classmethod
    def _unbuilt(cls, model_dir: ModelDir, kind: str) -> Any:
        """An instance of the class holding what the opened ``model_dir`` declares (the settings
        of _settings and, for the generating classes, their generation defaults) without building
        the C++ model: the graph manifest (_graph_file.py) reads these without packing a weight.
        It behaves as a closed model; the directory stays the caller's to close."""
        self = cls.__new__(cls)
        self._model, self._model_dir, self._tokenizer, self.num_threads = None, model_dir, None, 0
        self._settings(model_dir, None, None, kind)
        defaults = getattr(self, "_defaults", None)
        if defaults is not None:
            defaults(model_dir)
        return self

    def _shape_text(self) -> str:  # overridden: "layers=12, hidden=768, heads=12"
        return ""

    def _live(self) -> Any:
        """The C++ model; ValueError once close() has run (not an AttributeError on None)."""
        if self._model is None:
            raise ValueError(f"this {type(self).__name__} is closed")
        return self._model

    def close(self) -> None:
        """Frees the model and drops the weight maps; the object cannot be used afterwards."""
        self._model = None
        self._head = None
        self._model_dir.close()
        close_drafts(self)  # the self-drafts speculative decoding loaded (assistant_model='int8')

    @property
    def closed(self) -> bool:
        """True once close() has run (the model cannot be used any more)."""
        return getattr(self, "_model", None) is None

    @property
    def num_parameters(self) -> int:
        """Number of weights in the checkpoint (every tensor's element count; task heads that the
        model ignores included). Read from the safetensors headers, so it costs no weight read and
        stays available after close()."""
        if self._num_parameters is None:
            md = self._model_dir
            self._num_parameters = sum(_count(md.tensor_info(name)[1]) for name in md.names())
        return self._num_parameters

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        name = type(self).__name__
        architecture = getattr(self, "architecture", "?")
        shape = self._shape_text()
        parts = [architecture] + ([shape] if shape else []) + [f"dtype={getattr(self, 'dtype', '?')}"]
        try:
            parts.append(f"parameters={format_count(self.num_parameters)}")
        except Exception:  # a repr must never raise
            pass
        threads = getattr(self, "num_threads", 0)
        parts.append(f"isa={_core.cpu_info()['isa']}")
        parts.append(f"threads={threads if threads else f'auto({_core.get_num_threads()})'}")
        if self.closed:
            parts.append("closed")
        return f"{name}({', '.join(parts)})"


__all__ = ["Generated", "ModelBase", "Prompts", "TokenIds", "format_count"]
