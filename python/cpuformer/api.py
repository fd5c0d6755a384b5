"""``cpuformer.load``: open a Hugging Face model directory as the model class its config names."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Union

from . import weights
from ._model_dir import ModelDir
from .arch import find
from .models import CLASSES, CLIP, CLIPText, CLIPVision, Encoder, Generator, ImageEncoder, Seq2Seq
from .models._graph_file import write_graph_file
from .models._packed import write_packed_file


def load(path: Union[str, os.PathLike], dtype: Optional[str] = None, num_threads: Optional[int] = None,
         quantization: Optional[Mapping[str, Any]] = None
         ) -> Union[Encoder, Generator, Seq2Seq, ImageEncoder, CLIP, CLIPText, CLIPVision]:
    """Opens the model directory ``path`` as the model class its config names.

    Returns an :class:`~cpuformer.Encoder` for BERT / RoBERTa / XLM-RoBERTa / DistilBERT
    checkpoints (base models and task-head checkpoints; the heads are ignored), a
    :class:`~cpuformer.Generator` for GPT-2 / Llama / Mistral / Qwen2 / Qwen3 causal LMs, a
    :class:`~cpuformer.Seq2Seq` for Marian / BART / mBART / T5 / mT5 encoder-decoders, an
    :class:`~cpuformer.ImageClassifier` for ViT / DeiT / Swin image classification checkpoints, an
    :class:`~cpuformer.ImageEncoder` for their base models (Swin: their subclasses in
    ``cpuformer.models.swin``), a :class:`~cpuformer.CLIP` for CLIP checkpoints and a
    :class:`~cpuformer.CLIPText` / :class:`~cpuformer.CLIPVision` for one CLIP tower (the
    registry in ``cpuformer.arch`` lists every architecture). Unknown architectures raise
    ValueError listing what is supported.

    dtype: weight storage of the matrix multiplications, "float32", "float16", "bfloat16", "int8"
    or "int4" (docs/precision.md); None: float32, or the dtype a converted directory stores.
    quantization: {"group_size": 32 | 64 | 128, "zero_point": bool} for int4 weights,
    {"lm_head": dtype} for the LM head and {"embeddings": "float32" | "int8"} for the token-embedding
    table (both int8 by default under int4); None: the defaults, or what a converted directory
    stores.
    """
    model_dir = ModelDir(path)
    try:
        arch, _ = find(model_dir.config)
    except BaseException:
        model_dir.close()
        raise
    return CLASSES[arch.kind](model_dir, dtype=dtype, num_threads=num_threads, quantization=quantization)



def convert(src: Union[str, os.PathLike], dst: Union[str, os.PathLike], dtype: str, progress: bool = True,
            quantization: Optional[Mapping[str, Any]] = None, pack: bool = True) -> None:
    """Writes a copy of the model directory ``src`` to ``dst`` with its matmul weights stored in
    ``dtype`` ("int8", "int4", "float16", "bfloat16" or "float32"), ready to load zero-copy
    (``cpuformer.weights.convert``: the format, the quantization settings, the atomic write).
    A text model's copy also holds ``cpuformer_graph.json``, the manifest the C API opens it
    with (docs/c-api.md), and with ``pack`` (the default) ``cpuformer_packed.<level>.bin``, its
    weights packed for this machine's ISA level, which loading maps instead of packing
    (docs/precision.md, "Packed weights"; ``cpuformer pack DIR`` adds another machine's)."""
    def finish(directory: Any) -> None:
        write_graph_file(directory)
        if pack:
            write_packed_file(directory, required=False)

    weights.convert(src, dst, dtype, progress=progress, quantization=quantization, finish=finish)


__all__ = ["convert", "load"]
