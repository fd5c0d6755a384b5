"""Speculative decoding (``assistant_model``, ``prompt_lookup_num_tokens``): greedy output equal to
plain decoding token for token on every generating family, sampling that keeps the model's
distribution (measured against the exact distribution), and the refusals.

The checkpoints are the registry's parity rows (test_registry.PARITY): tiny random models whose
greedy tokens already match transformers'. Plain and speculative runs differ only in how many
positions one forward pass takes (1 or the drafts + 1), so a difference in tokens is a bug in the
drafting, the verification or the cache rollback, unless two logits tie within rounding: each
comparison first checks that the plain run's top-2 gaps are far above float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from cpuformer.arch import by_family

from ._hf import save_random_model
from .test_registry import PARITY, _build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GENERATING = sorted(f for f in PARITY if by_family()[f].kind in ("decoder", "seq2seq"))
NEW = 24
MIN_GAP = 1e-3  # top-2 logit gap the plain run must have at every step (rounding is ~1e-6)


def _prompt(vocab):
    """A prompt with repeats, so that prompt lookup finds n-grams to copy."""
    rng = np.random.default_rng(5)
    part = [int(x) for x in rng.integers(3, vocab - 2, 7)]
    return part + part[:4] + [int(x) for x in rng.integers(3, vocab - 2, 3)] + part


def _greedy_gaps(model, prompt, tokens):
    """The plain run's top-2 logit gap at each generated token (decoders only; seq2seq uses the
    teacher-forced decoder logits)."""
    if model.hparams.kind == "decoder":
        logits = model.logits([prompt + tokens[:-1]])[0, len(prompt) - 1:]
    else:
        start = model.decoder_start_token_id
        logits = model.logits([prompt], [[start] + tokens[:-1]])[0]
    top = np.sort(logits, axis=-1)[:, -2:]
    return top[:, 1] - top[:, 0]


@pytest.fixture(scope="module", params=GENERATING)
def family_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    _build(request.param, directory)
    return directory


def test_greedy_speculation_equals_plain_decoding_on_every_family(family_dir):
    model = cf.load(family_dir)
    prompt = _prompt(model.vocab_size)
    plain = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[])[0]
    assert len(plain) == NEW
    assert _greedy_gaps(model, prompt, plain).min() > MIN_GAP
    runs = {f"lookup k={k} n={n}": dict(prompt_lookup_num_tokens=k, max_matching_ngram_size=n)
            for k, n in ((1, 1), (3, 2), (10, 3))}
    runs.update({f"self-draft {dtype} k={k}": dict(assistant_model=dtype, num_assistant_tokens=k)
                 for dtype in ("int8", "int4") for k in (1, 4)})
    runs["self-draft int8 k=3 constant"] = dict(assistant_model="int8", num_assistant_tokens=3,
                                                num_assistant_tokens_schedule="constant")
    for name, kwargs in runs.items():
        out, stats = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], return_stats=True, **kwargs)
        assert out[0] == plain, name
        # Every target pass yields at least one token; the drafts it kept come on top.
        assert stats["target_passes"] <= NEW - 1, (name, stats)
        assert stats["accepted_tokens"] <= stats["draft_tokens"], (name, stats)
        assert stats["target_passes"] + stats["accepted_tokens"] == NEW - 1, (name, stats)
        if name.endswith("constant"):  # 3 drafts a round, fewer only near max_new_tokens
            assert stats["draft_tokens"] <= 3 * stats["target_passes"], (name, stats)
            assert stats["draft_tokens"] >= 3 * (stats["target_passes"] - 2), (name, stats)
        if name.startswith("self-draft int8"):
            assert stats["accepted_tokens"] > 0, (name, stats)  # a draft that never agrees would hide bugs
    # Log-probabilities are the plain run's (the same processed scores at every position).
    _, plain_lp = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], return_log_probs=True)
    _, spec_lp = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], return_log_probs=True,
                                assistant_model="int8")
    np.testing.assert_allclose(spec_lp[0], plain_lp[0], rtol=1e-4, atol=1e-4)


def test_greedy_speculation_keeps_the_logits_processors_and_stops(family_dir):
    """Repetition penalty, min_new_tokens and an EOS reached inside an accepted draft: the
    verification processes every position with the output so far, drafts included."""
    model = cf.load(family_dir)
    prompt = _prompt(model.vocab_size)
    plain = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], repetition_penalty=1.5)[0]
    rejected = 0
    for kwargs in (dict(prompt_lookup_num_tokens=4), dict(assistant_model="int8", num_assistant_tokens=3),
                   dict(assistant_model="int4", num_assistant_tokens=6)):
        out, stats = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], repetition_penalty=1.5,
                                    return_stats=True, **kwargs)
        assert out[0] == plain, kwargs
        rejected += stats["draft_tokens"] - stats["accepted_tokens"]
    # Some verification turned drafts down (the caches were rolled back), unless the model only
    # repeats one token (the random mBART checkpoint does: every draft is then right).
    assert rejected > 0 or len(set(plain[:-1])) == 1
    # An EOS id that the plain run produces mid-way: every run stops right after it.
    eos = plain[NEW // 2]
    stop = model.generate(prompt, max_new_tokens=NEW, eos_token_id=eos, repetition_penalty=1.5)[0]
    assert stop[-1] == eos and len(stop) <= NEW // 2 + 1
    min_new = model.generate(prompt, max_new_tokens=NEW, eos_token_id=eos, repetition_penalty=1.5,
                             min_new_tokens=len(stop) + 1)[0]
    for kwargs in (dict(prompt_lookup_num_tokens=4), dict(assistant_model="int8", num_assistant_tokens=3)):
        assert model.generate(prompt, max_new_tokens=NEW, eos_token_id=eos, repetition_penalty=1.5, **kwargs)[0] == stop
        assert model.generate(prompt, max_new_tokens=NEW, eos_token_id=eos, repetition_penalty=1.5,
                              min_new_tokens=len(stop) + 1, **kwargs)[0] == min_new
    # max_new_tokens smaller than a draft: never more tokens than asked for (and BART's forced EOS
    # at the last step still applies).
    for n in (1, 2, 3):
        plain = model.generate(prompt, max_new_tokens=n, eos_token_id=[])[0]
        assert model.generate(prompt, max_new_tokens=n, eos_token_id=[], prompt_lookup_num_tokens=8)[0] == plain
        assert model.generate(prompt, max_new_tokens=n, eos_token_id=[], assistant_model="int8")[0] == plain


def test_a_separate_smaller_assistant_gives_the_same_greedy_tokens(tmp_path):
    """A draft with its own (random, one-layer) weights and the same vocabulary: whatever it
    proposes, the output is the model's own."""
    for family in ("llama", "t5"):
        model_class, config_class, kwargs = PARITY[family]
        _build(family, tmp_path / family)
        layers = "num_hidden_layers" if "num_hidden_layers" in kwargs else "num_layers"
        small = dict(kwargs, **{layers: 1})
        save_random_model(tmp_path / (family + "-draft"), getattr(transformers, model_class),
                          getattr(transformers, config_class)(**small), seed=11)
        model, draft = cf.load(tmp_path / family), cf.load(tmp_path / (family + "-draft"))
        prompt = _prompt(model.vocab_size)
        plain = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[])[0]
        out, stats = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], assistant_model=draft,
                                    return_stats=True)
        assert out[0] == plain, family
        assert stats["target_passes"] + stats["accepted_tokens"] == NEW - 1, stats
        if hasattr(model, "stream"):
            streamed = list(model.stream(prompt, max_new_tokens=NEW, eos_token_id=[], assistant_model=draft))
            assert streamed == plain


# ---- sampling ------------------------------------------------------------------------------

SAMPLES = 3000
# Total-variation distance between an empirical marginal over 16 tokens from 3000 draws and the
# exact one: its expected size is ~0.03 (sampling noise); 0.08 is > 4 standard deviations above.
# The negative control shows that a rule that kept the drafts' distribution would be far outside.
TV_BOUND = 0.08


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _tv(counts, p):
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


@pytest.fixture(scope="module")
def sampling_pair(tmp_path_factory):
    """A 16-token GPT-2 and a smaller one-layer GPT-2 over the same vocabulary as its draft."""
    root = tmp_path_factory.mktemp("sampling")
    shape = dict(vocab_size=16, n_embd=32, n_head=2, n_positions=32, initializer_range=0.15, bos_token_id=1,
                 eos_token_id=2)
    save_random_model(root / "model", transformers.GPT2LMHeadModel, transformers.GPT2Config(n_layer=2, **shape), 3)
    save_random_model(root / "draft", transformers.GPT2LMHeadModel, transformers.GPT2Config(n_layer=1, **shape), 4)
    return cf.load(root / "model"), cf.load(root / "draft")


def _exact_marginals(model, prompt):
    """p(t1), p(t2), p(t3) of three sampled tokens (temperature 1, no EOS), from the logits."""
    V = model.vocab_size
    p1 = _softmax(model.logits([prompt])[0, -1].astype(np.float64))
    pairs = np.array([prompt + [a] for a in range(V)])
    p2_given = _softmax(model.logits(pairs)[:, -1].astype(np.float64))  # [t1, t2]
    joint12 = p1[:, None] * p2_given
    triples = np.array([prompt + [a, b] for a in range(V) for b in range(V)])
    p3_given = _softmax(model.logits(triples)[:, -1].astype(np.float64)).reshape(V, V, V)
    p3 = (joint12[:, :, None] * p3_given).sum(axis=(0, 1))
    return p1, joint12.sum(axis=0), p3


def _counts(model, prompt, V, **kwargs):
    counts = np.zeros((3, V))
    for seed in range(SAMPLES):
        out = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=True, seed=seed, eos_token_id=[],
                             **kwargs)[0]
        for i, t in enumerate(out):
            counts[i, t] += 1
    return counts


def test_speculative_sampling_keeps_the_model_distribution(sampling_pair):
    model, draft = sampling_pair
    V = model.vocab_size
    prompt = [5, 9, 3, 5, 9, 3, 5, 9]  # repeats: prompt lookup drafts 3, 5, ...
    exact = _exact_marginals(model, prompt)
    for kwargs in (dict(prompt_lookup_num_tokens=2), dict(assistant_model=draft, num_assistant_tokens=2)):
        counts = _counts(model, prompt, V, **kwargs)
        for position in range(3):
            assert _tv(counts[position], exact[position]) < TV_BOUND, (kwargs, position)
    # Negative control: the draft's own samples are far from the model's distribution, so a rule
    # that accepted every draft token would fail the bound above.
    draft_counts = _counts(draft, prompt, V)
    assert max(_tv(draft_counts[i], exact[i]) for i in range(3)) > 2 * TV_BOUND


# ---- refusals --------------------------------------------------------------------------------


def test_speculative_decoding_refuses_what_it_cannot_do(family_dir, tmp_path):
    model = cf.load(family_dir)
    prompt = _prompt(model.vocab_size)
    what = r"speculative decoding \(assistant_model, prompt_lookup_num_tokens\)"
    with pytest.raises(ValueError, match=what + r" takes one (prompt|source) at a time, got 2"):
        model.generate([prompt, prompt], prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match=what + r" does not combine with beam search \(num_beams > 1\)"):
        model.generate(prompt, num_beams=2, assistant_model="int8")
    with pytest.raises(ValueError, match=r"pass assistant_model or prompt_lookup_num_tokens, not both"):
        model.generate(prompt, assistant_model="int8", prompt_lookup_num_tokens=3)
    for value in (0, -1, 65, 2.0, True):
        with pytest.raises(ValueError, match=r"prompt_lookup_num_tokens must be an integer >= 1"):
            model.generate(prompt, prompt_lookup_num_tokens=value)
        with pytest.raises(ValueError, match=r"num_assistant_tokens must be an integer >= 1"):
            model.generate(prompt, assistant_model="int8", num_assistant_tokens=value)
    with pytest.raises(ValueError, match=r"num_assistant_tokens_schedule must be 'heuristic' or 'constant', got 'x'"):
        model.generate(prompt, assistant_model="int8", num_assistant_tokens_schedule="x")
    with pytest.raises(ValueError, match=r"max_matching_ngram_size must be an integer >= 1"):
        model.generate(prompt, prompt_lookup_num_tokens=2, max_matching_ngram_size=0)
    with pytest.raises(ValueError, match=r"num_assistant_tokens applies to speculative decoding"):
        model.generate(prompt, num_assistant_tokens=3)
    with pytest.raises(ValueError, match=r"max_matching_ngram_size applies to prompt_lookup_num_tokens"):
        model.generate(prompt, assistant_model="int8", max_matching_ngram_size=2)
    with pytest.raises(ValueError, match=r"assistant_model is the model itself"):
        model.generate(prompt, assistant_model=model)
    with pytest.raises(ValueError, match=r"the assistant model \(.*\) is not smaller than the model"):
        model.generate(prompt, assistant_model="float32")
    with pytest.raises(ValueError, match=r"dtype must be one of"):
        model.generate(prompt, assistant_model="int3")
    with pytest.raises(TypeError, match=r"assistant_model must be a cpuformer\.(Generator|Seq2Seq) or a dtype name"):
        model.generate(prompt, assistant_model=42)
    other = cf.load(family_dir, dtype="int8")
    other.close()
    with pytest.raises(ValueError, match=r"the assistant model is closed"):
        model.generate(prompt, assistant_model=other)


def _word_tokenizer(directory, words):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(directory / "tokenizer.json"))


def test_an_assistant_with_another_vocabulary_is_refused(tmp_path):
    model_class, config_class, kwargs = PARITY["gpt2"]
    _build("gpt2", tmp_path / "model")
    save_random_model(tmp_path / "draft", getattr(transformers, model_class),
                      getattr(transformers, config_class)(**dict(kwargs, vocab_size=kwargs["vocab_size"] + 1,
                                                                 n_layer=1)))
    model, draft = cf.load(tmp_path / "model"), cf.load(tmp_path / "draft")
    with pytest.raises(ValueError, match=r"the assistant model's vocabulary \(102 tokens\) differs from the "
                                         r"model's \(101\)"):
        model.generate([5, 6, 7], assistant_model=draft)
    # The same vocabulary size, but tokenizers that give the words other ids.
    save_random_model(tmp_path / "draft2", getattr(transformers, model_class),
                      getattr(transformers, config_class)(**dict(kwargs, n_layer=1)))
    words = [f"w{i}" for i in range(kwargs["vocab_size"])]
    _word_tokenizer(tmp_path / "model", words)
    _word_tokenizer(tmp_path / "draft2", words[::-1])
    model, draft = cf.load(tmp_path / "model"), cf.load(tmp_path / "draft2")
    with pytest.raises(ValueError, match=r"the assistant model's tokenizer \(.*\) maps tokens to other ids than "
                                         r"the model's"):
        model.generate("w5 w6 w7", assistant_model=draft)
    _word_tokenizer(tmp_path / "draft2", words)
    assert model.generate("w5 w6 w7", max_new_tokens=4, assistant_model=cf.load(tmp_path / "draft2")) == \
        model.generate("w5 w6 w7", max_new_tokens=4)
    _build("t5", tmp_path / "t5")
    seq2seq = cf.load(tmp_path / "t5")
    with pytest.raises(TypeError, match=r"assistant_model must be a cpuformer\.Seq2Seq"):
        seq2seq.generate([5, 6, 7], assistant_model=draft)


# ---- a draft packed at load ------------------------------------------------------------------


def test_a_draft_packed_from_the_same_read_is_the_dtype_model(tmp_path):
    """``draft_dtype=`` packs the draft from the weights the model reads (one read of the file):
    the draft is the model loaded at that dtype, and generate(assistant_model=dtype) uses it."""
    for family in ("gpt2", "t5"):
        _build(family, tmp_path / family)
        cls = cf.Generator if family == "gpt2" else cf.Seq2Seq
        model = cls(tmp_path / family, draft_dtype="int8")
        alone = cls(tmp_path / family, dtype="int8")
        prompt = _prompt(model.vocab_size)
        out, stats = model.generate(prompt, max_new_tokens=NEW, eos_token_id=[], assistant_model="int8",
                                    return_stats=True)
        assert out == model.generate(prompt, max_new_tokens=NEW, eos_token_id=[])
        draft = model._self_drafts["int8"]
        assert draft.dtype == "int8" and type(draft) is cls
        assert draft.generate(prompt, max_new_tokens=NEW, eos_token_id=[]) == \
            alone.generate(prompt, max_new_tokens=NEW, eos_token_id=[])
        model.close()
        assert draft.closed
    with pytest.raises(ValueError, match=r"dtype must be one of"):
        cf.Generator(tmp_path / "gpt2", draft_dtype="int3")
    cf.convert(tmp_path / "gpt2", tmp_path / "gpt2-int8", "int8")
    with pytest.raises(ValueError, match=r"draft_dtype needs a checkpoint of float weights; this directory was "
                                         r"converted to 'int8'"):
        cf.Generator(tmp_path / "gpt2-int8", draft_dtype="int4")


def test_the_binding_refuses_what_the_python_layer_checks_first(tmp_path):
    """The C++ generate checks again what reaches it past the Python layer (direct _core calls):
    each a ValueError with its message."""
    model_class, config_class, kwargs = PARITY["gpt2"]
    _build("gpt2", tmp_path / "model")
    save_random_model(tmp_path / "draft", getattr(transformers, model_class),
                      getattr(transformers, config_class)(**dict(kwargs, vocab_size=kwargs["vocab_size"] + 1,
                                                                 n_layer=1)))
    native = cf.load(tmp_path / "model")._model
    other = cf.load(tmp_path / "draft")._model
    cases = [
        ([[5, 6]], {"bad_words_ids": [[500]]}, None, r"bad_words_ids: token id 500 is out of range \[0, 101\)"),
        ([[5, 6]], {"bad_words_ids": [[]]}, None, r"bad_words_ids must hold non-empty token-id lists"),
        ([[5, 6], [7]], {"prompt_lookup_num_tokens": 2}, None,
         r"speculative decoding \(assistant_model, prompt_lookup_num_tokens\) takes one prompt, got 2"),
        ([[5, 6]], {"prompt_lookup_num_tokens": 2, "num_beams": 2}, None, r"does not combine with beam search"),
        ([[5, 6]], {}, other, r"the assistant model's vocabulary \(102 tokens\) differs from the model's \(101\)"),
        ([[5, 6]], {"kv_cache_dtype": 7}, None, r"kv_cache_dtype must be a KvType code 0..3, got 7"),
    ]
    for prompts, options, assistant, message in cases:
        with pytest.raises(ValueError, match=message):
            native.generate(prompts, dict(options, max_new_tokens=3), None, 1, assistant)


def test_cost_guard_decodes_plainly_while_speculation_loses():
    """The cost-aware schedule (greedy with a draft model). Rounds no dearer per emitted token than
    one verified position win outright (a plain step costs at least that), so nothing is measured;
    otherwise, after three rounds, one plain step is timed, and while rounds cost more per token
    than a plain step the run decodes plainly for 8 steps, then 16, 32 and 64 (the cap); a winning
    judgement resets that to 8. Fed measured times through the testing hook, so the policy is
    tested without timing."""
    guard = cf._core._speculation_cost_guard
    step = ("step", 0.010, 1, 0.0, 0)
    # 20 ms a token, verification 12 ms over 3 positions (4 ms each): judged against a plain step
    losing = ("round", 0.040, 2, 0.012, 3)
    sure = ("round", 0.030, 6, 0.036, 6)  # 5 ms a token: no more than a verified position's 6 ms
    close = ("round", 0.016, 2, 0.006, 3)  # 8 ms a token: more than a position's 2 ms, less than a step
    assert guard([sure] * 6) == [0] * 6  # winning rounds never stop to measure a plain step
    # three losing rounds: measure one step; the next round is judged against it: 8 plain steps
    assert guard([losing] * 3 + [step] + [losing]) == [0, 0, 1, 0, 8]
    events = [losing] * 3 + [step] + [losing]
    expected = [0, 0, 1, 0, 8]
    for backoff, next_backoff in ((8, 16), (16, 32), (32, 64), (64, 64)):
        events += [step] * backoff + [losing] * 3
        expected += list(range(backoff - 1, -1, -1)) + [0, 0, next_backoff]
    assert guard(events) == expected
    # Rounds that cost less per token than a step keep speculating and reset the backoff to 8:
    # after 8 + 16 plain steps, close rounds win; a losing one then falls back for 8, not 32.
    events = [losing] * 3 + [step] + [losing] + [step] * 8 + [losing] * 3 + [step] * 16 + [close] * 3
    assert guard(events)[-3:] == [0, 0, 0]
    assert guard(events + [losing])[-1] == 8
    assert guard([("round", 1.0, 0, 0.5, 2)] * 4) == [0] * 4  # a round that emitted nothing is not judged
    with pytest.raises(ValueError, match="event kinds are 'step' and 'round', got 'walk'"):
        guard([("walk", 0.1, 1, 0.0, 0)])


@pytest.mark.parametrize("name", ["gpt2", "mistral"])
def test_drafts_at_the_end_of_the_context(tmp_path, name):
    """Prompt plus new tokens up to the model's last position (GPT-2's learned position table
    ends there; Mistral's window of 8 slides over the rolled-back cache), drafts longer than the
    room left, logits processors on: the tokens are plain decoding's."""
    from .test_decoder import SMALL
    from .test_decoder import _build as build_small

    model_class, config_class, config = SMALL[name]
    build_small(tmp_path, model_class, config_class, seed=90, **config)
    model = cf.load(tmp_path)
    context = model.max_positions
    rng = np.random.default_rng(3)
    for trial in range(8):
        length = int(rng.integers(context - 12, context - 1))
        part = [int(t) for t in rng.integers(3, model.vocab_size, 5)]
        prompt = (part * context)[:length]  # repeats: prompt lookup finds drafts to propose
        room = context - length
        options = dict(max_new_tokens=room if trial % 2 == 0 else int(rng.integers(1, room + 1)), eos_token_id=[])
        if trial % 4 == 1:
            options["no_repeat_ngram_size"] = 3
        elif trial % 4 == 3:
            options["repetition_penalty"] = 1.3
        plain = model.generate(prompt, **options)[0]
        assert len(prompt) + len(plain) <= context
        for spec in (dict(prompt_lookup_num_tokens=10), dict(assistant_model="int8", num_assistant_tokens=9),
                     dict(assistant_model="int4", num_assistant_tokens=6)):
            assert model.generate(prompt, **options, **spec)[0] == plain, (trial, options, spec)
