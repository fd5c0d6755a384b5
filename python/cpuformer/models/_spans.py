"""Span-level task results of an encoder: ``tag`` (token classification: named entities, parts of
speech) and ``answer`` (extractive question answering), docs/tasks.md.

Both follow transformers' pipelines on the same checkpoint and tokenizer: ``tag`` the
token-classification pipeline (its aggregation strategies, ``ignore_labels`` and, with ``stride``,
its overlapping windows), ``answer`` the question-answering pipeline of transformers 4.x with a
fast tokenizer (windows over a long context with ``doc_stride`` tokens of overlap, the span scores
of ``select_starts_ends``, answers aligned to words and merged across windows). The steps below
keep the pipelines' order of operations so that ties and edge cases resolve the same way.

Character offsets come from the fast tokenizer (tokenizer.json): ``Encoding.offsets``,
``word_ids`` / ``token_to_word`` / ``word_to_chars``. The windows of all inputs run through the
encoder together, in batches sorted by length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._arguments import check_integer
from .._model_dir import _read_json_object
from ._tasks import TaskMixin, _describe, _softmax

STRATEGIES = ("none", "simple", "first", "average", "max")

Entity = Dict[str, Any]
Answer = Dict[str, Any]


class SpanMixin(TaskMixin):
    """``tag`` and ``answer`` of ``Encoder`` (models/encoder.py)."""

    _windows_tokenizer: Any = None

    if TYPE_CHECKING:  # provided by Encoder (declared here only for the type checker)
        @property
        def max_tokens(self) -> int: ...

    # ---- tokenizer ---------------------------------------------------------------------------

    def _window_tokenizer(self, method: str) -> Any:
        """A copy of the directory's tokenizer whose truncation (windows, strides) this module sets per
        call, so that the shared tokenizer of embed()/classify() keeps its settings."""
        if self._windows_tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self._get_tokenizer(method).to_str())
            tokenizer.no_padding()
            self._windows_tokenizer = tokenizer
        return self._windows_tokenizer

    def _special_token_id(self, key: str, fallbacks: Sequence[str]) -> Optional[int]:
        """The id of tokenizer_config.json's ``key`` token (e.g. cls_token), else of the first of
        ``fallbacks`` the vocabulary holds; None if there is none."""
        tokenizer = self._window_tokenizer("tag")
        candidates: List[str] = []
        path = self._model_dir.path / "tokenizer_config.json"
        if path.is_file():
            entry = _read_json_object(path).get(key)
            if isinstance(entry, dict):
                entry = entry.get("content")
            if isinstance(entry, str):
                candidates.append(entry)
        for token in candidates + list(fallbacks):
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                return int(token_id)
        return None

    def _window_logits(self, head: Any, windows: List[Any], batch_size: int) -> List[np.ndarray]:
        """The head's logits of each window, [tokens of the window, ...], float32."""
        out: List[Any] = [None] * len(windows)
        for chunk, hidden, pooled, mask in self._batches(windows, batch_size, head.uses_pooler):
            logits = head(hidden, pooled, mask)
            for row, i in enumerate(chunk):
                out[i] = logits[row, :len(windows[i].ids)]
        return out

    # ---- tag ---------------------------------------------------------------------------------

    def tag(self, inputs: Union[str, Sequence[str]], aggregation_strategy: str = "simple",
            ignore_labels: Optional[Sequence[str]] = None, stride: Optional[int] = None,
            batch_size: int = 32) -> Union[List[Entity], List[List[Entity]]]:
        """Token classification (named entities, parts of speech), as transformers'
        token-classification pipeline: for each text the entities, in text order.

        aggregation_strategy: "none" (one result per token: ``{"entity", "score", "index", "word",
        "start", "end"}``), or "simple", "first", "average", "max" (adjacent tokens of one entity
        grouped: ``{"entity_group", "score", "word", "start", "end"}``; the last three first give
        each word one label: its first token's, the average of its tokens' scores, or its most
        confident token's). start/end: character offsets in the text. ignore_labels: labels (or
        entity groups) left out, default ["O"]. Texts are truncated to ``max_tokens`` unless
        ``stride`` is given: then a longer text is read in windows of ``max_tokens`` overlapping by
        ``stride`` tokens, and overlapping entities are resolved as the pipeline does (the longer,
        then the higher-scoring one is kept). inputs: a string (one list of entities) or a list of
        strings (a list of them)."""
        head = self._require("tag", "token_classification")
        if aggregation_strategy not in STRATEGIES:
            raise ValueError(f"aggregation_strategy must be one of {', '.join(map(repr, STRATEGIES))}, "
                             f"got {aggregation_strategy!r}")
        batch_size = check_integer("batch_size", batch_size, 1)
        ignore = ["O"] if ignore_labels is None else _string_list(ignore_labels, "ignore_labels")
        single = isinstance(inputs, str)
        if not single and not isinstance(inputs, (list, tuple)):
            raise TypeError(f"tag() takes a string or a list of strings, got {_describe(inputs)}")
        items: List[Any] = [inputs] if single else list(inputs)
        if not items:
            raise ValueError("tag() needs at least one text, got an empty list")
        for index, item in enumerate(items):
            if not isinstance(item, str):
                raise TypeError(f"tag() takes strings; inputs[{index}] is {_describe(item)}")
        tokenizer = self._window_tokenizer("tag")
        limit = self.max_tokens
        if stride is None:
            tokenizer.enable_truncation(limit)
        else:
            if aggregation_strategy == "none":
                raise ValueError('tag(): stride needs an aggregation_strategy other than "none" (overlapping '
                                 "windows are merged entity by entity)")
            room = limit - tokenizer.num_special_tokens_to_add(False)
            if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or not 0 <= stride < room:
                raise ValueError(f"stride must be an integer from 0 to {room - 1} (max_tokens {limit} less "
                                 f"the special tokens, less 1), got {stride!r}")
            tokenizer.enable_truncation(limit, stride=int(stride))
        encodings = tokenizer.encode_batch(items)
        windows, owner = [], []
        for index, encoding in enumerate(encodings):
            for window in [encoding] + (list(encoding.overflowing) if stride is not None else []):
                windows.append(window)
                owner.append(index)
        logits = self._window_logits(head, windows, batch_size)
        unk_id = self._special_token_id("unk_token", ("[UNK]", "<unk>"))
        subword_prefix = getattr(tokenizer.model, "continuing_subword_prefix", None)
        per_text: List[List[Entity]] = [[] for _ in items]
        chunks = [0] * len(items)
        for window, text_index, window_logits in zip(windows, owner, logits):
            scores = _softmax(window_logits.astype(np.float64))
            pre = _pre_entities(items[text_index], window, scores, tokenizer, unk_id, subword_prefix)
            grouped = self._aggregate(pre, aggregation_strategy, head.labels, tokenizer)
            per_text[text_index] += [e for e in grouped if e.get("entity") not in ignore
                                     and e.get("entity_group") not in ignore]
            chunks[text_index] += 1
        results = [_resolve_overlaps(entities) if n > 1 else entities for entities, n in zip(per_text, chunks)]
        return results[0] if single else results

    def _aggregate(self, pre: List[Entity], strategy: str, labels: Tuple[str, ...], tokenizer: Any) -> List[Entity]:
        if strategy in ("none", "simple"):
            entities = []
            for p in pre:
                best = int(np.argmax(p["scores"]))
                entities.append({"entity": labels[best], "score": float(p["scores"][best]), "index": p["index"],
                                 "word": p["word"], "start": p["start"], "end": p["end"]})
            if strategy == "none":
                return entities
        else:
            entities = []
            group: List[Entity] = []
            for p in pre:  # a word: its first token and the subword tokens after it
                if group and not p["is_subword"]:
                    entities.append(_word_entity(group, strategy, labels, tokenizer))
                    group = []
                group.append(p)
            if group:
                entities.append(_word_entity(group, strategy, labels, tokenizer))
        return _group_entities(entities, tokenizer)

    # ---- answer ------------------------------------------------------------------------------

    def answer(self, question: Union[str, Sequence[Tuple[str, str]]], context: Optional[str] = None,
               top_k: int = 1, doc_stride: Optional[int] = None, max_answer_len: int = 15,
               max_seq_len: Optional[int] = None, max_question_len: int = 64,
               handle_impossible_answer: bool = False,
               batch_size: int = 32) -> Union[Answer, List[Answer], List[Union[Answer, List[Answer]]]]:
        """Extractive question answering, as transformers' question-answering pipeline: the span
        of ``context`` that answers ``question`` as ``{"score", "start", "end", "answer"}``
        (start/end: character offsets in the context; answer = context[start:end]).

        answer(question, context) gives one answer (top_k=1) or a list of up to top_k, best first;
        answer([(question, context), ...]) gives a list of those. A context longer than a window
        (``max_seq_len`` tokens with the question; default min(max_tokens, 384)) is read in
        windows overlapping by ``doc_stride`` tokens (default min(max_seq_len // 2, 128)); the
        answers of all windows compete, and the same answer text found in several windows adds up
        its scores. max_answer_len: the longest answer in tokens. max_question_len: a longer
        question is cut to this many tokens. handle_impossible_answer: also offer the empty answer
        ``{"answer": "", "start": 0, "end": 0}`` with the lowest null score of the windows."""
        head = self._require("answer", "question_answering")
        single = isinstance(question, str) or context is not None
        pairs: List[Any]
        if single:
            pairs = [(question, context)]
        elif isinstance(question, (list, tuple)):
            pairs = list(question)
            if not pairs:
                raise ValueError("answer() needs at least one (question, context) pair, got an empty list")
        else:
            raise TypeError(f"answer() takes a question and a context, or a list of (question, context) pairs; "
                            f"got {_describe(question)}")
        for index, pair in enumerate(pairs):
            where = "" if single else f"inputs[{index}]: "
            if not single and (not isinstance(pair, (tuple, list)) or len(pair) != 2):
                raise TypeError(f"answer() takes (question, context) pairs; inputs[{index}] is {_describe(pair)}")
            for name, value in zip(("question", "context"), pair):
                if not isinstance(value, str):
                    raise TypeError(f"answer(): {where}the {name} must be a string, got {_describe(value)}")
                if not value.strip():
                    raise ValueError(f"answer(): {where}the {name} is empty")
        top_k = check_integer("top_k", top_k, 1)
        max_answer_len = check_integer("max_answer_len", max_answer_len, 1)
        max_question_len = check_integer("max_question_len", max_question_len, 1)
        batch_size = check_integer("batch_size", batch_size, 1)
        if not isinstance(handle_impossible_answer, bool):
            raise TypeError(f"handle_impossible_answer must be True or False, got {handle_impossible_answer!r}")
        limit = self.max_tokens
        if max_seq_len is None:
            max_seq_len = min(limit, 384)
        elif isinstance(max_seq_len, bool) or not isinstance(max_seq_len, (int, np.integer)) or \
                not 1 <= max_seq_len <= limit:
            raise ValueError(f"max_seq_len must be an integer from 1 to max_tokens ({limit}), got {max_seq_len!r}")
        if doc_stride is None:
            doc_stride = min(max_seq_len // 2, 128)
        elif isinstance(doc_stride, bool) or not isinstance(doc_stride, (int, np.integer)) or doc_stride < 0:
            raise ValueError(f"doc_stride must be an integer >= 0, got {doc_stride!r}")

        tokenizer = self._window_tokenizer("answer")
        windows, owner = self._question_windows(tokenizer, pairs, single, int(max_seq_len), int(doc_stride),
                                                max_question_len)
        logits = self._window_logits(head, windows, batch_size)
        cls_id = self._special_token_id("cls_token", ("[CLS]", "<s>"))
        found: List[List[Answer]] = [[] for _ in pairs]
        null_scores = [1000000.0] * len(pairs)  # the pipeline's "large and positive" start
        pre_top_k = top_k * 2 + 10  # candidates that word alignment may merge
        for window, index, window_logits in zip(windows, owner, logits):
            context_text = pairs[index][1]
            allowed = np.array([s == 1 or token == cls_id for s, token in zip(window.sequence_ids, window.ids)])
            starts, ends, scores, null_scores[index] = _select_spans(
                window_logits[:, 0], window_logits[:, 1], allowed, null_scores[index], pre_top_k,
                handle_impossible_answer, max_answer_len)
            answers = found[index]
            for s, e, score in zip(starts, ends, scores):
                start, end = _word_aligned(window, int(s), int(e))
                text = context_text[start:end]
                same = next((a for a in answers if a["answer"].lower() == text.lower()), None)
                if same is not None:
                    same["score"] += float(score)
                else:
                    answers.append({"score": float(score), "start": start, "end": end, "answer": text})
        results: List[Any] = []
        for answers, null_score in zip(found, null_scores):
            if handle_impossible_answer:
                answers.append({"score": float(null_score), "start": 0, "end": 0, "answer": ""})
            best = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
            results.append(best[0] if top_k == 1 else best)
        return results[0] if single else results

    def _question_windows(self, tokenizer: Any, pairs: List[Tuple[str, str]], single: bool, max_seq_len: int,
                          doc_stride: int, max_question_len: int) -> Tuple[List[Any], List[int]]:
        """The encodings [CLS] question [SEP] context-window [SEP] of every pair, and the pair each
        comes from. A question is cut to max_question_len tokens; every window must leave the
        context room for more than doc_stride tokens."""
        tokenizer.no_truncation()
        specials = tokenizer.num_special_tokens_to_add(True)
        questions, contexts = [q for q, _ in pairs], [c for _, c in pairs]
        question_encodings = tokenizer.encode_batch(questions, add_special_tokens=False)
        context_encodings = tokenizer.encode_batch(contexts, add_special_tokens=False)
        for index, (q, c) in enumerate(zip(question_encodings, context_encodings)):
            where = "" if single else f"inputs[{index}]: "
            if not c.ids:
                raise ValueError(f"answer(): {where}the context holds no tokens")
            if len(q.ids) > max_question_len:
                questions[index] = questions[index][:q.offsets[max_question_len - 1][1]]
                q = tokenizer.encode(questions[index], add_special_tokens=False)
            room = max_seq_len - specials - len(q.ids)
            if len(q.ids) + len(c.ids) + specials <= max_seq_len:
                continue
            if room < 1:
                raise ValueError(f"answer(): {where}the question has {len(q.ids)} tokens, which leaves no room for "
                                 f"the context in a window of max_seq_len={max_seq_len} tokens ({specials} "
                                 "special tokens); shorten the question or lower max_question_len")
            if doc_stride >= room:
                raise ValueError(f"answer(): {where}doc_stride ({doc_stride}) must be smaller than the context "
                                 f"tokens a window holds ({room} = max_seq_len {max_seq_len} - question "
                                 f"{len(q.ids)} - {specials} special tokens); lower doc_stride")
        tokenizer.enable_truncation(max_seq_len, stride=doc_stride, strategy="only_second")
        windows, owner = [], []
        for index, encoding in enumerate(tokenizer.encode_batch(list(zip(questions, contexts)))):
            for window in [encoding] + list(encoding.overflowing):
                windows.append(window)
                owner.append(index)
        return windows, owner


# ---- token classification, as the pipeline's postprocessing ------------------------------------

def _pre_entities(text: str, encoding: Any, scores: np.ndarray, tokenizer: Any, unk_id: Optional[int],
                  subword_prefix: Optional[str]) -> List[Entity]:
    """One entry per non-special token: its token string, label scores, offsets and whether it
    continues the previous token's word."""
    pre = []
    for index, (token_id, special, (start, end)) in enumerate(zip(encoding.ids, encoding.special_tokens_mask,
                                                                 encoding.offsets)):
        if special:
            continue
        word = tokenizer.id_to_token(token_id)
        reference = text[start:end]
        if subword_prefix:
            # A WordPiece-style vocabulary marks continuations: a token whose text is not the
            # span it covers ("##ing" for "ing") continues a word.
            is_subword = len(word) != len(reference)
        else:  # the pipeline's fallback: a token not preceded by a space continues a word
            is_subword = start > 0 and " " not in text[start - 1:start + 1]
        if unk_id is not None and token_id == unk_id:
            word, is_subword = reference, False
        pre.append({"word": word, "scores": scores[index], "start": start, "end": end, "index": index,
                    "is_subword": is_subword})
    return pre


def _tokens_to_string(tokenizer: Any, tokens: List[str]) -> str:
    return tokenizer.decoder.decode(tokens) if tokenizer.decoder is not None else " ".join(tokens)


def _word_entity(tokens: List[Entity], strategy: str, labels: Tuple[str, ...], tokenizer: Any) -> Entity:
    if strategy == "first":
        scores = tokens[0]["scores"]
    elif strategy == "max":
        scores = max(tokens, key=lambda t: t["scores"].max())["scores"]
    else:  # average
        scores = np.nanmean(np.stack([t["scores"] for t in tokens]), axis=0)
    best = int(np.argmax(scores))
    return {"entity": labels[best], "score": float(scores[best]),
            "word": _tokens_to_string(tokenizer, [t["word"] for t in tokens]),
            "start": tokens[0]["start"], "end": tokens[-1]["end"]}


def _tag_parts(label: str) -> Tuple[str, str]:
    """("B" or "I", tag) of a label; a label without a B-/I- prefix continues ("I")."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _group_entities(entities: List[Entity], tokenizer: Any) -> List[Entity]:
    """Adjacent entities with the same tag form one group, unless the later one begins ("B-")."""
    groups: List[Entity] = []
    current: List[Entity] = []
    for entity in entities:
        if current:
            bi, tag = _tag_parts(entity["entity"])
            if tag == _tag_parts(current[-1]["entity"])[1] and bi != "B":
                current.append(entity)
                continue
            groups.append(_group(current, tokenizer))
        current = [entity]
    if current:
        groups.append(_group(current, tokenizer))
    return groups


def _group(entities: List[Entity], tokenizer: Any) -> Entity:
    return {"entity_group": entities[0]["entity"].split("-", 1)[-1],
            "score": float(np.nanmean([e["score"] for e in entities])),
            "word": _tokens_to_string(tokenizer, [e["word"] for e in entities]),
            "start": entities[0]["start"], "end": entities[-1]["end"]}


def _resolve_overlaps(entities: List[Entity]) -> List[Entity]:
    """Entities of overlapping windows: of two that overlap, the longer (then the higher-scoring)
    one stays."""
    if not entities:
        return entities
    entities = sorted(entities, key=lambda e: e["start"])
    kept = []
    previous = entities[0]
    for entity in entities:
        if previous["start"] <= entity["start"] < previous["end"]:
            length, previous_length = entity["end"] - entity["start"], previous["end"] - previous["start"]
            if length > previous_length or (length == previous_length and entity["score"] > previous["score"]):
                previous = entity
        else:
            kept.append(previous)
            previous = entity
    kept.append(previous)
    return kept


def _string_list(value: Any, name: str) -> List[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)) or \
            not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a list of strings, got {_describe(value)}")
    return list(value)


# ---- question answering, as the pipeline's select_starts_ends / decode_spans --------------------

def _select_spans(start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, null_score: float,
                  top_k: int, handle_impossible: bool,
                  max_answer_len: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(starts, ends, scores, null score) of the best spans of one window: start and end
    probabilities over the allowed tokens (the context and [CLS]), a span's score their product,
    spans longer than max_answer_len or ending before they start left out."""
    start = np.where(allowed, start_logits.astype(np.float64), -10000.0)
    end = np.where(allowed, end_logits.astype(np.float64), -10000.0)
    start = np.exp(start - start.max())
    start /= start.sum()
    end = np.exp(end - end.max())
    end /= end.sum()
    if handle_impossible:
        null_score = min(null_score, float(start[0] * end[0]))
    start[0] = end[0] = 0.0  # the first token ([CLS]) stands for "no answer", not for a span
    candidates = np.tril(np.triu(np.outer(start, end)), max_answer_len - 1)
    flat = candidates.ravel()
    if top_k == 1:
        order = np.array([np.argmax(flat)])
    elif len(flat) <= top_k:
        order = np.argsort(-flat)
    else:
        best = np.argpartition(-flat, top_k)[:top_k]
        order = best[np.argsort(-flat[best])]
    starts, ends = np.unravel_index(order, candidates.shape)
    # The pipeline tests membership in the 2-D mask's nonzero() (row indices, all 0, and column
    # indices): position 0 always counts as allowed.
    desired = np.flatnonzero(allowed).tolist() + [0]
    keep = np.isin(starts, desired) & np.isin(ends, desired)
    starts, ends = starts[keep], ends[keep]
    return starts, ends, candidates[starts, ends], null_score


def _word_aligned(window: Any, start: int, end: int) -> Tuple[int, int]:
    """Character offsets in the context of tokens start..end, widened to whole words; a token that
    belongs to no word ([CLS]) keeps its own offsets."""
    start_word, end_word = window.token_to_word(start), window.token_to_word(end)
    if start_word is None or end_word is None:
        return window.offsets[start][0], window.offsets[end][1]
    first = window.word_to_chars(start_word, sequence_index=1)
    last = window.word_to_chars(end_word, sequence_index=1)
    if first is None or last is None:
        return window.offsets[start][0], window.offsets[end][1]
    return first[0], last[1]


__all__ = ["SpanMixin", "STRATEGIES"]
