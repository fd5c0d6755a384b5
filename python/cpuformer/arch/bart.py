"""BART and mBART: encoder-decoders with learned positions (the first two rows reserved), a norm
over the embeddings and, for mBART, pre-norm layers with a final norm per stack. Marian (marian.py)
is the same network with sinusoidal positions."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping

from .._model_dir import config_int
from .spec import Arch, Hparams, Source, Tensor, not_supported, weight_and_bias

#: Hugging Face activation names -> cpuformer's (the seq2seq families accept all of them).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "swish": "silu", "silu": "silu"}


class Bart(Arch):
    kind = "seq2seq"
    family = "bart"
    title = "BART"
    architectures = ("BartForConditionalGeneration",)
    model_types = ("bart",)
    prefixes = ("model.", "")
    # The encoder's and decoder's embed_tokens are the shared table (tied copies).
    ignored = (r"(model\.)?(encoder|decoder)\.embed_tokens\.weight",)
    tied_copies = (("encoder.embed_tokens.weight", "shared.weight"), ("decoder.embed_tokens.weight", "shared.weight"))
    pre_norm = False

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        # (aliases: transformers' Marian/Bart/MBartConfig.attribute_map)
        d = config_int(config, "d_model", default=1024, aliases=("hidden_size",))
        heads = config_int(config, "encoder_attention_heads", default=16, aliases=("num_attention_heads",))
        not_supported(config_int(config, "decoder_attention_heads", default=heads) != heads,
                      "encoder_attention_heads != decoder_attention_heads is not supported")
        ffn = config_int(config, "encoder_ffn_dim", default=4096)
        not_supported(config_int(config, "decoder_ffn_dim", default=ffn) != ffn,
                      "encoder_ffn_dim != decoder_ffn_dim is not supported")
        if d % heads:
            raise ValueError(f"config.json: d_model {d} is not a multiple of encoder_attention_heads {heads}")
        act = config.get("activation_function", "gelu")
        not_supported(act not in ACTIVATIONS, f"activation_function {act!r} is not supported; use one of "
                                              f"{', '.join(sorted(ACTIVATIONS))}")
        self.check(config)
        marian = self.family == "marian"
        return Hparams(
            kind="seq2seq", vocab_size=config_int(config, "vocab_size"), hidden_size=d,
            num_layers=config_int(config, "encoder_layers", default=12, aliases=("num_hidden_layers",)),
            num_decoder_layers=config_int(config, "decoder_layers", default=12), num_heads=heads,
            head_dim=d // heads, intermediate_size=ffn, norm="layer", norm_eps=1e-5, pre_norm=self.pre_norm,
            activation=ACTIVATIONS[act], gated_ffn=False, positions="sinusoidal" if marian else "learned",
            max_positions=config_int(config, "max_position_embeddings", default=1024),
            position_offset=0 if marian else 2, embedding_norm=not marian, final_norm=self.pre_norm,
            embed_scale=math.sqrt(d) if config.get("scale_embedding", marian) else 1.0,
            attention_scale=(d // heads) ** -0.5,
            tie_word_embeddings=config.get("tie_word_embeddings", True) is not False)

    def check(self, config: Mapping[str, Any]) -> None:
        """Family-specific refusals."""

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("shared.weight", fallbacks=("encoder.embed_tokens.weight",)),
                "lm_head": Tensor("lm_head.weight", root=True, optional=True),
                "lm_head.bias": Tensor("final_logits_bias", root=True, optional=True, as_row=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        out: Dict[str, Source] = {"embed.positions": Tensor(f"{stack}.embed_positions.weight"),
                                  **weight_and_bias("embed.norm", f"{stack}.layernorm_embedding")}
        if hp.final_norm:
            out.update(weight_and_bias("final_norm", f"{stack}.layer_norm"))
        return out

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"{stack}.layers.{layer}."
        attentions = [("attn", "self_attn")] + ([("cross", "encoder_attn")] if stack == "decoder" else [])
        out: Dict[str, Tensor] = {}
        for canonical, module in attentions:
            for key, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
                out.update(weight_and_bias(f"{canonical}.{key}", f"{p}{module}.{proj}", bias="optional"))
            out.update(weight_and_bias(f"{canonical}_norm", f"{p}{module}_layer_norm"))
        out.update(weight_and_bias("ffn.up", p + "fc1", bias="optional"))
        out.update(weight_and_bias("ffn.down", p + "fc2", bias="optional"))
        out.update(weight_and_bias("ffn_norm", p + "final_layer_norm"))
        return out


class MBart(Bart):
    family = "mbart"
    title = "mBART"
    architectures = ("MBartForConditionalGeneration",)
    model_types = ("mbart",)
    pre_norm = True


ARCHS = (Bart(), MBart())
