"""What an encoder with a task head answers: ``logits`` (the head's raw output, as transformers
returns it) and the pipeline-level results built on it — ``classify`` (text classification),
``score`` (cross-encoder reranking), ``fill_mask`` (docs/tasks.md).

The results follow transformers' pipelines on the same checkpoint and tokenizer (the tests hold
them equal): the same default score functions, labels from config.json's id2label, the same
result dictionaries. Texts are tokenized with the directory's tokenizer.json and truncated to the
model's ``max_tokens``; batches are sorted by length so that they carry little padding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._arguments import check_integer
from .._model_dir import _read_json_object
from ..arch.heads import TASK_TEXT

#: A text, or a (text, text_pair) pair.
TextInput = Union[str, Tuple[str, str]]
_FUNCTIONS = ("softmax", "sigmoid", "none")


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _apply(function: str, logits: np.ndarray) -> np.ndarray:
    if function == "softmax":
        return _softmax(logits)
    if function == "sigmoid":
        return _sigmoid(logits)
    return logits


class TaskMixin:
    """Task-head methods of ``Encoder`` (models/encoder.py)."""

    _head: Any
    config: Dict[str, Any]
    architecture: str

    if TYPE_CHECKING:  # provided by Encoder and ModelBase (declared here only for the type checker)
        _model_dir: Any

        def __call__(self, input_ids: Any, attention_mask: Any = None, token_type_ids: Any = None, *,
                     return_pooler: bool = False, skip_padding: bool = False) -> Any: ...
        def _live(self) -> Any: ...
        def _forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any,
                     return_pooler: bool, skip_padding: Optional[bool] = False,
                     first_only: bool = False,
                     pick: Optional[np.ndarray] = None) -> Tuple[Any, Optional[np.ndarray]]: ...
        def _get_tokenizer(self, method: str = "embed") -> Any: ...

    @property
    def task(self) -> Optional[str]:
        """The task head this model runs: "sequence_classification", "token_classification",
        "question_answering", "masked_lm", or None (a base model, or opened with head=False)."""
        return None if self._head is None else self._head.task

    @property
    def labels(self) -> Tuple[str, ...]:
        """The class labels of a classification head, in id order (config.json's id2label)."""
        return () if self._head is None else self._head.labels

    def _require(self, method: str, *tasks: str) -> Any:
        self._live()
        if self._head is None or self._head.task not in tasks:
            have = "no task head" if self._head is None else f"a {TASK_TEXT[self._head.task]} head"
            wanted = " or ".join(TASK_TEXT[t] for t in tasks)
            raise ValueError(f"{method}() needs a {wanted} head; this {self.architecture} model has {have}")
        return self._head

    # ---- logits ------------------------------------------------------------------------------

    def logits(self, input_ids: Any, attention_mask: Any = None,
               token_type_ids: Any = None) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
        """The head's logits as transformers returns them, float32: [B, labels] (sequence
        classification), [B, T, labels] (token classification), [B, T, vocab] (masked LM), or for
        question answering a pair (start_logits [B, T], end_logits [B, T]). Arguments as ``__call__``."""
        head = self._require("logits", "sequence_classification", "token_classification", "question_answering",
                             "masked_lm")
        return self._logits(head, input_ids, attention_mask, token_type_ids)

    def _logits(self, head: Any, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
        # A sequence-level head reads row 0 or unpadded rows only: padding is not computed when row 0 is unpadded.
        # One reading the first token only gets the last layer computed for that token alone.
        sequence_level = head.task == "sequence_classification"
        out, mask = self._forward(input_ids, attention_mask, token_type_ids, head.uses_pooler,
                                  None if sequence_level else False, sequence_level and head.reads_first_token)
        hidden, pooled = out if head.uses_pooler else (out, None)
        out = head(hidden, pooled, mask, self.num_threads)
        if head.task == "question_answering":
            return np.ascontiguousarray(out[..., 0]), np.ascontiguousarray(out[..., 1])
        return out

    # ---- text batches ------------------------------------------------------------------------

    def _encode_texts(self, inputs: Sequence[Any], method: str, pairs: bool) -> List[Any]:
        """Tokenizer encodings of strings or (text, text_pair) pairs (pairs=True: pairs only)."""
        encoded = []
        for index, item in enumerate(inputs):
            if isinstance(item, str) and not pairs:
                encoded.append(item)
            elif isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(t, str) for t in item):
                encoded.append((item[0], item[1]))
            elif pairs:
                raise TypeError(f"{method}() takes (query, passage) pairs of strings; inputs[{index}] is "
                                f"{_describe(item)}")
            else:
                raise TypeError(f"{method}() takes strings or (text, text_pair) pairs of strings; inputs[{index}] "
                                f"is {_describe(item)}")
        return self._get_tokenizer(method).encode_batch(encoded)

    def _batches(self, encodings: List[Any], batch_size: int, pooler: bool,
                 first_only: bool = False) -> Iterator[Tuple[List[int], np.ndarray, Optional[np.ndarray], np.ndarray]]:
        """(indices into encodings, last_hidden_state, pooler output or None, attention mask) per
        batch, the encodings sorted by length. first_only: only row 0 of each sequence is read (the
        others come back zero)."""
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        pad, type_vocab = self.config["pad_token_id"], self.config["type_vocab_size"]
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            T = max(len(encodings[i].ids) for i in chunk)
            ids = np.full((len(chunk), T), pad, dtype=np.int64)
            mask = np.zeros((len(chunk), T), dtype=np.int64)
            types = np.zeros((len(chunk), T), dtype=np.int64)
            for row, i in enumerate(chunk):
                e = encodings[i]
                ids[row, :len(e.ids)] = e.ids
                mask[row, :len(e.ids)] = 1
                if type_vocab:  # a tokenizer's pair template may name more types than the table has
                    types[row, :len(e.ids)] = np.minimum(e.type_ids, type_vocab - 1)
            # Every caller reads unpadded rows only (row 0 among them unless an encoding is empty).
            result, _ = self._forward(ids, mask, types if type_vocab else None, pooler,
                                      all(len(encodings[i].ids) > 0 for i in chunk), first_only)
            hidden, pooled = result if pooler else (result, None)
            yield chunk, hidden, pooled, mask

    def _sequence_logits(self, head: Any, encodings: List[Any], batch_size: int) -> np.ndarray:
        """[N, labels] of a sequence-level head, in input order."""
        out = np.empty((len(encodings), len(head.labels)), dtype=np.float32)
        for chunk, hidden, pooled, mask in self._batches(encodings, batch_size, head.uses_pooler,
                                                         head.reads_first_token):
            out[chunk] = head(hidden, pooled, mask, self.num_threads)
        return out

    # ---- classification ----------------------------------------------------------------------

    def classify(self, inputs: Union[TextInput, Sequence[TextInput]], top_k: Optional[int] = 1,
                 function_to_apply: Optional[str] = None,
                 batch_size: int = 32) -> Union[List[Dict[str, Any]], List[List[Dict[str, Any]]]]:
        """Text classification, as transformers' text-classification pipeline: for each input the
        ``top_k`` (None: all) labels as ``{"label": str, "score": float}``, best first.

        inputs: a string, a (text, text_pair) pair, or a list of these; one input gives one list of
        results, a list gives a list of them. function_to_apply: "softmax", "sigmoid" or "none";
        None chooses as the pipeline does: none for problem_type "regression", sigmoid for
        "multi_label_classification" or a single label, softmax otherwise."""
        head = self._require("classify", "sequence_classification")
        top_k = None if top_k is None else check_integer("top_k", top_k, 1, note=" or None")
        batch_size = check_integer("batch_size", batch_size, 1)
        function = self._classification_function(function_to_apply)
        single = isinstance(inputs, str) or (isinstance(inputs, tuple) and len(inputs) == 2
                                             and all(isinstance(t, str) for t in inputs))
        items = [inputs] if single else list(inputs)  # type: ignore[arg-type]
        if not items:
            raise ValueError("classify() needs at least one input, got an empty list")
        logits = self._sequence_logits(head, self._encode_texts(items, "classify", False), batch_size)
        scores = _apply(function, logits.astype(np.float64))
        results = []
        for row in scores:
            order = np.argsort(-row, kind="stable")[:top_k]
            results.append([{"label": head.labels[int(j)], "score": float(row[j])} for j in order])
        return results[0] if single else results

    def _classification_function(self, function_to_apply: Optional[str]) -> str:
        if function_to_apply is not None:
            if function_to_apply not in _FUNCTIONS:
                raise ValueError(f"function_to_apply must be one of {', '.join(map(repr, _FUNCTIONS))} or None, "
                                 f"got {function_to_apply!r}")
            return function_to_apply
        problem = self._model_dir.config.get("problem_type")  # type: ignore[attr-defined]
        if problem == "regression":
            return "none"
        if problem == "multi_label_classification" or len(self.labels) == 1:
            return "sigmoid"
        return "softmax"

    def score(self, pairs: Sequence[Tuple[str, str]], batch_size: int = 32,
              activation: Optional[str] = None) -> np.ndarray:
        """Cross-encoder scores of (query, passage) pairs, as sentence-transformers'
        ``CrossEncoder.predict``: float32 [N] for a single-label head, [N, labels] otherwise.

        activation: "sigmoid", "softmax" or "none"; None reads the checkpoint's convention —
        config.json's sentence_transformers.activation_fn (or the older
        sbert_ce_default_activation_function): Sigmoid, Identity, Softmax or Tanh — and otherwise
        applies sigmoid to a single-label head and nothing to others, as CrossEncoder does."""
        head = self._require("score", "sequence_classification")
        batch_size = check_integer("batch_size", batch_size, 1)
        if isinstance(pairs, (str, bytes)) or (isinstance(pairs, tuple) and len(pairs) == 2
                                               and all(isinstance(t, str) for t in pairs)):
            raise TypeError("score() takes a list of (query, passage) pairs; wrap a single pair in a list")
        items = list(pairs)
        if not items:
            raise ValueError("score() needs at least one (query, passage) pair, got an empty list")
        function = self._score_function(activation)
        logits = self._sequence_logits(head, self._encode_texts(items, "score", True), batch_size)
        if function == "tanh":
            scores = np.tanh(logits)
        else:
            scores = _apply(function, logits)
        scores = scores.astype(np.float32)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def _score_function(self, activation: Optional[str]) -> str:
        if activation is not None:
            if activation not in _FUNCTIONS:
                raise ValueError(f"activation must be one of {', '.join(map(repr, _FUNCTIONS))} or None, "
                                 f"got {activation!r}")
            return activation
        config = self._model_dir.config  # type: ignore[attr-defined]
        path = None
        settings = config.get("sentence_transformers")
        if isinstance(settings, dict) and settings.get("activation_fn") is not None:
            path = settings["activation_fn"]
        elif config.get("sbert_ce_default_activation_function") is not None:
            path = config["sbert_ce_default_activation_function"]
        if path is not None:
            known = {"Sigmoid": "sigmoid", "Identity": "none", "Softmax": "softmax", "Tanh": "tanh"}
            name = path.rsplit(".", 1)[-1] if isinstance(path, str) else None
            if not isinstance(path, str) or not path.startswith("torch.") or name not in known:
                raise ValueError(f"config.json: the cross-encoder activation {path!r} is not supported; use one of "
                                 "torch.nn.Sigmoid, Identity, Softmax, Tanh, or pass score(..., activation=...)")
            return known[name]
        return "sigmoid" if len(self.labels) == 1 else "none"

    # ---- fill-mask ---------------------------------------------------------------------------

    def fill_mask(self, inputs: Union[str, Sequence[str]], top_k: int = 5,
                  batch_size: int = 32) -> Union[List[Dict[str, Any]], List[List[Dict[str, Any]]]]:
        """The ``top_k`` fillings of the one mask token in each text, as transformers' fill-mask
        pipeline: ``{"score", "token", "token_str", "sequence"}`` best first. inputs: a string (one
        list of results) or a list of strings (a list of them). A text needs exactly one mask token
        (the tokenizer's, e.g. "[MASK]" or "<mask>")."""
        head = self._require("fill_mask", "masked_lm")
        top_k = check_integer("top_k", top_k, 1)
        batch_size = check_integer("batch_size", batch_size, 1)
        single = isinstance(inputs, str)
        items = [inputs] if single else list(inputs)  # type: ignore[list-item]
        if not items:
            raise ValueError("fill_mask() needs at least one text, got an empty list")
        for index, item in enumerate(items):
            if not isinstance(item, str):
                raise TypeError(f"fill_mask() takes strings; inputs[{index}] is {_describe(item)}")
        tokenizer = self._get_tokenizer("fill_mask")
        mask_token, mask_id = self._mask_token()
        encodings = tokenizer.encode_batch(items)
        positions = []
        for index, e in enumerate(encodings):
            found = [t for t, token in enumerate(e.ids) if token == mask_id]
            if len(found) != 1:
                where = f"inputs[{index}]" if not single else "the text"
                raise ValueError(f"fill_mask(): {where} must hold exactly one mask token {mask_token!r}, "
                                 f"found {len(found)}" + (" (after truncation to max_tokens)" if not found else ""))
            positions.append(found[0])
        # Only the masked row of each text goes through the vocabulary projection.
        per_text = np.empty((len(encodings), self.config["vocab_size"]), dtype=np.float32)
        for chunk, hidden, _, _ in self._batches(encodings, batch_size, False):
            rows = hidden[np.arange(len(chunk)), [positions[i] for i in chunk]]
            per_text[chunk] = head(rows[:, None, :])[:, 0]
        results = []
        for e, position, logits in zip(encodings, positions, per_text):
            probabilities = _softmax(logits.astype(np.float64))
            best = np.argsort(-probabilities, kind="stable")[:top_k]
            entries = []
            for token in best:
                ids = list(e.ids)
                ids[position] = int(token)
                special = np.asarray(e.special_tokens_mask, dtype=bool)
                kept = [t for t, s in zip(ids, special) if not s]
                entries.append({"score": float(probabilities[token]), "token": int(token),
                                "token_str": tokenizer.decode([int(token)]),
                                "sequence": tokenizer.decode(kept)})
            results.append(entries)
        return results[0] if single else results

    def _mask_token(self) -> Tuple[str, int]:
        """The tokenizer's mask token and its id: tokenizer_config.json's mask_token, else "[MASK]"
        or "<mask>"."""
        tokenizer = self._get_tokenizer()
        candidates = []
        path = self._model_dir.path / "tokenizer_config.json"  # type: ignore[attr-defined]
        if path.is_file():
            entry = _read_json_object(path).get("mask_token")
            if isinstance(entry, Mapping):
                entry = entry.get("content")
            if isinstance(entry, str):
                candidates.append(entry)
        candidates += ["[MASK]", "<mask>"]
        for token in candidates:
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                return token, int(token_id)
        raise ValueError(f"fill_mask(): the tokenizer of {self._model_dir.path} has no mask token "  # type: ignore
                         "(tokenizer_config.json mask_token, [MASK] or <mask>)")


def _describe(item: Any) -> str:
    text = repr(item)
    return f"{type(item).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


__all__ = ["TaskMixin"]
