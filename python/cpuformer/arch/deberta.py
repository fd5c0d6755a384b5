"""DeBERTa-v2 and DeBERTa-v3 (model_type "deberta-v2"): a post-norm encoder with disentangled
attention over relative positions (transformers' modeling_deberta_v2.py).

The attention scores gain a content-to-position (c2p) and a position-to-content (p2c) term over
log-bucketed relative positions, scaled by 1 / sqrt(head_dim * (1 + number of terms)); the
mathematics is in csrc/layers/disentangled_attention.h. DeBERTa-v3 adds no position to the
embeddings (position_biased_input false: positions "none") and has no token types.

Task-head checkpoints (``DebertaV2ForSequenceClassification`` and the others) hold the encoder
under the prefix "deberta."; ``head`` declares the sequence classifier (ContextPooler: dense and
``pooler_hidden_act`` on the first token, then the classifier), token classification, question
answering and both masked-LM heads (``legacy`` true: ``cls.predictions``; false:
``lm_predictions.lm_head``), each decoded by the word-embedding table.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from .._model_dir import config_float, config_int
from .heads import Head, HeadBuilder, labels, linear_head
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported, weight_and_bias

#: DeBERTa's activations (hidden_act) and the task classes of its checkpoints.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
          "ForMultipleChoice")

_POSITION_TERMS = ("c2p", "p2c")


def _names(config: Mapping[str, Any], key: str, default: str) -> List[str]:
    """A config value that transformers reads as a "|"-separated string or a list of names, lowercased."""
    value = config.get(key)
    if value is None:
        value = default
    if isinstance(value, str):
        value = value.lower().split("|")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"config.json: {key} must be a '|'-separated string or a list of strings, got {value!r}")
    return [v.strip().lower() for v in value if v.strip()]


def _flag(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"config.json: {key} must be true or false, got {value!r}")
    return value


class DebertaV2(Arch):
    kind = "encoder"
    family = "deberta-v2"
    title = "DeBERTa-v2"
    architectures = tuple("DebertaV2" + head for head in _HEADS)
    model_types = ("deberta-v2",)
    prefixes = ("", "deberta.")
    ignored = (
        # Task heads (read when the model runs its head, see ``head``): ContextPooler, classifiers, MLM.
        r"pooler\..*", r"classifier\..*", r"qa_outputs\..*", r"lm_predictions\..*", r"cls\..*",
        r"(deberta\.)?embeddings\.position_ids",
        # transformers ignores a saved position table when position_biased_input is false.
        r"(deberta\.)?embeddings\.position_embeddings\.weight",
        # Relative embeddings of relative_attention without c2p or p2c: transformers adds nothing.
        r"(deberta\.)?encoder\.rel_embeddings\.weight", r"(deberta\.)?encoder\.LayerNorm\.(weight|bias)")
    # microsoft/deberta-v3-base's entries besides its sizes.
    example = dict(hidden_act="gelu", type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=True,
                   max_relative_positions=-1, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                   pos_att_type="p2c|c2p", position_biased_input=False, max_position_embeddings=512, pad_token_id=0)

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        hidden = config_int(config, "hidden_size", default=1536)
        heads = config_int(config, "num_attention_heads", default=24)
        if hidden % heads:
            raise ValueError(f"config.json: hidden size {hidden} is not a multiple of the number of attention "
                             f"heads {heads}")
        head_dim = hidden // heads
        not_supported(config.get("attention_head_size") not in (None, head_dim),
                      f"attention_head_size {config.get('attention_head_size')!r} is not supported; only "
                      "hidden_size / num_attention_heads is")
        not_supported(config_int(config, "conv_kernel_size", default=0, minimum=0) > 0,
                      "conv_kernel_size > 0 (the convolution layer of DeBERTa-v2 xlarge/xxlarge) is not supported")
        not_supported(config_int(config, "embedding_size", default=hidden) != hidden,
                      f"embedding_size {config.get('embedding_size')} != hidden_size {hidden} (a projected "
                      "embedding) is not supported")
        terms = _names(config, "pos_att_type", "")
        unknown = [t for t in terms if t not in _POSITION_TERMS]
        not_supported(unknown, f"pos_att_type {unknown} is not supported; only 'c2p' and 'p2c' are")
        norms = _names(config, "norm_rel_ebd", "none")
        not_supported([n for n in norms if n not in ("none", "layer_norm")],
                      f"norm_rel_ebd {config.get('norm_rel_ebd')!r} is not supported; use 'layer_norm' or 'none'")
        max_positions = config_int(config, "max_position_embeddings", default=512)
        relative = _flag(config, "relative_attention", False)
        buckets = config_int(config, "position_buckets", default=-1, minimum=None)
        max_relative = config_int(config, "max_relative_positions", default=-1, minimum=None)
        if max_relative < 1:
            max_relative = max_positions
        if relative and buckets > 0:
            if buckets < 2:
                raise ValueError(f"config.json: position_buckets must be >= 2 (or <= 0: none), got {buckets}")
            if max_relative - 1 <= buckets // 2:
                raise ValueError(f"config.json: max_relative_positions {max_relative} (max_position_embeddings "
                                 f"when < 1) must exceed position_buckets / 2 + 1 = {buckets // 2 + 1}: the log "
                                 "buckets divide by log((max_relative_positions - 1) / (position_buckets / 2))")
        # transformers scales q·kᵀ by 1 / sqrt(head_dim * scale_factor) in float32, with one factor per
        # position term the config names, whether or not relative_attention is on.
        factor = 1 + sum(t in terms for t in _POSITION_TERMS)
        scale = np.float32(1) / np.sqrt(np.float32(head_dim) * np.float32(factor))
        return Hparams(
            kind="encoder", vocab_size=config_int(config, "vocab_size", default=128100), hidden_size=hidden,
            num_layers=config_int(config, "num_hidden_layers", default=24), num_heads=heads, head_dim=head_dim,
            intermediate_size=config_int(config, "intermediate_size", default=6144), norm="layer",
            norm_eps=config_float(config, "layer_norm_eps", default=1e-7, minimum=0.0), pre_norm=False,
            activation=mapped(config, "hidden_act", "gelu", _ACTIVATIONS), gated_ffn=False,
            positions="learned" if _flag(config, "position_biased_input", True) else "none",
            max_positions=max_positions, position_ids="arange",
            pad_token_id=config_int(config, "pad_token_id", default=0, minimum=0, maximum=None),
            type_vocab_size=config_int(config, "type_vocab_size", default=0, minimum=0), embedding_norm=True,
            attention_scale=float(scale),
            content_to_position=relative and "c2p" in terms, position_to_content=relative and "p2c" in terms,
            position_buckets=max(buckets, 0), max_relative_positions=max_relative,
            relative_embedding_norm="layer_norm" in norms,
            share_attention_key=_flag(config, "share_att_key", False))

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        out: Dict[str, Source] = {"embed.tokens": Tensor("embeddings.word_embeddings.weight")}
        if hp.type_vocab_size:
            out["embed.token_types"] = Tensor("embeddings.token_type_embeddings.weight", rows_key="type_vocab_size")
        return out

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        out: Dict[str, Source] = dict(weight_and_bias("embed.norm", "embeddings.LayerNorm"))
        if hp.positions == "learned":
            out["embed.positions"] = Tensor("embeddings.position_embeddings.weight")
        if hp.content_to_position or hp.position_to_content:
            out["relative_embeddings"] = Tensor("encoder.rel_embeddings.weight")
            if hp.relative_embedding_norm:
                out.update(weight_and_bias("relative_norm", "encoder.LayerNorm"))
        return out

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"encoder.layer.{layer}."
        out = {**weight_and_bias("attn.q", p + "attention.self.query_proj"),
               **weight_and_bias("attn.k", p + "attention.self.key_proj"),
               **weight_and_bias("attn.v", p + "attention.self.value_proj"),
               **weight_and_bias("attn.o", p + "attention.output.dense"),
               **weight_and_bias("attn_norm", p + "attention.output.LayerNorm"),
               **weight_and_bias("ffn.up", p + "intermediate.dense"),
               **weight_and_bias("ffn.down", p + "output.dense"),
               **weight_and_bias("ffn_norm", p + "output.LayerNorm")}
        if not hp.share_attention_key:
            if hp.position_to_content:
                out.update(weight_and_bias("attn.position_q", p + "attention.self.pos_query_proj"))
            if hp.content_to_position:
                out.update(weight_and_bias("attn.position_k", p + "attention.self.pos_key_proj"))
        return out

    # ---- task heads (transformers' DebertaV2For* classes) --------------------------------------

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Head]:
        H = hp.hidden_size
        if task == "sequence_classification":
            names = labels(config)
            pooled = config_int(config, "pooler_hidden_size", default=H)
            activation = mapped(config, "pooler_hidden_act", "gelu", dict(_ACTIVATIONS, tanh="tanh"),
                                error=NotImplementedError)
            return (HeadBuilder(task, names).first().dense("pooler", "pooler.dense.weight", (pooled, H))
                    .act(activation).dense("classifier", "classifier.weight", (len(names), pooled),
                                           rows_key="id2label").build())
        if task in ("token_classification", "question_answering"):
            return linear_head(config, task, H)
        if task == "masked_lm":
            # legacy (the default): cls.predictions (its decoder tied to the word embeddings);
            # otherwise lm_predictions.lm_head, which multiplies by the word embeddings itself.
            prefix = "cls.predictions.transform." if config.get("legacy", True) else "lm_predictions.lm_head."
            bias = "cls.predictions.bias" if config.get("legacy", True) else "lm_predictions.lm_head.bias"
            builder = HeadBuilder(task).dense("transform", prefix + "dense.weight", (H, H))
            builder.act(mapped(config, "hidden_act", "gelu", _ACTIVATIONS)).norm("transform_norm",
                                                                                  prefix + "LayerNorm", H,
                                                                                  hp.norm_eps)
            return builder.dense("decoder", "embeddings.word_embeddings.weight", (hp.vocab_size, H), bias=bias,
                                 root=False, bias_root=True, rows_key="vocab_size").build()
        return None


ARCHS = (DebertaV2(),)
