"""Hostile arguments to ``Encoder.__call__`` and ``Encoder.embed`` (hypothesis property tests).

Valid calls (one-token sequences, ragged lists, masks with padding, token types, every length up
to max_seq_len) must match a float64 NumPy forward pass over the same weights at the unpadded
positions (tolerance 1e-4 · max|ref|, as tests/models/test_encoder.py). Hostile calls — negative,
too large and beyond-int64 ids, float / bool / object ids, wrong ranks and shapes, empty batches
and empty sequences, masks that are not 0/1 (NaN, 0.5, 2), out-of-range token types, sequences
longer than the position table, bad pooling / batch_size — must raise TypeError or ValueError
with a message naming the problem. Each entry point gets at least 2,000 calls.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cpuformer as cf

from ._support import CallCounter, property_settings
from .conftest import reference_forward

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def encoder(tiny_bert):
    directory, weights, config = tiny_bert
    enc = cf.Encoder(directory, num_threads=1)  # tiny inputs: see test_ops_properties.one_thread
    yield enc, weights, config
    enc.close()


def check_close(got, ref, mask):
    ref = np.asarray(ref)
    assert got.dtype == np.float32 and got.shape == ref.shape
    keep = np.asarray(mask, dtype=bool)
    if keep.any():
        scale = float(np.abs(ref[keep]).max())
        np.testing.assert_allclose(got[keep], ref[keep], rtol=0, atol=TOLERANCE * max(scale, 1.0))


@st.composite
def batches(draw, vocab, max_len):
    B = draw(st.integers(1, 4))
    T = draw(st.one_of(st.just(1), st.integers(1, max_len)))  # one-token sequences often
    ids = np.array(draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=T, max_size=T), min_size=B,
                                 max_size=B)), dtype=np.int64)
    lengths = [draw(st.integers(1, T)) for _ in range(B)]
    return ids, lengths


HOSTILE_CALLS = ["negative", "too_large", "beyond_int64", "huge_python_int", "float_ids", "bool_ids", "one_dim",
                 "three_dim", "empty_batch", "empty_sequence", "empty_list", "empty_row_in_ragged", "too_long",
                 "mask_two", "mask_half", "mask_nan", "mask_shape", "types_range", "types_shape", "ids_object",
                 "string_ids", "ragged_mask_mismatch"]


def hostile_call(calls, enc, ids, case, vocab, max_len):
    B, T = ids.shape

    def expect(kind, match, *args, **kwargs):
        calls.raises("__call__", kind, match, enc, *args, **kwargs)

    if case == "negative":
        bad = ids.copy()
        bad[-1, -1] = -1 - bad[-1, -1]
        expect(ValueError, f"input_ids[{B - 1}, {T - 1}] = {bad[-1, -1]} is out of range", bad)
    elif case == "too_large":
        bad = ids.copy()
        bad[0, 0] = vocab + bad[0, 0]
        expect(ValueError, "is out of range; token ids must be in [0, 61)", bad)
    elif case == "beyond_int64":
        expect(ValueError, "is out of range; token ids must be in [0, 61)", ids.astype(np.uint64) + np.uint64(2**63))
    elif case == "huge_python_int":
        rows = ids.tolist()
        rows[0][0] = 2**70
        expect(ValueError, f"input_ids: token id {2**70} is out of range; token ids must be in [0, 61)", rows)
    elif case == "float_ids":
        expect(TypeError, "input_ids must hold integers, got dtype float", ids.astype(np.float32))
    elif case == "bool_ids":
        expect(TypeError, "input_ids must hold integers, got dtype bool", ids > 3)
    elif case == "one_dim":
        expect(ValueError, f"input_ids must have 2 dimensions [batch, seq_len], got shape [{T}]; wrap a single", ids[0])
    elif case == "three_dim":
        expect(ValueError, "input_ids must have 2 dimensions", ids[None])
    elif case == "empty_batch":
        expect(ValueError, "input_ids must hold at least one sequence", ids[:0])
    elif case == "empty_sequence":
        expect(ValueError, "input_ids must hold at least one sequence of at least one token", ids[:, :0])
    elif case == "empty_list":
        expect(ValueError, "input_ids must hold at least one sequence, got an empty batch", [])
    elif case == "empty_row_in_ragged":
        expect(ValueError, "input_ids holds an empty sequence", [ids[0].tolist(), []])
    elif case == "too_long":
        long_ids = np.zeros((1, max_len + 1 + T), np.int64)
        expect(ValueError, f"sequence length {max_len + 1 + T} exceeds the model's maximum of {max_len}", long_ids)
    elif case == "mask_two":
        expect(ValueError, "attention_mask entries must be 0 (padding) or 1 (token)", ids, np.full((B, T), 2))
    elif case == "mask_half":
        expect(ValueError, "attention_mask entries must be 0 (padding) or 1 (token)", ids, np.full((B, T), 0.5))
    elif case == "mask_nan":
        m = np.ones((B, T), np.float32)
        m[-1, -1] = np.nan
        expect(ValueError, "attention_mask entries must be 0 (padding) or 1 (token)", ids, m)
    elif case == "mask_shape":
        expect(ValueError, "attention_mask must have the shape of input_ids", ids, np.ones((B, T + 1), np.int64))
    elif case == "types_range":
        t = np.zeros((B, T), np.int64)
        t[0, -1] = 2
        expect(ValueError, "token type ids must be in [0, 2) (type_vocab_size)", ids, None, t)
    elif case == "types_shape":
        expect(ValueError, "token_type_ids must have the shape of input_ids", ids, None, np.zeros((B + 1, T), np.int64))
    elif case == "ids_object":
        calls.raises("__call__", ValueError, "input_ids must be a rectangular [batch, seq_len] array of integers", enc,
                     object())
    elif case == "string_ids":
        calls.raises("__call__", TypeError, "input_ids must hold integers, got dtype <U", enc, [["a", "b"]])
    else:
        rows = [ids[0].tolist(), ids[0].tolist() + [1]]
        expect(ValueError, "attention_mask must be a list of lists of the same lengths", rows, [[1] * T, [1] * T])


def test_encoder_call(encoder):
    enc, weights, config = encoder
    calls = CallCounter()
    vocab, max_len = config.vocab_size, enc.max_seq_len

    @property_settings(420)
    @given(batch=batches(vocab, max_len), types=st.booleans(),
           hostile=st.lists(st.sampled_from(HOSTILE_CALLS), min_size=3, max_size=3, unique=True))
    def check(batch, types, hostile):
        ids, lengths = batch
        B, T = ids.shape
        mask = (np.arange(T)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        tt = (ids % 2) if types else None
        ref = reference_forward(weights, config, ids, mask, tt)
        out = calls.ok("__call__", enc, ids, mask, tt)
        check_close(out, ref, mask)
        # The same batch as ragged lists: padded and masked inside, identical at the real tokens.
        ragged = [ids[b, :n].tolist() for b, n in enumerate(lengths)]
        ragged_types = None if tt is None else [tt[b, :n].tolist() for b, n in enumerate(lengths)]
        out2 = calls.ok("__call__", enc, ragged, None, ragged_types)
        Tr = max(lengths)
        check_close(out2, ref[:, :Tr], mask[:, :Tr])
        for case in hostile:
            hostile_call(calls, enc, ids, case, vocab, max_len)

    check()
    calls.require("__call__")


def reference_embed(weights, config, sequences, pooling, normalize):
    rows = []
    for s in sequences:
        h = reference_forward(weights, config, np.array([s]))[0]
        v = {"mean": h.mean(axis=0), "cls": h[0], "max": h.max(axis=0), "last": h[-1]}[pooling]
        rows.append(v / max(np.linalg.norm(v), 1e-12) if normalize else v)
    return np.array(rows)


HOSTILE_EMBED = ["string", "bytes", "empty", "mixed", "empty_tokens", "float_token", "bool_token", "negative",
                 "too_long", "pooling", "batch_zero", "batch_bool", "batch_float", "no_tokenizer", "ndarray_2d",
                 "ndarray_float", "not_a_list"]


def hostile_embed(calls, enc, sequences, case, vocab, max_len):
    def expect(kind, match, *args, **kwargs):
        calls.raises("embed", kind, match, enc.embed, *args, **kwargs)

    if case == "string":
        expect(TypeError, "wrap a single string in a list", "hello")
    elif case == "bytes":
        expect(TypeError, "wrap a single string in a list", b"hello")
    elif case == "empty":
        expect(ValueError, "embed() needs at least one input", [])
    elif case == "mixed":
        expect(TypeError, "must be all strings or all token-id lists", ["a", sequences[0]])
    elif case == "empty_tokens":
        expect(ValueError, f"inputs[{len(sequences)}] is an empty token list", sequences + [[]])
    elif case == "float_token":
        expect(TypeError, "inputs[0] must hold integer token ids, got float", [[1.0] + sequences[0]])
    elif case == "bool_token":
        expect(TypeError, "inputs[0] must hold integer token ids, got bool", [[True]])
    elif case == "negative":
        expect(ValueError, "is out of range", sequences + [[0, -5]])
    elif case == "too_long":
        expect(ValueError, f"exceeds the model's maximum of {max_len}", sequences + [[1] * (max_len + 1)])
    elif case == "pooling":
        expect(ValueError, "pooling must be None, 'mean', 'cls', 'max' or 'last'", sequences, pooling="sum")
    elif case == "batch_zero":
        expect(ValueError, "batch_size must be an integer >= 1", sequences, batch_size=0)
    elif case == "batch_bool":
        expect(ValueError, "batch_size must be an integer >= 1", sequences, batch_size=True)
    elif case == "batch_float":
        expect(ValueError, "batch_size must be an integer >= 1", sequences, batch_size=2.0)
    elif case == "no_tokenizer":
        expect(ValueError, "has no tokenizer.json", ["a sentence"])
    elif case == "ndarray_2d":
        expect(ValueError, "inputs[0] must be a 1-D sequence of token ids", [np.zeros((2, 2), np.int64)])
    elif case == "ndarray_float":
        expect(TypeError, "inputs[0] must hold integer token ids, got dtype float", [np.zeros(3, np.float64)])
    else:
        expect(TypeError, "inputs[0] must be a string or a list of token ids, got int", [5])


def test_encoder_embed(encoder):
    enc, weights, config = encoder
    calls = CallCounter()
    vocab, max_len = config.vocab_size, enc.max_seq_len

    @property_settings(420)
    @given(sequences=st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_len), min_size=1,
                              max_size=5),
           pooling=st.sampled_from(["mean", "cls", "max", "last"]), normalize=st.booleans(),
           batch_size=st.integers(1, 6),
           as_arrays=st.booleans(),
           hostile=st.lists(st.sampled_from(HOSTILE_EMBED), min_size=3, max_size=3, unique=True))
    def check(sequences, pooling, normalize, batch_size, as_arrays, hostile):
        inputs = [np.array(s, dtype=np.int64) for s in sequences] if as_arrays else sequences
        got = calls.ok("embed", enc.embed, inputs, pooling=pooling, normalize=normalize, batch_size=batch_size)
        ref = reference_embed(weights, config, sequences, pooling, normalize)
        check_close(got, ref, np.ones(ref.shape, bool))
        # Batching and sorting by length must not change a sequence's embedding beyond rounding.
        one = calls.ok("embed", enc.embed, sequences[:1], pooling=pooling, normalize=normalize)
        np.testing.assert_allclose(one[0], got[0], rtol=0, atol=TOLERANCE * max(1.0, float(np.abs(ref[0]).max())))
        for case in hostile:
            hostile_embed(calls, enc, sequences, case, vocab, max_len)

    check()
    calls.require("embed")


def test_closed_encoder_raises(tiny_bert):
    enc = cf.Encoder(tiny_bert[0], num_threads=1)
    enc.close()
    with pytest.raises(ValueError, match="this Encoder is closed"):
        enc(np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="this Encoder is closed"):
        enc.embed([[1, 2]])
    with pytest.raises(ValueError, match="this Encoder is closed"):
        enc.embed(["a sentence"])
    for name in ("hidden_size", "max_seq_len", "has_pooler"):
        with pytest.raises(ValueError, match="this Encoder is closed"):
            getattr(enc, name)
    enc.close()  # closing twice is harmless
