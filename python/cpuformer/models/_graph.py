"""Builds the C++ model of a checkpoint: the one seam between the Python layer and the graphs.

Every model kind takes the same two things (csrc/bindings/config.h, model_builder.h): the
hyperparameters (``arch.Hparams`` plus the weight format, ``weights.graph_format``) and canonical
tensors — the model-level ones (each stack's under ``"<stack>."``) at construction, then one layer
at a time with ``add_layer(stack, tensors)``.
"""

from __future__ import annotations

from typing import Any, Dict

from .. import _core
from ..weights import Checkpoint, load_layers

#: The C++ graph of each model kind.
GRAPHS = {"encoder": _core.EncoderModel, "decoder": _core.DecoderModel, "seq2seq": _core.Seq2SeqModel}


def build(checkpoint: Checkpoint, weight_format: Dict[str, Any], *more_formats: Dict[str, Any]) -> Any:
    """The C++ model of ``checkpoint``'s kind, with every weight loaded; ``weight_format``: the
    config fields of weights.graph_format (dtype, head_dtype, group_size, zero_point). With
    ``more_formats``, a list of models, one per format, built from one read of the weights (each
    tensor is read once and packed for every model: a model and its speculative-decoding draft)."""
    hp = checkpoint.hp
    checkpoint.check_accounted()
    tensors, names = checkpoint.read(checkpoint.top)
    for stack, _ in checkpoint.arch.stacks(hp):
        arrays, stack_names = checkpoint.read(checkpoint.stack_sources(stack))
        tensors.update({f"{stack}.{name}": array for name, array in arrays.items()})
        names += stack_names

    def add_layer(stack: str, layer_tensors: Dict[str, Any]) -> None:
        for model in models:
            model.add_layer(stack, layer_tensors)

    # One set of scratch buffers for joining and converting the weights of every layer (the C++
    # load scratch: fresh pages each time would cost their zeroing), freed when the model is built.
    with _core._LoadScratchScope():
        models = [GRAPHS[hp.kind](dict(hp.as_dict(), **form), tensors) for form in (weight_format,) + more_formats]
        del tensors
        checkpoint.release(names)  # copied or packed by the models
        load_layers(checkpoint, add_layer)
    # The buffers that quantized and packed the weights are free now, but the C library keeps
    # freed heap memory for reuse: hand it back, so the resident size is the model's.
    _core._release_free_memory()
    return models if more_formats else models[0]


__all__ = ["GRAPHS", "build"]
