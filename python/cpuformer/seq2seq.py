"""``cpuformer.Seq2Seq``: encoder-decoder models (translation, summarisation, T5-style tasks).

Supported: MarianMTModel (sinusoidal positions, scaled embeddings, final_logits_bias, post-norm),
BartForConditionalGeneration (learned positions with offset 2, layernorm_embedding, post-norm),
MBartForConditionalGeneration (the same, pre-norm, with final layer norms),
T5ForConditionalGeneration / MT5ForConditionalGeneration (RMSNorm, bucketed relative position
bias, unscaled attention, ReLU (v1.0) or gated-GELU (v1.1, flan-T5, mT5) feed-forward, tied head
scaled by d_model^-0.5 or an untied head).

Loading maps a checkpoint's tensor names onto one graph (``_core.Seq2SeqModel``, C++), packs
each layer's projections and releases the layer's source pages right after. Generation is the
C++ loop that Generator uses: the encoder runs once per batch, cross-attention keys/values are
projected once per source and layer, the decoder's KV cache is written in place.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._arguments import check_integer
from ._base import Generated, ModelBase, Prompts, TokenIds
from ._model_dir import ModelDir, _describe, _is_int, config_float, config_int, config_token_ids
from .convert import put_weight, release_weight
from .generator import Generator, _as_2d, generation_setting

PathLike = Union[str, os.PathLike]

# Hugging Face activation names -> the graph's.
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "swish": "silu", "silu": "silu"}


def _family(model_type: Any, architecture: str) -> str:
    for prefix, family in (("Marian", "marian"), ("MBart", "mbart"), ("Bart", "bart"), ("MT5", "mt5"), ("T5", "t5")):
        if architecture.startswith(prefix):
            return family
    if model_type in ("marian", "bart", "mbart", "t5", "mt5"):
        return model_type
    raise ValueError(f"unknown encoder-decoder architecture {architecture!r}")


def sinusoidal_positions(n_pos: int, dim: int) -> np.ndarray:
    """Marian's position table [n_pos, dim] float32: sin of pos / 10000^(2·(j//2)/dim) over the
    even j in the first half, cos over the odd j in the second (not interleaved)."""
    j = np.arange(dim)
    angles = np.arange(n_pos, dtype=np.float64)[:, None] / np.power(10000.0, 2 * (j // 2) / dim)[None, :]
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out = np.empty((n_pos, dim), dtype=np.float32)
    out[:, :sentinel] = np.sin(angles[:, 0::2])
    out[:, sentinel:] = np.cos(angles[:, 1::2])
    return out


def _feed_forward(config: Dict[str, Any]) -> Tuple[str, bool]:
    """T5's feed_forward_proj ("relu", "gated-gelu", ...) as (activation, gated)."""
    proj = config.get("feed_forward_proj", "relu")
    if not isinstance(proj, str):
        raise ValueError(f"config.json: feed_forward_proj must be a string, got {proj!r}")
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    act = parts[-1]
    if len(parts) > 2 or (len(parts) == 2 and not gated) or act not in _ACTIVATIONS:
        raise NotImplementedError(f"config.json: feed_forward_proj {proj!r} is not supported; use 'relu', "
                                  "'gated-gelu' or '[gated-]<activation>' with an activation among "
                                  f"{', '.join(sorted(_ACTIVATIONS))}")
    if proj == "gated-gelu":
        act = "gelu_new"  # transformers maps T5's "gated-gelu" to the tanh approximation
    return _ACTIVATIONS[act], gated


def _relative_attention(config: Dict[str, Any]) -> Tuple[int, int]:
    """T5's (relative_attention_num_buckets, relative_attention_max_distance), checked so that the
    bucket formula (transformers' T5Attention._relative_position_bucket, csrc/models/relative_position.cc)
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


def _graph_config(family: str, config: Dict[str, Any]) -> Dict[str, Any]:
    if family in ("t5", "mt5"):
        # (aliases: transformers' T5Config.attribute_map)
        d = config_int(config, "d_model", default=512, aliases=("hidden_size",))
        heads = config_int(config, "num_heads", default=8, aliases=("num_attention_heads",))
        act, gated = _feed_forward(config)
        num_layers = config_int(config, "num_layers", default=6, aliases=("num_hidden_layers",))
        num_buckets, max_distance = _relative_attention(config)
        dec_layers = config.get("num_decoder_layers")
        tied = config.get("tie_word_embeddings", True) is not False
        # transformers 5 records the d_model^-0.5 output scaling of tied (v1.0) heads as
        # scale_decoder_outputs; older configs imply it by tie_word_embeddings. mT5 never scales.
        scaled = family == "t5" and config.get("scale_decoder_outputs", tied) is not False
        return dict(vocab_size=config_int(config, "vocab_size", default=32128), d_model=d, encoder_layers=num_layers,
                    decoder_layers=num_layers if dec_layers is None else config_int(config, "num_decoder_layers"),
                    heads=heads, head_dim=config_int(config, "d_kv", default=64, aliases=("head_dim",)),
                    ffn_dim=config_int(config, "d_ff", default=2048), max_positions=0, position_offset=0,
                    position_table=False, relative_attention=True,
                    num_buckets=num_buckets, max_distance=max_distance,
                    rms_norm=True, norm_eps=config_float(config, "layer_norm_epsilon", default=1e-6, minimum=0.0),
                    pre_norm=True, embedding_norm=False, final_norm=True, embed_scale=1.0, attention_scale=1.0,
                    activation=act, gated_ffn=gated, head_scale=d ** -0.5 if scaled else 1.0, tied=tied)
    # (aliases: transformers' Marian/Bart/MBartConfig.attribute_map)
    d = config_int(config, "d_model", default=1024, aliases=("hidden_size",))
    heads = config_int(config, "encoder_attention_heads", default=16, aliases=("num_attention_heads",))
    if config_int(config, "decoder_attention_heads", default=heads) != heads:
        raise NotImplementedError("config.json: encoder_attention_heads != decoder_attention_heads is not supported")
    ffn = config_int(config, "encoder_ffn_dim", default=4096)
    if config_int(config, "decoder_ffn_dim", default=ffn) != ffn:
        raise NotImplementedError("config.json: encoder_ffn_dim != decoder_ffn_dim is not supported")
    if d % heads:
        raise ValueError(f"config.json: d_model {d} is not a multiple of encoder_attention_heads {heads}")
    act = config.get("activation_function", "gelu")
    if act not in _ACTIVATIONS:
        raise NotImplementedError(f"config.json: activation_function {act!r} is not supported; use one of "
                                  f"{', '.join(sorted(_ACTIVATIONS))}")
    if family == "marian" and config.get("share_encoder_decoder_embeddings", True) is False:
        raise NotImplementedError("config.json: share_encoder_decoder_embeddings=false (separate source and "
                                  "target vocabularies) is not supported")
    scale = math.sqrt(d) if config.get("scale_embedding", family == "marian") else 1.0
    return dict(vocab_size=config_int(config, "vocab_size"), d_model=d,
                encoder_layers=config_int(config, "encoder_layers", default=12, aliases=("num_hidden_layers",)),
                decoder_layers=config_int(config, "decoder_layers", default=12), heads=heads, head_dim=d // heads,
                ffn_dim=ffn, max_positions=config_int(config, "max_position_embeddings", default=1024),
                position_offset=0 if family == "marian" else 2, position_table=True, relative_attention=False,
                num_buckets=32, max_distance=128, rms_norm=False, norm_eps=1e-5, pre_norm=family == "mbart",
                embedding_norm=family != "marian", final_norm=family == "mbart", embed_scale=scale,
                attention_scale=(d // heads) ** -0.5, activation=_ACTIVATIONS[act], gated_ffn=False, head_scale=1.0,
                tied=config.get("tie_word_embeddings", True) is not False)


def _bad_words(settings: Dict[str, Any], source: str, vocab_size: int) -> List[int]:
    """bad_words_ids ([[id], [id], ...], single-token sequences only) as the ids to suppress."""
    bad = settings.get("bad_words_ids")
    if bad is None:
        return []
    if not isinstance(bad, list) or not all(isinstance(b, list) and b and all(_is_int(i) and 0 <= i < vocab_size
                                                                            for i in b) for b in bad):
        raise ValueError(f"{source}: 'bad_words_ids' must be a list of non-empty lists of token ids (integers in "
                         f"[0, {vocab_size})), got {_describe(bad)}")
    if any(len(b) != 1 for b in bad):
        raise NotImplementedError(f"{source}: bad_words_ids with multi-token sequences are not supported, got "
                                  f"{_describe(bad)}")
    return [b[0] for b in bad]


class Seq2Seq(ModelBase):
    """An encoder-decoder model loaded from a Hugging Face model directory.

    ``Seq2Seq(path, dtype=None, num_threads=None)``. ``s2s.encode(input_ids,
    attention_mask=None)`` gives the encoder output float32 [B, T, d_model];
    ``s2s.logits(input_ids, decoder_input_ids, attention_mask=None)`` the decoder logits
    [B, Td, V] (teacher forcing); ``s2s.generate(sources, ...)`` generates target tokens with
    Generator.generate's arguments plus num_return_sequences and no_repeat_ngram_size.
    """

    # The prompt/tokenizer/option helpers are Generator's: one behaviour for both APIs.
    _get_tokenizer = Generator._get_tokenizer
    _INPUT = "source"
    _prompts = Generator._prompts
    _encode = Generator._encode
    _decode = Generator._decode
    _generator_options = Generator._options

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None):
        self._tokenizer = None
        model_dir = self._open(path, dtype, num_threads, "seq2seq", self._build)
        self._defaults(model_dir)

    # ---- loading ---------------------------------------------------------------------------

    def _build(self, md: ModelDir, _: str) -> None:
        self.family = _family(md.config.get("model_type"), self.architecture)
        cfg = _graph_config(self.family, md.config)
        self.config = cfg
        graph_cfg = {k: v for k, v in cfg.items() if k != "tied"}
        graph_cfg["dtype"] = self.dtype
        stored = self._stored_dtype
        d, V, F = cfg["d_model"], cfg["vocab_size"], cfg["ffn_dim"]
        inner = cfg["heads"] * cfg["head_dim"]
        t5 = self.family in ("t5", "mt5")
        prefix = "" if t5 else "model."
        word = md.tensor(prefix + "shared.weight", shape=(V, d)) if prefix + "shared.weight" in md else \
            md.tensor(prefix + "encoder.embed_tokens.weight", shape=(V, d))
        embeddings: Dict[str, Any] = {"word_embeddings": word}
        if t5:
            rel = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            for stack in ("encoder", "decoder"):
                embeddings[stack + "_relative_bias"] = md.tensor(f"{stack}.{rel}",
                                                                 shape=(cfg["num_buckets"], cfg["heads"]))
        elif self.family == "marian":
            table = sinusoidal_positions(cfg["max_positions"], d)
            embeddings["encoder_positions"] = embeddings["decoder_positions"] = table
        else:
            rows = cfg["max_positions"] + 2
            for stack in ("encoder", "decoder"):
                embeddings[stack + "_positions"] = md.tensor(f"model.{stack}.embed_positions.weight", shape=(rows, d))
                embeddings[stack + "_norm.weight"] = md.tensor(f"model.{stack}.layernorm_embedding.weight", shape=(d,))
                embeddings[stack + "_norm.bias"] = md.tensor(f"model.{stack}.layernorm_embedding.bias", shape=(d,))
        model = _core.Seq2SeqModel(graph_cfg, embeddings)

        def take(t: Dict[str, Any], names: List[str], key: str, name: str, shape, required: bool = True) -> None:
            if not required and name not in md:
                return
            if len(shape) == 2:  # a projection weight (norms and biases are 1-D)
                put_weight(md, stored, t, key, name, shape)
            else:
                t[key] = md.tensor(name, shape=shape)
            names.append(name)

        for stack, count in (("encoder", cfg["encoder_layers"]), ("decoder", cfg["decoder_layers"])):
            decoder = stack == "decoder"
            for layer in range(count):
                t: Dict[str, Any] = {}
                names: List[str] = []
                if t5:
                    p = f"{stack}.block.{layer}.layer."
                    for key in ("q", "k", "v"):
                        take(t, names, key + ".weight", f"{p}0.SelfAttention.{key}.weight", (inner, d))
                    take(t, names, "o.weight", f"{p}0.SelfAttention.o.weight", (d, inner))
                    take(t, names, "self_norm.weight", f"{p}0.layer_norm.weight", (d,))
                    ffn = 1
                    if decoder:
                        for key in ("q", "k", "v"):
                            take(t, names, f"cross_{key}.weight", f"{p}1.EncDecAttention.{key}.weight", (inner, d))
                        take(t, names, "cross_o.weight", f"{p}1.EncDecAttention.o.weight", (d, inner))
                        take(t, names, "cross_norm.weight", f"{p}1.layer_norm.weight", (d,))
                        ffn = 2
                    dense = f"{p}{ffn}.DenseReluDense."
                    if cfg["gated_ffn"]:
                        take(t, names, "gate.weight", dense + "wi_0.weight", (F, d))
                        take(t, names, "up.weight", dense + "wi_1.weight", (F, d))
                    else:
                        take(t, names, "up.weight", dense + "wi.weight", (F, d))
                    take(t, names, "down.weight", dense + "wo.weight", (d, F))
                    take(t, names, "ffn_norm.weight", f"{p}{ffn}.layer_norm.weight", (d,))
                else:
                    p = f"model.{stack}.layers.{layer}."
                    attentions = [("", "self_attn.")] + ([("cross_", "encoder_attn.")] if decoder else [])
                    for key_prefix, module in attentions:
                        for key, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
                            shape = (d, inner) if key == "o" else (inner, d)
                            take(t, names, f"{key_prefix}{key}.weight", f"{p}{module}{proj}.weight", shape)
                            take(t, names, f"{key_prefix}{key}.bias", f"{p}{module}{proj}.bias", shape[:1], False)
                    for key, norm_name in (("self_norm", "self_attn_layer_norm"), ("ffn_norm", "final_layer_norm")) + \
                            ((("cross_norm", "encoder_attn_layer_norm"),) if decoder else ()):
                        take(t, names, key + ".weight", f"{p}{norm_name}.weight", (d,))
                        take(t, names, key + ".bias", f"{p}{norm_name}.bias", (d,))
                    take(t, names, "up.weight", p + "fc1.weight", (F, d))
                    take(t, names, "up.bias", p + "fc1.bias", (F,), False)
                    take(t, names, "down.weight", p + "fc2.weight", (d, F))
                    take(t, names, "down.bias", p + "fc2.bias", (d,), False)
                if decoder:
                    model.add_decoder_layer(t)
                else:
                    model.add_encoder_layer(t)
                del t
                for name in names:
                    release_weight(md, name)
        head: Dict[str, Any] = {}
        if cfg["final_norm"]:
            for stack in ("encoder", "decoder"):
                if t5:
                    head[stack + "_norm.weight"] = md.tensor(f"{stack}.final_layer_norm.weight", shape=(d,))
                else:
                    head[stack + "_norm.weight"] = md.tensor(f"model.{stack}.layer_norm.weight", shape=(d,))
                    head[stack + "_norm.bias"] = md.tensor(f"model.{stack}.layer_norm.bias", shape=(d,))
        # A checkpoint's own lm_head.weight wins (untied heads; a tied one equals the embeddings). A
        # converted directory always stores its head (a quantized copy when tied).
        if "lm_head.weight" in md or stored is not None:
            put_weight(md, stored, head, "lm_head", "lm_head.weight", (V, d))
        elif not cfg["tied"] and not t5:
            raise ValueError(f"{md.path}: the checkpoint has no lm_head.weight and tie_word_embeddings is false")
        if "final_logits_bias" in md:
            head["final_logits_bias"] = np.ascontiguousarray(
                md.tensor("final_logits_bias", shape=(1, V)).reshape(V), dtype=np.float32)
        model.set_head(head)
        if "lm_head" in head:
            release_weight(md, "lm_head.weight")
        del word, embeddings
        self._model = model

    def _defaults(self, md: ModelDir) -> None:
        """Generation defaults from generation_config.json, else config.json. Every id is checked
        here (type and range, naming file and key), so a value that would fail every generate()
        or reach the C++ loop unconverted fails at load; only eos ids are checked against the
        vocabulary at generate() time, because a call may pass its own eos_token_id."""
        V = self.vocab_size

        def token_ids(key: str, in_vocabulary: bool = True) -> Tuple[Optional[List[int]], str]:
            settings, source = generation_setting(md, key)
            return config_token_ids(settings, key, vocab_size=V if in_vocabulary else None, source=source), source

        eos, self._eos_source = token_ids("eos_token_id", in_vocabulary=False)
        self.eos_token_ids = eos or []
        pad, _ = token_ids("pad_token_id", in_vocabulary=False)  # outside [0, V): no pad token
        self.pad_token_id = pad[0] if pad else (self.eos_token_ids[0] if self.eos_token_ids else 0)
        # transformers: decoder_start_token_id, else bos_token_id; T5 checkpoints start from pad.
        start, source = token_ids("decoder_start_token_id")
        key = "decoder_start_token_id"
        if not start:
            (start, source), key = token_ids("bos_token_id"), "bos_token_id"
        if not start and self.family in ("t5", "mt5"):
            start = [self.pad_token_id]
        if not start:
            raise ValueError(f"{md.path}: the config has neither decoder_start_token_id nor bos_token_id; "
                             "encoder-decoder generation needs one")
        if len(set(start)) > 1:  # transformers' per-row start tokens
            raise NotImplementedError(f"{source}: {key!r} lists different start tokens {start}; one start "
                                      "token for every row is supported")
        self.decoder_start_token_id = start[0]
        settings, source = generation_setting(md, "forced_bos_token_id")
        bos = config_token_ids(settings, "forced_bos_token_id", vocab_size=V, source=source, single=True)
        self.forced_bos_token_id = -1 if bos is None else bos[0]
        forced_eos, source = token_ids("forced_eos_token_id")
        if forced_eos is not None and len(forced_eos) != 1:
            # An empty list would force no token at all (transformers then masks every logit).
            error = ValueError if not forced_eos else NotImplementedError
            raise error(f"{source}: 'forced_eos_token_id' must be one token id (or a list of one), got {forced_eos}")
        self.forced_eos_token_id = -1 if forced_eos is None else forced_eos[0]
        self.suppress_token_ids = _bad_words(*generation_setting(md, "bad_words_ids"), V)

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def max_positions(self) -> Optional[int]:
        """Longest source / target the position table covers; None for T5 (relative positions)."""
        return self.config["max_positions"] or None

    def close(self) -> None:
        """Frees the model and drops the weight maps; the object cannot be used afterwards."""
        self._model = None
        self._model_dir.close()

    def _live(self):
        if self._model is None:
            raise ValueError("this Seq2Seq is closed")
        return self._model

    # ---- forward ---------------------------------------------------------------------------

    def encode(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Encoder output float32 [B, T, d_model]; padded positions (mask 0) are masked as keys."""
        model = self._live()
        ids = _as_2d(input_ids, "input_ids", vocab_size=self.vocab_size)
        mask = None if attention_mask is None else _as_2d(attention_mask, "attention_mask", allow_bool=True)
        return model.encode(ids, mask, self.num_threads)

    def logits(self, input_ids: TokenIds, decoder_input_ids: TokenIds,
               attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Decoder logits float32 [B, Td, V] for the given decoder inputs (teacher forcing)."""
        model = self._live()
        ids = _as_2d(input_ids, "input_ids", vocab_size=self.vocab_size)
        mask = None if attention_mask is None else _as_2d(attention_mask, "attention_mask", allow_bool=True)
        tgt = _as_2d(decoder_input_ids, "decoder_input_ids", vocab_size=self.vocab_size)
        if tgt.shape[0] != ids.shape[0]:
            raise ValueError(f"decoder_input_ids must have shape [batch, target_len] with batch {ids.shape[0]} "
                             f"(the batch of input_ids), got {list(tgt.shape)}")
        return model.logits(ids, tgt, mask, self.num_threads)

    # ---- generation ------------------------------------------------------------------------

    def _options(self, num_return_sequences, no_repeat_ngram_size, **kwargs) -> Dict[str, Any]:
        options = self._generator_options(**kwargs)
        num_return_sequences = check_integer("num_return_sequences", num_return_sequences, 0)
        no_repeat_ngram_size = check_integer("no_repeat_ngram_size", no_repeat_ngram_size, 0)
        if not 1 <= num_return_sequences <= options["num_beams"]:
            raise ValueError(f"num_return_sequences ({num_return_sequences}) must be between 1 and num_beams "
                             f"({options['num_beams']})")
        options.update(num_return_sequences=int(num_return_sequences), no_repeat_ngram_size=int(no_repeat_ngram_size),
                       decoder_start_token_id=int(self.decoder_start_token_id),
                       forced_bos_token_id=self.forced_bos_token_id, forced_eos_token_id=self.forced_eos_token_id,
                       suppress_token_ids=list(self.suppress_token_ids))
        return options

    def generate(self, sources: Prompts, max_new_tokens: int = 20, min_new_tokens: int = 0, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 num_beams: int = 1, length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
                 eos_token_id: Union[None, int, Sequence[int]] = None, seed: Optional[int] = None,
                 return_log_probs: bool = False, num_return_sequences: int = 1,
                 no_repeat_ngram_size: int = 0) -> Generated:
        """Target tokens for each source (list[list[int]]; the decoder start token excluded, EOS
        included when produced), as transformers' generate() on the same model.

        sources: a list of token ids (one source), a list of token-id lists (a batch of any
        lengths), a string or a list of strings (needs tokenizer.json; the result is then text).
        Arguments as Generator.generate; num_return_sequences (≤ num_beams) returns that many
        best beams per source, consecutively; no_repeat_ngram_size bans repeated n-grams of the
        target. The model's generation_config.json supplies eos / pad / decoder start tokens,
        forced BOS/EOS tokens and single-token bad_words_ids.
        """
        model = self._live()
        ids, kind = self._prompts(sources)
        options = self._options(num_return_sequences, no_repeat_ngram_size, max_new_tokens=max_new_tokens,
                                min_new_tokens=min_new_tokens, do_sample=do_sample, temperature=temperature,
                                top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty, num_beams=num_beams,
                                length_penalty=length_penalty, early_stopping=early_stopping,
                                eos_token_id=eos_token_id, seed=seed, return_log_probs=return_log_probs)
        tokens, log_probs = model.generate(ids, options, None, self.num_threads)
        if kind == "str" and num_return_sequences == 1:
            out: Any = self._decode(tokens[0])
        elif kind in ("str", "strs"):
            out = [self._decode(t) for t in tokens]
        else:
            out = tokens
        return (out, log_probs) if return_log_probs else out

    def _shape_text(self) -> str:
        c = self.config
        return (f"layers={c['encoder_layers']}+{c['decoder_layers']}, "
                f"d_model={c['d_model']}, heads={c['heads']}")


__all__ = ["Seq2Seq", "sinusoidal_positions"]
