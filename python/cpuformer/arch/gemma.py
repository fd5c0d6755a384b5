"""Gemma: the Llama layout with three differences in the mathematics. The embeddings are multiplied
by √hidden_size, the feed-forward is gated with tanh-approximated GELU instead of SiLU (GeGLU), and
every RMSNorm multiplies by ``1 + w`` (the checkpoint stores ``w``; the load adds the one). The
head is tied to the embeddings by default, and head_dim is a config key of its own (256 by
default, not hidden_size / num_attention_heads)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

import numpy as np

from .llama import Llama
from .spec import Hparams, Source, Tensor, mapped, not_supported

# transformers 5 runs hidden_act and reads "gelu" as the tanh approximation (the legacy value of
# the official releases, meant as tanh); transformers 4 ran hidden_activation when present.
_HIDDEN_ACT = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu_tanh"}
_HIDDEN_ACTIVATION = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


def _activation(config: Mapping[str, Any]) -> str:
    activation = mapped(config, "hidden_act", "gelu_pytorch_tanh", _HIDDEN_ACT, " by Gemma")
    if config.get("hidden_activation") is not None:
        mapped(config, "hidden_activation", "", _HIDDEN_ACTIVATION, " by Gemma")
    return activation


class Gemma(Llama):
    family = "gemma"
    title = "Gemma"
    architectures = ("GemmaForCausalLM",)
    model_types = ("gemma",)

    default_max_positions = 8192  # GemmaConfig's defaults, like head_dim's

    def check(self, config: Mapping[str, Any]) -> None:
        super().check(config)
        not_supported(config.get("use_bidirectional_attention"),
                      "use_bidirectional_attention=true (Gemma as a bidirectional encoder) is not supported")

    def activation(self, config: Mapping[str, Any]) -> str:
        return _activation(config)

    def default_head_dim(self, hidden: int, heads: int) -> int:
        return 256

    def embed_scale(self, hidden: int) -> float:
        # transformers multiplies by torch.tensor(hidden_size ** 0.5): the float32 rounding of √hidden.
        return float(np.float32(hidden ** 0.5))

    def tied(self, config: Mapping[str, Any]) -> bool:
        return config.get("tie_word_embeddings", True) is not False

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        out = super().stack_tensors(config, hp, stack)
        norm = out["final_norm"]
        assert isinstance(norm, Tensor)
        out["final_norm"] = dataclasses.replace(norm, plus_one=True)
        return out

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        out = super().layer_tensors(hp, stack, layer)
        for norm in ("attn_norm", "ffn_norm"):
            out[norm] = dataclasses.replace(out[norm], plus_one=True)
        return out


ARCHS = (Gemma(),)
