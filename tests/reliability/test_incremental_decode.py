"""Decoding a growing token list in linear time (cpuformer.models._text.IncrementalDecode): the
text of every prefix equals decoding the whole prefix, and what is built on it — stream pieces
(TextPieces) and the server's log-probability text offsets (cpuformer._logprobs.Offsets) — is
the same as with whole decodes, for every kind of tokenizer of test_stream_text (byte-level BPE
with tokens that split UTF-8 characters, WordPiece with its cleanup, Unigram with Metaspace, a
decoder that rewrites text across a token boundary) and any anchor window.
Mechanism: docs/reliability.md, "Streams and sampling limits"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpuformer._logprobs import Offsets
from cpuformer.models._text import IncrementalDecode, TextPieces, common_prefix

from ._support import property_settings
from .test_stream_text import CORPUS, KINDS

WHOLE = 10 ** 9  # a window no sequence reaches: every decode from the first token


@pytest.fixture(scope="module")
def tokenizers():
    return {kind: build() for kind, build in KINDS.items()}


def _ids(data, vocab, texts):
    """Random ids, or a corpus text's ids cut anywhere (real words next to split characters)."""
    if data.draw(st.booleans()):
        return data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=50))
    return data.draw(st.sampled_from(texts))[data.draw(st.integers(0, 5)):] or [1]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_incremental_decodes_equal_whole_decodes(tokenizers, kind):
    tokenizer = tokenizers[kind]
    vocab = tokenizer.get_vocab_size()
    texts = [tokenizer.encode(text).ids for text in CORPUS]

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    @property_settings(60)
    @given(data=st.data(), window=st.integers(1, 6), start=st.integers(0, 5))
    def check(data, window, start):
        ids = _ids(data, vocab, texts)
        incremental = IncrementalDecode(decode, window)
        assert [incremental.append(t) for t in ids] == [decode(ids[:i + 1]) for i in range(len(ids))]
        assert incremental.anchor > 0 or len(ids) <= 2 * window + 1 or "\ufffd" in decode(ids)
        whole, anchored = Offsets(decode, start, window=WHOLE), Offsets(decode, start, window=window)
        assert [anchored.next(t) for t in ids] == [whole.next(t) for t in ids]
        stops = data.draw(st.sampled_from([(), (" ",), ("e", "ab"), ("é",)]))
        pieces = [TextPieces(decode, stops, window=w) for w in (window, WHOLE)]
        out = [[p.add(t) for t in ids] + [p.finish()] for p in pieces]
        assert out[0] == out[1]

    check()


def test_common_prefix():
    for a, b in [("", ""), ("abc", "abd"), ("abc", "abc"), ("ab", "abc"), ("x" * 1000 + "a", "x" * 1000 + "b"),
                 ("é😀", "é😁"), ("a", "")]:
        expected = 0
        while expected < min(len(a), len(b)) and a[expected] == b[expected]:
            expected += 1
        assert common_prefix(a, b) == common_prefix(b, a) == a[:expected]
