"""The architecture registry: every family cpuformer runs, declared once (one module per family).

``find(config)`` picks the family a config.json describes: the first ``architectures`` entry that
a family claims, else its ``model_type``. Everything that depends on a family (loading,
converting, random benchmark checkpoints, the CLI help, the unknown-architecture error) reads
``ARCHS`` through the functions here.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from . import (
    clip,
    native,
    swin,
    vit,
)
from .spec import KIND_CLASS, KIND_TEXT, KINDS, MATMUL, NORMS, Arch, Hparams, Source, Tensor, canonical_shape

#: Every registered architecture family, encoders first.
ARCHS: Tuple[Arch, ...] = (native.BERTS + native.DEBERTA_MODERNBERT_XLNET
                           + native.DECODERS + native.SEQ2SEQ
                           + vit.ARCHS + swin.ARCHS + clip.ARCHS)


def supported(kind: str) -> List[str]:
    """The config.json architectures of one model kind, sorted."""
    return sorted(name for arch in ARCHS if arch.kind == kind for name in arch.architectures)


KIND_PLURAL = {"encoder": "encoders", "decoder": "decoders (causal LMs)", "seq2seq": "encoder-decoders (seq2seq)",
               "vision": "image models", "clip": "CLIP models"}


def supported_text() -> str:
    """What each model kind supports, for error messages and the CLI help."""
    parts = []
    for kind in KINDS:
        types = sorted({t for arch in ARCHS if arch.kind == kind for t in arch.model_types})
        parts.append(f"{KIND_PLURAL[kind]} {', '.join(supported(kind))} (model_type {', '.join(types)})")
    return "supported: " + "; ".join(parts)


def find(config: Mapping[str, Any]) -> Tuple[Arch, str]:
    """(family, name) for a config: name is the architecture (or model_type) the choice was made
    from. ValueError listing what is supported for an unknown one."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ValueError(f"config.json: 'architectures' must be a list of class names, got {architectures!r}")
    for name in architectures:
        for arch in ARCHS:
            if arch.claims(name):
                return arch, name
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        for arch in ARCHS:
            if model_type in arch.model_types:
                return arch, architectures[0] if architectures else model_type
    described = ", ".join(architectures) if architectures else "none"
    raise ValueError(f"unknown architecture (architectures: {described}; model_type: {model_type!r}); "
                     + supported_text())


def wrong_kind(kind: str, name: str) -> ValueError:
    """The error for a model class opened on another kind of model (e.g. Encoder on a GPT-2)."""
    return ValueError(f"{name} is {KIND_TEXT[kind]} architecture; open it with cpuformer.{KIND_CLASS[kind]} or "
                      "cpuformer.load")


def titles(kind: str) -> str:
    """The families of one model kind in prose, in registry order ("GPT-2, Llama, Mistral, ...")."""
    return ", ".join(arch.title for arch in ARCHS if arch.kind == kind)


def by_family() -> Dict[str, Arch]:
    return {arch.family: arch for arch in ARCHS}


__all__ = ["ARCHS", "Arch", "Hparams", "KINDS", "KIND_CLASS", "KIND_TEXT", "MATMUL", "NORMS", "Source", "Tensor",
           "by_family", "canonical_shape", "find", "supported", "supported_text", "titles", "wrong_kind"]
