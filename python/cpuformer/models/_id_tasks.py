"""Token ids in place of text for the encoder task commands (``cpuformer classify|rerank|tag|answer|
fill-mask --ids``, docs/cli.md).

The ids are used as given: the caller includes the special tokens the model expects ([CLS] ...
[SEP], <s> ... </s>), nothing is added, truncated or windowed, and no tokenizer is needed. A pair
(rerank's query and passage, answer's question and context) is the two id lists joined, with
token type 0 over the first and 1 over the second (clipped to the model's token-type table, as the
text methods do), which is what a BERT-style tokenizer's pair template gives when the first list
ends with [SEP] and the second with [SEP]. Scores follow the text methods (``classify``, ``score``,
``tag`` with aggregation "none", ``answer``, ``fill_mask``) on the same token sequences.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._spans import _select_spans
from ._tasks import _apply, _softmax


class _Sequence:
    """The two fields of a tokenizer encoding the encoder's batching reads."""

    __slots__ = ("ids", "type_ids")

    def __init__(self, first: Sequence[int], second: Sequence[int] = ()) -> None:
        self.ids = list(first) + list(second)
        self.type_ids = [0] * len(first) + [1] * len(second)


def _check_length(model: Any, sequences: List[_Sequence], what: str) -> None:
    limit = model.max_seq_len
    for index, sequence in enumerate(sequences, 1):
        if len(sequence.ids) > limit:
            raise ValueError(f"--ids: {what} {index} has {len(sequence.ids)} tokens, more than the model's "
                             f"{limit} positions (token ids are not truncated or split into windows)")


def classify(model: Any, sequences: List[List[int]], top_k: Optional[int], function: Optional[str],
             batch_size: int) -> List[List[Dict[str, Any]]]:
    """``classify`` of token-id sequences: the top_k labels of each, best first."""
    head = model._require("classify", "sequence_classification")
    function = model._classification_function(function)
    encodings = [_Sequence(ids) for ids in sequences]
    _check_length(model, encodings, "input")
    scores = _apply(function, model._sequence_logits(head, encodings, batch_size).astype(np.float64))
    results = []
    for row in scores:
        order = np.argsort(-row, kind="stable")[:top_k]
        results.append([{"label": head.labels[int(j)], "score": float(row[j])} for j in order])
    return results


def score(model: Any, query: List[int], passages: List[List[int]], batch_size: int) -> np.ndarray:
    """Cross-encoder scores of query + passage, float32 [N] (the single-label head rerank needs)."""
    head = model._require("score", "sequence_classification")
    function = model._score_function(None)
    encodings = [_Sequence(query, passage) for passage in passages]
    _check_length(model, encodings, "query + passage")
    logits = model._sequence_logits(head, encodings, batch_size)
    scores = np.tanh(logits) if function == "tanh" else _apply(function, logits)
    return scores.astype(np.float32)[:, 0]


def tag(model: Any, sequences: List[List[int]], ignore: Sequence[str], batch_size: int) -> List[List[Dict[str, Any]]]:
    """Per-token labels ``{"entity", "score", "index", "token"}`` of every given token (there are no
    words or character offsets to group tokens by), leaving out the labels in ``ignore``."""
    head = model._require("tag", "token_classification")
    encodings = [_Sequence(ids) for ids in sequences]
    _check_length(model, encodings, "input")
    results = []
    for ids, logits in zip(sequences, model._window_logits(head, encodings, batch_size)):
        scores = _softmax(logits.astype(np.float64))
        row = []
        for index, (token, token_scores) in enumerate(zip(ids, scores)):
            best = int(np.argmax(token_scores))
            if head.labels[best] not in ignore:
                row.append({"entity": head.labels[best], "score": float(token_scores[best]), "index": index,
                            "token": int(token)})
        results.append(row)
    return results


def answer(model: Any, pairs: List[Tuple[List[int], List[int]]], top_k: int, max_answer_len: int,
           handle_impossible: bool, batch_size: int) -> List[Any]:
    """The best spans of each context: ``{"score", "start", "end", "answer"}`` with start/end token
    positions in the context ids (answer = context[start:end]); the first token of the question
    (its [CLS]) stands for "no answer", as in the text method."""
    head = model._require("answer", "question_answering")
    encodings = [_Sequence(question, context) for question, context in pairs]
    _check_length(model, encodings, "question + context")
    results: List[Any] = []
    for (question, context), logits in zip(pairs, model._window_logits(head, encodings, batch_size)):
        allowed = np.array([False] * len(question) + [True] * len(context))
        allowed[0] = True
        starts, ends, scores, null_score = _select_spans(logits[:, 0], logits[:, 1], allowed, 1000000.0, top_k,
                                                         handle_impossible, max_answer_len)
        offset = len(question)
        found = [{"score": float(s), "start": int(b) - offset, "end": int(e) - offset + 1,
                  "answer": context[int(b) - offset:int(e) - offset + 1]}
                 for b, e, s in zip(starts, ends, scores) if b >= offset]
        if handle_impossible:
            found.append({"score": float(null_score), "start": 0, "end": 0, "answer": []})
        best = sorted(found, key=lambda a: a["score"], reverse=True)[:top_k]
        results.append(best[0] if top_k == 1 else best)
    return results


def mask_id(model: Any) -> int:
    """The id of the tokenizer's mask token (the model directory must have tokenizer.json)."""
    return model._mask_token()[1]


def fill_mask(model: Any, sequences: List[List[int]], mask: int, top_k: int,
              batch_size: int) -> List[List[Dict[str, Any]]]:
    """The top_k fillings ``{"score", "token", "sequence"}`` of the one ``mask`` id in each sequence,
    best first; sequence: the ids with the mask replaced by the token."""
    head = model._require("fill_mask", "masked_lm")
    positions = []
    for index, ids in enumerate(sequences, 1):
        found = [t for t, token in enumerate(ids) if token == mask]
        if len(found) != 1:
            raise ValueError(f"--ids: input {index} must hold the mask id {mask} exactly once, found it "
                             f"{len(found)} times")
        positions.append(found[0])
    encodings = [_Sequence(ids) for ids in sequences]
    _check_length(model, encodings, "input")
    per_input = np.empty((len(sequences), model.config["vocab_size"]), dtype=np.float32)
    for chunk, hidden, _, _ in model._batches(encodings, batch_size, False):
        rows = hidden[np.arange(len(chunk)), [positions[i] for i in chunk]]
        per_input[chunk] = head(rows[:, None, :])[:, 0]
    results = []
    for ids, position, logits in zip(sequences, positions, per_input):
        probabilities = _softmax(logits.astype(np.float64))
        entries = []
        for token in np.argsort(-probabilities, kind="stable")[:top_k]:
            filled = list(ids)
            filled[position] = int(token)
            entries.append({"score": float(probabilities[token]), "token": int(token), "sequence": filled})
        results.append(entries)
    return results
