"""T5 and mT5: pre-norm RMSNorm encoder-decoders with a bucketed relative position bias (one
table per stack, in its first layer), unscaled attention, a ReLU (v1.0) or gated-GELU (v1.1,
flan-T5, mT5) feed-forward, and a tied head scaled by d_model^-0.5 or an untied head."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from .._model_dir import config_float, config_int
from .bart import ACTIVATIONS
from .spec import Arch, Hparams, Source, Tensor


def feed_forward(config: Mapping[str, Any]) -> Tuple[str, bool]:
    """T5's feed_forward_proj ("relu", "gated-gelu", ...) as (activation, gated)."""
    proj = config.get("feed_forward_proj", "relu")
    if not isinstance(proj, str):
        raise ValueError(f"config.json: feed_forward_proj must be a string, got {proj!r}")
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    act = parts[-1]
    if len(parts) > 2 or (len(parts) == 2 and not gated) or act not in ACTIVATIONS:
        raise NotImplementedError(f"config.json: feed_forward_proj {proj!r} is not supported; use 'relu', "
                                  "'gated-gelu' or '[gated-]<activation>' with an activation among "
                                  f"{', '.join(sorted(ACTIVATIONS))}")
    if proj == "gated-gelu":
        act = "gelu_new"  # transformers maps T5's "gated-gelu" to the tanh approximation
    return ACTIVATIONS[act], gated


def relative_attention(config: Mapping[str, Any]) -> Tuple[int, int]:
    """T5's (relative_attention_num_buckets, relative_attention_max_distance), checked so that the
    bucket formula (transformers' T5Attention._relative_position_bucket, csrc/layers/relative_position.cc)
    stays inside the bias table.

    Distances below max_exact get their own bucket; larger ones get
    max_exact + log(distance / max_exact) / log(max_distance / max_exact) * (buckets - max_exact),
    where buckets and max_exact = buckets // 2 are halved for the encoder's bidirectional attention
    (num_buckets // 2 and num_buckets // 4) and not for the decoder's causal one (num_buckets and
    num_buckets // 2). max_exact = 0 divides by zero (a NaN bucket); max_distance <= max_exact
    makes the denominator zero or negative, so buckets become NaN or negative (reads before the
    table). Hence num_buckets >= 4 and max_distance > num_buckets // 2.
    """
    num_buckets = config_int(config, "relative_attention_num_buckets", default=32, minimum=4,
                             note=" (the encoder's bidirectional buckets need num_buckets // 4 >= 1)")
    max_distance = config_int(config, "relative_attention_max_distance", default=128, minimum=num_buckets // 2 + 1,
                              note=f" (more than relative_attention_num_buckets // 2 = {num_buckets // 2}, the "
                                   "decoder's exactly bucketed distances)")
    return num_buckets, max_distance


class T5(Arch):
    kind = "seq2seq"
    family = "t5"
    title = "T5"
    architectures = ("T5ForConditionalGeneration",)
    model_types = ("t5",)
    # The encoder's and decoder's embed_tokens are the shared table (tied copies).
    ignored = (r"(encoder|decoder)\.embed_tokens\.weight",)
    start_from_pad = True

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        # (aliases: transformers' T5Config.attribute_map)
        d = config_int(config, "d_model", default=512, aliases=("hidden_size",))
        heads = config_int(config, "num_heads", default=8, aliases=("num_attention_heads",))
        activation, gated = feed_forward(config)
        num_layers = config_int(config, "num_layers", default=6, aliases=("num_hidden_layers",))
        num_buckets, max_distance = relative_attention(config)
        decoder_layers = config.get("num_decoder_layers")
        tied = config.get("tie_word_embeddings", True) is not False
        # transformers 5 records the d_model^-0.5 output scaling of tied (v1.0) heads as
        # scale_decoder_outputs; older configs imply it by tie_word_embeddings. mT5 never scales.
        scaled = self.family == "t5" and config.get("scale_decoder_outputs", tied) is not False
        return Hparams(
            kind="seq2seq", vocab_size=config_int(config, "vocab_size", default=32128), hidden_size=d,
            num_layers=num_layers,
            num_decoder_layers=num_layers if decoder_layers is None else config_int(config, "num_decoder_layers"),
            num_heads=heads, head_dim=config_int(config, "d_kv", default=64, aliases=("head_dim",)),
            intermediate_size=config_int(config, "d_ff", default=2048), norm="rms",
            norm_eps=config_float(config, "layer_norm_epsilon", default=1e-6, minimum=0.0), pre_norm=True,
            activation=activation, gated_ffn=gated, positions="relative", max_positions=0, final_norm=True,
            attention_scale=1.0, num_buckets=num_buckets, max_distance=max_distance, tie_word_embeddings=tied,
            head_scale=d ** -0.5 if scaled else 1.0)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("shared.weight", fallbacks=("encoder.embed_tokens.weight",)),
                "lm_head": Tensor("lm_head.weight", optional=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"relative_bias": Tensor(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
                "final_norm": Tensor(f"{stack}.final_layer_norm.weight")}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"{stack}.block.{layer}.layer."
        out = {f"attn.{key}": Tensor(f"{p}0.SelfAttention.{key}.weight") for key in "qkvo"}
        out["attn_norm"] = Tensor(f"{p}0.layer_norm.weight")
        ffn = 1
        if stack == "decoder":
            out.update({f"cross.{key}": Tensor(f"{p}1.EncDecAttention.{key}.weight") for key in "qkvo"})
            out["cross_norm"] = Tensor(f"{p}1.layer_norm.weight")
            ffn = 2
        dense = f"{p}{ffn}.DenseReluDense."
        if hp.gated_ffn:
            out["ffn.gate"] = Tensor(dense + "wi_0.weight")
            out["ffn.up"] = Tensor(dense + "wi_1.weight")
        else:
            out["ffn.up"] = Tensor(dense + "wi.weight")
        out["ffn.down"] = Tensor(dense + "wo.weight")
        out["ffn_norm"] = Tensor(f"{p}{ffn}.layer_norm.weight")
        return out


class MT5(T5):
    family = "mt5"
    title = "mT5"
    architectures = ("MT5ForConditionalGeneration",)
    model_types = ("mt5",)


ARCHS = (T5(), MT5())
