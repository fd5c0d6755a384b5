"""generate(..., return_scores=True): cpuformer.GenerationResult per returned sequence (token ids,
text, finish reason, log-probabilities, score) against transformers on the same random, seeded
weights; stream()'s finish_reason; num_return_sequences and no_repeat_ngram_size on Generator.

Beam scores are transformers' sequences_scores (the finished hypothesis' sum of log-probabilities
over length ** length_penalty, computed by the C++ beam search); greedy log-probabilities are
compute_transition_scores(normalize_logits=True) of the processed scores.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer.models._text import cut_at_stop  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DECODERS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=101, n_embd=48, n_layer=2, n_head=3, n_positions=96, initializer_range=0.2,
                  bos_token_id=1, eos_token_id=2)),
    "llama": ("LlamaForCausalLM", "LlamaConfig",
              dict(vocab_size=103, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=37, max_position_embeddings=128, initializer_range=0.2)),
}
_BART_SIZES = dict(d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=67, decoder_ffn_dim=67, max_position_embeddings=64,
                   init_std=0.1)
SEQ2SEQ = {
    "marian": ("MarianMTModel", "MarianConfig",
               dict(vocab_size=101, pad_token_id=100, decoder_start_token_id=100, eos_token_id=0, **_BART_SIZES),
               "model.decoder.layers.1.final_layer_norm.weight"),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(vocab_size=97, **_BART_SIZES),
             "model.decoder.layers.1.final_layer_norm.weight"),
    "t5": ("T5ForConditionalGeneration", "T5Config",
           dict(vocab_size=99, d_model=40, d_kv=12, d_ff=65, num_layers=2, num_heads=4, decoder_start_token_id=0,
                relative_attention_num_buckets=16, relative_attention_max_distance=20),
           "decoder.final_layer_norm.weight"),
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """PyTorch's OpenMP pool and ours would spin-wait on the same cores; the references need no
    parallelism."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _word_tokenizer(directory, vocab_size):
    """tokenizer.json: token i is the word "t{i}"; the decoder joins words with spaces."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models

    tokenizer = Tokenizer(tok_models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config)) in enumerate(DECODERS.items()):
        directory = tmp_path_factory.mktemp(name)
        torch.manual_seed(10 + i)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key in ("model.norm.weight", "transformer.ln_f.weight"):
                    p.mul_(8.0)  # peaky next-token distributions: wide top-2 gaps
        model.save_pretrained(directory)
        _word_tokenizer(directory, config["vocab_size"])
        out[name] = (model, cf.Generator(directory))
    return out


@pytest.fixture(scope="module")
def seq2seqs(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config, peaky)) in enumerate(SEQ2SEQ.items()):
        directory = tmp_path_factory.mktemp(name)
        torch.manual_seed(20 + i)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
        with torch.no_grad():
            dict(model.named_parameters())[peaky].mul_(8.0)
            if "final_logits_bias" in dict(model.named_buffers()):
                model.final_logits_bias.normal_(0.0, 1.0)
        model.save_pretrained(directory)
        _word_tokenizer(directory, config["vocab_size"])
        out[name] = (model, cf.Seq2Seq(directory))
    return out


def _prompt(seed, vocab, n):
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab - 2, n)]


def _hf(model, prompt, **kwargs):
    """transformers' generate() output for one prompt (return_dict_in_generate, output_scores)."""
    ids = torch.tensor([prompt])
    kwargs.setdefault("pad_token_id", 0)
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True,
                              output_scores=True, **kwargs)


def _new_tokens(model, out, prompt, eos):
    """Each returned sequence's new tokens, up to and including its first EOS (HF pads after it)."""
    start = 1 if model.config.is_encoder_decoder else len(prompt)
    rows = []
    for row in out.sequences[:, start:].tolist():
        kept = []
        for t in row:
            kept.append(t)
            if t in eos:
                break
        rows.append(kept)
    return rows


def _eos_from_free_run(model, prompt, steps=(3, 6), **kwargs):
    """EOS ids that beam search meets at different lengths: tokens of an unconstrained run."""
    free = _new_tokens(model, _hf(model, prompt, eos_token_id=None, **kwargs), prompt, ())
    return sorted({free[0][s] for s in steps})


# ---- beam search: sequences_scores -----------------------------------------------------------------

def _check_beams(model, ours_model, prompt, **kwargs):
    hf_kwargs = dict(kwargs)
    if "eos_token_id" in hf_kwargs and hf_kwargs["eos_token_id"] == []:
        hf_kwargs["eos_token_id"] = None
    out = _hf(model, prompt, do_sample=False, **hf_kwargs)
    eos = set(kwargs.get("eos_token_id") or [])
    expected = _new_tokens(model, out, prompt, eos)
    results = ours_model.generate(prompt, return_scores=True, **kwargs)
    assert all(isinstance(r, cf.GenerationResult) for r in results)
    assert [r.token_ids for r in results] == expected
    # float32 on both sides, summed in other orders: a score with length_penalty -0.5 is the sum of
    # the log-probabilities times sqrt(length), which multiplies their rounding too (an Intel Xeon
    # with AMX, 2026-11-27: 1.07e-4 apart at -5.26, 2e-5 relative).
    np.testing.assert_allclose([r.score for r in results], out.sequences_scores.numpy(), rtol=5e-5, atol=1e-4)
    for r in results:
        assert r.finish_reason == ("eos" if r.token_ids[-1] in eos else "length")
        assert r.text is None and len(r.log_probs) == len(r.token_ids)
    return results


@pytest.mark.parametrize("name", list(DECODERS))
@pytest.mark.parametrize("length_penalty", [0.6, 2.0, -0.5])
def test_decoder_beam_scores_match_transformers(decoders, name, length_penalty):
    model, gen = decoders[name]
    prompt = _prompt(8, DECODERS[name][2]["vocab_size"], 6)
    eos = _eos_from_free_run(model, prompt, max_new_tokens=14, num_beams=4)
    results = _check_beams(model, gen, prompt, max_new_tokens=14, num_beams=4, num_return_sequences=3,
                           length_penalty=length_penalty, eos_token_id=eos)
    assert len(results) == 3 and {r.finish_reason for r in results} <= {"eos", "length"}
    # Without EOS every beam runs to max_new_tokens.
    results = _check_beams(model, gen, prompt, max_new_tokens=9, num_beams=3, num_return_sequences=2,
                           length_penalty=length_penalty, eos_token_id=[])
    assert [r.finish_reason for r in results] == ["length", "length"]
    assert all(len(r.token_ids) == 9 for r in results)


@pytest.mark.parametrize("name", list(SEQ2SEQ))
@pytest.mark.parametrize("length_penalty", [0.7, 1.8])
def test_seq2seq_beam_scores_match_transformers(seq2seqs, name, length_penalty):
    model, s2s = seq2seqs[name]
    source = _prompt(5, SEQ2SEQ[name][2]["vocab_size"], 9)
    eos = _eos_from_free_run(model, source, steps=(2, 5), max_new_tokens=12, num_beams=4)
    results = _check_beams(model, s2s, source, max_new_tokens=12, num_beams=4, num_return_sequences=3,
                           length_penalty=length_penalty, eos_token_id=eos, early_stopping=True)
    assert any(r.finish_reason == "eos" for r in results)
    _check_beams(model, s2s, source, max_new_tokens=10, num_beams=3, num_return_sequences=3,
                 length_penalty=length_penalty, eos_token_id=eos, early_stopping="never")


def test_beam_results_batch_are_each_prompt_alone(decoders):
    _, gen = decoders["llama"]
    prompts = [_prompt(1, 103, 4), _prompt(2, 103, 9)]
    kwargs = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, length_penalty=0.5, eos_token_id=[7, 9])
    batched = gen.generate(prompts, return_scores=True, **kwargs)
    alone = [r for p in prompts for r in gen.generate(p, return_scores=True, **kwargs)]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    np.testing.assert_allclose([r.score for r in batched], [r.score for r in alone], rtol=0, atol=1e-5)
    # The plain result: the same sequences, prompt i's at [2i, 2i + 2).
    assert gen.generate(prompts, **kwargs) == [r.token_ids for r in batched]


# ---- greedy and sampling: log-probabilities and scores ---------------------------------------------

@pytest.mark.parametrize("kind", ["gpt2", "bart"])
def test_greedy_log_probs_match_compute_transition_scores(decoders, seq2seqs, kind):
    model, ours = decoders[kind] if kind in decoders else seq2seqs[kind]
    prompt = _prompt(4, model.config.vocab_size, 7)
    kwargs = dict(max_new_tokens=12, repetition_penalty=1.3)
    out = _hf(model, prompt, do_sample=False, eos_token_id=None, **kwargs)
    expected = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0].numpy()
    (result,) = ours.generate(prompt, return_scores=True, eos_token_id=[], **kwargs)
    assert result.token_ids == _new_tokens(model, out, prompt, ())[0]
    np.testing.assert_allclose(result.log_probs, expected, rtol=0, atol=1e-4)
    assert result.score == pytest.approx(float(np.sum(result.log_probs)), abs=1e-9)
    assert result.finish_reason == "length" and result.text is None
    # The same numbers as return_log_probs=True.
    assert ours.generate(prompt, return_log_probs=True, eos_token_id=[], **kwargs)[1][0] == result.log_probs


@pytest.mark.parametrize("name", list(DECODERS))
def test_sampling_returns_n_samples_per_prompt(decoders, name):
    model, gen = decoders[name]
    vocab = DECODERS[name][2]["vocab_size"]
    prompts = [_prompt(6, vocab, 5), _prompt(7, vocab, 5)]
    kwargs = dict(max_new_tokens=10, do_sample=True, temperature=1.7, top_k=0, eos_token_id=[], seed=3)
    results = gen.generate(prompts, num_return_sequences=3, return_scores=True, **kwargs)
    assert len(results) == 6
    plain = gen.generate(prompts, num_return_sequences=3, **kwargs)
    assert plain == [r.token_ids for r in results]
    assert len({tuple(r.token_ids) for r in results[:3]}) > 1  # distinct samples of one prompt
    # Each sample's log-probabilities are transformers' tempered distribution at its tokens, under its
    # own prompt (prompt i's samples are results [3i, 3i + 3)).
    for i, r in enumerate(results):
        prompt = prompts[i // 3]
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + r.token_ids])).logits[0, len(prompt) - 1:-1].double()
        expected = torch.log_softmax(logits / 1.7, -1)[torch.arange(10), torch.tensor(r.token_ids)].numpy()
        np.testing.assert_allclose(r.log_probs, expected, rtol=0, atol=1e-4)
        assert r.score == pytest.approx(float(np.sum(r.log_probs)))
    # top_k=1 samples are the greedy sequence, n times; transformers returns n rows per prompt too.
    greedy = gen.generate(prompts[0], max_new_tokens=10, eos_token_id=[])[0]
    assert gen.generate(prompts[0], max_new_tokens=10, eos_token_id=[], do_sample=True, top_k=1,
                        num_return_sequences=4) == [greedy] * 4
    ref = _hf(model, prompts[0], max_new_tokens=10, do_sample=True, top_k=1, num_return_sequences=4,
              eos_token_id=None)
    assert _new_tokens(model, ref, prompts[0], ()) == [greedy] * 4


def test_seq2seq_sampling_returns_n_samples_per_source(seq2seqs):
    model, s2s = seq2seqs["marian"]
    sources = [_prompt(1, 101, 6), _prompt(2, 101, 3)]
    results = s2s.generate(sources, do_sample=True, seed=5, max_new_tokens=8, num_return_sequences=2,
                           return_scores=True)
    assert len(results) == 4
    greedy = s2s.generate(sources, max_new_tokens=8)
    assert s2s.generate(sources, do_sample=True, top_k=1, max_new_tokens=8, num_return_sequences=2) == \
        [greedy[0], greedy[0], greedy[1], greedy[1]]
    for r in results:
        assert r.finish_reason == ("eos" if r.token_ids[-1] == 0 else "length")


# ---- num_return_sequences and no_repeat_ngram_size on Generator ------------------------------------

@pytest.mark.parametrize("name", list(DECODERS))
def test_no_repeat_ngram_size_matches_transformers(decoders, name):
    model, gen = decoders[name]
    prompt = _prompt(9, DECODERS[name][2]["vocab_size"], 5)
    prompt = prompt + prompt[:3]  # the prompt's own n-grams count
    for kwargs in (dict(max_new_tokens=30), dict(max_new_tokens=16, num_beams=3, num_return_sequences=2)):
        for size in (2, 3):
            out = _hf(model, prompt, do_sample=False, eos_token_id=None, no_repeat_ngram_size=size, **kwargs)
            expected = _new_tokens(model, out, prompt, ())
            ours = gen.generate(prompt, eos_token_id=[], no_repeat_ngram_size=size, **kwargs)
            assert ours == expected
            for row in ours:  # no generated token completes an n-gram seen before
                seq = prompt + row
                for end in range(len(prompt), len(seq)):
                    gram = seq[end - size + 1:end + 1]
                    assert all(seq[i:i + size] != gram for i in range(end - size + 1))


def test_text_results_with_several_sequences(decoders):
    _, gen = decoders["gpt2"]
    texts = gen.generate("t5 t6 t7", max_new_tokens=5, num_beams=3, num_return_sequences=2, eos_token_id=[])
    tokens = gen.generate([5, 6, 7], max_new_tokens=5, num_beams=3, num_return_sequences=2, eos_token_id=[])
    assert texts == [" ".join(f"t{t}" for t in row) for row in tokens]
    results = gen.generate(["t5 t6 t7"], max_new_tokens=5, num_beams=3, num_return_sequences=2, eos_token_id=[],
                           return_scores=True)
    assert [r.text for r in results] == texts and [r.token_ids for r in results] == tokens


# ---- finish reasons ------------------------------------------------------------------------------

def test_finish_reasons_greedy(decoders):
    _, gen = decoders["gpt2"]
    prompt = [5, 6, 7]
    free = gen.generate(prompt, max_new_tokens=12, eos_token_id=[])[0]
    eos = free[4]
    first = free.index(eos)
    (r,) = gen.generate(prompt, max_new_tokens=12, eos_token_id=eos, return_scores=True)
    assert r.finish_reason == "eos" and r.token_ids == free[:first + 1]
    (r,) = gen.generate(prompt, max_new_tokens=12, eos_token_id=[], return_scores=True)
    assert r.finish_reason == "length" and r.token_ids == free
    (r,) = gen.generate(prompt, max_new_tokens=0, return_scores=True)
    assert (r.token_ids, r.finish_reason, r.log_probs, r.score) == ([], "length", [], 0.0)
    # A batch: each sequence its own reason.
    rs = gen.generate([prompt, prompt], max_new_tokens=12, eos_token_id=eos, min_new_tokens=12, return_scores=True)
    assert [r.finish_reason for r in rs] == ["length", "length"]
    # Speculative decoding (prompt lookup) reports the same reasons.
    (r,) = gen.generate(prompt, max_new_tokens=12, eos_token_id=eos, prompt_lookup_num_tokens=3, return_scores=True)
    assert r.finish_reason == "eos" and r.token_ids == free[:first + 1]


def _stop_word(text, index):
    """A word of text and the text cut before the stop string's first occurrence."""
    word = text.split()[index]
    cut, found = cut_at_stop(text, [word])
    assert found
    return word, cut


def test_finish_reason_stop(decoders):
    _, gen = decoders["gpt2"]
    free = gen.generate("t5 t6 t7", max_new_tokens=12, eos_token_id=[])
    word, cut = _stop_word(free, 5)
    (r,) = gen.generate("t5 t6 t7", max_new_tokens=12, eos_token_id=[], stop=word, return_scores=True)
    assert (r.finish_reason, r.text) == ("stop", cut) and len(r.token_ids) <= 6
    assert r.score == pytest.approx(sum(r.log_probs))
    # Token input: no text, the reason still says stop.
    (r,) = gen.generate([5, 6, 7], max_new_tokens=12, eos_token_id=[], stop=word, return_scores=True)
    assert r.finish_reason == "stop" and r.text is None
    # Beam search is not ended by a stop string, but its text is cut there: "stop".
    beams = gen.generate("t5 t6 t7", max_new_tokens=12, eos_token_id=[], num_beams=2, return_scores=True)
    beam_word, beam_cut = _stop_word(beams[0].text, 4)
    (r,) = gen.generate("t5 t6 t7", max_new_tokens=12, eos_token_id=[], num_beams=2, stop=beam_word,
                        return_scores=True)
    assert (r.finish_reason, r.text, r.token_ids) == ("stop", beam_cut, beams[0].token_ids)


def test_finish_reasons_seq2seq(seq2seqs):
    _, s2s = seq2seqs["t5"]
    source = _prompt(3, 99, 8)
    free = s2s.generate(source, max_new_tokens=10, eos_token_id=[])[0]
    (r,) = s2s.generate(source, max_new_tokens=10, eos_token_id=[], return_scores=True)
    assert (r.token_ids, r.finish_reason) == (free, "length")
    (r,) = s2s.generate(source, max_new_tokens=10, eos_token_id=free[3], return_scores=True)
    assert r.finish_reason == "eos" and r.token_ids == free[:free.index(free[3]) + 1]
    text = s2s.generate(" ".join(f"t{t}" for t in source), max_new_tokens=10, eos_token_id=[])
    word, cut = _stop_word(text, 4)
    (r,) = s2s.generate(" ".join(f"t{t}" for t in source), max_new_tokens=10, eos_token_id=[], stop=word,
                        return_scores=True)
    assert (r.finish_reason, r.text) == ("stop", cut)
    results, stats = s2s.generate(source, max_new_tokens=10, return_scores=True, return_stats=True,
                                  prompt_lookup_num_tokens=2, eos_token_id=[])
    assert results[0].token_ids == free and set(stats) == {"target_passes", "draft_tokens", "accepted_tokens"}


def test_stream_finish_reason(decoders):
    _, gen = decoders["gpt2"]
    prompt = [5, 6, 7]
    free = gen.generate(prompt, max_new_tokens=12, eos_token_id=[])[0]
    stream = gen.stream(prompt, max_new_tokens=12, eos_token_id=[])
    assert stream.finish_reason is None
    assert list(stream) == free and stream.finish_reason == "length"
    stream = gen.stream(prompt, max_new_tokens=12, eos_token_id=free[4])
    assert list(stream) == free[:free.index(free[4]) + 1] and stream.finish_reason == "eos"
    text = gen.generate("t5 t6 t7", max_new_tokens=12, eos_token_id=[])
    word, cut = _stop_word(text, 5)
    stream = gen.stream("t5 t6 t7", max_new_tokens=12, eos_token_id=[], stop=word)
    assert "".join(stream) == cut and stream.finish_reason == "stop"
    stream = gen.stream(prompt, max_new_tokens=12, eos_token_id=[], stop=word)
    tokens = list(stream)
    assert stream.finish_reason == "stop" and len(tokens) < 12
    stream = gen.stream(prompt, max_new_tokens=12, eos_token_id=[], num_beams=2)
    assert len(list(stream)) == 12 and stream.finish_reason == "length"
    stream = gen.stream(prompt, max_new_tokens=12, eos_token_id=[], no_repeat_ngram_size=2)
    assert list(stream) == gen.generate(prompt, max_new_tokens=12, eos_token_id=[], no_repeat_ngram_size=2)[0]
    # Closed early: no reason.
    stream = gen.stream(prompt, max_new_tokens=12, eos_token_id=[])
    next(stream)
    stream.close()
    assert stream.finish_reason is None
    with pytest.raises(StopIteration):
        next(stream)


# ---- errors --------------------------------------------------------------------------------------

def test_errors(decoders, seq2seqs):
    _, gen = decoders["gpt2"]
    _, s2s = seq2seqs["marian"]
    for model in (gen, s2s):
        with pytest.raises(ValueError, match=r"return_scores=True already gives each sequence's log_probs"):
            model.generate([5, 6], return_scores=True, return_log_probs=True)
        with pytest.raises(ValueError, match=r"num_return_sequences \(2\) > 1 needs beam search \(num_beams > 1\) "
                                             r"or sampling \(do_sample=True\)"):
            model.generate([5, 6], num_return_sequences=2)
        with pytest.raises(ValueError, match=r"num_return_sequences \(4\) must be between 1 and num_beams \(3\)"):
            model.generate([5, 6], num_beams=3, num_return_sequences=4)
        with pytest.raises(ValueError, match=r"num_return_sequences must be >= 1, got 0"):
            model.generate([5, 6], do_sample=True, num_return_sequences=0)
        with pytest.raises(ValueError, match=r"num_return_sequences must be an integer >= 0"):
            model.generate([5, 6], num_return_sequences=1.5)
        with pytest.raises(ValueError, match=r"no_repeat_ngram_size must be an integer >= 0"):
            model.generate([5, 6], no_repeat_ngram_size=-1)
        with pytest.raises(ValueError, match=r"speculative decoding \(assistant_model, prompt_lookup_num_tokens\) "
                                             r"gives one sequence; it does not combine with num_return_sequences"):
            model.generate([5, 6], do_sample=True, num_return_sequences=2, prompt_lookup_num_tokens=2)
    with pytest.raises(TypeError, match=r"stream\(\) does not return log-probabilities or scores; "
                                        r"use generate\(return_scores=True\)"):
        gen.stream([5, 6], return_scores=True)
    with pytest.raises(TypeError, match=r"stream\(\) got unexpected keyword arguments \['num_return_sequences'\]"):
        gen.stream([5, 6], num_return_sequences=2)
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size must be an integer >= 0"):
        gen.stream([5, 6], no_repeat_ngram_size=-2)


def test_the_bindings_own_refusals_and_output(decoders, seq2seqs):
    """The C++ loop's checks behind the Python ones, and the binding's (tokens, log_probs, stats,
    finish reasons, beam scores)."""
    _, gen = decoders["gpt2"]
    _, s2s = seq2seqs["marian"]
    binding = gen._model
    for options, message in (
            ({"num_return_sequences": 2}, r"num_return_sequences > 1 needs beam search or sampling"),
            ({"num_return_sequences": 0}, r"num_return_sequences must be >= 1"),
            ({"num_beams": 2, "num_return_sequences": 3}, r"num_return_sequences must be in \[1, num_beams\]"),
            ({"do_sample": True, "num_return_sequences": 2, "prompt_lookup_num_tokens": 2},
             r"speculative decoding \(assistant_model, prompt_lookup_num_tokens\) does not combine with "
             r"num_return_sequences > 1")):
        with pytest.raises(ValueError, match=message):
            binding.generate([[5, 6, 7]], {"max_new_tokens": 4, **options}, None, 1)
    with pytest.raises(ValueError, match=r"num_return_sequences \(3\) must be between 1 and num_beams \(2\)"):
        s2s._model.generate([[5, 6]], {"decoder_start_token_id": 100, "num_beams": 2, "num_return_sequences": 3})
    tokens, log_probs, stats, reasons, scores = binding.generate(
        [[5, 6, 7]], {"max_new_tokens": 4, "num_beams": 3, "num_return_sequences": 2, "eos_token_ids": []}, None, 1)
    assert len(tokens) == 2 and log_probs is None and stats is None
    assert reasons == ["length", "length"] and len(scores) == 2 and scores[0] >= scores[1]
    tokens, _, _, reasons, scores = binding.generate(
        [[5, 6, 7], [8]], {"max_new_tokens": 4, "do_sample": True, "num_return_sequences": 3, "eos_token_ids": []},
        None, 1)
    assert len(tokens) == 6 and reasons == ["length"] * 6 and scores is None


def test_result_is_a_frozen_dataclass():
    r = cf.GenerationResult(token_ids=[1], text=None, finish_reason="eos", log_probs=[-0.5], score=-0.5)
    assert "GenerationResult" in cf.__all__ and r.finish_reason == "eos"
    with pytest.raises(AttributeError):
        r.score = 0.0  # type: ignore[misc]
