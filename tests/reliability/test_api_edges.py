"""Integers at the API edge: values beyond int64 (or beyond the C++ field they feed) are refused
with a ValueError naming the argument and the range, before pybind11 could report "Unable to cast
Python instance ..." or dump a signature; ``enc([[]])`` reports the empty sequence, not a dtype."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _bench

VOCAB = 50
SHAPES = {
    "encoder": dict(name="edge-bert", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=32),
    "decoder": dict(name="edge-gpt2", vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32),
    "seq2seq": dict(name="edge-marian", vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                    max_position_embeddings=32),
}
BEYOND_INT64 = [2 ** 63, 2 ** 64, -(2 ** 63) - 1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    directories = {kind: _bench.build_model(kind, shape, str(root / kind)) for kind, shape in SHAPES.items()}
    loaded = {kind: cf.load(directory) for kind, directory in directories.items()}
    yield directories, loaded
    for model in loaded.values():
        model.close()


def _out_of_range(name, value):
    return rf"^{name}: token id {value} is out of range; token ids must be in \[0, {VOCAB}\) \(vocab_size\)$"


@pytest.mark.parametrize("value", BEYOND_INT64)
def test_token_ids_beyond_int64(models, value):
    _, m = models
    enc, gen, s2s = m["encoder"], m["decoder"], m["seq2seq"]
    with pytest.raises(ValueError, match=_out_of_range("input_ids", value)):
        enc([[1, value]])
    with pytest.raises(ValueError, match=_out_of_range("input_ids", value)):
        enc([[1, value], [2]])  # ragged
    with pytest.raises(ValueError, match=_out_of_range(r"inputs\[0\]", value)):
        enc.embed([[1, value]])
    with pytest.raises(ValueError, match=_out_of_range("prompt token ids", value)):
        gen.generate([[1, value]])
    with pytest.raises(ValueError, match=_out_of_range("prompt token ids", value)):
        gen.generate([1, value])
    with pytest.raises(ValueError, match=_out_of_range("prompt token ids", value)):
        list(gen.stream([1, value]))
    with pytest.raises(ValueError, match=_out_of_range("input_ids", value)):
        gen.logits([[1, value]])
    with pytest.raises(ValueError, match=_out_of_range("source token ids", value)):
        s2s.generate([[1, value]])
    with pytest.raises(ValueError, match=_out_of_range("input_ids", value)):
        s2s.encode([[1, value]])
    with pytest.raises(ValueError, match=_out_of_range("decoder_input_ids", value)):
        s2s.logits([[1, 2]], [[1, value]])


def test_uint64_arrays_beyond_int64(models):
    _, m = models
    ids = np.array([[1, 2 ** 63]], dtype=np.uint64)
    with pytest.raises(ValueError, match=_out_of_range("input_ids", 2 ** 63)):
        m["encoder"](ids)
    with pytest.raises(ValueError, match=_out_of_range("input_ids", 2 ** 63)):
        m["decoder"].logits(ids)
    with pytest.raises(ValueError, match=_out_of_range(r"inputs\[0\]", 2 ** 64 - 1)):
        m["encoder"].embed([np.array([1, 2 ** 64 - 1], dtype=np.uint64)])


def test_mask_beyond_int64(models):
    _, m = models
    with pytest.raises(ValueError, match=rf"^attention_mask: value {2 ** 64} is beyond int64$"):
        m["decoder"].logits([[1, 2]], [[1, 2 ** 64]])


def test_empty_sequence_is_not_a_dtype_error(models):
    _, m = models
    message = r"input_ids must hold at least one sequence of at least one token, got shape \[1, 0\]"
    with pytest.raises(ValueError, match=message):
        m["encoder"]([[]])
    with pytest.raises(ValueError, match=message):
        m["decoder"].logits([[]])
    with pytest.raises(ValueError, match=message):
        m["seq2seq"].encode([[]])
    with pytest.raises(ValueError, match=r"decoder_input_ids must have shape \[batch, target_len\] with batch 1 .*"
                                         r"target_len >= 1, got \[1, 0\]"):
        m["seq2seq"].logits([[1]], [[]])
    with pytest.raises(TypeError, match="input_ids must hold integers, got dtype float64"):
        m["encoder"]([[1.5]])  # a non-empty float list is still a dtype error


INT64 = r"<= 2\*\*63 - 1"


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
@pytest.mark.parametrize("argument, minimum, extra", [
    ("max_new_tokens", 0, {}), ("min_new_tokens", 0, {}), ("num_beams", 1, {}),
    ("top_k", 0, {"do_sample": True}),
])
@pytest.mark.parametrize("value", [2 ** 63, 2 ** 64, 10 ** 30])
def test_generation_integers_beyond_int64(models, kind, argument, minimum, extra, value):
    _, m = models
    model = m[kind]
    pattern = rf"^{argument} must be an integer >= {minimum} and {INT64}.*, got {value}$"
    with pytest.raises(ValueError, match=pattern):
        model.generate([[1, 2]], **{argument: value}, **extra)
    if kind == "decoder":
        with pytest.raises(ValueError, match=pattern):
            model.stream([1, 2], **{argument: value}, **extra)


@pytest.mark.parametrize("argument", ["num_return_sequences", "no_repeat_ngram_size"])
def test_seq2seq_integers_beyond_int64(models, argument):
    _, m = models
    with pytest.raises(ValueError, match=rf"^{argument} must be an integer >= 0 and {INT64}, got {2 ** 64}$"):
        m["seq2seq"].generate([[1, 2]], **{argument: 2 ** 64})


@pytest.mark.parametrize("kind", ["encoder", "decoder", "seq2seq"])
def test_num_threads_is_checked_at_load(models, kind):
    directories, _ = models
    cls = {"encoder": cf.Encoder, "decoder": cf.Generator, "seq2seq": cf.Seq2Seq}[kind]
    for value in (2 ** 40, 2 ** 64, 1025):
        pattern = rf"^num_threads must be an integer >= 1 and <= 1024 or None, got {value}$"
        with pytest.raises(ValueError, match=pattern):
            cf.load(directories[kind], num_threads=value)
        with pytest.raises(ValueError, match=pattern):
            cls(directories[kind], num_threads=value)
    with pytest.raises(ValueError, match=r"^num_threads must be an integer >= 1 or None, got True$"):
        cf.load(directories[kind], num_threads=True)
    with cf.load(directories[kind], num_threads=1024) as model:  # the cap itself is accepted
        assert model.num_threads == 1024


def test_set_num_threads_range():
    before = cf.get_num_threads()
    for value in (2 ** 40, 2 ** 64):
        with pytest.raises(ValueError, match=rf"^num_threads must be an integer >= 0 and <= 1024 \(0: the "
                                             rf"automatic default\), got {value}$"):
            cf.set_num_threads(value)
    with pytest.raises(ValueError, match=r"^num_threads must be an integer >= 0 \(0: the automatic default\), "
                                         r"got -1$"):
        cf.set_num_threads(-1)
    assert cf.get_num_threads() == before
