"""ELECTRA (the discriminator, and any ElectraModel body): BERT whose embedding tables may be
narrower than the hidden size. When ``embedding_size != hidden_size``, ``embeddings_project``
(Linear embedding_size -> hidden_size) maps the normed embeddings into the hidden size
(canonical ``embed.project``); otherwise there is no projection.

Task-head checkpoints (``ElectraFor...``) hold the encoder under the prefix "electra."; the heads of
sequence and token classification, question answering and the generator's masked LM run (``head``).
The discriminator's ``ElectraForPreTraining`` head is not run: ``cpuformer.Encoder(path,
head=False)`` opens its encoder. ``ElectraForCausalLM`` (a decoder) is not claimed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from .._model_dir import config_int
from .bert import _HEADS, Bert
from .heads import Head, HeadBuilder
from .spec import Hparams, Source, Tensor, weight_and_bias

#: ElectraConfig's defaults where they differ from BertConfig's (the size of ELECTRA-small).
_DEFAULTS = dict(embedding_size=128, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
#: The task heads' tensors: pre-training (discriminator_predictions), masked LM (the generator's
#: generator_predictions and generator_lm_head), sequence classification (classifier.dense,
#: classifier.out_proj), token classification (classifier), question answering (qa_outputs),
#: multiple choice (sequence_summary, classifier).
HEAD_TENSORS = (r"discriminator_predictions\..*", r"generator_predictions\..*", r"generator_lm_head\..*",
                r"classifier\..*", r"qa_outputs\..*", r"sequence_summary\..*")


class Electra(Bert):
    family = "electra"
    title = "ELECTRA"
    architectures = tuple("Electra" + head for head in _HEADS) + ("ElectraForPreTraining",)
    model_types = ("electra",)
    prefixes = ("", "electra.")
    # (position_ids, token_type_ids: buffers older checkpoints saved)
    ignored = HEAD_TENSORS + (r"(electra\.)?embeddings\.(position_ids|token_type_ids)",)
    example = dict(Bert.example, embedding_size=128)
    # The generator's masked-LM head (ElectraGeneratorPredictions + generator_lm_head).
    mlm_transform, mlm_norm, mlm_bias, mlm_decoder = ("generator_predictions.dense", "generator_predictions.LayerNorm",
                                                      "generator_lm_head.bias", "generator_lm_head")

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Head]:
        # ElectraForPreTraining is the discriminator (a per-token real/replaced score), not a masked LM.
        if task == "masked_lm" and "ElectraForPreTraining" in (config.get("architectures") or ()):
            return None
        return super().head(config, hp, task)

    def sequence_head(self, builder: HeadBuilder, hidden: int, num_labels: int) -> HeadBuilder:
        """ELECTRA: out_proj(gelu(dense(h[:, 0])))."""
        return (builder.first().dense("dense", "classifier.dense.weight", (hidden, hidden)).act("gelu")
                .dense("out_proj", "classifier.out_proj.weight", (num_labels, hidden), rows_key="id2label"))

    def mlm_activation(self, config: Mapping[str, Any], hp: Hparams) -> str:
        return "gelu"  # ElectraGeneratorPredictions: get_activation("gelu")

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        config = {**_DEFAULTS, **{key: value for key, value in config.items() if value is not None}}
        hp = super().hparams(config)
        return dataclasses.replace(hp, embedding_size=config_int(config, "embedding_size", default=128))

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        out: Dict[str, Source] = {
            "embed.tokens": Tensor("embeddings.word_embeddings.weight"),
            "embed.token_types": Tensor("embeddings.token_type_embeddings.weight", optional=hp.type_vocab_size == 0,
                                        rows_key="type_vocab_size")}
        if hp.embedding_size != hp.hidden_size:
            out.update(weight_and_bias("embed.project", "embeddings_project"))
        return out


ARCHS = (Electra(),)
