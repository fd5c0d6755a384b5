"""Token log-probabilities as ``cpuformer serve`` returns them (docs/serving.md, "Log-probabilities").

The Batcher reports, per token, its log-probability under the model's raw distribution and the n
most likely tokens (models/_batcher.py, TokenLogProb). This module turns them into what a client
reads: each token's text, its UTF-8 bytes, its character offset in the answer's text, and the two
OpenAI response shapes (legacy completions: parallel lists; chat: one object per token).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from .models._text import IncrementalDecode, common_prefix

#: What a log-probability that is not a finite number is reported as (JSON has no -Infinity).
FLOOR = -9999.0

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> Dict[str, int]:
    """The byte-level BPE alphabet: the character that stands for each byte in such a
    vocabulary (printable Latin-1 bytes stand for themselves; the others, in byte order, for the
    code points from 256 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 256
    for b in range(256):
        if b not in printable:
            table[chr(extra)] = b
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_alphabet()


class Scored(NamedTuple):
    """One token as a response reports it: text, log-probability (None: the prompt's first
    token, which nothing predicts), UTF-8 bytes (None when unknown), character offset in the
    text, and the most likely alternatives as (text, log-probability, bytes)."""
    text: str
    log_prob: Optional[float]
    bytes: Optional[List[int]]
    offset: int
    top: List[Tuple[str, float, Optional[List[int]]]]


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else FLOOR


class TokenText:
    """Each token's own text and bytes, for one tokenizer (``model.tokenizer``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend", None)
        decoder = getattr(backend, "decoder", None) if backend is not None else None
        self.byte_level = type(decoder).__name__ == "ByteLevel"

    def texts(self, ids: Sequence[int]) -> List[str]:
        return self.tokenizer.decode_batch([[int(t)] for t in ids], skip_special_tokens=False)

    def bytes_of(self, token: int, text: str) -> Optional[List[int]]:
        """The token's bytes: its text's UTF-8 when that text is whole; for a token that holds
        part of a character (its text decodes to U+FFFD), the byte it stands for (``<0x..>``
        tokens) or the bytes its byte-level BPE characters stand for; else None."""
        if "\ufffd" not in text:
            return list(text.encode("utf-8"))
        piece = self.tokenizer.id_to_token(int(token))
        if piece is None:
            return None
        match = _BYTE_TOKEN.match(piece)
        if match:
            return [int(match.group(1), 16)]
        if self.byte_level and all(c in _BYTE_LEVEL for c in piece):
            return [_BYTE_LEVEL[c] for c in piece]
        return None

    def scored(self, token: int, log_prob: Optional[float], top: Sequence[Tuple[int, float]],
               offset: int) -> Scored:
        ids = [int(token)] + [int(t) for t, _ in top]
        texts = self.texts(ids)
        alternatives = [(texts[i + 1], _finite(lp), self.bytes_of(t, texts[i + 1])) for i, (t, lp) in enumerate(top)]
        return Scored(texts[0], None if log_prob is None else _finite(log_prob), self.bytes_of(token, texts[0]),
                      offset, alternatives)


def _agreed(before: str, after: str) -> str:
    """The text two successive decodes agree on; when the first ended in U+FFFD that the second
    changes, without those (the token after may complete that character)."""
    agreed = common_prefix(before, after)
    return agreed if agreed == before else agreed.rstrip("\ufffd")


class Offsets:
    """Where each token of a sequence begins in the text the sequence decodes to: fed token by
    token, ``next(token)`` returns the token's character offset (plus ``start``) — the length of
    the text that the decodes before and after it agree on (_agreed: a token that completes a
    character begins where that character does); never less than the offset before it. The
    decodes come from an IncrementalDecode (linear in the length; ``window`` as there)."""

    def __init__(self, decode: Callable[[List[int]], str], start: int = 0, window: int = 64) -> None:
        self.start = start
        self.text = IncrementalDecode(decode, window)
        self.previous = ""
        self.settled = 0

    def next(self, token: int) -> int:
        decoded = self.text.append(token)
        self.settled = max(self.settled, len(_agreed(self.previous, decoded)))
        self.previous = decoded
        return self.start + self.settled


def completion_logprobs(scored: Sequence[Scored]) -> Dict[str, Any]:
    """The legacy completions shape: parallel lists; top_logprobs maps each alternative's text to
    its log-probability, the chosen token's included (None for the prompt's first token)."""
    top: List[Optional[Dict[str, float]]] = []
    for s in scored:
        if s.log_prob is None:
            top.append(None)
            continue
        entry = {text: lp for text, lp, _ in s.top}
        entry.setdefault(s.text, s.log_prob)
        top.append(entry)
    return {"tokens": [s.text for s in scored], "token_logprobs": [s.log_prob for s in scored],
            "top_logprobs": top, "text_offset": [s.offset for s in scored]}


def chat_logprobs(scored: Sequence[Scored]) -> Dict[str, Any]:
    """The chat shape: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}."""
    return {"content": [{"token": s.text, "logprob": s.log_prob, "bytes": s.bytes,
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in s.top]}
                        for s in scored],
            "refusal": None}
