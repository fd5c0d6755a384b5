"""Stop strings (``generate(..., stop=...)``, ``stream(..., stop=...)``): the output ends at the
first stop string, text results are cut before it, streams never emit part of one, and the C++ loop
stops generating the sequence as soon as its text holds one."""

from __future__ import annotations

import pytest

import cpuformer as cf
from cpuformer import _bench
from cpuformer.models._text import StopWatch, cut_at_stop, held_back

from .test_registry import _build

NEW = 16
RP = dict(repetition_penalty=3.0)  # the random tiny model repeats itself without it
DECODER = dict(name="tiny-gpt2", vocab_size=200, n_embd=32, n_layer=2, n_head=4, n_positions=64)
SEQ2SEQ = dict(name="tiny-marian", vocab_size=200, d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
               max_position_embeddings=64)


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    return cf.load(_bench.build_model("decoder", DECODER, str(tmp_path_factory.mktemp("gen") / "m")))


def _a_word(text, index):
    """The index-th word of text that does not occur earlier in it (so it is the first match)."""
    words = text.split()
    for i in range(index, len(words)):
        if text.find(words[i]) == text.find(" " + words[i]) + 1 and words[i] not in " ".join(words[:i]):
            return words[i]
    raise AssertionError(f"no fresh word in {text!r}")


def test_generate_stops_at_the_first_stop_string(gen):
    prompt = "t5 t6 t7"
    plain = gen.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=[], **RP)
    word = _a_word(plain, 5)
    expected, found = cut_at_stop(plain, [word])
    assert found and expected and word not in expected
    assert gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, stop=word) == expected
    assert gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, stop=[word, "nowhere"]) == expected
    # The earliest of several stop strings wins, whichever is listed first.
    earlier = _a_word(plain, 2)
    assert gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, stop=[word, earlier]) == \
        cut_at_stop(plain, [earlier])[0]
    # Token ids: the sequence ends with the token that completed the stop string (generation stopped).
    ids = gen._encode(prompt, 0)
    plain_ids = gen.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=[], **RP)[0]
    tokens = gen.generate(ids, max_new_tokens=NEW, eos_token_id=[], **RP, stop=word)[0]
    assert tokens == plain_ids[:len(tokens)] and len(tokens) < NEW
    assert word in gen._decode(tokens) and word not in gen._decode(tokens[:-1])
    # A batch: each sequence stops on its own; beam search cuts its final text.
    batch = gen.generate([prompt, "t9 t3"], max_new_tokens=NEW, eos_token_id=[], **RP, stop=word)
    assert batch[0] == expected
    alone = gen.generate("t9 t3", max_new_tokens=NEW, eos_token_id=[], **RP)
    assert batch[1] == cut_at_stop(alone, [word])[0]
    beams = gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, num_beams=3)
    assert gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, num_beams=3, stop=word) == \
        cut_at_stop(beams, [word])[0]
    # Speculative decoding stops at the same place.
    assert gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, stop=word, prompt_lookup_num_tokens=4) == \
        expected
    assert gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, stop=word, assistant_model="int8") == \
        cut_at_stop(gen.generate(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, assistant_model="int8"), [word])[0]


def test_stream_never_emits_part_of_a_stop_string(gen):
    prompt = "t5 t6 t7"
    plain = gen.generate(prompt, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=[], **RP)
    word = _a_word(plain, 5)
    # The stop string spans two words: its first part ("t.. t") is held back until it is decided.
    first, second = plain.split(word)[0].split()[-1], word
    stop = f"{first} {second[:2]}"
    pieces = list(gen.stream(prompt, max_new_tokens=NEW, eos_token_id=[], **RP, stop=stop))
    expected = cut_at_stop(plain, [stop])[0]
    assert "".join(pieces) == expected
    for i in range(len(pieces)):
        emitted = "".join(pieces[:i + 1])
        assert stop not in emitted and expected.startswith(emitted)
    tokens = list(gen.stream(gen._encode(prompt, 0), max_new_tokens=NEW, eos_token_id=[], **RP, stop=stop))
    assert stop in gen._decode(tokens) and stop not in gen._decode(tokens[:-1])


def test_seq2seq_stop(tmp_path):
    s2s = cf.load(_bench.build_model("seq2seq", SEQ2SEQ, str(tmp_path / "m")))
    plain = s2s.generate("t5 t6 t7", max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=[], **RP)
    word = _a_word(plain, 4)
    assert s2s.generate("t5 t6 t7", max_new_tokens=NEW, eos_token_id=[], **RP, stop=word) == \
        cut_at_stop(plain, [word])[0]


def test_stop_helpers():
    assert cut_at_stop("abc</s>def</s>", ["</s>", "def"]) == ("abc", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)
    assert held_back("hello </", ["</s>"]) == 2 and held_back("hello", ["</s>"]) == 0
    assert held_back("ab", ["abc", "b"]) == 2
    # Incremental detokenization: a piece that ends inside a character waits for the next token.
    pieces = {1: "he", 2: "llo", 3: "\ufffd", 4: "!"}

    def decode(ids):
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffd!", "é!")

    watch = StopWatch(decode, ["é!"])
    assert [watch.add(t) for t in (1, 2, 3)] == [False, False, False]
    assert watch.text == "hello"
    assert watch.add(4) and watch.text == "helloé!"


def test_stop_errors(gen, tmp_path):
    with pytest.raises(ValueError, match=r"stop strings must not be empty"):
        gen.generate("t5", stop=["x", ""])
    with pytest.raises(TypeError, match=r"stop must be a string or a list of strings, got \[1\]"):
        gen.generate("t5", stop=[1])
    with pytest.raises(ValueError, match=r"stop strings must not be empty"):
        list(gen.stream("t5", stop=""))
    _build("gpt2", tmp_path)
    no_tokenizer = cf.load(tmp_path)
    with pytest.raises(ValueError, match=r"stop strings need the model's tokenizer to read the text, but .* has no "
                                         r"tokenizer \(tokenizer.json or SentencePiece model\)"):
        no_tokenizer.generate([5, 6], stop="x")
