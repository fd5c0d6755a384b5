"""The text offsets of ``cpuformer serve``'s log-probabilities (cpuformer._logprobs.Offsets): the
anchored decodes that keep them linear in the sequence's length give exactly the offsets of
decoding the whole sequence at every token, for every kind of tokenizer of test_stream_text
(byte-level BPE with tokens that split UTF-8 characters, WordPiece with its cleanup, Unigram with
Metaspace, a decoder that rewrites text across a token boundary) and any window.
Mechanism: docs/serving.md, "Log-probabilities"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpuformer._logprobs import Offsets

from ._support import property_settings
from .test_stream_text import CORPUS, KINDS


@pytest.fixture(scope="module")
def tokenizers():
    return {kind: build() for kind, build in KINDS.items()}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_anchored_offsets_equal_whole_decodes(tokenizers, kind):
    tokenizer = tokenizers[kind]
    vocab = tokenizer.get_vocab_size()
    texts = [tokenizer.encode(text).ids for text in CORPUS]

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    @property_settings(60)
    @given(data=st.data(), window=st.integers(1, 6), start=st.integers(0, 5))
    def check(data, window, start):
        # random ids, or a corpus text's ids cut anywhere (real words next to split characters)
        if data.draw(st.booleans()):
            ids = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=50))
        else:
            ids = data.draw(st.sampled_from(texts))[data.draw(st.integers(0, 5)):] or [1]
        whole, anchored = Offsets(decode, start, window=10 ** 9), Offsets(decode, start, window=window)
        assert [anchored.next(t) for t in ids] == [whole.next(t) for t in ids]
        assert anchored.anchor > 0 or len(ids) <= 2 * window + 1 or "\ufffd" in decode(ids)

    check()
