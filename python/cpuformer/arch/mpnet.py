"""MPNet (all-mpnet-base-v2 and the other MPNet sentence encoders): BERT's post-norm layers with
RoBERTa's padding positions, no token types, and a T5-style bucketed relative position bias that
every layer adds to its attention scores.

What transformers' ``modeling_mpnet.py`` fixes in code rather than in the config:
- position ids count from ``padding_idx = 1`` (``MPNetEmbeddings``), whatever ``pad_token_id`` says;
- ``MPNetEncoder.compute_position_bias`` buckets with its defaults, 32 buckets and a max distance
  of 128 (bidirectional T5 buckets), so ``relative_attention_num_buckets`` only sizes the table.

Task-head checkpoints (``MPNetFor...``) load as the encoder under the prefix "mpnet."; their head
tensors (``HEAD_TENSORS``) are ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

from .._model_dir import config_int
from .bert import _HEADS, Bert, Roberta, _check
from .spec import Hparams, Source, Tensor, not_supported, weight_and_bias

#: The buckets and the distance transformers' MPNet always computes with.
_BUCKETS, _MAX_DISTANCE = 32, 128
#: transformers' MPNetEmbeddings.padding_idx.
_PADDING_IDX = 1
#: The task heads' tensors: MaskedLM (lm_head), sequence classification and multiple choice
#: (classifier), token classification (classifier), question answering (qa_outputs).
HEAD_TENSORS = (r"lm_head\..*", r"classifier\..*", r"qa_outputs\..*")


class MPNet(Bert):
    family = "mpnet"
    title = "MPNet"
    architectures = tuple("MPNet" + head for head in _HEADS)
    model_types = ("mpnet",)
    prefixes = ("", "mpnet.")
    # (position_ids: a buffer older checkpoints saved)
    ignored = HEAD_TENSORS + (r"(mpnet\.)?embeddings\.position_ids",)
    example = dict(hidden_act="gelu", layer_norm_eps=1e-5, relative_attention_num_buckets=_BUCKETS,
                   pad_token_id=_PADDING_IDX)
    padding_positions = True
    # The heads are RoBERTa's (MPNetClassificationHead, MPNetLMHead).
    mlm_transform, mlm_norm, mlm_bias, mlm_decoder = (Roberta.mlm_transform, Roberta.mlm_norm, Roberta.mlm_bias,
                                                      Roberta.mlm_decoder)
    sequence_head = Roberta.sequence_head
    mlm_activation = Roberta.mlm_activation

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        buckets = config_int(config, "relative_attention_num_buckets", default=_BUCKETS)
        not_supported(buckets != _BUCKETS,
                      f"relative_attention_num_buckets {buckets} is not supported; transformers' MPNet always "
                      f"computes {_BUCKETS} relative position buckets, so the table must have {_BUCKETS} rows")
        if config.get("vocab_size") is None:  # MPNetConfig's default vocabulary, not BERT's
            config = {**config, "vocab_size": 30527}
        hp = super().hparams(config)
        return _check(dataclasses.replace(hp, type_vocab_size=0, pad_token_id=_PADDING_IDX, relative_bias=True,
                                          num_buckets=_BUCKETS, max_distance=_MAX_DISTANCE))

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("embeddings.word_embeddings.weight"),
                **weight_and_bias("pooler", "pooler.dense", optional=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"embed.positions": Tensor("embeddings.position_embeddings.weight"),
                **weight_and_bias("embed.norm", "embeddings.LayerNorm"),
                "relative_bias": Tensor("encoder.relative_attention_bias.weight")}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"encoder.layer.{layer}."
        return {**weight_and_bias("attn.q", p + "attention.attn.q"),
                **weight_and_bias("attn.k", p + "attention.attn.k"),
                **weight_and_bias("attn.v", p + "attention.attn.v"),
                **weight_and_bias("attn.o", p + "attention.attn.o"),
                **weight_and_bias("attn_norm", p + "attention.LayerNorm"),
                **weight_and_bias("ffn.up", p + "intermediate.dense"),
                **weight_and_bias("ffn.down", p + "output.dense"),
                **weight_and_bias("ffn_norm", p + "output.LayerNorm")}


ARCHS = (MPNet(),)
