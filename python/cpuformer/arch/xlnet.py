"""XLNet (model_type "xlnet"): a post-norm encoder with Transformer-XL relative attention
(transformers' modeling_xlnet.py, attn_type "bi").

No position enters the embeddings: every layer's scores gain a position term over sinusoidal
relative distances, projected by the layer's ``r``, with the biases ``r_w_bias`` (content) and
``r_r_bias`` (position), and a segment term (``r_s_bias``, ``seg_embed``) that compares token types
for equality (XLNet has no token-type table: any integer is a segment id). The mathematics is in
csrc/layers/relative_attention_xl.h. The keys and values can extend over a memory of earlier
hidden states (``Encoder.encode_with_memory``, with ``mem_len`` and ``reuse_len`` as transformers'
``cache_mem`` applies them; ``memory``).

The projections are stored [d_model, n_head, d_head] (``q``, ``k``, ``v``, ``r``: transposed into
nn.Linear layout; ``o`` is [out, in] already): ``stored_shape`` edits. What XLNet pretraining
alone uses is refused or ignored: ``attn_type`` "uni" and ``bi_data`` are NotImplementedError,
``mask_emb`` (the query stream of two-stream attention) is not read.

Task-head checkpoints hold the encoder under "transformer."; ``head`` declares
XLNetForSequenceClassification (the sequence summary: the last or first position, its
projection and activation, then ``logits_proj``), XLNetForTokenClassification and
XLNetForQuestionAnsweringSimple. XLNetForQuestionAnswering (beam search over start and end),
XLNetForMultipleChoice and XLNetLMHeadModel (the permutation LM) are refused (head=False opens
their encoder).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from .._model_dir import config_float, config_int
from .heads import Head, HeadBuilder, labels, linear_head
from .spec import Arch, Hparams, Source, Tensor, mapped, not_supported, weight_and_bias

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                "silu": "silu", "swish": "silu"}
#: summary_activation (transformers' get_activation) -> head activation; "linear" is none.
_SUMMARY_ACTIVATIONS = dict(_ACTIVATIONS, tanh="tanh")

#: The longest segment cpuformer runs in one call. XLNet has no position table, so transformers
#: sets no limit; the attention costs grow with segment × (memory + segment), and longer texts
#: are meant to be read in segments that carry their memory (Encoder.encode_with_memory).
MAX_SEGMENT = 4096


@dataclasses.dataclass(frozen=True)
class Memory:
    """How transformers' ``cache_mem`` keeps each layer's memory between calls: the first
    ``reuse_len`` tokens of a call (0: all of them) are appended to the memory, which then keeps
    its last ``mem_len`` tokens (0: all)."""

    mem_len: int
    reuse_len: int


class XLNet(Arch):
    kind = "encoder"
    family = "xlnet"
    title = "XLNet"
    architectures = ("XLNetModel", "XLNetLMHeadModel", "XLNetForSequenceClassification",
                     "XLNetForTokenClassification", "XLNetForQuestionAnsweringSimple", "XLNetForQuestionAnswering",
                     "XLNetForMultipleChoice")
    model_types = ("xlnet",)
    prefixes = ("", "transformer.")
    ignored = (
        # The query stream's embedding of two-stream (pretraining) attention.
        r"(transformer\.)?mask_emb",
        # Task heads (read when the model runs its head, see ``head``; the others are refused when
        # the head is asked for): sequence summary, classifiers, question answering (the simple
        # head and the beam-search one), the permutation-LM head of XLNetLMHeadModel.
        r"sequence_summary\..*", r"logits_proj\..*", r"classifier\..*", r"qa_outputs\..*",
        r"start_logits\..*", r"end_logits\..*", r"answer_class\..*", r"lm_loss\..*")
    # xlnet-base-cased's entries besides its sizes.
    example = dict(ff_activation="gelu", attn_type="bi", bi_data=False, clamp_len=-1, layer_norm_eps=1e-12,
                   mem_len=None, reuse_len=None, untie_r=True, pad_token_id=5)

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        hidden = config_int(config, "d_model", default=1024)
        heads = config_int(config, "n_head", default=16)
        if hidden % heads:
            raise ValueError(f"config.json: d_model {hidden} is not a multiple of n_head {heads}")
        head_dim = hidden // heads
        if config.get("d_head") is not None and config_int(config, "d_head") != head_dim:
            raise ValueError(f"config.json: d_head {config['d_head']} must be d_model / n_head = {head_dim}")
        if hidden % 2:
            raise ValueError(f"config.json: d_model {hidden} must be even (the relative position encoding is "
                             "sin and cos halves)")
        attention = config.get("attn_type", "bi")
        not_supported(attention != "bi", f"attn_type {attention!r} is not supported; only 'bi' (bidirectional) is")
        not_supported(config.get("bi_data", False) is not False,
                      "bi_data (forward and backward position encodings in one batch, a pretraining setting) is "
                      "not supported")
        clamp = config_int(config, "clamp_len", default=-1, minimum=None)
        self.memory(config)  # its errors at load, not at the first call
        return Hparams(
            kind="encoder", vocab_size=config_int(config, "vocab_size", default=32000), hidden_size=hidden,
            num_layers=config_int(config, "n_layer", default=24), num_heads=heads, head_dim=head_dim,
            intermediate_size=config_int(config, "d_inner", default=4096), norm="layer",
            norm_eps=config_float(config, "layer_norm_eps", default=1e-12, minimum=0.0), pre_norm=False,
            activation=mapped(config, "ff_activation", "gelu", _ACTIVATIONS, error=NotImplementedError),
            gated_ffn=False, positions="none", max_positions=MAX_SEGMENT, position_ids="arange",
            pad_token_id=config_int(config, "pad_token_id", default=5, minimum=0, maximum=None),
            type_vocab_size=0, transformer_xl_attention=True, relative_clamp=max(clamp, 0))

    def memory(self, config: Mapping[str, Any]) -> Memory:
        """config.json's mem_len and reuse_len (null or 0: keep everything / append every token)."""
        return Memory(mem_len=config_int(config, "mem_len", default=0, minimum=0, maximum=None),
                      reuse_len=config_int(config, "reuse_len", default=0, minimum=0, maximum=None))

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        return {"embed.tokens": Tensor("word_embedding.weight")}

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {}

    def layer_tensors(self, hp: Hparams, stack: str, layer: int) -> Dict[str, Tensor]:
        p = f"layer.{layer}."
        split = (hp.hidden_size, hp.num_heads, hp.head_dim)  # [d_model, n_head, d_head]
        per_head = (hp.num_heads, hp.head_dim)
        out = {name: Tensor(p + "rel_attn." + stored, transpose=True, stored_shape=split)
               for name, stored in (("attn.q", "q"), ("attn.k", "k"), ("attn.v", "v"), ("attn.position_k", "r"))}
        out.update({
            "attn.o": Tensor(p + "rel_attn.o", stored_shape=split),  # o[h, n, d]: [out, in] already
            "attn.content_bias": Tensor(p + "rel_attn.r_w_bias", stored_shape=per_head),
            "attn.position_bias": Tensor(p + "rel_attn.r_r_bias", stored_shape=per_head),
            "attn.segment_bias": Tensor(p + "rel_attn.r_s_bias", stored_shape=per_head),
            "attn.segment_embed": Tensor(p + "rel_attn.seg_embed", stored_shape=(2,) + per_head),
            **weight_and_bias("attn_norm", p + "rel_attn.layer_norm"),
            **weight_and_bias("ffn.up", p + "ff.layer_1"),
            **weight_and_bias("ffn.down", p + "ff.layer_2"),
            **weight_and_bias("ffn_norm", p + "ff.layer_norm"),
        })
        return out

    # ---- task heads (transformers' XLNetFor* classes) -----------------------------------------

    def head(self, config: Mapping[str, Any], hp: Hparams, task: str) -> Optional[Head]:
        H = hp.hidden_size
        if task == "sequence_classification":
            # XLNetSequenceSummary (summary_type, summary_use_proj, summary_activation with
            # XLNetConfig's defaults), then logits_proj.
            names = labels(config)
            builder = HeadBuilder(task, names)
            summary = config.get("summary_type", "last")
            if summary in ("last", "cls_index"):  # (cls_index without an index: the last token)
                builder.last()
            elif summary == "first":
                builder.first()
            else:
                raise NotImplementedError(f"config.json: summary_type {summary!r} is not supported; use 'last', "
                                          "'first' or 'cls_index'")
            not_supported(config.get("summary_proj_to_labels"),
                          "summary_proj_to_labels true (a summary projected to the labels before logits_proj) is "
                          "not supported")
            if config.get("summary_use_proj", True):
                builder.dense("summary", "sequence_summary.summary.weight", (H, H))
            if config.get("summary_activation", "tanh") not in (None, "", "linear"):  # (those: no activation)
                builder.act(mapped(config, "summary_activation", "tanh", _SUMMARY_ACTIVATIONS,
                                   error=NotImplementedError))
            return builder.dense("logits_proj", "logits_proj.weight", (len(names), H), rows_key="id2label").build()
        if task == "token_classification":
            return linear_head(config, task, H)
        if task == "question_answering":
            # XLNetForQuestionAnsweringSimple (qa_outputs); XLNetForQuestionAnswering's beam-search
            # head (start_n_top / end_n_top) is refused.
            architectures = config.get("architectures") or []
            if "XLNetForQuestionAnsweringSimple" not in architectures:
                return None
            return linear_head(config, task, H)
        return None


ARCHS = (XLNet(),)
