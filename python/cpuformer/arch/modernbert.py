"""ModernBERT: a pre-norm encoder with rotary positions, a GeGLU feed-forward and alternating
global and local attention (transformers' ``modeling_modernbert.py``).

- Embeddings: token embeddings, then a LayerNorm (no position table, no token types).
- Layer l: ``h += Wo(attn(attn_norm(h)))``, ``h += Wo(act(input) * gate)`` with
  ``input, gate = Wi(mlp_norm(h))``; layer 0 has no attention norm (``nn.Identity``: the embedding
  norm precedes it). ``attn.Wqkv`` holds the query, key and value rows one after the other.
- A final LayerNorm. LayerNorms have no bias unless ``norm_bias``.
- Layer l attends to every key when ``l % global_attn_every_n_layers == 0`` (RoPE theta
  ``global_rope_theta``), otherwise to the keys with ``|i - j| <= local_attention // 2`` (theta
  ``local_rope_theta``): transformers' ``create_bidirectional_sliding_window_mask`` with
  ``config.sliding_window = local_attention // 2``. cpuformer's window counts the keys within
  ``sliding_window - 1`` positions, hence ``local_attention // 2 + 1``.

Positions are ``0..T-1`` for every sequence, padding included, as transformers' default
``position_ids``; padded keys are masked. transformers' unpadded (flash-attention) path gives the
same results for the unpadded positions.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from .._model_dir import config_float, config_int
from .heads import Head, HeadBuilder, labels
from .native import rope_inv_freq
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported, weight_and_bias

# transformers' ACT2FN names for hidden_activation.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "silu": "silu", "swish": "silu"}
_HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
          "ForMultipleChoice")
_HEAD_ACTIVATIONS = dict(_ACTIVATIONS, tanh="tanh")
_POOLINGS = ("cls", "mean")
_LAYER_TYPES = ("full_attention", "sliding_attention")
#: transformers' ModernBertConfig.default_theta.
_DEFAULT_THETA = {"full_attention": 160000.0, "sliding_attention": 10000.0}


def _layer_pattern(config: Mapping[str, Any], layers: int) -> int:
    """n such that layer l is global iff l % n == 0: global_attn_every_n_layers (default 3), or
    the pattern of an explicit layer_types list (transformers 5 saves one), which must be of that
    form."""
    every_key = "global_attn_every_n_layers"
    types = config.get("layer_types")
    if types is None:
        return config_int(config, every_key, default=3)
    if not isinstance(types, list) or len(types) != layers or any(t not in _LAYER_TYPES for t in types):
        raise ValueError(f"config.json: layer_types must list {layers} entries (num_hidden_layers) of "
                         f"{' or '.join(map(repr, _LAYER_TYPES))}, got {types!r}")
    if config.get(every_key) is not None:
        every = config_int(config, every_key)
    else:  # the first global layer after layer 0, or none
        every = next((l for l, t in enumerate(types) if l > 0 and t == "full_attention"), max(layers, 1))
    expected: List[str] = ["full_attention" if l % every == 0 else "sliding_attention" for l in range(layers)]
    not_supported(types != expected,
                  f"layer_types {types!r} is not supported; cpuformer runs ModernBERT's pattern of a global "
                  f"(full_attention) layer every {every} layers starting with layer 0")
    return every


def _rope_theta(config: Mapping[str, Any], layer_type: str) -> float:
    """The RoPE theta of one layer type: rope_parameters[layer_type] (transformers 5), else
    global_rope_theta / local_rope_theta (a null local_rope_theta means the global one, as in
    transformers 4); only the default RoPE."""
    params = config.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"config.json: rope_parameters must be an object, got {params!r}")
    unknown = sorted(set(params) - set(_LAYER_TYPES))
    if unknown:
        raise ValueError(f"config.json: rope_parameters must map the layer types {', '.join(_LAYER_TYPES)} to "
                         f"their RoPE parameters, got the keys {', '.join(map(str, unknown))}")
    own = params.get(layer_type) or {}
    scaling = config.get("rope_scaling") or {}
    for key, values in ((f"rope_parameters[{layer_type!r}]", own), ("rope_scaling", scaling)):
        if not isinstance(values, dict):
            raise ValueError(f"config.json: {key} must be an object, got {values!r}")
        rope_type = values.get("rope_type", values.get("type", "default"))
        not_supported(rope_type != "default", f"{key} type {rope_type!r} is not supported; only the default RoPE is")
    if own.get("rope_theta") is not None:
        return config_float(own, "rope_theta", minimum=1e-9, source=f"config.json rope_parameters[{layer_type!r}]")
    global_theta = config_float(config, "global_rope_theta", default=_DEFAULT_THETA["full_attention"], minimum=1e-9)
    if layer_type == "full_attention":
        return global_theta
    if "local_rope_theta" in config and config["local_rope_theta"] is None:
        return global_theta
    return config_float(config, "local_rope_theta", default=_DEFAULT_THETA["sliding_attention"], minimum=1e-9)


class ModernBert(Arch):
    kind = "encoder"
    family = "modernbert"
    title = "ModernBERT"
    architectures = tuple("ModernBert" + head for head in _HEADS)
    model_types = ("modernbert",)
    prefixes = ("", "model.")
    # Task heads (head: dense + norm of the classification and MLM heads; classifier; the MLM
    # decoder, tied to the embeddings) are not run.
    ignored = (r"head\..*", r"classifier\..*", r"decoder\..*")
    example = dict(hidden_activation="gelu", global_attn_every_n_layers=3, local_attention=128,
                   global_rope_theta=160000.0, local_rope_theta=10000.0, norm_eps=1e-5, norm_bias=False,
                   pad_token_id=0)

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        not_supported(config.get("mlp_bias"), "mlp_bias=true (biases of the gated Wi projection) is not supported")
        hidden = config_int(config, "hidden_size", default=768)
        heads = config_int(config, "num_attention_heads", default=12)
        if hidden % heads:
            raise ValueError(f"config.json: hidden size {hidden} is not a multiple of the number of attention "
                             f"heads {heads}")
        head_dim = hidden // heads
        # transformers' RoPE reads head_dim when set; its attention always uses hidden / heads.
        not_supported(config.get("head_dim") not in (None, head_dim),
                      f"head_dim {config.get('head_dim')!r} other than hidden_size / num_attention_heads "
                      f"({head_dim}) is not supported")
        if head_dim % 2:
            raise ValueError(f"config.json: RoPE needs an even head dimension (hidden_size / num_attention_heads), "
                             f"got {head_dim}")
        layers = config_int(config, "num_hidden_layers", default=22)
        vocab = config_int(config, "vocab_size", default=50368)
        pad = config_int(config, "pad_token_id", default=50283, minimum=0)
        if pad >= vocab:
            raise ValueError(f"config.json: pad_token_id {pad} must be < vocab_size {vocab}")
        local_attention = config_int(config, "local_attention", default=128, minimum=0)
        for layer_type in _LAYER_TYPES:  # (refused here, before any weight is read)
            _rope_theta(config, layer_type)
        return Hparams(
            kind="encoder", vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
            head_dim=head_dim, intermediate_size=config_int(config, "intermediate_size", default=1152),
            norm="layer", norm_eps=config_float(config, "norm_eps", default=1e-5, minimum=0.0), pre_norm=True,
            activation=mapped(config, "hidden_activation", "gelu", _ACTIVATIONS, error=NotImplementedError),
            gated_ffn=True, positions="rope",
            max_positions=config_int(config, "max_position_embeddings", default=8192), pad_token_id=pad,
            embedding_norm=True, final_norm=True, sliding_window=local_attention // 2 + 1,
            global_attention_every=_layer_pattern(config, layers))

    # Biases (attention_bias, norm_bias; false in the released checkpoints) are read when the
    # checkpoint has them: layer_tensors does not see the config.
    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("embeddings.tok_embeddings.weight")}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {**weight_and_bias("embed.norm", "embeddings.norm", bias="optional"),
                **weight_and_bias("final_norm", "final_norm", bias="optional"),
                "rope.inv_freq": rope_inv_freq({"rope_theta": _rope_theta(config, "full_attention")}, hp.head_dim),
                "rope.local_inv_freq": rope_inv_freq({"rope_theta": _rope_theta(config, "sliding_attention")},
                                                     hp.head_dim)}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"layers.{layer}."
        H, F = hp.hidden_size, hp.intermediate_size
        qkv = p + "attn.Wqkv"
        out: Dict[str, Tensor] = {
            **weight_and_bias("attn.q", qkv, bias="optional", rows=(0, H)),
            **weight_and_bias("attn.k", qkv, bias="optional", rows=(H, 2 * H)),
            **weight_and_bias("attn.v", qkv, bias="optional", rows=(2 * H, 3 * H)),
            **weight_and_bias("attn.o", p + "attn.Wo", bias="optional"),
            # Wi's first half gets the activation (act(input) * gate): cpuformer's gate.
            "ffn.gate": Tensor(p + "mlp.Wi.weight", rows=(0, F)),
            "ffn.up": Tensor(p + "mlp.Wi.weight", rows=(F, 2 * F)),
            # (no MLP biases: mlp_bias is refused, so a stray mlp.Wo.bias is named as unused)
            "ffn.down": Tensor(p + "mlp.Wo.weight"),
            **weight_and_bias("ffn_norm", p + "mlp_norm", bias="optional"),
        }
        if layer > 0:  # layer 0's attention norm is nn.Identity
            out.update(weight_and_bias("attn_norm", p + "attn_norm", bias="optional"))
        return out

    # ---- task heads: ModernBertPredictionHead (dense, activation, norm), then the task's layer ----

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Head]:
        H = hp.hidden_size
        names = labels(config) if "classification" in task else ()
        builder = HeadBuilder(task, names)
        if task == "sequence_classification":
            pooling = mapped(config, "classifier_pooling", "cls", {p: p for p in _POOLINGS})
            builder.first() if pooling == "cls" else builder.mean()
        builder.dense("dense", "head.dense.weight", (H, H), bias="" if config.get("classifier_bias") else None)
        builder.act(mapped(config, "classifier_activation", "gelu", _HEAD_ACTIVATIONS, error=NotImplementedError))
        builder.norm("norm", "head.norm", H, hp.norm_eps, bias=bool(config.get("norm_bias", False)))
        if task in ("sequence_classification", "token_classification"):
            return builder.dense("classifier", "classifier.weight", (len(names), H), rows_key="id2label").build()
        if task == "question_answering":
            return builder.dense("classifier", "classifier.weight", (2, H)).build()
        if task == "masked_lm":
            bias = "decoder.bias" if config.get("decoder_bias", True) else None
            if config.get("tie_word_embeddings", True) is not False:
                return builder.dense("decoder", "embeddings.tok_embeddings.weight", (hp.vocab_size, H), bias=bias,
                                     root=False, bias_root=True, rows_key="vocab_size").build()
            return builder.dense("decoder", "decoder.weight", (hp.vocab_size, H), bias=bias,
                                 rows_key="vocab_size").build()
        return None


ARCHS = (ModernBert(),)
