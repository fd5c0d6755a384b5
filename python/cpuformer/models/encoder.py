"""``cpuformer.Encoder``: the registry's encoders (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet,
ELECTRA, ALBERT, DeBERTa, ModernBERT, XLNet) and their task heads (models/_tasks.py, models/_spans.py).

The families are declared in ``arch/``; loading (``weights.py``, ``models/_graph.py``)
packs the projection weights one layer at a time and releases each layer's source pages right
after, so loading peaks near one copy of the weights. The embedding tables are copied into memory
the C++ model owns, and the weights maps are closed when loading ends: a loaded model does not
depend on its files (docs/reliability.md, "fork() and files changing after load").
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _sentence
from .._arguments import check_integer, integer_array, token_id_range_error
from .._model_dir import ModelDir
from .._slow_tokenizers import has_slow_tokenizer, open_slow_tokenizer, slow_tokenizer_file
from .._tokenizer import Tokenizer, load_tokenizer, read_length_limit, read_tokenizer_settings
from ._base import ModelBase, TokenIds
from ._spans import SpanMixin
from ._tasks import TaskMixin

# embed()'s explicit pooling names -> sentence-transformers' mode names (_sentence.py)
_POOLINGS = {"mean": "mean", "cls": "cls", "max": "max", "last": "lasttoken"}
_NOT_READ = object()

PathLike = Union[str, os.PathLike]


class Encoder(SpanMixin, TaskMixin, ModelBase):
    """An encoder loaded from a Hugging Face model directory.

    ``Encoder(path, dtype=None, num_threads=None, head=True)``: ``path`` holds config.json and
    model.safetensors (or shards), optionally tokenizer.json. Supported: the registry's encoders
    (``cpuformer.arch``, kind "encoder"; ``cpuformer.arch.supported("encoder")`` lists them),
    base models and their task-head checkpoints. ``head``: load the task head the checkpoint's
    class names (``...ForSequenceClassification``: ``logits``, ``classify``, ``score``; see
    docs/tasks.md); a head cpuformer does not run is a NotImplementedError, and ``head=False``
    opens the encoder alone. ``num_threads`` (None: the process default) applies to every call.

    ``enc(input_ids, attention_mask=None, token_type_ids=None)`` returns last_hidden_state,
    float32 [B, T, H]; ``return_pooler=True`` returns ``(last_hidden_state, pooler_output)`` for
    BERT checkpoints that have a pooler (tanh(dense(h[:, 0]))); ``enc.pooler_output(...)`` returns
    just the pooler output. Rows at padded positions are computed like real tokens that attend
    only to the unpadded keys; they carry no meaning (Hugging Face's differ only in how a row with
    no key at all is treated), so compare and pool only unpadded positions.
    """

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, head: bool = True,
                 quantization: Optional[Mapping[str, Any]] = None):
        if not isinstance(head, bool):
            raise TypeError(f"head must be True or False, got {head!r}")
        self._tokenizer = None
        self._open(path, dtype, num_threads, "encoder", head=head, quantization=quantization)
        #: Transformer-XL memory settings (XLNet: arch.spec.Memory), None for other families.
        self._memory = self._arch.memory(self._model_dir.config)

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

    # ---- forward ---------------------------------------------------------------------------

    def __call__(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None,
                 token_type_ids: Optional[TokenIds] = None, *, return_pooler: bool = False,
                 skip_padding: bool = False) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
        """last_hidden_state float32 [B, T, H] (``return_pooler=True``: (last_hidden_state, pooler_output [B, H])).

        input_ids: integer NumPy array [B, T] or a list of lists of ints; ragged lists are padded
        with pad_token_id and the attention mask is built (an explicit mask / token types must
        then be lists of the same lengths). attention_mask: 0/1 (or bool) [B, T], default all
        ones. token_type_ids: [B, T] in [0, type_vocab_size), default zeros.

        skip_padding=True: the padded positions of last_hidden_state are zeros, and the layers run
        on the unpadded tokens only, so a batch of mixed lengths costs what its real tokens cost
        (docs/encoders.md, "Padding removal"). The unpadded positions and the pooler output are
        the same as without it (float32 rounding aside).
        """
        out, _ = self._forward(input_ids, attention_mask, token_type_ids, bool(return_pooler), bool(skip_padding))
        return out

    def _forward(self, input_ids: TokenIds, attention_mask: Optional[TokenIds], token_type_ids: Optional[TokenIds],
                 return_pooler: bool, skip_padding: Optional[bool] = False,
                 first_only: bool = False, pick: Optional[np.ndarray] = None) -> Tuple[Any, Optional[np.ndarray]]:
        """(what __call__ returns, the attention mask it used: int64 [B, T], None for all ones).
        skip_padding=None: skip it when every sequence's first position is unpadded (for callers
        that read only unpadded rows and row 0: sequence-level heads). first_only: the caller reads
        row 0 of each sequence only; the other rows come back zero (the last layer is computed for
        the first tokens alone, docs/encoders.md "First-token outputs"); pick (int64 [B]): row
        pick[b] of sequence b instead."""
        model = self._live()
        ids, mask, types = _prepare_inputs(input_ids, attention_mask, token_type_ids, self.pad_token_id,
                                           self.config["vocab_size"])
        if skip_padding is None:
            skip_padding = mask is not None and bool(mask[:, 0].all())
        return model.forward(ids, mask, types, return_pooler, self.num_threads, skip_padding, first_only, pick), mask

    def encode_with_memory(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None,
                           token_type_ids: Optional[TokenIds] = None,
                           mems: Optional[Sequence[np.ndarray]] = None) -> Tuple[np.ndarray, List[np.ndarray]]:
        """Transformer-XL segment recurrence (XLNet): ``(last_hidden_state [B, T, H], new_mems)``.

        ``mems``: None (a first segment), or what the previous call returned: one float32 array
        [B, M, H] per layer (batch first, like the rest of cpuformer; transformers' are [M, B, H]),
        the hidden states of earlier tokens that each layer's keys and values extend over; the
        relative positions then span M + T. Every memory token is attended (transformers applies
        no mask to them, so padding of an earlier segment stays visible). ``new_mems``: per layer,
        the previous mems followed by this call's layer input (its first ``reuse_len`` tokens when
        config.json sets reuse_len), of which the last ``mem_len`` tokens are kept when config.json
        sets mem_len (null or 0: all), as transformers' ``cache_mem``. The result equals the
        transformers model's called with ``mems=[m.transpose(1, 0, 2) for m in mems], use_mems=True``,
        with its mems transposed back (docs/encoders.md, "XLNet memory").
        Other inputs are as for ``__call__``. Bad mems (not one per layer, another batch or hidden
        size, lengths that differ, a dtype other than float32, NaN or ±inf) are ValueErrors.
        """
        model = self._live()
        if self._memory is None:
            raise NotImplementedError(f"encode_with_memory needs a model with a Transformer-XL memory (XLNet); "
                                      f"{self._arch.title} models have none")
        ids, mask, types = _prepare_inputs(input_ids, attention_mask, token_type_ids, self.pad_token_id,
                                           self.config["vocab_size"])
        memory = None if mems is None else _check_mems(mems, self.config["num_layers"], ids.shape[0],
                                                       self.hidden_size)
        out, layer_inputs = model.forward_memory(ids, mask, types, memory, self.num_threads)
        keep, reuse = self._memory.mem_len, self._memory.reuse_len
        new_mems = []
        for layer, current in enumerate(layer_inputs):
            if reuse:
                current = current[:, :reuse]
            joined = current if memory is None else np.concatenate([memory[layer], current], axis=1)
            if keep:
                joined = joined[:, -keep:]
            new_mems.append(np.ascontiguousarray(joined))
        return out, new_mems

    def pooler_output(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None,
                      token_type_ids: Optional[TokenIds] = None) -> np.ndarray:
        """BERT's pooler output tanh(dense(h[:, 0])) [B, H]; ValueError if the checkpoint has no pooler."""
        return self(input_ids, attention_mask, token_type_ids, return_pooler=True)[1]

    # ---- sentence embeddings ---------------------------------------------------------------

    def _get_tokenizer(self, method: str = "embed"):
        if self._tokenizer is None:
            path = self._model_dir.tokenizer_path
            if path is not None:
                tokenizer = load_tokenizer(path)
            else:
                # a directory with the slow tokenizer files only (vocab.txt, spm.model, ...):
                # the tokenizers.Tokenizer transformers builds from them (_slow_tokenizers.py)
                tokenizer = open_slow_tokenizer(self._model_dir.path)
                if tokenizer is None:
                    if method != "embed":
                        raise ValueError(f"{method}() needs the model directory's tokenizer.json, but "
                                         f"{self._model_dir.path} has none")
                    raise ValueError(f"embed() was given strings, but {self._model_dir.path} has no tokenizer.json; "
                                     "pass lists of token ids instead")
            if _sentence.read_do_lower_case(self._model_dir.path):
                _sentence.lowercase_tokenizer(tokenizer)
            tokenizer.no_padding()  # batches are padded here, after sorting by length
            tokenizer.enable_truncation(self.max_tokens)
            self._tokenizer = tokenizer
        return self._tokenizer

    def _has_tokenizer(self) -> bool:
        """Whether strings can be encoded: tokenizer.json, or slow tokenizer files of a family
        _slow_tokenizers.py reads (errors for unreadable files come when it is first used)."""
        return self._model_dir.tokenizer_path is not None or has_slow_tokenizer(self._model_dir.path)

    @property
    def tokenizer(self) -> Tokenizer:
        """The model directory's tokenizer (cpuformer.Tokenizer: encode, decode, count), with the
        lowercasing of a sentence-transformers directory but without embed()'s truncation, so that
        count() tells how long a text really is; ValueError without tokenizer.json or the slow
        tokenizer files it is built from (docs/tokenizers.md)."""
        if getattr(self, "_public_tokenizer", None) is None:
            from tokenizers import Tokenizer as Backend

            backend = Backend.from_str(self._get_tokenizer("tokenizer").to_str())
            backend.no_truncation()
            path = self._model_dir.tokenizer_path or slow_tokenizer_file(self._model_dir.path)
            self._public_tokenizer = Tokenizer(backend, path, read_tokenizer_settings(self._model_dir.path))
        return self._public_tokenizer

    @property
    def max_tokens(self) -> int:
        """Truncation length for embed() of strings: the position table's limit, lowered by
        sentence-transformers' sentence_bert_config.json max_seq_length when present (which replaces
        the tokenizer's limit, as sentence-transformers does), else by tokenizer_config.json's
        model_max_length."""
        # both files are read, so that a corrupt one is reported whichever of them decides
        tokenizer_limit = read_length_limit(self._model_dir.path, "tokenizer_config.json", "model_max_length")
        sentence_limit = read_length_limit(self._model_dir.path, "sentence_bert_config.json", "max_seq_length")
        limit = sentence_limit if sentence_limit is not None else tokenizer_limit
        return self.max_seq_len if limit is None else min(limit, self.max_seq_len)

    _sentence_pipeline = _NOT_READ  # read on first use (docs/reliability.md, "files read after load")

    def _get_sentence_pipeline(self) -> Optional[_sentence.SentencePipeline]:
        if self._sentence_pipeline is _NOT_READ:
            self._sentence_pipeline = _sentence.read_sentence_pipeline(self._model_dir.path, self.hidden_size)
        return self._sentence_pipeline

    @property
    def sentence_pooling(self) -> Optional[dict]:
        """What ``embed()`` does by default when the directory is a sentence-transformers model
        (modules.json): ``{"source", "pooling": [modes], "include_prompt", "after_pooling": [Dense /
        Normalize steps], "default_prompt"}``; None without modules.json (embed() then mean-pools and
        normalises). Raises the errors embed() would raise for an unsupported module list."""
        self._live()
        pipeline = self._get_sentence_pipeline()
        return None if pipeline is None else pipeline.describe()

    def embed(self, inputs: Union[Sequence[str], Sequence[Sequence[int]]], pooling: Optional[str] = None,
              normalize: Optional[bool] = None, batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings, float32 [N, D], in input order (D = hidden_size unless Dense modules
        or several pooling modes change it).

        inputs: a list of strings (needs tokenizer.json; truncated to ``max_tokens``, lowercased when
        sentence_bert_config.json sets do_lower_case) or a list of token-id lists (used as given;
        longer than max_seq_len is an error).

        pooling=None follows the directory's sentence-transformers configuration when it has a
        modules.json (the Pooling module's modes, then its Dense and Normalize modules in order, and
        the default prompt of config_sentence_transformers.json prepended to strings), so the result
        equals ``SentenceTransformer(path).encode(inputs)``; without modules.json it is mean pooling.
        An explicit pooling ("mean" over the unpadded tokens, "cls" the first token, "max" the
        elementwise maximum over the unpadded tokens, "last" the last unpadded token) pools the
        encoder's output and applies none of the configured modules or prompt.
        normalize=None: L2-normalise unless the configured modules decide (they do when
        pooling=None and modules.json exists: normalised exactly when a Normalize module is listed).
        normalize=True/False replaces any configured Normalize module: the Dense modules still apply,
        then the rows are L2-normalised or not.
        Sequences are run in batches of ``batch_size`` sorted by length, so batches carry little padding.
        """
        self._live()
        if pooling is not None and pooling not in _POOLINGS:
            raise ValueError(f"pooling must be None, 'mean', 'cls', 'max' or 'last', got {pooling!r}")
        if normalize is not None and not isinstance(normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be None, True or False, got {normalize!r}")
        batch_size = check_integer("batch_size", batch_size, 1)
        if isinstance(inputs, (str, bytes)):
            raise TypeError("embed() takes a list of strings or of token-id lists; wrap a single string in a list")
        inputs = list(inputs)
        if not inputs:
            raise ValueError("embed() needs at least one input, got an empty list")
        pipeline = self._get_sentence_pipeline() if pooling is None else None
        if pipeline is None:
            pipeline = _sentence.SentencePipeline("", (_POOLINGS[pooling or "mean"],), True)
        prompt_length = 0
        if all(isinstance(x, str) for x in inputs):
            tokenizer = self._get_tokenizer()
            if pipeline.prompt is not None:
                inputs = [pipeline.prompt + x for x in inputs]
                prompt_length = _sentence.prompt_token_count(tokenizer, pipeline.prompt)
            sequences = [e.ids for e in tokenizer.encode_batch(inputs)]
        elif any(isinstance(x, str) for x in inputs):
            raise TypeError("embed() inputs must be all strings or all token-id lists, not a mix")
        else:
            sequences = [_id_list(x, i, self.config["vocab_size"]) for i, x in enumerate(inputs)]
        whole = prompt_length == 0 or pipeline.include_prompt  # pooling sees every token
        first_token = pipeline.pooling == ("cls",) and whole
        last_token = pipeline.pooling == ("lasttoken",) and whole
        result: Optional[np.ndarray] = None
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            ids, mask = _pad([sequences[i] for i in chunk], self.pad_token_id)
            # Pooling reads unpadded rows only (and row 0, unpadded unless a sequence is empty);
            # CLS pooling reads row 0 alone, last-token pooling each sequence's last token (unless a
            # left-out prompt moves them): the last layer runs for those rows alone.
            lengths = [len(sequences[i]) for i in chunk]
            pick = np.array(lengths, dtype=np.int64) - 1 if last_token and min(lengths) > 0 else None
            hidden, _ = self._forward(ids, mask, None, False, min(lengths) > 0, first_only=first_token, pick=pick)
            pooled = pipeline.apply(hidden, mask, prompt_length, normalize_modules=normalize is None)
            if result is None:
                result = np.empty((len(sequences), pooled.shape[1]), dtype=np.float32)
            result[chunk] = pooled
        assert result is not None
        if normalize or (normalize is None and not pipeline.source):
            result = _sentence.l2_normalize(result).astype(np.float32, copy=False)
        return result

    def _shape_text(self) -> str:
        c = self.config
        return (f"layers={c['num_layers']}, hidden={c['hidden_size']}, "
                f"heads={c['num_heads']}")


# ---- input preparation -------------------------------------------------------------------------

def _check_mems(mems, layers: int, batch: int, hidden: int) -> List[np.ndarray]:
    """encode_with_memory's mems, checked: one float32 [batch, M, hidden] array per layer, the same
    M in all of them, every value finite."""
    if not isinstance(mems, (list, tuple)):
        raise TypeError(f"mems must be None or a list of {layers} arrays (one per layer, as encode_with_memory "
                        f"returns them), got {type(mems).__name__}")
    if len(mems) != layers:
        raise ValueError(f"mems must hold one array per layer: {layers} (n_layer), got {len(mems)}")
    length = None
    for layer, m in enumerate(mems):
        if not isinstance(m, np.ndarray):
            raise TypeError(f"mems[{layer}] must be a NumPy array, got {type(m).__name__}")
        if m.dtype != np.float32:
            raise ValueError(f"mems[{layer}] must have dtype float32 (as encode_with_memory returns it), got {m.dtype}")
        if m.ndim != 3 or m.shape[0] != batch or m.shape[2] != hidden:
            raise ValueError(f"mems[{layer}] must have shape [batch {batch}, memory length, hidden {hidden}] "
                             f"(batch first), got {list(m.shape)}")
        if length is None:
            length = m.shape[1]
        elif m.shape[1] != length:
            raise ValueError(f"mems[{layer}] holds {m.shape[1]} tokens but mems[0] holds {length}; every layer's "
                             "memory has the same length")
        if not np.isfinite(m).all():
            raise ValueError(f"mems[{layer}] holds non-finite values (NaN or ±inf)")
    return [np.ascontiguousarray(m) for m in mems]


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
