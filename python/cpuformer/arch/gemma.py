"""Gemma: the Llama layout with three differences in the mathematics. The embeddings are multiplied
by √hidden_size, the feed-forward is gated with tanh-approximated GELU instead of SiLU (GeGLU), and
every RMSNorm multiplies by ``1 + w`` (the checkpoint stores ``w``; the load adds the one). The
head is tied to the embeddings by default, and head_dim is a config key of its own (256 by
default, not hidden_size / num_attention_heads)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

import numpy as np

from .._model_dir import config_float, config_int
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

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        not_supported(config.get("use_bidirectional_attention"),
                      "use_bidirectional_attention=true (Gemma as a bidirectional encoder) is not supported")
        hidden = config_int(config, "hidden_size")
        heads = config_int(config, "num_attention_heads")
        kv_heads = config_int(config, "num_key_value_heads", default=heads)
        head_dim = config_int(config, "head_dim", default=256)  # GemmaConfig's default
        if heads % kv_heads:
            raise ValueError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                             f"{kv_heads}")
        if head_dim % 2:
            raise ValueError(f"config.json: RoPE needs an even head_dim, got {head_dim}")
        return Hparams(
            kind="decoder", vocab_size=config_int(config, "vocab_size"), hidden_size=hidden,
            num_layers=config_int(config, "num_hidden_layers"), num_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim, intermediate_size=config_int(config, "intermediate_size"), norm="rms",
            norm_eps=config_float(config, "rms_norm_eps", default=1e-6, minimum=0.0), pre_norm=True,
            activation=_activation(config), gated_ffn=True, positions="rope",
            max_positions=config_int(config, "max_position_embeddings", default=8192), final_norm=True,
            # transformers multiplies by torch.tensor(hidden_size ** 0.5): the float32 rounding of √hidden.
            embed_scale=float(np.float32(hidden ** 0.5)),
            tie_word_embeddings=config.get("tie_word_embeddings", True) is not False)

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
