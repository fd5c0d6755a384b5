"""Hostile and valid arguments to the generation entry points (hypothesis property tests):
``Generator.generate``, ``Generator.stream``, ``Generator.logits``, ``Seq2Seq.generate``,
``Seq2Seq.logits`` and ``Seq2Seq.encode``, at least 2,000 calls each.

Valid calls (greedy, seeded sampling, beam search; one-token prompts, batches of ragged prompts,
max_new_tokens 0..4, explicit EOS) must give consistent results: tokens in range and no longer
than asked, greedy's first token the argmax of ``logits`` at the prompt's last position, a
sampling seed reproducing its tokens, a streamed sequence equal to ``generate``'s, each row of a
padded batch equal to the row alone. Hostile calls — negative / too-large / float / bool ids,
empty prompts and batches, wrong ranks, strings without a tokenizer, out-of-range or non-finite
options, unknown keywords, prompts longer than the position table, mismatched masks — must raise
TypeError or ValueError with a message naming the problem (NotImplementedError only for beam
sampling, which is documented).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cpuformer as cf

from ._support import CallCounter, property_settings

VOCAB = 61
MAX_POSITIONS = 32
# Each example makes one valid and one hostile call per entry point: 1,000 examples give the 2,000
# calls (under the sanitizer, property_settings and the required count both shrink 10x).
EXAMPLES = 1000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = tmp_path_factory.mktemp("prop_gpt2")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=MAX_POSITIONS, n_embd=24, n_layer=2, n_head=3, bos_token_id=1,
        eos_token_id=2)).eval().save_pretrained(gpt2, safe_serialization=True)
    t5 = tmp_path_factory.mktemp("prop_t5")
    transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=24, d_kv=8, d_ff=32, num_layers=2, num_heads=3, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1)).eval().save_pretrained(t5, safe_serialization=True)
    generator, seq2seq = cf.Generator(gpt2, num_threads=1), cf.Seq2Seq(t5, num_threads=1)
    yield generator, seq2seq
    generator.close()
    seq2seq.close()


prompt_lists = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), min_size=1, max_size=3)


@st.composite
def options(draw):
    mode = draw(st.sampled_from(["greedy", "sample", "beam"]))
    kw = dict(max_new_tokens=draw(st.integers(0, 4)))
    if draw(st.booleans()):
        kw["eos_token_id"] = draw(st.integers(0, VOCAB - 1))
    if mode == "sample":
        kw.update(do_sample=True, seed=draw(st.integers(0, 2**64 - 1)), temperature=draw(st.floats(0.2, 3.0)),
                  top_k=draw(st.integers(0, 10)), top_p=draw(st.floats(0.05, 1.0)))
    elif mode == "beam":
        kw.update(num_beams=draw(st.integers(2, 4)), length_penalty=draw(st.floats(-1.0, 2.0)),
                  early_stopping=draw(st.sampled_from([False, True, "never"])))
    if draw(st.booleans()):
        kw["repetition_penalty"] = draw(st.floats(0.5, 2.0))
    return mode, kw


# (keyword arguments or a prompt transformation, exception type, text the message must contain)
HOSTILE_OPTIONS = [
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be an integer >= 0"),
    (dict(max_new_tokens=1.5), ValueError, "max_new_tokens must be an integer >= 0"),
    (dict(max_new_tokens="3"), ValueError, "max_new_tokens must be an integer >= 0"),
    (dict(min_new_tokens=-2), ValueError, "min_new_tokens must be an integer >= 0"),
    (dict(do_sample=True, temperature=0.0), ValueError, "temperature must be > 0 when sampling"),
    (dict(temperature=float("nan")), ValueError, "temperature must be a finite number"),
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite number"),
    (dict(do_sample=True, top_p=0.0), ValueError, "top_p must be in (0, 1]"),
    (dict(top_p=1.5), ValueError, "top_p must be in (0, 1]"),
    (dict(top_k=-1), ValueError, "top_k must be an integer >= 0"),
    (dict(num_beams=0), ValueError, "num_beams must be an integer >= 1"),
    (dict(repetition_penalty=0.0), ValueError, "repetition_penalty must be > 0"),
    (dict(length_penalty=float("nan")), ValueError, "length_penalty must be a finite number"),
    (dict(early_stopping="x"), ValueError, "early_stopping must be False, True or 'never'"),
    (dict(eos_token_id=VOCAB), ValueError, f"eos_token_id {VOCAB} is out of range"),
    (dict(eos_token_id=-1), ValueError, "eos_token_id -1 is out of range"),
    (dict(eos_token_id=1.5), TypeError, "eos_token_id must be an int or a list of ints"),
    (dict(seed=-1), ValueError, "seed must be an integer in [0, 2**64)"),
    (dict(seed=2**64), ValueError, "seed must be an integer in [0, 2**64)"),
    (dict(bogus=1), TypeError, "unexpected keyword argument"),
]
HOSTILE_PROMPTS = [
    ("negative", ValueError, "token id -1 is out of range; token ids must be in [0, 61)"),
    ("too_large", ValueError, f"token id {VOCAB} is out of range; token ids must be in [0, 61)"),
    ("float", TypeError, "must hold integer token ids, got float"),
    ("bool", TypeError, "must hold integer token ids, got bool"),
    ("empty_prompt", ValueError, "is empty; every prompt needs at least one token"),
    ("empty_batch", ValueError, "prompts is empty"),
    ("three_dim", ValueError, "prompts must be 1-D or 2-D"),
    ("float_array", TypeError, "prompts must hold integer token ids, got dtype float"),
    ("object", TypeError, "prompts must be a string, a list of strings or token-id lists"),
    ("text", ValueError, "has no tokenizer (tokenizer.json or SentencePiece model); pass token ids instead"),
]


def hostile_prompt(case, prompts):
    first = list(prompts[0])
    if case == "negative":
        return [first[:-1] + [-1]] + prompts[1:]
    if case == "too_large":
        return prompts[:-1] + [prompts[-1][:-1] + [VOCAB]]
    if case == "float":
        return [first[:-1] + [1.5]]
    if case == "bool":
        return [[True] + first]
    if case == "empty_prompt":
        return prompts + [[]]
    if case == "empty_batch":
        return []
    if case == "three_dim":
        return np.zeros((1, 1, len(first)), np.int64)
    if case == "float_array":
        return np.asarray([first], np.float32)
    if case == "object":
        return object()
    return "some text"


@st.composite
def hostile(draw):
    if draw(st.booleans()):
        return ("option",) + draw(st.sampled_from(HOSTILE_OPTIONS))
    return ("prompt",) + draw(st.sampled_from(HOSTILE_PROMPTS))


def check_tokens(out, n_rows, kw):
    assert len(out) == n_rows
    eos = kw.get("eos_token_id")
    for row in out:
        assert len(row) <= kw["max_new_tokens"]
        assert all(0 <= t < VOCAB for t in row)
        if eos is not None and eos in row:
            assert row.index(eos) == len(row) - 1, "tokens after EOS"


def argmax_is_clear(logits):
    top2 = np.sort(logits)[-2:]
    return top2[1] - top2[0] > 1e-3  # a near-tie may flip between the batched and the stepped path


def run_generate_properties(calls, name, model, prompt_ok, label):
    @property_settings(EXAMPLES)
    @given(prompts=prompt_lists, opts=options(), bad=hostile())
    def check(prompts, opts, bad):
        mode, kw = opts
        out = calls.ok(name, model.generate, prompts, **kw)
        check_tokens(out, len(prompts), kw)
        if mode == "sample":
            assert calls.ok(name, model.generate, prompts, **kw) == out, "the same seed gave other tokens"
        if mode == "greedy" and kw["max_new_tokens"] > 0 and kw.get("repetition_penalty", 1.0) == 1.0:
            first = prompt_ok(prompts[0])
            if argmax_is_clear(first):
                assert out[0][0] == int(np.argmax(first))
        kind, *rest = bad
        if kind == "option":
            bad_kw, error, match = rest
            calls.raises(name, error, match, model.generate, prompts, **bad_kw)
        else:
            case, error, match = rest
            message = str(calls.raises(name, error, match.replace("prompt", label), model.generate,
                                       hostile_prompt(case, prompts)))
            assert message

    check()
    calls.require(name)


def test_generator_generate(models):
    generator, _ = models
    calls = CallCounter()

    def next_logits(prompt):
        return generator.logits([prompt])[0, -1]

    run_generate_properties(calls, "Generator.generate", generator, next_logits, "prompt")

    # Beyond the position table, and beam sampling (documented NotImplementedError).
    calls.raises("Generator.generate", ValueError, f"exceeds the model's maximum of {MAX_POSITIONS} tokens",
                 generator.generate, [[3] * 30], max_new_tokens=5)
    with pytest.raises(NotImplementedError, match="beam sampling"):
        generator.generate([[3]], do_sample=True, num_beams=2)


def test_seq2seq_generate(models):
    _, seq2seq = models
    calls = CallCounter()

    def first_logits(source):
        return seq2seq.logits([source], [[0]])[0, -1]

    run_generate_properties(calls, "Seq2Seq.generate", seq2seq, first_logits, "source")
    calls.raises("Seq2Seq.generate", ValueError, "num_return_sequences (3) must be between 1 and num_beams (2)",
                 seq2seq.generate, [[3]], num_beams=2, num_return_sequences=3)
    calls.raises("Seq2Seq.generate", ValueError, "no_repeat_ngram_size must be an integer >= 0",
                 seq2seq.generate, [[3]], no_repeat_ngram_size=-1)


def test_generator_stream(models):
    generator, _ = models
    calls = CallCounter()
    name = "Generator.stream"

    def stream(prompt, **kw):
        return list(generator.stream(prompt, **kw))

    @property_settings(EXAMPLES)
    @given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8), opts=options(), bad=hostile())
    def check(prompt, opts, bad):
        mode, kw = opts
        got = calls.ok(name, stream, prompt, **kw)  # beam search yields the best sequence at the end
        assert got == generator.generate([prompt], **kw)[0]
        kind, *rest = bad
        if kind == "option":
            bad_kw, error, match = rest
            calls.raises(name, error, match, stream, prompt, **bad_kw)
        else:
            case, error, match = rest
            if case in ("negative", "too_large", "float", "bool"):
                calls.raises(name, error, match, stream, hostile_prompt(case, [prompt])[0])
            elif case in ("empty_prompt", "empty_batch"):
                calls.raises(name, ValueError, "prompts is empty", stream, [])
            else:
                calls.raises(name, error, match, stream, hostile_prompt(case, [prompt]))

    check()
    calls.require(name)
    calls.raises(name, ValueError, "stream() takes one prompt, got 2", stream, [[1, 2], [3]])
    calls.raises(name, TypeError, "stream() does not return log-probabilities", stream, [1], return_log_probs=True)


@st.composite
def padded_batches(draw, max_len):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, max_len))
    ids = np.array(draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=T, max_size=T), min_size=B,
                                 max_size=B)), np.int64)
    lengths = np.array([draw(st.integers(1, T)) for _ in range(B)])
    return ids, lengths


HOSTILE_IDS = [
    ("negative", ValueError, "is out of range; token ids must be in [0, 61)"),
    ("too_large", ValueError, "is out of range; token ids must be in [0, 61)"),
    ("float", TypeError, "input_ids must hold integers, got dtype float"),
    ("three_dim", ValueError, "input_ids must have 2 dimensions"),
    ("object", ValueError, "input_ids must be a rectangular [batch, seq_len] array of integers"),
    ("mask_shape", ValueError, "attention_mask"),
    ("mask_two", ValueError, "attention_mask"),
    ("empty", ValueError, "input_ids"),
]


def hostile_ids(case, ids):
    bad, mask = ids.copy(), None
    if case == "negative":
        bad[0, -1] = -5
    elif case == "too_large":
        bad[-1, 0] = VOCAB + 3
    elif case == "float":
        bad = bad.astype(np.float64)
    elif case == "three_dim":
        bad = bad[None]
    elif case == "object":
        bad = [list(bad[0]), list(bad[0]) + [1]]
    elif case == "mask_shape":
        mask = np.ones((bad.shape[0], bad.shape[1] + 1), np.int64)
    elif case == "mask_two":
        mask = np.full(bad.shape, 2, np.int64)
    else:
        bad = bad[:, :0]
    return bad, mask


def left_padded(ids, lengths):
    B, T = ids.shape
    mask = (np.arange(T)[None, :] >= (T - lengths)[:, None]).astype(np.int64)
    return np.where(mask > 0, ids, 0), mask


def right_padded(ids, lengths):
    B, T = ids.shape
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    return np.where(mask > 0, ids, 0), mask


def test_generator_logits(models):
    generator, _ = models
    calls = CallCounter()
    name = "Generator.logits"

    @property_settings(EXAMPLES)
    @given(batch=padded_batches(12), bad=st.sampled_from(HOSTILE_IDS))
    def check(batch, bad):
        ids, lengths = batch
        padded, mask = left_padded(ids, lengths)
        out = calls.ok(name, generator.logits, padded, mask)
        assert out.shape == (*ids.shape, VOCAB) and np.isfinite(out).all()
        b = int(np.argmin(lengths))  # the most padded row, alone: same logits at its real positions
        n = int(lengths[b])
        alone = generator.logits(padded[b:b + 1, -n:])
        np.testing.assert_allclose(out[b, -n:], alone[0], rtol=0, atol=1e-4 * max(1.0, float(np.abs(alone).max())))
        case, error, match = bad
        bad_ids, bad_mask = hostile_ids(case, ids)
        calls.raises(name, error, match, generator.logits, bad_ids, bad_mask)

    check()
    calls.require(name)
    calls.raises(name, ValueError, f"exceeds the model's maximum of {MAX_POSITIONS}", generator.logits,
                 np.zeros((1, MAX_POSITIONS + 1), np.int64))


def test_seq2seq_encode_and_logits(models):
    _, seq2seq = models
    calls = CallCounter()

    @property_settings(EXAMPLES)
    @given(batch=padded_batches(12), target=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5),
           bad=st.sampled_from(HOSTILE_IDS))
    def check(batch, target, bad):
        ids, lengths = batch
        padded, mask = right_padded(ids, lengths)
        enc = calls.ok("Seq2Seq.encode", seq2seq.encode, padded, mask)
        assert enc.shape == (*ids.shape, 24) and np.isfinite(enc).all()
        tgt = np.array([target] * ids.shape[0], np.int64)
        out = calls.ok("Seq2Seq.logits", seq2seq.logits, padded, tgt, mask)
        assert out.shape == (ids.shape[0], len(target), VOCAB) and np.isfinite(out).all()
        b = int(np.argmin(lengths))
        n = int(lengths[b])
        alone = seq2seq.logits(padded[b:b + 1, :n], tgt[b:b + 1])
        np.testing.assert_allclose(out[b], alone[0], rtol=0, atol=1e-4 * max(1.0, float(np.abs(alone).max())))
        case, error, match = bad
        bad_ids, bad_mask = hostile_ids(case, ids)
        calls.raises("Seq2Seq.encode", error, match, seq2seq.encode, bad_ids, bad_mask)
        calls.raises("Seq2Seq.logits", error, match, seq2seq.logits, bad_ids, tgt, bad_mask)

    check()
    calls.require("Seq2Seq.encode")
    calls.require("Seq2Seq.logits")
    calls.raises("Seq2Seq.logits", ValueError, "decoder_input_ids must have shape [batch, target_len] with batch 1",
                 seq2seq.logits, [[3, 4]], [[0], [0]])
    calls.raises("Seq2Seq.logits", TypeError, "decoder_input_ids must hold integers", seq2seq.logits, [[3, 4]],
                 [[0.5]])
    calls.raises("Seq2Seq.logits", ValueError, "out of range", seq2seq.logits, [[3, 4]], [[VOCAB]])


def test_closed_models_raise(models, tmp_path):
    generator, seq2seq = models
    g = cf.Generator(generator._model_dir.path, num_threads=1)
    g.close()
    for call in (lambda: g.generate([[1]]), lambda: g.logits([[1]]), lambda: list(g.stream([1]))):
        with pytest.raises(ValueError, match="closed"):
            call()
