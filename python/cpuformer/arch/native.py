"""Families declared in C++ (``csrc/models/arch/``), the registry the C API reads too: each is an
``Arch`` here whose ``hparams`` and tensor maps come from the binding, so the Python package and
libcpuformer turn a config.json into the same hyperparameters and the same canonical weights, with
the same messages. Families still written in Python (their own modules in this package) move here
one by one; a family is declared in exactly one of the two places.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from .. import _core
from .heads import Head, head_of
from .spec import Arch, Hparams, Memory, Source, Tensor

_HPARAM_FIELDS = tuple(field.name for field in dataclasses.fields(Hparams))


def _config(config: Mapping[str, Any]) -> Dict[str, Any]:
    if not isinstance(config, Mapping):
        raise ValueError(f"config.json: must be a JSON object, got {type(config).__name__}")
    return config if isinstance(config, dict) else dict(config)


def _sources(entries: Mapping[str, Any]) -> Dict[str, Source]:
    return {name: entry if isinstance(entry, np.ndarray) else Tensor(**entry) for name, entry in entries.items()}


class NativeArch(Arch):
    """A family of the C++ registry (``_core.arch_families()``)."""

    def __init__(self, info: Mapping[str, Any]):
        self.kind = info["kind"]
        self.family = info["family"]
        self.title = info["title"]
        self.architectures = tuple(info["architectures"])
        self.model_types = tuple(info["model_types"])
        self.prefixes = tuple(info["prefixes"])
        self.ignored = tuple(info["ignored"])
        self.example = json.loads(info["example"])
        self.tied_copies = tuple(tuple(pair) for pair in info["tied_copies"])
        self.start_from_pad = bool(info["start_from_pad"])

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        fields = _core.arch_hparams(self.family, _config(config))
        return Hparams(**{name: fields[name] for name in _HPARAM_FIELDS})

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return _sources(_core.arch_tensors(self.family, "model", _config(config), hp.as_dict()))

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return _sources(_core.arch_tensors(self.family, "stack", _config(config), hp.as_dict(), stack))

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Head]:
        declared = _core.arch_head(self.family, _config(config), hp.as_dict(), task)
        return None if declared is None else head_of(declared)

    def memory(self, config: Mapping[str, Any]) -> Optional[Memory]:
        declared = _core.arch_memory(self.family, _config(config))
        return None if declared is None else Memory(*declared)

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        entries = _sources(_core.arch_tensors(self.family, "layer", None, hp.as_dict(), stack, layer))
        assert all(isinstance(entry, Tensor) for entry in entries.values())
        return entries  # type: ignore[return-value]


_FAMILIES = {info["family"]: info for info in _core.arch_families()}


def archs(*families: str) -> Tuple[Arch, ...]:
    """The C++ registry's families, in the order given."""
    return tuple(NativeArch(_FAMILIES[family]) for family in families)


def rope_inv_freq(config: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2] float32 as transformers computes them, with
    ``rope_scaling`` / ``rope_parameters`` types default, linear and llama3 (computed by the C++
    registry, for the families declared in Python too)."""
    return _core.rope_inv_freq(_config(config), head_dim)


#: The encoder families (csrc/models/arch/encoders.cc): BERT, RoBERTa, XLM-RoBERTa, DistilBERT, and
#: those built on them: MPNet, ELECTRA and ALBERT.
BERTS = archs("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "albert")
#: DeBERTa-v2/v3, ModernBERT and XLNet (csrc/models/arch/encoders.cc).
DEBERTA_MODERNBERT_XLNET = archs("deberta-v2", "modernbert", "xlnet")
#: The decoder families (csrc/models/arch/decoders.cc): GPT-2 and the Llama family.
DECODERS = archs("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")
#: The encoder-decoder families (csrc/models/arch/seq2seq.cc): Marian, BART, mBART, M2M100 / NLLB,
#: T5 and mT5.
SEQ2SEQ = archs("marian", "bart", "mbart", "m2m100", "t5", "mt5")

__all__ = ["BERTS", "DEBERTA_MODERNBERT_XLNET", "DECODERS", "NativeArch", "SEQ2SEQ", "archs", "rope_inv_freq"]
