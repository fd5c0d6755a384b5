"""BERT, RoBERTa, XLM-RoBERTa and DistilBERT: post-norm encoders with learned positions.

Task-head checkpoints (``...ForSequenceClassification`` and the others) hold the encoder under a
prefix ("bert.", "roberta.", "distilbert.") and the head at the root; ``head`` declares the heads
of sequence and token classification, question answering and masked LM (arch/heads.py).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .._model_dir import config_float, config_int
from .heads import Head, HeadBuilder, labels, linear_head
from .spec import Arch, Hparams, Source, Tensor, mapped, weight_and_bias

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
          "ForMultipleChoice")


def _check(hp: Hparams) -> Hparams:
    if hp.hidden_size % hp.num_heads:
        raise ValueError(f"config.json: hidden size {hp.hidden_size} is not a multiple of the number of "
                         f"attention heads {hp.num_heads}")
    if hp.pad_token_id >= hp.vocab_size:
        raise ValueError(f"config.json: pad_token_id {hp.pad_token_id} must be < vocab_size {hp.vocab_size}")
    if hp.position_ids == "padding_cumsum" and hp.max_positions <= hp.pad_token_id + 1:
        raise ValueError(f"config.json: max_position_embeddings {hp.max_positions} leaves no positions after "
                         f"padding_idx {hp.pad_token_id}")
    return hp


class Bert(Arch):
    kind = "encoder"
    family = "bert"
    title = "BERT"
    architectures = tuple("Bert" + head for head in _HEADS) + ("BertForPreTraining", "BertForNextSentencePrediction")
    model_types = ("bert",)
    prefixes = ("", "bert.")
    ignored = (r"cls\..*", r"classifier\..*", r"qa_outputs\..*", r"(bert\.)?embeddings\.position_ids")
    example = dict(hidden_act="gelu", type_vocab_size=2, layer_norm_eps=1e-12, position_embedding_type="absolute")
    padding_positions = False  # RoBERTa: positions count only real tokens, after pad_token_id + 1

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        position_type = config.get("position_embedding_type", "absolute")
        if position_type not in (None, "absolute"):
            raise NotImplementedError(f"config.json: position_embedding_type {position_type!r} is not supported; "
                                      "only 'absolute' position embeddings are")
        hidden = config_int(config, "hidden_size", default=768)
        heads = config_int(config, "num_attention_heads", default=12)
        return _check(Hparams(
            kind="encoder", vocab_size=config_int(config, "vocab_size", default=30522), hidden_size=hidden,
            num_layers=config_int(config, "num_hidden_layers", default=12), num_heads=heads,
            head_dim=hidden // heads, intermediate_size=config_int(config, "intermediate_size", default=3072),
            norm="layer", norm_eps=config_float(config, "layer_norm_eps", default=1e-12, minimum=0.0),
            pre_norm=False, activation=mapped(config, "hidden_act", "gelu", _ACTIVATIONS), gated_ffn=False,
            positions="learned", max_positions=config_int(config, "max_position_embeddings", default=512),
            position_ids="padding_cumsum" if self.padding_positions else "arange",
            pad_token_id=config_int(config, "pad_token_id", default=1 if self.padding_positions else 0, minimum=0),
            type_vocab_size=config_int(config, "type_vocab_size", default=2, minimum=0), embedding_norm=True))

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("embeddings.word_embeddings.weight"),
                # A table the config does not describe would be read with the wrong row count.
                "embed.token_types": Tensor("embeddings.token_type_embeddings.weight",
                                            optional=hp.type_vocab_size == 0, rows_key="type_vocab_size"),
                **weight_and_bias("pooler", "pooler.dense", optional=True)}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"embed.positions": Tensor("embeddings.position_embeddings.weight"),
                **weight_and_bias("embed.norm", "embeddings.LayerNorm")}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"encoder.layer.{layer}."
        return {**weight_and_bias("attn.q", p + "attention.self.query"),
                **weight_and_bias("attn.k", p + "attention.self.key"),
                **weight_and_bias("attn.v", p + "attention.self.value"),
                **weight_and_bias("attn.o", p + "attention.output.dense"),
                **weight_and_bias("attn_norm", p + "attention.output.LayerNorm"),
                **weight_and_bias("ffn.up", p + "intermediate.dense"),
                **weight_and_bias("ffn.down", p + "output.dense"),
                **weight_and_bias("ffn_norm", p + "output.LayerNorm")}

    # ---- task heads (transformers' Bert*For* classes) -------------------------------------------

    #: The masked-LM head's transform, its norm, its output bias and its decoder (used when the config
    #: unties it from the word embeddings), at the checkpoint's root.
    mlm_transform, mlm_norm, mlm_bias, mlm_decoder = ("cls.predictions.transform.dense",
                                                      "cls.predictions.transform.LayerNorm", "cls.predictions.bias",
                                                      "cls.predictions.decoder")

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Head]:
        H = hp.hidden_size
        if task == "sequence_classification":
            names = labels(config)
            return self.sequence_head(HeadBuilder(task, names), H, len(names)).build()
        if task in ("token_classification", "question_answering"):
            return linear_head(config, task, H)
        if task == "masked_lm":
            E = hp.embedding_size  # the transform maps into the word embeddings' width (ELECTRA's is narrower)
            builder = HeadBuilder(task).dense("transform", self.mlm_transform + ".weight", (E, H))
            builder.act(self.mlm_activation(config, hp)).norm("transform_norm", self.mlm_norm, E, hp.norm_eps)
            # The decoder is the word-embedding table unless the config unties it.
            # (transformers ties the decoder's bias to mlm_bias too; untied, it has its own.)
            if config.get("tie_word_embeddings", True) is not False:
                return builder.dense("decoder", "embeddings.word_embeddings.weight", (hp.vocab_size, E),
                                     bias=self.mlm_bias, root=False, bias_root=True, rows_key="vocab_size").build()
            return builder.dense("decoder", self.mlm_decoder + ".weight", (hp.vocab_size, E),
                                 rows_key="vocab_size").build()
        return None

    def sequence_head(self, builder: HeadBuilder, hidden: int, num_labels: int) -> HeadBuilder:
        """BERT: classifier(pooler output)."""
        return builder.pooler().dense("classifier", "classifier.weight", (num_labels, hidden), rows_key="id2label")

    def mlm_activation(self, config: Mapping[str, Any], hp: Hparams) -> str:
        return hp.activation


class Roberta(Bert):
    family = "roberta"
    title = "RoBERTa"
    architectures = tuple("Roberta" + head for head in _HEADS)
    model_types = ("roberta",)
    prefixes = ("", "roberta.")
    ignored = (r"lm_head\..*", r"classifier\..*", r"qa_outputs\..*", r"(roberta\.)?embeddings\.position_ids")
    padding_positions = True
    mlm_transform, mlm_norm, mlm_bias, mlm_decoder = ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias",
                                                      "lm_head.decoder")

    def sequence_head(self, builder: HeadBuilder, hidden: int, num_labels: int) -> HeadBuilder:
        """RoBERTa: out_proj(tanh(dense(h[:, 0])))."""
        return (builder.first().dense("dense", "classifier.dense.weight", (hidden, hidden)).act("tanh")
                .dense("out_proj", "classifier.out_proj.weight", (num_labels, hidden), rows_key="id2label"))

    def mlm_activation(self, config: Mapping[str, Any], hp: Hparams) -> str:
        return "gelu"  # RobertaLMHead applies the erf GELU whatever hidden_act is


class XLMRoberta(Roberta):
    family = "xlm-roberta"
    title = "XLM-RoBERTa"
    architectures = tuple("XLMRoberta" + head for head in _HEADS)
    model_types = ("xlm-roberta",)


class DistilBert(Bert):
    family = "distilbert"
    title = "DistilBERT"
    architectures = tuple("DistilBert" + head for head in _HEADS)
    model_types = ("distilbert",)
    prefixes = ("", "distilbert.")
    ignored = (r"vocab_transform\..*", r"vocab_layer_norm\..*", r"vocab_projector\..*", r"pre_classifier\..*",
               r"classifier\..*", r"qa_outputs\..*", r"(distilbert\.)?embeddings\.position_ids")

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        # (aliases: transformers' DistilBertConfig.attribute_map)
        hidden = config_int(config, "dim", default=768, aliases=("hidden_size",))
        heads = config_int(config, "n_heads", default=12, aliases=("num_attention_heads",))
        return _check(Hparams(
            kind="encoder", vocab_size=config_int(config, "vocab_size", default=30522), hidden_size=hidden,
            num_layers=config_int(config, "n_layers", default=6, aliases=("num_hidden_layers",)), num_heads=heads,
            head_dim=hidden // heads, intermediate_size=config_int(config, "hidden_dim", default=4 * hidden),
            norm="layer", norm_eps=1e-12, pre_norm=False,
            activation=mapped(config, "activation", "gelu", _ACTIVATIONS), gated_ffn=False, positions="learned",
            max_positions=config_int(config, "max_position_embeddings", default=512), position_ids="arange",
            pad_token_id=config_int(config, "pad_token_id", default=0, minimum=0), type_vocab_size=0,
            embedding_norm=True))

    mlm_transform, mlm_norm, mlm_bias, mlm_decoder = ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias",
                                                      "vocab_projector")

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("embeddings.word_embeddings.weight")}

    def sequence_head(self, builder: HeadBuilder, hidden: int, num_labels: int) -> HeadBuilder:
        """DistilBERT: classifier(relu(pre_classifier(h[:, 0])))."""
        return (builder.first().dense("pre_classifier", "pre_classifier.weight", (hidden, hidden)).act("relu")
                .dense("classifier", "classifier.weight", (num_labels, hidden), rows_key="id2label"))

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"transformer.layer.{layer}."
        return {**weight_and_bias("attn.q", p + "attention.q_lin"),
                **weight_and_bias("attn.k", p + "attention.k_lin"),
                **weight_and_bias("attn.v", p + "attention.v_lin"),
                **weight_and_bias("attn.o", p + "attention.out_lin"),
                **weight_and_bias("attn_norm", p + "sa_layer_norm"),
                **weight_and_bias("ffn.up", p + "ffn.lin1"),
                **weight_and_bias("ffn.down", p + "ffn.lin2"),
                **weight_and_bias("ffn_norm", p + "output_layer_norm")}


ARCHS = (Bert(), Roberta(), XLMRoberta(), DistilBert())
