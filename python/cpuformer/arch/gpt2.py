"""GPT-2: a pre-norm decoder with learned positions and Conv1D projections (weights stored
[in, out], transposed once at load) whose query, key and value share one fused tensor."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from .._model_dir import config_float, config_int
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported, weight_and_bias

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "gelu_fast": "gelu_tanh"}


class GPT2(Arch):
    kind = "decoder"
    family = "gpt2"
    title = "GPT-2"
    architectures = ("GPT2LMHeadModel", "GPT2Model")
    model_types = ("gpt2",)
    prefixes = ("transformer.", "")
    # attn.bias / attn.masked_bias: the causal-mask buffers older checkpoints saved.
    ignored = (r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias",)
    example = dict(activation_function="gelu_new", layer_norm_epsilon=1e-5)

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        # (aliases: transformers' GPT2Config.attribute_map)
        hidden = config_int(config, "n_embd", default=768, aliases=("hidden_size",))
        activation = mapped(config, "activation_function", "gelu_new", _ACTIVATIONS)
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            not_supported(config.get(flag), f"{flag}=true is not supported")
        not_supported(config.get("scale_attn_weights") is False, "scale_attn_weights=false is not supported")
        heads = config_int(config, "n_head", default=12, aliases=("num_attention_heads",))
        if hidden % heads:
            raise ValueError(f"config.json: n_embd {hidden} is not a multiple of n_head {heads}")
        n_inner = config.get("n_inner")
        return Hparams(
            kind="decoder", vocab_size=config_int(config, "vocab_size", default=50257), hidden_size=hidden,
            num_layers=config_int(config, "n_layer", default=12, aliases=("num_hidden_layers",)), num_heads=heads,
            head_dim=hidden // heads,
            intermediate_size=4 * hidden if n_inner is None else config_int(config, "n_inner"),
            norm="layer", norm_eps=config_float(config, "layer_norm_epsilon", default=1e-5, minimum=0.0),
            pre_norm=True, activation=activation, gated_ffn=False, positions="learned",
            max_positions=config_int(config, "n_positions", default=1024, aliases=("max_position_embeddings",)),
            final_norm=True, tie_word_embeddings=config.get("tie_word_embeddings", True) is not False)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("wte.weight"), "lm_head": Tensor("lm_head.weight", root=True, optional=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"embed.positions": Tensor("wpe.weight"), **weight_and_bias("final_norm", "ln_f")}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p, H = f"h.{layer}.", hp.hidden_size
        out: Dict[str, Tensor] = {}
        for i, name in enumerate(("attn.q", "attn.k", "attn.v")):  # row blocks of the fused c_attn
            out.update(weight_and_bias(name, p + "attn.c_attn", transpose=True, rows=(i * H, (i + 1) * H)))
        out.update(weight_and_bias("attn.o", p + "attn.c_proj", transpose=True))
        out.update(weight_and_bias("ffn.up", p + "mlp.c_fc", transpose=True))
        out.update(weight_and_bias("ffn.down", p + "mlp.c_proj", transpose=True))
        out.update(weight_and_bias("attn_norm", p + "ln_1"))
        out.update(weight_and_bias("ffn_norm", p + "ln_2"))
        return out


ARCHS = (GPT2(),)
