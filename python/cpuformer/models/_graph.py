"""Builds the C++ model of a checkpoint: the one seam between the Python layer and the graphs.

Every model kind takes the same two things (csrc/bindings/config.h, model_builder.h): the
hyperparameters (``arch.Hparams`` plus the weight format, ``weights.graph_format``) and canonical
tensors — the model-level ones (each stack's under ``"<stack>."``) at construction, then one layer
at a time with ``add_layer(stack, tensors)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import warnings
from typing import Any, Dict, Iterator, Optional, Tuple

from .. import _core
from ..arch import find
from ..weights import Checkpoint, load_layers

#: The C++ graph of each model kind.
GRAPHS = {"encoder": _core.EncoderModel, "decoder": _core.DecoderModel, "seq2seq": _core.Seq2SeqModel}

# The packed-weights writer the builds of this context record into (models/_packed.py), or None.
_RECORDING: "contextvars.ContextVar[Optional[Any]]" = contextvars.ContextVar("cpuformer_packed_recording",
                                                                             default=None)


@contextlib.contextmanager
def recording(writer: Any) -> Iterator[None]:
    """Builds inside the block hand every packed weight to ``writer`` (a _core.PackedWeightsWriter)
    instead of mapping a packed-weights file."""
    token = _RECORDING.set(writer)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def packed_store(checkpoint: Checkpoint) -> Tuple[Optional[Any], str]:
    """What the C++ model takes packed weights from: the recording writer, or the converted
    directory's packed-weights file for the running ISA level (``cpuformer convert`` / ``cpuformer
    pack`` write it; docs/precision.md, "Packed weights"), mapped; None: pack at load. A damaged
    file is a ValueError naming it; for a stale one (the weights changed, another build's layouts)
    None and the warning to give once the model is built (a load that fails reports its own error
    alone)."""
    writer = _RECORDING.get()
    if writer is not None:
        return writer, ""
    # (A CLIP directory's towers are encoders, but none of its files is a text model's.)
    if checkpoint.stored is None or find(checkpoint.md.config)[0].kind not in GRAPHS:
        return None, ""
    store, warning = _core.open_packed(str(checkpoint.md.path))
    return store, warning


def _caller_level() -> int:
    """warnings.warn's stacklevel for the first frame outside the cpuformer package (the line of
    the user's code that loads the model)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "cpuformer":
        frame, level = frame.f_back, level + 1
    return level


def build(checkpoint: Checkpoint, weight_format: Dict[str, Any], *more_formats: Dict[str, Any]) -> Any:
    """The C++ model of ``checkpoint``'s kind, with every weight loaded; ``weight_format``: the
    config fields of weights.graph_format (dtype, head_dtype, group_size, zero_point). With
    ``more_formats``, a list of models, one per format, built from one read of the weights (each
    tensor is read once and packed for every model: a model and its speculative-decoding draft)."""
    hp = checkpoint.hp
    tensors, names = checkpoint.model_arrays()

    def add_layer(stack: str, layer_tensors: Dict[str, Any]) -> None:
        for model in models:
            model.add_layer(stack, layer_tensors)

    # One set of scratch buffers for joining and converting the weights of every layer (the C++
    # load scratch: fresh pages each time would cost their zeroing), freed when the model is built.
    with _core._LoadScratchScope():
        packed, warning = packed_store(checkpoint) if not more_formats else (None, "")
        models = [GRAPHS[hp.kind](dict(hp.as_dict(), **form), tensors, packed)
                  for form in (weight_format,) + more_formats]
        del tensors
        checkpoint.release(names)  # copied or packed by the models
        load_layers(checkpoint, add_layer)
    # The buffers that quantized and packed the weights are free now, but the C library keeps
    # freed heap memory for reuse: hand it back, so the resident size is the model's.
    _core._release_free_memory()
    if warning:
        warnings.warn(warning, stacklevel=_caller_level())
    return models if more_formats else models[0]


__all__ = ["GRAPHS", "build", "packed_store", "recording"]
