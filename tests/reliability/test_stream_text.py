"""stream() of text: the pieces join to exactly generate()'s text, for every kind of tokenizer.

Tokenizers trained offline with the `tokenizers` library on a small multilingual corpus (accents,
CJK, Hangul, Cyrillic, Arabic, Devanagari, emoji with modifiers and joiners): byte-level BPE
(GPT-2 style; most tokens of the random model's output are single bytes of multi-byte UTF-8
characters), WordPiece (BERT style) and Unigram with Metaspace (SentencePiece style), plus a
decoder that rewrites text across a token boundary. Each sits next to a tiny random GPT-2 with
its vocabulary size. Before, a stream ending inside a UTF-8 sequence never yielded the
characters decoded after its last piece.
Mechanism: docs/reliability.md, "Streams and sampling limits".
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cpuformer as cf

from ._support import property_settings

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Größenwahn, déjà vu, naïve café — señor Ñandú.",
    "東京は日本の首都です。北京是中国的首都。",
    "서울은 한국의 수도입니다.",
    "Привет, как дела? Всё хорошо!",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Emoji: 😀🎉👍🏽 🇫🇷 👨‍👩‍👧 ❤️ 🚀",
    "Ελληνικά γράμματα και αριθμοί 12345.",
]


def byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tokenizer.train_from_iterator(CORPUS * 3, trainer)
    return tokenizer


def wordpiece():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.train_from_iterator(CORPUS * 3, trainers.WordPieceTrainer(vocab_size=400,
                                                                        special_tokens=["[UNK]", "[SEP]"]))
    return tokenizer


def metaspace_unigram():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(CORPUS * 3, trainers.UnigramTrainer(vocab_size=300, special_tokens=["<unk>"],
                                                                      unk_token="<unk>"))
    return tokenizer


def rewriting_decoder():
    """Characters as tokens; the decoder joins them and then replaces "ab" by "X", so a token can
    change text that the token before produced ("a" becomes "X" when "b" follows). Three letters
    only, so that the random model samples "a" then "b" often."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2, "c": 3}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tokenizer.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    return tokenizer


KINDS = {"byte_level_bpe": byte_level_bpe, "wordpiece": wordpiece, "metaspace_unigram": metaspace_unigram,
         "rewriting_decoder": rewriting_decoder}


@pytest.fixture(scope="module")
def generators(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = {}
    for kind, build in KINDS.items():
        tokenizer = build()
        directory = tmp_path_factory.mktemp(kind)
        torch.manual_seed(0)
        config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=128, n_embd=32, n_layer=1,
                                        n_head=2, bos_token_id=0, eos_token_id=0)
        transformers.GPT2LMHeadModel(config).eval().save_pretrained(directory, safe_serialization=True)
        tokenizer.save(os.path.join(directory, "tokenizer.json"))
        out[kind] = cf.Generator(directory)
    return out


def check_stream_joins_to_generate(gen, prompt, **kwargs):
    pieces = list(gen.stream(prompt, **kwargs))
    text = gen.generate(prompt, **kwargs)
    assert "".join(pieces) == text, (pieces, text)
    assert all(pieces), pieces  # no empty pieces
    return text


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_stream_joins_to_generate(generators, kind):
    gen = generators[kind]

    @property_settings(60)
    @given(seed=st.integers(0, 2 ** 64 - 1), prompt=st.sampled_from(CORPUS), max_new_tokens=st.integers(1, 24),
           sampling=st.sampled_from([dict(temperature=1.0), dict(temperature=2.0), dict(top_k=40, temperature=1.5),
                                     dict(top_p=0.9)]))
    def check(seed, prompt, max_new_tokens, sampling):
        check_stream_joins_to_generate(gen, prompt, max_new_tokens=max_new_tokens, do_sample=True, seed=seed,
                                       **sampling)

    check()
    check_stream_joins_to_generate(gen, CORPUS[7], max_new_tokens=20)  # greedy


def test_stream_ending_inside_a_utf8_sequence(generators):
    """Seeds whose last token leaves an incomplete UTF-8 character: the text ends with U+FFFD,
    which the stream yields too."""
    gen = generators["byte_level_bpe"]
    endings = 0
    for seed in range(40):
        text = check_stream_joins_to_generate(gen, CORPUS[7], max_new_tokens=5, do_sample=True, seed=seed)
        endings += text.endswith("\ufffd")
    assert endings >= 5  # the case is exercised, not just possible


def test_stream_of_a_decoder_that_rewrites_earlier_text(generators):
    gen = generators["rewriting_decoder"]
    rewritten = 0
    for seed in range(30):
        text = check_stream_joins_to_generate(gen, "cab", max_new_tokens=12, do_sample=True, seed=seed,
                                              eos_token_id=[])
        rewritten += "X" in text
    assert rewritten >= 10  # the case is exercised, not just possible
