"""``cpuformer.Encoder``: BERT-family encoders (BERT, RoBERTa, XLM-RoBERTa, DistilBERT).

Loading maps a checkpoint's tensor names onto one graph (``_core.EncoderModel``, C++), packs the
projection weights one layer at a time and releases each layer's source pages right after, so
loading peaks near one copy of the weights. The embedding tables are copied into memory the C++
model owns, and the weights maps are closed when loading ends: a loaded model does not depend on
its files (docs/reliability.md, "fork() and files changing after load").
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._arguments import integer_array, token_id_range_error
from ._base import ModelBase, TokenIds
from ._load import ENCODER_FAMILIES
from ._model_dir import ModelDir, config_float, config_int
from ._tokenizer import load_tokenizer, read_length_limit
from .convert import put_weight, release_weight

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_POOLINGS = ("mean", "cls")

PathLike = Union[str, os.PathLike]


def _encoder_config(family: str, config: Dict[str, Any]) -> Dict[str, Any]:
    """The graph's config from a Hugging Face config.json (defaults are the HF config classes')."""
    if family == "distilbert":
        # (aliases: transformers' DistilBertConfig.attribute_map)
        hidden = config_int(config, "dim", default=768, aliases=("hidden_size",))
        act_key, act = "activation", config.get("activation", "gelu")
        out = dict(hidden_size=hidden, num_layers=config_int(config, "n_layers", default=6,
                                                             aliases=("num_hidden_layers",)),
                   num_heads=config_int(config, "n_heads", default=12, aliases=("num_attention_heads",)),
                   intermediate_size=config_int(config, "hidden_dim", default=4 * hidden),
                   type_vocab_size=0, layer_norm_eps=1e-12, position_ids="arange",
                   pad_token_id=config_int(config, "pad_token_id", default=0, minimum=0))
    else:
        position_type = config.get("position_embedding_type", "absolute")
        if position_type not in (None, "absolute"):
            raise NotImplementedError(f"config.json: position_embedding_type {position_type!r} is not supported; "
                                      "only 'absolute' position embeddings are")
        act_key, act = "hidden_act", config.get("hidden_act", "gelu")
        roberta = family in ("roberta", "xlm-roberta")
        out = dict(hidden_size=config_int(config, "hidden_size", default=768),
                   num_layers=config_int(config, "num_hidden_layers", default=12),
                   num_heads=config_int(config, "num_attention_heads", default=12),
                   intermediate_size=config_int(config, "intermediate_size", default=3072),
                   type_vocab_size=config_int(config, "type_vocab_size", default=2, minimum=0),
                   layer_norm_eps=config_float(config, "layer_norm_eps", default=1e-12, minimum=0.0),
                   position_ids="padding_cumsum" if roberta else "arange",
                   pad_token_id=config_int(config, "pad_token_id", default=1 if roberta else 0, minimum=0))
    if act not in _ACTIVATIONS:
        raise ValueError(f"config.json: {act_key} {act!r} is not supported; use one of {sorted(_ACTIVATIONS)}")
    out["activation"] = _ACTIVATIONS[act]
    out["vocab_size"] = config_int(config, "vocab_size", default=30522)
    out["max_positions"] = config_int(config, "max_position_embeddings", default=512)
    if out["hidden_size"] % out["num_heads"]:
        raise ValueError(f"config.json: hidden size {out['hidden_size']} is not a multiple of the number of "
                         f"attention heads {out['num_heads']}")
    if out["pad_token_id"] >= out["vocab_size"]:
        raise ValueError(f"config.json: pad_token_id {out['pad_token_id']} must be < vocab_size {out['vocab_size']}")
    if out["position_ids"] == "padding_cumsum" and out["max_positions"] <= out["pad_token_id"] + 1:
        raise ValueError(f"config.json: max_position_embeddings {out['max_positions']} leaves no positions after "
                         f"padding_idx {out['pad_token_id']}")
    return out


def _tensor_names(family: str, layer: int) -> Dict[str, str]:
    """Graph key -> checkpoint name (without the task-head prefix) for one layer."""
    if family == "distilbert":
        p = f"transformer.layer.{layer}."
        pairs = {"q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin", "out": "attention.out_lin",
                 "attention_norm": "sa_layer_norm", "intermediate": "ffn.lin1", "output": "ffn.lin2",
                 "output_norm": "output_layer_norm"}
    else:
        p = f"encoder.layer.{layer}."
        pairs = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                 "out": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
                 "intermediate": "intermediate.dense", "output": "output.dense", "output_norm": "output.LayerNorm"}
    names = {}
    for key, name in pairs.items():
        names[key + ".weight"] = p + name + ".weight"
        names[key + ".bias"] = p + name + ".bias"
    return names


class Encoder(ModelBase):
    """A BERT-family encoder loaded from a Hugging Face model directory.

    ``Encoder(path, dtype=None, num_threads=None)``: ``path`` holds config.json and
    model.safetensors (or shards), optionally tokenizer.json. Supported: BertModel, RobertaModel,
    XLMRobertaModel, DistilBertModel and their task-head checkpoints (…ForMaskedLM,
    …ForSequenceClassification, …: the heads are ignored). ``num_threads`` (None: the process
    default) applies to every call.

    ``enc(input_ids, attention_mask=None, token_type_ids=None)`` returns last_hidden_state,
    float32 [B, T, H]; ``return_pooler=True`` returns ``(last_hidden_state, pooler_output)`` for
    BERT checkpoints that have a pooler (tanh(dense(h[:, 0]))); ``enc.pooler_output(...)`` returns
    just the pooler output. Rows at padded positions are computed like real tokens that attend
    only to the unpadded keys; they carry no meaning (Hugging Face's differ only in how a row with
    no key at all is treated), so compare and pool only unpadded positions.
    """

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None):
        self._tokenizer = None
        # The directory stays open while the model lives: the embedding tables are views of its maps.
        self._open(path, dtype, num_threads, "encoder", self._build)

    # ---- loading ---------------------------------------------------------------------------

    def _build(self, md: ModelDir, family: str) -> None:
        self.family = family
        cfg = _encoder_config(family, md.config)
        cfg["dtype"] = self.dtype
        self.config = cfg
        H, I = cfg["hidden_size"], cfg["intermediate_size"]
        prefix = ENCODER_FAMILIES[family]
        if prefix + "embeddings.word_embeddings.weight" not in md:
            prefix = ""  # a bare base model (BertModel …) has no prefix

        def tensor(name: str, shape: Sequence[int]) -> np.ndarray:
            return md.tensor(prefix + name, shape=shape)

        embeddings = {
            "word_embeddings": tensor("embeddings.word_embeddings.weight", (cfg["vocab_size"], H)),
            "position_embeddings": tensor("embeddings.position_embeddings.weight", (cfg["max_positions"], H)),
            "norm.weight": tensor("embeddings.LayerNorm.weight", (H,)),
            "norm.bias": tensor("embeddings.LayerNorm.bias", (H,)),
        }
        token_types = prefix + "embeddings.token_type_embeddings.weight"
        if token_types in md:
            # A table the config does not describe would be ignored (type_vocab_size 0) or read
            # with the wrong row count: name both sides.
            shape = list(md.tensor_info(token_types)[1])
            if family != "distilbert" and shape != [cfg["type_vocab_size"], H]:
                raise ValueError(f"config.json: 'type_vocab_size' is {cfg['type_vocab_size']}, but the checkpoint's "
                                 f"{token_types} has shape {shape} (type_vocab_size × hidden_size {H})")
        if cfg["type_vocab_size"] > 0:
            embeddings["token_type_embeddings"] = tensor("embeddings.token_type_embeddings.weight",
                                                         (cfg["type_vocab_size"], H))
        model = _core.EncoderModel(cfg, embeddings)
        shapes = {"q": (H, H), "k": (H, H), "v": (H, H), "out": (H, H), "attention_norm": (H,),
                  "intermediate": (I, H), "output": (H, I), "output_norm": (H,)}
        for layer in range(cfg["num_layers"]):
            names = _tensor_names(family, layer)
            tensors: Dict[str, Any] = {}
            for key, name in names.items():
                part, kind = key.rsplit(".", 1)
                shape = shapes[part] if kind == "weight" else shapes[part][:1]
                if kind == "weight" and not part.endswith("norm"):
                    put_weight(md, self._stored_dtype, tensors, key, prefix + name, shape)
                else:
                    tensors[key] = tensor(name, shape)
            model.add_layer(tensors)
            del tensors
            for name in names.values():
                release_weight(md, prefix + name)  # packed: its pages can leave resident memory
        pooler = prefix + "pooler.dense.weight"
        if pooler in md:
            p: Dict[str, Any] = {}
            put_weight(md, self._stored_dtype, p, "weight", pooler, (H, H))
            model.set_pooler(p["weight"], tensor("pooler.dense.bias", (H,)), p.get("weight_scale"))
            del p
            release_weight(md, pooler)
        self._model = model

    def _live(self):
        """The C++ model; ValueError once close() has run (not an AttributeError on None)."""
        if self._model is None:
            raise ValueError("this Encoder is closed")
        return self._model

    @property
    def hidden_size(self) -> int:
        return self._live().hidden_size

    @property
    def max_seq_len(self) -> int:
        """Longest sequence the position table covers (RoBERTa-style models reserve pad + 1 rows)."""
        return self._live().max_seq_len

    @property
    def pad_token_id(self) -> int:
        return self.config["pad_token_id"]

    @property
    def has_pooler(self) -> bool:
        return self._live().has_pooler

    def close(self) -> None:
        """Frees the model and drops the weight maps; the object cannot be used afterwards."""
        self._model = None
        self._model_dir.close()

    # ---- forward ---------------------------------------------------------------------------

    def __call__(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None,
                 token_type_ids: Optional[TokenIds] = None, *,
                 return_pooler: bool = False) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
        """last_hidden_state float32 [B, T, H] (``return_pooler=True``: (last_hidden_state, pooler_output [B, H])).

        input_ids: integer NumPy array [B, T] or a list of lists of ints; ragged lists are padded
        with pad_token_id and the attention mask is built (an explicit mask / token types must
        then be lists of the same lengths). attention_mask: 0/1 (or bool) [B, T], default all
        ones. token_type_ids: [B, T] in [0, type_vocab_size), default zeros.
        """
        model = self._live()
        ids, mask, types = _prepare_inputs(input_ids, attention_mask, token_type_ids, self.pad_token_id,
                                           self.config["vocab_size"])
        return model.forward(ids, mask, types, bool(return_pooler), self.num_threads)

    def pooler_output(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None,
                      token_type_ids: Optional[TokenIds] = None) -> np.ndarray:
        """BERT's pooler output tanh(dense(h[:, 0])) [B, H]; ValueError if the checkpoint has no pooler."""
        return self(input_ids, attention_mask, token_type_ids, return_pooler=True)[1]

    # ---- sentence embeddings ---------------------------------------------------------------

    def _get_tokenizer(self):
        if self._tokenizer is None:
            path = self._model_dir.tokenizer_path
            if path is None:
                raise ValueError(f"embed() was given strings, but {self._model_dir.path} has no tokenizer.json; "
                                 "pass lists of token ids instead")
            tokenizer = load_tokenizer(path)
            tokenizer.no_padding()  # batches are padded here, after sorting by length
            tokenizer.enable_truncation(self.max_tokens)
            self._tokenizer = tokenizer
        return self._tokenizer

    @property
    def max_tokens(self) -> int:
        """Truncation length for embed() of strings: the position table's limit, lowered by tokenizer_config.json's
        model_max_length and sentence-transformers' max_seq_length when those are present."""
        limit = self.max_seq_len
        for file, key in (("tokenizer_config.json", "model_max_length"), ("sentence_bert_config.json", "max_seq_length")):
            value = read_length_limit(self._model_dir.path, file, key)
            if value is not None and value < limit:
                limit = value
        return limit

    def embed(self, inputs: Union[Sequence[str], Sequence[Sequence[int]]], pooling: str = "mean",
              normalize: bool = True, batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings, float32 [N, H], in input order.

        inputs: a list of strings (needs tokenizer.json; truncated to ``max_tokens``) or a list of
        token-id lists (used as given; longer than max_seq_len is an error). pooling: "mean" (over
        the tokens of each sequence, using the attention mask) or "cls" (the first token).
        normalize: L2-normalise each row. Sequences are run in batches of ``batch_size`` sorted by
        length, so batches carry little padding.
        """
        self._live()
        if pooling not in _POOLINGS:
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(inputs, (str, bytes)):
            raise TypeError("embed() takes a list of strings or of token-id lists; wrap a single string in a list")
        inputs = list(inputs)
        if not inputs:
            raise ValueError("embed() needs at least one input, got an empty list")
        if all(isinstance(x, str) for x in inputs):
            encodings = self._get_tokenizer().encode_batch(inputs)
            sequences = [e.ids for e in encodings]
        elif any(isinstance(x, str) for x in inputs):
            raise TypeError("embed() inputs must be all strings or all token-id lists, not a mix")
        else:
            sequences = [_id_list(x, i, self.config["vocab_size"]) for i, x in enumerate(inputs)]
        H = self.hidden_size
        result = np.empty((len(sequences), H), dtype=np.float32)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            ids, mask = _pad([sequences[i] for i in chunk], self.pad_token_id)
            hidden = self(ids, mask)
            if pooling == "cls":
                pooled = hidden[:, 0, :]
            else:
                weights = mask.astype(np.float32)[:, :, None]
                # padded rows are selected out, not multiplied by 0: 0 · NaN would reach the mean
                kept = np.where(weights > 0, hidden, np.float32(0.0))
                pooled = kept.sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            result[chunk] = pooled
        if normalize:
            norms = np.linalg.norm(result, axis=1, keepdims=True)
            result /= np.maximum(norms, 1e-12)
        return result

    def _shape_text(self) -> str:
        c = self.config
        return (f"layers={c['num_layers']}, hidden={c['hidden_size']}, "
                f"heads={c['num_heads']}")


# ---- input preparation -------------------------------------------------------------------------

def _id_list(x, index: int, vocab_size: int) -> List[int]:
    if isinstance(x, np.ndarray):
        if x.ndim != 1:
            raise ValueError(f"inputs[{index}] must be a 1-D sequence of token ids, got shape {list(x.shape)}")
        if x.dtype.kind not in "iu":
            raise TypeError(f"inputs[{index}] must hold integer token ids, got dtype {x.dtype}")
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"inputs[{index}] must be a string or a list of token ids, got {type(x).__name__}")
    for v in x:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"inputs[{index}] must hold integer token ids, got {type(v).__name__} {v!r}")
    if not x:
        raise ValueError(f"inputs[{index}] is an empty token list")
    for v in x:  # here, so that no id beyond int64 reaches the int64 batch array
        if not 0 <= v < vocab_size:
            raise token_id_range_error(f"inputs[{index}]", int(v), vocab_size)
    return list(x)


def _pad(sequences: List[List[int]], pad: int) -> Tuple[np.ndarray, np.ndarray]:
    T = max(len(s) for s in sequences)
    ids = np.full((len(sequences), T), pad, dtype=np.int64)
    mask = np.zeros((len(sequences), T), dtype=np.int64)
    for b, s in enumerate(sequences):
        ids[b, :len(s)] = s
        mask[b, :len(s)] = 1
    return ids, mask


def _as_int_array(value, name: str, allow_bool: bool = False, vocab_size: Optional[int] = None) -> np.ndarray:
    """int64 [batch, seq_len]; vocab_size words a value beyond int64 as an out-of-range token id."""
    array = integer_array(value, name, vocab_size=vocab_size, allow_bool=allow_bool)
    if array.ndim != 2:
        raise ValueError(f"{name} must have 2 dimensions [batch, seq_len], got shape {list(array.shape)}"
                         + ("; wrap a single sequence in a list" if array.ndim == 1 else ""))
    return array


def _is_ragged(value) -> bool:
    if not isinstance(value, (list, tuple)) or not value:
        return False
    if not all(isinstance(row, (list, tuple, np.ndarray)) for row in value):
        return False
    return len({len(row) for row in value}) > 1


def _pad_like(value, lengths: List[int], T: int, name: str, fill: int) -> np.ndarray:
    if not isinstance(value, (list, tuple)) or len(value) != len(lengths) or \
            any(not isinstance(r, (list, tuple, np.ndarray)) or len(r) != n for r, n in zip(value, lengths)):
        raise ValueError(f"input_ids is a ragged list, so {name} must be a list of lists of the same lengths "
                         f"{lengths}")
    rows = []
    for r, n in zip(value, lengths):
        row = _as_int_array([list(r)], name, allow_bool=True)[0]
        rows.append(np.concatenate([row, np.full(T - n, fill, dtype=np.int64)]))
    return np.stack(rows)


def _prepare_inputs(input_ids, attention_mask, token_type_ids, pad: int, vocab_size: int):
    if isinstance(input_ids, (list, tuple)) and len(input_ids) == 0:
        raise ValueError("input_ids must hold at least one sequence, got an empty batch")
    if _is_ragged(input_ids):
        lengths = [len(row) for row in input_ids]
        if min(lengths) == 0:
            raise ValueError("input_ids holds an empty sequence; every sequence needs at least one token")
        rows = [_as_int_array([list(row)], "input_ids", vocab_size=vocab_size)[0] for row in input_ids]
        ids, built_mask = _pad([r.tolist() for r in rows], pad)
        T = ids.shape[1]
        mask = built_mask if attention_mask is None else \
            _pad_like(attention_mask, lengths, T, "attention_mask", 0) * built_mask
        types = None if token_type_ids is None else _pad_like(token_type_ids, lengths, T, "token_type_ids", 0)
        return ids, mask, types
    ids = _as_int_array(input_ids, "input_ids", vocab_size=vocab_size)
    mask = None if attention_mask is None else _as_mask(attention_mask)
    types = None if token_type_ids is None else _as_int_array(token_type_ids, "token_type_ids")
    return ids, mask, types


def _as_mask(value) -> np.ndarray:
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype.kind == "f":
        # Hugging Face tokenizers can return float masks; only exact 0/1 values are meaningful.
        if not np.all((array == 0) | (array == 1)):
            raise ValueError("attention_mask entries must be 0 (padding) or 1 (token)")
        array = array.astype(np.int64)
    return _as_int_array(array, "attention_mask", allow_bool=True)


__all__ = ["Encoder"]
