"""The Llama family: Llama, Mistral (sliding window), Qwen2 (q/k/v bias), Qwen3 (per-head q/k
RMSNorm). Pre-norm RMSNorm decoders with rotary positions, grouped-query attention and a SwiGLU
feed-forward."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping

import numpy as np

from .._model_dir import config_float, config_int
from .spec import Arch, Hparams, Source, Tensor, not_supported, weight_and_bias

_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(config: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2] float32 as transformers computes them, with
    ``rope_scaling`` / ``rope_parameters`` types default, linear and llama3."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"config.json: rope_scaling must be an object, got {params!r}")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    theta = config_float({"rope_theta": theta}, "rope_theta", minimum=1e-9)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"config.json: unknown rope_scaling type {rope_type!r}; supported: {', '.join(_ROPE_TYPES)}")
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float64(theta) ** exponent.astype(np.float64))).astype(np.float32)
    if rope_type == "linear":
        factor = config_float(params, "factor", minimum=1e-9, source="config.json rope_scaling")
        inv_freq = (inv_freq / np.float32(factor)).astype(np.float32)
    elif rope_type == "llama3":
        source = "config.json rope_scaling"
        factor = config_float(params, "factor", minimum=1e-9, source=source)
        low = config_float(params, "low_freq_factor", minimum=1e-9, source=source)
        high = config_float(params, "high_freq_factor", minimum=1e-9, source=source)
        old = config_float(params, "original_max_position_embeddings", minimum=1, source=source)
        if high <= low:
            raise ValueError(f"{source}: high_freq_factor ({high}) must exceed low_freq_factor ({low})")
        low_wavelen, high_wavelen = old / low, old / high
        f = inv_freq.astype(np.float32)
        wavelen = np.float32(2 * math.pi) / f
        scaled = np.where(wavelen > low_wavelen, f / np.float32(factor), f).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    return np.ascontiguousarray(inv_freq, dtype=np.float32)


class Llama(Arch):
    kind = "decoder"
    family = "llama"
    title = "Llama"
    architectures = ("LlamaForCausalLM",)
    model_types = ("llama",)
    # rotary_emb.inv_freq: a buffer older checkpoints saved (recomputed from the config here).
    ignored = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)

    # What families built on this layout change (Gemma, Phi-3, ...).
    default_max_positions = 2048

    def window(self, config: Mapping[str, Any]) -> int:
        return 0

    def activation(self, config: Mapping[str, Any]) -> str:
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json: hidden_act {act!r} is not supported; the Llama family uses 'silu'")
        return "silu"

    def default_head_dim(self, hidden: int, heads: int) -> int:
        return hidden // heads

    def embed_scale(self, hidden: int) -> float:
        return 1.0

    def tied(self, config: Mapping[str, Any]) -> bool:
        return bool(config.get("tie_word_embeddings", False))

    def check(self, config: Mapping[str, Any]) -> None:
        """Family-specific refusals."""
        not_supported(config.get("mlp_bias"), "MLP biases (mlp_bias=true) are not supported")

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        self.check(config)
        hidden = config_int(config, "hidden_size")
        heads = config_int(config, "num_attention_heads")
        kv_heads = config_int(config, "num_key_value_heads", default=heads)
        head_dim = config.get("head_dim")
        head_dim = self.default_head_dim(hidden, heads) if head_dim is None else config_int(config, "head_dim")
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
            activation=self.activation(config), gated_ffn=True, positions="rope",
            max_positions=config_int(config, "max_position_embeddings", default=self.default_max_positions),
            final_norm=True, embed_scale=self.embed_scale(hidden), sliding_window=self.window(config),
            qk_norm=self.family == "qwen3", tie_word_embeddings=self.tied(config))

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("model.embed_tokens.weight"),
                "lm_head": Tensor("lm_head.weight", optional=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"rope.inv_freq": rope_inv_freq(config, hp.head_dim), "final_norm": Tensor("model.norm.weight")}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"model.layers.{layer}."
        out: Dict[str, Tensor] = {}
        for name, proj in (("attn.q", "q_proj"), ("attn.k", "k_proj"), ("attn.v", "v_proj"), ("attn.o", "o_proj")):
            out.update(weight_and_bias(name, p + "self_attn." + proj, bias="optional"))
        # No MLP biases: the family has them only with mlp_bias, which hparams refuses, so a stray
        # up_proj.bias is named as unused rather than silently dropped by the gated feed-forward.
        out["ffn.gate"] = Tensor(p + "mlp.gate_proj.weight")
        out["ffn.up"] = Tensor(p + "mlp.up_proj.weight")
        out["ffn.down"] = Tensor(p + "mlp.down_proj.weight")
        out["attn_norm"] = Tensor(p + "input_layernorm.weight")
        out["ffn_norm"] = Tensor(p + "post_attention_layernorm.weight")
        if hp.qk_norm:
            out["attn.q_norm"] = Tensor(p + "self_attn.q_norm.weight")
            out["attn.k_norm"] = Tensor(p + "self_attn.k_norm.weight")
        return out


class Mistral(Llama):
    family = "mistral"
    title = "Mistral"
    architectures = ("MistralForCausalLM",)
    model_types = ("mistral",)

    def window(self, config: Mapping[str, Any]) -> int:
        return 0 if config.get("sliding_window") is None else config_int(config, "sliding_window")


class Qwen2(Llama):
    family = "qwen2"
    title = "Qwen2"
    architectures = ("Qwen2ForCausalLM",)
    model_types = ("qwen2",)

    def window(self, config: Mapping[str, Any]) -> int:
        not_supported(config.get("use_sliding_window") and config.get("sliding_window"),
                      "use_sliding_window=true (per-layer sliding windows) is not supported")
        return 0


class Qwen3(Qwen2):
    family = "qwen3"
    title = "Qwen3"
    architectures = ("Qwen3ForCausalLM",)
    model_types = ("qwen3",)


ARCHS = (Llama(), Mistral(), Qwen2(), Qwen3())
