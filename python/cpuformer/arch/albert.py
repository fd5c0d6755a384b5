"""ALBERT: BERT with factorized embeddings and layers that share their weights (transformers'
``modeling_albert.py``).

- The embedding tables and their LayerNorm are ``embedding_size`` wide (128 in the released
  checkpoints); ``encoder.embedding_hidden_mapping_in`` maps them into the hidden size
  (canonical ``embed.project``, always present).
- ``num_hidden_groups`` distinct layers (``encoder.albert_layer_groups.<g>``) serve all
  ``num_hidden_layers``: layer i runs group ``i // (num_hidden_layers / num_hidden_groups)``
  (``Hparams.layer_groups``), so a 12-layer ALBERT with one group holds one layer's weights once.
  Groups of more than one layer (``inner_group_num`` > 1) are refused.
- Each layer is BERT's post-norm layer under other names (``attention.dense``,
  ``full_layer_layer_norm``, ``ffn``, ``ffn_output``).

Task heads: the classifier on the pooler output (``albert.pooler``), token classification,
question answering, and the masked LM (``predictions``, into the embeddings' width, decoded by the
word-embedding table); ``AlbertForPreTraining`` runs its masked-LM head (its sentence-order head,
``sop_classifier``, is not used).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

from .._model_dir import config_int
from .bert import _HEADS, Bert
from .spec import Hparams, Source, Tensor, not_supported, weight_and_bias

#: AlbertConfig's defaults where they differ from BertConfig's (the size of ALBERT-xxlarge).
_DEFAULTS = dict(vocab_size=30000, embedding_size=128, hidden_size=4096, num_attention_heads=64,
                 intermediate_size=16384, hidden_act="gelu_new")
#: The task heads' tensors (ignored when the encoder is opened without its head).
HEAD_TENSORS = (r"predictions\..*", r"sop_classifier\..*", r"classifier\..*", r"qa_outputs\..*")


class Albert(Bert):
    family = "albert"
    title = "ALBERT"
    architectures = tuple("Albert" + head for head in _HEADS)
    model_types = ("albert",)
    prefixes = ("", "albert.")
    # (position_ids, token_type_ids: buffers older checkpoints saved)
    ignored = HEAD_TENSORS + (r"(albert\.)?embeddings\.(position_ids|token_type_ids)",)
    example = dict(Bert.example, hidden_act="gelu_new", embedding_size=128, num_hidden_groups=1, inner_group_num=1)
    mlm_transform, mlm_norm, mlm_bias, mlm_decoder = ("predictions.dense", "predictions.LayerNorm", "predictions.bias",
                                                      "predictions.decoder")

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        config = {**_DEFAULTS, **{key: value for key, value in config.items() if value is not None}}
        inner = config_int(config, "inner_group_num", default=1)
        not_supported(inner != 1, f"inner_group_num {inner} is not supported; only groups of one layer are "
                                  "(inner_group_num 1, as every released ALBERT)")
        hp = super().hparams(config)
        groups = config_int(config, "num_hidden_groups", default=1)
        if hp.num_layers % groups:
            raise ValueError(f"config.json: num_hidden_layers {hp.num_layers} is not a multiple of "
                             f"num_hidden_groups {groups}")
        return dataclasses.replace(hp, embedding_size=config_int(config, "embedding_size", default=128),
                                   layer_groups=groups)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("embeddings.word_embeddings.weight"),
                "embed.token_types": Tensor("embeddings.token_type_embeddings.weight",
                                            optional=hp.type_vocab_size == 0, rows_key="type_vocab_size"),
                **weight_and_bias("embed.project", "encoder.embedding_hidden_mapping_in"),
                **weight_and_bias("pooler", "pooler", optional=True)}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"encoder.albert_layer_groups.{layer}.albert_layers.0."  # layer: the group (Arch.stacks)
        return {**weight_and_bias("attn.q", p + "attention.query"),
                **weight_and_bias("attn.k", p + "attention.key"),
                **weight_and_bias("attn.v", p + "attention.value"),
                **weight_and_bias("attn.o", p + "attention.dense"),
                **weight_and_bias("attn_norm", p + "attention.LayerNorm"),
                **weight_and_bias("ffn.up", p + "ffn"),
                **weight_and_bias("ffn.down", p + "ffn_output"),
                **weight_and_bias("ffn_norm", p + "full_layer_layer_norm")}


ARCHS = (Albert(),)
