"""Builds the C++ model of each kind from canonical hyperparameters and weights.

The one place that knows the bindings' key names (``_core.EncoderModel``, ``DecoderModel``,
``Seq2SeqModel``): each builder translates ``Hparams`` into its graph's config and canonical weight
names into its graph's tensor keys, then loads the layers with ``weights.load_layers``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np

from .. import _core
from ..arch import Hparams
from ..weights import SCALE, Checkpoint, load_layers

# Canonical layer weight -> the graph's key (".weight", ".bias" and ".weight_scale" are appended).
_ENCODER_LAYER = {"attn.q": "q", "attn.k": "k", "attn.v": "v", "attn.o": "out", "attn_norm": "attention_norm",
                  "ffn.up": "intermediate", "ffn.down": "output", "ffn_norm": "output_norm"}
_DECODER_LAYER = {"attn.q": "q", "attn.k": "k", "attn.v": "v", "attn.o": "o", "attn_norm": "norm1",
                  "ffn_norm": "norm2", "ffn.gate": "gate", "ffn.up": "up", "ffn.down": "down",
                  "attn.q_norm": "q_norm", "attn.k_norm": "k_norm"}
_SEQ2SEQ_LAYER = {"attn.q": "q", "attn.k": "k", "attn.v": "v", "attn.o": "o", "cross.q": "cross_q",
                  "cross.k": "cross_k", "cross.v": "cross_v", "cross.o": "cross_o", "attn_norm": "self_norm",
                  "cross_norm": "cross_norm", "ffn_norm": "ffn_norm", "ffn.gate": "gate", "ffn.up": "up",
                  "ffn.down": "down"}


def _keyed(arrays: Mapping[str, np.ndarray], names: Mapping[str, str]) -> Dict[str, np.ndarray]:
    """Canonical arrays under the graph's keys: ``names[w] + ".weight"`` / ``".bias"`` / ``".weight_scale"``."""
    out = {}
    for canonical, array in arrays.items():
        if canonical.endswith(SCALE):
            out[names[canonical[:-len(SCALE)]] + ".weight" + SCALE] = array
        elif canonical.endswith(".bias"):
            out[names[canonical[:-len(".bias")]] + ".bias"] = array
        else:
            out[names[canonical] + ".weight"] = array
    return out


def _with_bias(out: Dict[str, Any], key: str, arrays: Mapping[str, np.ndarray], canonical: str) -> None:
    if canonical in arrays:
        out[key + ".weight"] = arrays[canonical]
    if canonical + ".bias" in arrays:
        out[key + ".bias"] = arrays[canonical + ".bias"]


def _head(out: Dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    if "lm_head" in arrays:
        out["lm_head"] = arrays["lm_head"]
        if "lm_head" + SCALE in arrays:
            out["lm_head" + SCALE] = arrays["lm_head" + SCALE]


def build(checkpoint: Checkpoint, dtype: str) -> Any:
    """The C++ model of ``checkpoint``'s kind, with every weight loaded."""
    hp = checkpoint.hp
    checkpoint.check_accounted()
    top, top_names = checkpoint.read(checkpoint.top)
    stacks = {stack: checkpoint.read(checkpoint.stack_sources(stack))[0] for stack, _ in checkpoint.arch.stacks(hp)}
    model = _BUILDERS[hp.kind](checkpoint, hp, dtype, top, stacks)
    checkpoint.release(top_names)  # packed or copied by the model
    return model


def _encoder(checkpoint: Checkpoint, hp: Hparams, dtype: str, top: Dict[str, np.ndarray],
             stacks: Dict[str, Dict[str, np.ndarray]]) -> Any:
    config = dict(hidden_size=hp.hidden_size, num_layers=hp.num_layers, num_heads=hp.num_heads,
                  intermediate_size=hp.intermediate_size, type_vocab_size=hp.type_vocab_size,
                  layer_norm_eps=hp.norm_eps, position_ids=hp.position_ids, pad_token_id=hp.pad_token_id,
                  activation=hp.activation, vocab_size=hp.vocab_size, max_positions=hp.max_positions, dtype=dtype)
    stack = stacks["encoder"]
    embeddings = {"word_embeddings": top["embed.tokens"], "position_embeddings": stack["embed.positions"]}
    _with_bias(embeddings, "norm", stack, "embed.norm")
    if hp.type_vocab_size > 0:
        embeddings["token_type_embeddings"] = top["embed.token_types"]
    model = _core.EncoderModel(config, embeddings)
    load_layers(checkpoint, lambda _, arrays: model.add_layer(_keyed(arrays, _ENCODER_LAYER)))
    if "pooler" in top:
        model.set_pooler(top["pooler"], top["pooler.bias"], top.get("pooler" + SCALE))
    return model


def _decoder(checkpoint: Checkpoint, hp: Hparams, dtype: str, top: Dict[str, np.ndarray],
             stacks: Dict[str, Dict[str, np.ndarray]]) -> Any:
    config = dict(vocab_size=hp.vocab_size, hidden_size=hp.hidden_size, num_layers=hp.num_layers,
                  num_heads=hp.num_heads, num_kv_heads=hp.num_kv_heads, head_dim=hp.head_dim,
                  intermediate_size=hp.intermediate_size, max_positions=hp.max_positions,
                  rms_norm=hp.norm == "rms", norm_eps=hp.norm_eps, learned_positions=hp.positions == "learned",
                  gated_ffn=hp.gated_ffn, activation=hp.activation, embed_scale=hp.embed_scale,
                  sliding_window=hp.sliding_window, qk_norm=hp.qk_norm, dtype=dtype)
    stack = stacks["decoder"]
    embeddings = {"word_embeddings": top["embed.tokens"]}
    if "embed.positions" in stack:
        embeddings["position_embeddings"] = stack["embed.positions"]
    if "rope.inv_freq" in stack:
        embeddings["rope_inv_freq"] = stack["rope.inv_freq"]
    model = _core.DecoderModel(config, embeddings)
    load_layers(checkpoint, lambda _, arrays: model.add_layer(_keyed(arrays, _DECODER_LAYER)))
    head: Dict[str, Any] = {}
    _with_bias(head, "norm", stack, "final_norm")
    _head(head, top)
    model.set_head(head)
    return model


def _seq2seq(checkpoint: Checkpoint, hp: Hparams, dtype: str, top: Dict[str, np.ndarray],
             stacks: Dict[str, Dict[str, np.ndarray]]) -> Any:
    config = dict(vocab_size=hp.vocab_size, d_model=hp.hidden_size, encoder_layers=hp.num_layers,
                  decoder_layers=hp.num_decoder_layers, heads=hp.num_heads, head_dim=hp.head_dim,
                  ffn_dim=hp.intermediate_size, max_positions=hp.max_positions, position_offset=hp.position_offset,
                  position_table=hp.positions in ("learned", "sinusoidal"),
                  relative_attention=hp.positions == "relative", num_buckets=hp.num_buckets,
                  max_distance=hp.max_distance, rms_norm=hp.norm == "rms", norm_eps=hp.norm_eps,
                  pre_norm=hp.pre_norm, embedding_norm=hp.embedding_norm, final_norm=hp.final_norm,
                  embed_scale=hp.embed_scale, attention_scale=hp.attention_scale, activation=hp.activation,
                  gated_ffn=hp.gated_ffn, head_scale=hp.head_scale, dtype=dtype)
    embeddings: Dict[str, Any] = {"word_embeddings": top["embed.tokens"]}
    head: Dict[str, Any] = {}
    for name, stack in stacks.items():
        if "relative_bias" in stack:
            embeddings[name + "_relative_bias"] = stack["relative_bias"]
        if "embed.positions" in stack:
            embeddings[name + "_positions"] = stack["embed.positions"]
        _with_bias(embeddings, name + "_norm", stack, "embed.norm")
        _with_bias(head, name + "_norm", stack, "final_norm")
    model = _core.Seq2SeqModel(config, embeddings)

    def add_layer(stack: str, arrays: Dict[str, np.ndarray]) -> None:
        keyed = _keyed(arrays, _SEQ2SEQ_LAYER)
        if stack == "decoder":
            model.add_decoder_layer(keyed)
        else:
            model.add_encoder_layer(keyed)

    load_layers(checkpoint, add_layer)
    _head(head, top)
    if "lm_head.bias" in top:
        head["final_logits_bias"] = top["lm_head.bias"]
    model.set_head(head)
    return model


_BUILDERS = {"encoder": _encoder, "decoder": _decoder, "seq2seq": _seq2seq}
