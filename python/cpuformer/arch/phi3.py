"""Phi-3: the Llama mathematics with fused checkpoint tensors. ``qkv_proj`` holds the query, key and
value rows one after the other ([num_heads·D | num_kv_heads·D | num_kv_heads·D], unequal blocks
under grouped-query attention) and ``gate_up_proj`` the gate and up rows ([I | I]); the loader
slices them into the canonical weights. Attention uses config.sliding_window as Mistral does.
Only the short-context models are supported: their RoPE is the default one."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from .._model_dir import config_float
from .llama import Mistral
from .spec import Hparams, Tensor, not_supported

#: Phi-3's long-context RoPE (the 128k models); transformers reads "su" and "yarn" as "longrope".
_LONG_ROPE = ("longrope", "su", "yarn")


def _check_rope(config: Mapping[str, Any]) -> None:
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    params = config.get(key) or {}
    if not isinstance(params, dict):
        raise ValueError(f"config.json: {key} must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    not_supported(rope_type in _LONG_ROPE,
                  f"{key} type {rope_type!r} (Phi-3's long-context RoPE with long_factor / short_factor) is not "
                  "supported; the short-context Phi-3 models (rope_scaling null) are")
    if rope_type != "default":  # as transformers' Phi3Config.validate_rope
        raise ValueError(f"config.json: {key} type {rope_type!r} is not a Phi-3 RoPE type; use 'default'")
    for source, values in (("config.json", config), (f"config.json {key}", params)):
        factor = config_float(values, "partial_rotary_factor", default=1.0, minimum=0.0, source=source)
        not_supported(factor != 1.0, f"partial_rotary_factor {factor} (RoPE on part of each head) is not supported")


class Phi3(Mistral):  # (Mistral: the Llama family with config.sliding_window)
    family = "phi3"
    title = "Phi-3"
    architectures = ("Phi3ForCausalLM",)
    model_types = ("phi3",)

    def check(self, config: Mapping[str, Any]) -> None:
        super().check(config)
        _check_rope(config)

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"model.layers.{layer}."
        q, kv, inner = hp.num_heads * hp.head_dim, hp.num_kv_heads * hp.head_dim, hp.intermediate_size
        qkv, gate_up = p + "self_attn.qkv_proj.weight", p + "mlp.gate_up_proj.weight"
        return {
            "attn.q": Tensor(qkv, rows=(0, q)),
            "attn.k": Tensor(qkv, rows=(q, q + kv)),
            "attn.v": Tensor(qkv, rows=(q + kv, q + 2 * kv)),
            "attn.o": Tensor(p + "self_attn.o_proj.weight"),
            "ffn.gate": Tensor(gate_up, rows=(0, inner)),
            "ffn.up": Tensor(gate_up, rows=(inner, 2 * inner)),
            "ffn.down": Tensor(p + "mlp.down_proj.weight"),
            "attn_norm": Tensor(p + "input_layernorm.weight"),
            "ffn_norm": Tensor(p + "post_attention_layernorm.weight"),
        }


ARCHS = (Phi3(),)
