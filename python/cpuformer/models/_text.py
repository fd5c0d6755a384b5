"""Prompts and text for the generating models: one behaviour for Generator and Seq2Seq (the
tokenizer, strings or token ids in, text or token ids out)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._sentencepiece import SentencePieceTokenizer
from .._tokenizer import Tokenizer
from .._tokenizer_dir import open_tokenizer
from ._inputs import token_ids


class TextMixin:
    """Prompt handling for a model with ``_model_dir``, ``_tokenizer``, ``vocab_size`` and
    ``_INPUT`` (what the error messages call one input sequence: "prompt" or "source")."""

    _INPUT = "prompt"
    _tokenizer = None
    _model_dir = None
    vocab_size: int

    def _get_tokenizer(self, reason: str = "") -> Tokenizer:
        """The directory's tokenizer, opened once; without one a ValueError that starts with
        ``reason`` (what needed it; default: a string prompt)."""
        if self._tokenizer is None:
            tokenizer = open_tokenizer(self._model_dir.path)
            if tokenizer is None:
                why = reason or f"the {self._INPUT} is a string"
                raise ValueError(f"{why}, but {self._model_dir.path} has no tokenizer "
                                 "(tokenizer.json or SentencePiece model); pass token ids instead")
            if isinstance(tokenizer, SentencePieceTokenizer) and tokenizer.vocab_size > self.vocab_size:
                # vocab.json or the .spm of another model: its ids would index past the embeddings
                raise ValueError(f"{tokenizer.path}: the tokenizer has {tokenizer.vocab_size} token ids, but the "
                                 f"model's vocab_size is {self.vocab_size}; the tokenizer files do not belong to "
                                 "this model")
            self._tokenizer = tokenizer
        return self._tokenizer

    @property
    def tokenizer(self) -> Tokenizer:
        """The model directory's tokenizer (encode, decode, count; cpuformer.Tokenizer); ValueError
        when the directory has no tokenizer files."""
        return self._get_tokenizer()

    def _prompts(self, prompts) -> Tuple[List[List[int]], str]:
        """(token-id lists, kind): kind "str" (one string), "strs" (a list of strings) or "ids"."""
        if isinstance(prompts, str):
            return [self._encode(prompts, 0)], "str"
        if isinstance(prompts, np.ndarray):
            if prompts.dtype.kind not in "iu":
                raise TypeError(f"{self._INPUT}s must hold integer token ids, got dtype {prompts.dtype}")
            if prompts.ndim == 1:
                prompts = [prompts]
            elif prompts.ndim != 2:
                raise ValueError(f"{self._INPUT}s must be 1-D or 2-D, got shape {list(prompts.shape)}")
            return [token_ids(p, i, self._INPUT, self.vocab_size) for i, p in enumerate(prompts)], "ids"
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"{self._INPUT}s must be a string, a list of strings or token-id lists, got "
                            f"{type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError(f"{self._INPUT}s is empty: give at least one {self._INPUT}")
        if all(isinstance(p, str) for p in prompts):
            return [self._encode(p, i) for i, p in enumerate(prompts)], "strs"
        if not any(isinstance(p, (list, tuple, np.ndarray, str)) for p in prompts):
            return [token_ids(prompts, 0, self._INPUT, self.vocab_size)], "ids"  # one prompt (a flat list)
        return [token_ids(p, i, self._INPUT, self.vocab_size) for i, p in enumerate(prompts)], "ids"

    def _encode(self, text: str, index: int) -> List[int]:
        ids = self._get_tokenizer().encode(text)
        if not ids:
            raise ValueError(f"{self._INPUT} {index} is empty (it encodes to no tokens)")
        return ids

    def _decode(self, ids: Sequence[int]) -> str:
        return self._get_tokenizer().decode(ids, skip_special_tokens=True)


def check_stop(stop: Any) -> List[str]:
    """generate()'s ``stop``: None, a string or a list of strings, none of them empty."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise TypeError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(s == "" for s in stops):
        raise ValueError("stop strings must not be empty (an empty string would end every output at once)")
    return list(stops)


def cut_at_stop(text: str, stops: Sequence[str]) -> Tuple[str, bool]:
    """(text before the first stop string, whether one was found)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(found)], True) if found else (text, False)


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of text could begin a stop string (so a stream must not emit
    them yet)."""
    for n in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0


class StopWatch:
    """One sequence's incremental detokenization and stop-string search, fed token by token (the
    token callback of the C++ loop): add() returns True once the text holds a stop string.

    The text grows by the decode of the tokens since an offset minus the decode of the tokens
    already final (as text-generation servers detokenize), so each token costs a decode of a few
    tokens, not of the whole output; a piece that ends inside a UTF-8 sequence waits for the next
    token."""

    def __init__(self, decode: Callable[[List[int]], str], stops: Sequence[str]) -> None:
        self.decode, self.stops = decode, list(stops)
        self.longest = max(len(s) for s in self.stops)
        self.tokens: List[int] = []
        self.text = ""
        self.prefix_offset = self.read_offset = 0
        self.stopped = False

    def add(self, token: int) -> bool:
        if self.stopped:
            return True
        self.tokens.append(int(token))
        prefix = self.decode(self.tokens[self.prefix_offset:self.read_offset])
        new = self.decode(self.tokens[self.prefix_offset:])
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            start = max(0, len(self.text) - self.longest + 1)
            self.text += new[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
            self.stopped = any(self.text.find(s, start) >= 0 for s in self.stops)
        return self.stopped


def common_prefix(a: str, b: str) -> str:
    """The longest common prefix of two strings, by slice comparisons (C speed): successive
    decodes of a growing text share all but their last characters, which os.path.commonprefix
    would walk one Python iteration per character."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return a[:n]
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return a[:low]


class IncrementalDecode:
    """decode(tokens) of a growing token list, token by token, in time linear in its length:
    ``append(token)`` returns the decode of every token so far. The text before an anchor at most
    2 × ``window`` tokens back is kept as a string and only the tokens from the anchor on are
    decoded: full text = kept prefix + the anchored decode from the position where the anchor's
    next token begins. The anchored decode starts one token early, because a decoder may change
    its first token's text (drop a leading space, a WordPiece cleanup), and a new anchor is taken
    only where the kept prefix + the anchored decode reproduce the text exactly (not inside a
    UTF-8 character, whose bytes decode to U+FFFD)."""

    def __init__(self, decode: Callable[[List[int]], str], window: int = 64) -> None:
        self.decode = decode
        self.window = max(1, window)
        self.tokens: List[int] = []
        self.anchor = 0  # decodes start at this token
        self.kept = ""  # the text before ...
        self.cut = 0  # ... this position of the anchored decode
        self.text = ""

    def append(self, token: int) -> str:
        self.tokens.append(int(token))
        self.text = self.kept + self.decode(self.tokens[self.anchor:])[self.cut:]
        if len(self.tokens) - self.anchor > 2 * self.window:
            self._move_anchor()
        return self.text

    def _move_anchor(self) -> None:
        first = len(self.tokens) - self.window  # the kept text ends where this token's text begins
        anchor = first - 1
        before, after = self.decode(self.tokens[anchor:first]), self.decode(self.tokens[anchor:first + 1])
        cut = len(common_prefix(before, after))
        whole = self.decode(self.tokens[anchor:])
        # where the token begins in the whole text: what the whole text's tail from it is
        kept = len(self.text) - (len(whole) - cut)
        if "\ufffd" in after or kept < 0 or self.text[kept:] != whole[cut:]:
            return  # no clean boundary here: keep the old anchor one more token
        self.anchor, self.kept, self.cut = anchor, self.text[:kept], cut


class TextPieces:
    """One sequence's text pieces, fed token by token: add(token) returns the text that became
    final with it ("" if none) — text the decodes of the first n-1 and the first n tokens agree on
    (a decoder may rewrite the end of its text when a token follows), without a trailing U+FFFD (a
    byte-level token may end inside a UTF-8 sequence that the next token completes); finish()
    returns the rest, from the decode of the whole sequence, so the pieces join to generate()'s
    text. With stop strings, the text up to the first one is returned, text that could still turn
    out to begin one is held back until the next token says, and ``stopped`` turns True (add()
    then returns the last piece, and the sequence should end)."""

    def __init__(self, decode: Callable[[List[int]], str], stops: Sequence[str] = (), window: int = 64) -> None:
        self.decode, self.stops = decode, list(stops)
        self.produced: List[int] = []
        self.emitted = self.previous = ""
        self.stopped = False
        self.text = IncrementalDecode(decode, window)  # each add()'s decode, linear in the length

    def add(self, token: int) -> str:
        self.produced.append(int(token))
        decoded = self.text.append(token)
        final = common_prefix(self.previous, decoded).rstrip("\ufffd")
        self.previous = decoded
        if self.stops:
            cut, found = cut_at_stop(decoded, self.stops)
            if found:
                self.stopped = True
                return self._advance(cut)
            final = final[:len(final) - held_back(final, self.stops)]
        return self._advance(final)

    def finish(self) -> str:
        if self.stopped:
            return ""
        text = self.decode(self.produced)
        if self.stops:
            text = cut_at_stop(text, self.stops)[0]
        rest = text[len(common_prefix(self.emitted, text)):]
        self.emitted = text
        return rest

    def _advance(self, final: str) -> str:
        if len(final) > len(self.emitted) and final.startswith(self.emitted):
            piece, self.emitted = final[len(self.emitted):], final
            return piece
        return ""


def text_pieces(tokens: Iterator[int], decode: Callable[[List[int]], str], stops: Sequence[str] = (),
                on_stop: Optional[Callable[[], None]] = None) -> Iterator[str]:
    """The text pieces of a token stream (TextPieces), each once it is final (Generator.stream's
    text, stream_chat); ``on_stop()`` is called when a stop string ends the text. Closing this
    generator closes ``tokens``."""
    pieces = TextPieces(decode, stops)
    try:
        for token in tokens:
            piece = pieces.add(token)
            if piece:
                yield piece
            if pieces.stopped:
                if on_stop is not None:
                    on_stop()
                return
        rest = pieces.finish()
        if rest:
            yield rest
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()
