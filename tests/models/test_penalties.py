"""OpenAI's presence / frequency penalties and logit_bias (generate(), stream(), Batcher.submit()):
against transformers' generate() with its sequence_bias and the penalties as a logits processor,
against the formula on cpuformer's own logits, and their errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import cpuformer as cf
from models.test_decoder import SMALL, _build, one_torch_thread  # noqa: F401 (an autouse fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for i, name in enumerate(("gpt2", "llama")):
        model_class, config_class, config = SMALL[name]
        directory = tmp_path_factory.mktemp(name)
        model = _build(directory, model_class, config_class, seed=40 + i, **config)
        out[name] = (model, cf.Generator(directory))
    return out


class OpenAIPenalties(transformers.LogitsProcessor):
    """The reference: score -= count × frequency + (count > 0) × presence over the new tokens."""

    def __init__(self, prompt_length, presence, frequency):
        self.start, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids, scores):
        for row, ids in enumerate(input_ids[:, self.start:].tolist()):
            for token in set(ids):
                scores[row, token] -= ids.count(token) * self.frequency + self.presence
        return scores


def _reference(model, prompt, max_new, presence=0.0, frequency=0.0, logit_bias=None, **kwargs):
    ids = torch.tensor([prompt])
    processors = transformers.LogitsProcessorList([OpenAIPenalties(len(prompt), presence, frequency)])
    bias = {(t,): float(b) for t, b in (logit_bias or {}).items()} or None
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=None, pad_token_id=0, logits_processor=processors, sequence_bias=bias,
                             **kwargs)
    return out[0, len(prompt):].tolist()


CASES = [
    dict(presence=1.5, frequency=0.0),
    dict(presence=0.0, frequency=1.2),
    dict(presence=-0.5, frequency=-2.0),  # negative: repeats encouraged, counts above 1
    dict(presence=1.0, frequency=1.0, logit_bias={5: 6.0, 7: -100, 11: 0.75}),
    dict(presence=0.8, frequency=0.2, repetition_penalty=1.3, logit_bias={3: -1.5, 9: 4.0}),
]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_greedy_with_penalties_matches_transformers(models, name, case):
    model, gen = models[name]
    options = dict(CASES[case])
    presence, frequency = options.pop("presence"), options.pop("frequency")
    prompt = [int(t) for t in np.random.default_rng(case).integers(3, gen.vocab_size, 7)]
    ref = _reference(model, prompt, 30, presence, frequency, **options)
    ours = gen.generate(prompt, max_new_tokens=30, eos_token_id=[], presence_penalty=presence,
                        frequency_penalty=frequency, **options)
    assert ours == [ref]
    # the options change the output (otherwise this comparison would prove nothing)
    assert ours != gen.generate(prompt, max_new_tokens=30, eos_token_id=[],
                                repetition_penalty=options.get("repetition_penalty", 1.0))
    # the same request through stream() and the continuous batcher
    assert list(gen.stream(prompt, max_new_tokens=30, eos_token_id=[], presence_penalty=presence,
                           frequency_penalty=frequency, **options)) == ref
    batcher = gen.batcher(capacity=3)
    plain = batcher.submit(prompt[:4], max_new_tokens=30, eos_token_id=[])
    penalised = batcher.submit(prompt, max_new_tokens=30, eos_token_id=[], presence_penalty=presence,
                               frequency_penalty=frequency, **options)
    tokens = {plain: [], penalised: []}
    while batcher.waiting or batcher.running:
        for event in batcher.step():
            tokens[event.request].append(event.token)
    assert tokens[penalised] == ref
    assert tokens[plain] == gen.generate(prompt[:4], max_new_tokens=30, eos_token_id=[])[0]


@pytest.mark.parametrize("presence, frequency, repetition", [(0.6, -1.1, 1.0), (0.6, -1.1, 1.8)])
def test_the_processed_log_probabilities_follow_the_formula(models, presence, frequency, repetition):
    """Each chosen token's log-probability (under the processed distribution) equals
    log_softmax of the logits with the bias added, then the repetition penalty (transformers'
    order: its sequence_bias comes first), then minus count × frequency + presence, at that step,
    with the logits of the whole sequence so far from cpuformer's own forward."""
    _, gen = models["llama"]
    prompt = [4, 9, 4, 17, 30]
    top = int(np.argmax(gen.logits([prompt])[0, -1]))
    prompt.append(top)  # a likely token in the history: the bias and the repetition penalty both move it
    bias = {top: 5.0, 17: -4.0, 40: -3.0}
    tokens, log_probs = gen.generate(prompt, max_new_tokens=24, eos_token_id=[], presence_penalty=presence,
                                     frequency_penalty=frequency, logit_bias=bias, repetition_penalty=repetition,
                                     return_log_probs=True)
    tokens, log_probs = tokens[0], log_probs[0]
    counts = np.bincount(tokens, minlength=gen.vocab_size)
    if repetition == 1.0:
        assert counts.max() >= 3  # the negative frequency penalty made repeats (counts above 1 are exercised)
    logits = gen.logits([prompt + tokens])[0]
    for i, token in enumerate(tokens):
        scores = logits[len(prompt) + i - 1].astype(np.float64)
        for t, b in bias.items():
            scores[t] += b
        for t in set(prompt + tokens[:i]):
            scores[t] = scores[t] * repetition if scores[t] < 0 else scores[t] / repetition
        seen = np.bincount(tokens[:i], minlength=gen.vocab_size)
        scores -= seen * frequency + (seen > 0) * presence
        expected = scores - (scores.max() + math.log(np.exp(scores - scores.max()).sum()))
        assert token == int(np.argmax(scores))
        assert log_probs[i] == pytest.approx(expected[token], abs=2e-4)


def test_logit_bias_forces_and_bans(models):
    _, gen = models["gpt2"]
    prompt = [5, 6, 7]
    assert gen.generate(prompt, max_new_tokens=6, eos_token_id=[], logit_bias={42: 100}) == [[42] * 6]
    first = gen.generate(prompt, max_new_tokens=1, eos_token_id=[])[0][0]
    banned = gen.generate(prompt, max_new_tokens=8, eos_token_id=[], logit_bias={first: -100})[0]
    assert first not in banned
    # sampling: a seed gives one output, and the batcher gives it too
    options = dict(max_new_tokens=16, eos_token_id=[], do_sample=True, temperature=0.9, seed=11,
                   presence_penalty=1.0, frequency_penalty=0.5, logit_bias={first: -5.0, 42: 3.0})
    sampled = gen.generate(prompt, **options)[0]
    assert gen.batcher(capacity=2).run([prompt], **options) == [sampled]
    assert sampled != gen.generate(prompt, max_new_tokens=16, eos_token_id=[], do_sample=True, temperature=0.9,
                                   seed=11)[0]


BIAS = r"logit_bias of token 5 must be a number in \[-100, 100\], "


def test_bad_penalties_and_bias_are_value_errors(models):
    _, gen = models["gpt2"]
    V = gen.vocab_size
    batcher = gen.batcher(capacity=1)
    cases = [
        (dict(presence_penalty=2.5), ValueError, r"presence_penalty must be a number in \[-2, 2\], got 2.5"),
        (dict(frequency_penalty=-3), ValueError, r"frequency_penalty must be a number in \[-2, 2\], got -3.0"),
        (dict(frequency_penalty=float("nan")), ValueError, r"frequency_penalty must be a number in \[-2, 2\], got nan"),
        (dict(presence_penalty="1"), ValueError, r"presence_penalty must be a number in \[-2, 2\], got '1'"),
        (dict(presence_penalty=True), ValueError, r"presence_penalty must be a number in \[-2, 2\], got True"),
        (dict(logit_bias={V: 1.0}), ValueError,
         rf"logit_bias token id {V} is out of range; token ids must be in \[0, {V}\) \(vocab_size\)"),
        (dict(logit_bias={-1: 1.0}), ValueError, r"logit_bias token id -1 is out of range"),
        (dict(logit_bias={"5": 1.0}), ValueError, r"logit_bias keys must be token ids \(integers\), got '5'"),
        (dict(logit_bias={True: 1.0}), ValueError, r"logit_bias keys must be token ids \(integers\), got True"),
        (dict(logit_bias={5: 101}), ValueError, BIAS + "got 101"),
        (dict(logit_bias={5: -100.5}), ValueError, BIAS + "got -100.5"),
        (dict(logit_bias={5: float("nan")}), ValueError, BIAS + "got nan"),
        (dict(logit_bias={5: 10 ** 400}), ValueError, BIAS + "got 1000"),
        (dict(logit_bias={5: "up"}), ValueError, BIAS + "got 'up'"),
        (dict(logit_bias=[(5, 1.0)]), TypeError, r"logit_bias must be a dict of token id -> bias, got list"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            gen.generate([1, 2], max_new_tokens=2, **options)
        with pytest.raises(error, match=message):
            batcher.submit([1, 2], max_new_tokens=2, **options)
        with pytest.raises(error, match=message):
            gen.stream([1, 2], max_new_tokens=2, **options)
    assert batcher.waiting == 0


def test_the_core_checks_options_it_is_given_directly(models):
    """The C++ check guards the batcher's core too (a caller past the Python checks): ids beyond
    the vocabulary would index past the logits."""
    from cpuformer import _core

    _, gen = models["gpt2"]
    core = _core.BatchDecoder(gen._live(), 1, 32, 16)
    base = dict(max_new_tokens=2, eos_token_ids=[])
    with pytest.raises(ValueError, match=r"logit_bias token id 999999 is out of range"):
        core.add(0, [1, 2], dict(base, logit_bias_ids=[999999], logit_bias_values=[1.0]))
    with pytest.raises(ValueError, match=r"logit_bias: 2 token ids but 1 values"):
        core.add(0, [1, 2], dict(base, logit_bias_ids=[1, 2], logit_bias_values=[1.0]))
    with pytest.raises(ValueError, match=r"presence_penalty must be a number in \[-2, 2\], got inf"):
        core.add(0, [1, 2], dict(base, presence_penalty=float("inf")))
    assert core.waiting == 0


@pytest.fixture(scope="module")
def seq2seq_models(tmp_path_factory):
    from models.test_seq2seq import SMALL as SEQ2SEQ
    from models.test_seq2seq import _build as build_seq2seq

    out = {}
    for i, name in enumerate(("marian", "t5")):
        model_class, config_class, config, peaky = SEQ2SEQ[name]
        directory = tmp_path_factory.mktemp(name)
        out[name] = (build_seq2seq(directory, model_class, config_class, config, peaky, seed=50 + i),
                     cf.load(directory))
    return out


@pytest.mark.parametrize("name", ["marian", "t5"])
def test_seq2seq_greedy_and_beams_with_penalties_match_transformers(seq2seq_models, name):
    """The decoder's processors see the target: the penalties count its new tokens (the decoder
    start token is not one), as transformers' processors given the decoder input ids."""
    model, s2s = seq2seq_models[name]
    source = [int(t) for t in np.random.default_rng(5).integers(3, s2s.vocab_size - 2, 11)]
    options = dict(presence_penalty=1.0, frequency_penalty=0.8, logit_bias={4: 3.0, 9: -2.0})
    for beams in (1, 3):
        ids = torch.tensor([source])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                                 num_beams=beams, do_sample=False, sequence_bias={(4,): 3.0, (9,): -2.0},
                                 logits_processor=transformers.LogitsProcessorList([OpenAIPenalties(1, 1.0, 0.8)]))
        expected = out[0, 1:].tolist()
        ours = s2s.generate(source, max_new_tokens=24, min_new_tokens=24, num_beams=beams, **options)
        assert ours == [expected]
        assert ours != s2s.generate(source, max_new_tokens=24, min_new_tokens=24, num_beams=beams)
    with pytest.raises(ValueError, match=r"frequency_penalty must be a number in \[-2, 2\], got 9.0"):
        s2s.generate(source, frequency_penalty=9)
