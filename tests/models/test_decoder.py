"""Decoder-only LMs (GPT-2, Llama, Mistral, Qwen2, Qwen3) against Hugging Face transformers on the
same random, seeded weights.

Every model is built once per module from a real config class, saved with save_pretrained and
loaded by cpuformer. Random weights give near-tied next-token logits, so the models are made
peaky (a large initializer_range) and every token-identity test first checks that Hugging Face's
top-2 logit gap at every step exceeds GAP (far above the ~1e-5 numeric difference of two float32
implementations): a mismatch then means a real bug, not a rounding tie.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
GAP = 2e-3  # minimum top-2 logit gap (absolute) a token-identity comparison relies on

# name -> (model class, config class, config kwargs). Sizes exercise vector tails: head dims 16,
# 16, 12, 10, 24 and odd intermediate sizes; GQA in all Llama-family models but one.
SMALL = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=101, n_embd=48, n_layer=2, n_head=3, n_positions=96, initializer_range=0.2,
                  bos_token_id=1, eos_token_id=2)),
    "llama": ("LlamaForCausalLM", "LlamaConfig",
              dict(vocab_size=103, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=37, max_position_embeddings=128, initializer_range=0.2)),
    "llama_tied_linear_rope": ("LlamaForCausalLM", "LlamaConfig",
                               dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=33, max_position_embeddings=128, initializer_range=0.2,
                                    tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama3_rope": ("LlamaForCausalLM", "LlamaConfig",
                    dict(vocab_size=89, hidden_size=60, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=3, intermediate_size=65, max_position_embeddings=128,
                         initializer_range=0.2,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                       "rope_theta": 500000.0})),
    "mistral": ("MistralForCausalLM", "MistralConfig",
                dict(vocab_size=91, hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                     intermediate_size=17, max_position_embeddings=128, sliding_window=8, initializer_range=0.2)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config",
              dict(vocab_size=107, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=33, max_position_embeddings=128, initializer_range=0.2)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config",
              dict(vocab_size=97, hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=24, intermediate_size=29, max_position_embeddings=128, initializer_range=0.2)),
}
NAMES = list(SMALL)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """PyTorch's OpenMP pool and ours spin-wait on the same two cores: with both at two threads,
    alternating calls (a reference generate, then ours) slow each other down a hundredfold on
    these tiny models. The references need no parallelism."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _build(directory, model_class, config_class, seed, **config):
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_class)(**config)
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):  # qkv biases (Qwen2) are zero-initialised: make them count
                p.normal_(0.0, 0.5)
            if name in ("model.norm.weight", "transformer.ln_f.weight"):
                p.mul_(8.0)  # peaky next-token distributions: wide top-2 gaps
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config)) in enumerate(SMALL.items()):
        directory = tmp_path_factory.mktemp(name)
        model = _build(directory, model_class, config_class, seed=10 + i, **config)
        out[name] = (str(directory), model, cf.Generator(directory))
    return out


def _prompt(rng, vocab, n, avoid=()):
    ids = rng.integers(3, vocab, n)
    return [int(t) for t in ids if t not in avoid] or [3]


def _hf_generate(model, prompt, **kwargs):
    """(new tokens, per-step raw logits [steps, V]) from transformers' generate()."""
    ids = torch.tensor([prompt])
    kwargs.setdefault("pad_token_id", 0)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True,
                             output_logits=True, **kwargs)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, torch.stack(out.logits, dim=1)[0].numpy()


def _top2_gap(logits):
    top = np.sort(logits, axis=-1)[..., -2:]
    return float((top[..., 1] - top[..., 0]).min())


def _strip(tokens, eos, pad):
    """HF pads a sequence after its EOS; keep up to and including the first EOS."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


# ---- logits ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(models, name):
    _, model, gen = models[name]
    vocab = SMALL[name][2]["vocab_size"]
    ids = np.random.default_rng(1).integers(0, vocab, (2, 33))
    with torch.inference_mode():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = gen.logits(ids)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.abs(ours - ref).max() <= TOLERANCE * np.abs(ref).max()


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen3"])
def test_left_padded_logits_equal_each_row_alone(models, name):
    _, model, gen = models[name]
    vocab = SMALL[name][2]["vocab_size"]
    rng = np.random.default_rng(2)
    lengths = [7, 1, 17]
    T = max(lengths)
    ids = np.zeros((3, T), dtype=np.int64)
    mask = np.zeros((3, T), dtype=np.int64)
    rows = []
    for b, n in enumerate(lengths):
        row = rng.integers(0, vocab, n)
        ids[b, T - n:] = row
        mask[b, T - n:] = 1
        rows.append(row)
    batched = gen.logits(ids, mask)
    for b, row in enumerate(rows):
        alone = gen.logits(row[None, :])[0]
        assert np.abs(batched[b, T - len(row):] - alone).max() <= TOLERANCE * np.abs(alone).max()
    # Hugging Face with the same positions (cumsum(mask) - 1) agrees at the real tokens
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.inference_mode():
        ref = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions)).logits.numpy()
    real = mask == 1
    assert np.abs(batched[real] - ref[real]).max() <= TOLERANCE * np.abs(ref[real]).max()


# ---- greedy --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_greedy_64_tokens_match_transformers(models, name):
    _, model, gen = models[name]
    prompt = _prompt(np.random.default_rng(3), SMALL[name][2]["vocab_size"], 11)
    ref, logits = _hf_generate(model, prompt, max_new_tokens=64, do_sample=False, eos_token_id=None)
    assert len(ref) == 64 and _top2_gap(logits) > GAP
    ours, log_probs = gen.generate(prompt, max_new_tokens=64, eos_token_id=[], return_log_probs=True)
    assert ours == [ref]
    expected = torch.log_softmax(torch.tensor(logits, dtype=torch.float64), -1).numpy()[np.arange(64), ref]
    np.testing.assert_allclose(log_probs[0], expected, rtol=0, atol=1e-4)


def _clear_prompts(model, vocab, lengths, max_new, attempts=20):
    """Prompts (and HF's greedy continuations) whose top-2 logit gap stays above GAP at every step:
    the first of a fixed series of seeds that gives them all, so the test stays deterministic."""
    for seed in range(attempts):
        rng = np.random.default_rng(100 + seed)
        prompts = [_prompt(rng, vocab, n) for n in lengths]
        refs = [_hf_generate(model, p, max_new_tokens=max_new, do_sample=False, eos_token_id=None) for p in prompts]
        if all(_top2_gap(logits) > GAP for _, logits in refs):
            return prompts, [tokens for tokens, _ in refs]
    raise AssertionError("no prompt set with clear greedy choices; make the test model peakier")


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral"])
def test_padded_batch_equals_each_prompt_alone(models, name):
    _, model, gen = models[name]
    prompts, refs = _clear_prompts(model, SMALL[name][2]["vocab_size"], (5, 1, 13), 24)
    batched = gen.generate(prompts, max_new_tokens=24, eos_token_id=[])
    assert batched == refs
    for prompt, tokens in zip(prompts, batched):
        assert gen.generate([prompt], max_new_tokens=24, eos_token_id=[]) == [tokens]


def test_each_sequence_stops_on_its_own_eos(models):
    _, model, gen = models["llama"]
    rng = np.random.default_rng(5)
    prompts = [_prompt(rng, 103, n) for n in (4, 9)]
    free = gen.generate(prompts, max_new_tokens=20, eos_token_id=[])
    eos = free[0][5]  # the first prompt's 6th token: it stops there
    out = gen.generate(prompts, max_new_tokens=20, eos_token_id=eos)
    for tokens, unconstrained in zip(out, free):
        stop = unconstrained.index(eos) + 1 if eos in unconstrained else 20
        assert tokens == unconstrained[:stop]
    assert len(out[0]) <= 6 and out[0][-1] == eos


def test_eos_min_and_max_new_tokens_match_transformers(models):
    _, model, gen = models["gpt2"]
    prompt = _prompt(np.random.default_rng(6), 101, 6)
    free, _ = _hf_generate(model, prompt, max_new_tokens=30, do_sample=False, eos_token_id=None)
    eos = [free[9], free[4]]  # several EOS ids: the first one produced stops
    stop = min(free.index(e) for e in eos) + 1
    ref, logits = _hf_generate(model, prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    assert _top2_gap(logits) > GAP
    assert gen.generate(prompt, max_new_tokens=30, eos_token_id=eos) == [_strip(ref, eos, 0)] == [free[:stop]]
    # min_new_tokens forbids EOS before it
    ref, logits = _hf_generate(model, prompt, max_new_tokens=30, min_new_tokens=12, do_sample=False,
                               eos_token_id=eos)
    ours = gen.generate(prompt, max_new_tokens=30, min_new_tokens=12, eos_token_id=eos)
    assert ours == [_strip(ref, eos, 0)] and len(ours[0]) >= 12
    assert gen.generate(prompt, max_new_tokens=7, eos_token_id=[]) == [free[:7]]


def test_default_eos_comes_from_generation_config(models, tmp_path):
    directory, _, gen = models["gpt2"]
    assert gen.eos_token_ids == [2]
    free = gen.generate([5, 6, 7], max_new_tokens=20, eos_token_id=[])[0]
    eos = free[4]
    with open(os.path.join(directory, "generation_config.json")) as f:
        generation = json.load(f)
    generation["eos_token_id"] = [eos, 2]
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in os.listdir(directory):
        if file != "generation_config.json":
            os.symlink(os.path.join(directory, file), copy / file)
    with open(copy / "generation_config.json", "w") as f:
        json.dump(generation, f)
    other = cf.Generator(copy)
    assert other.eos_token_ids == [eos, 2]
    assert other.generate([5, 6, 7], max_new_tokens=20) == [free[:free.index(eos) + 1]]
    generation["eos_token_id"] = 101
    with open(copy / "generation_config.json", "w") as f:
        json.dump(generation, f)
    with pytest.raises(ValueError, match=r"the default eos_token_id 101 \(from generation_config.json\) is out of "
                                         r"range; token ids must be in \[0, 101\)"):
        cf.Generator(copy).generate([5, 6, 7])


def test_repetition_penalty_matches_transformers(models):
    _, model, gen = models["llama"]
    prompt = _prompt(np.random.default_rng(7), 103, 9)
    ref, logits = _hf_generate(model, prompt, max_new_tokens=32, do_sample=False, eos_token_id=None,
                               repetition_penalty=1.7)
    ours = gen.generate(prompt, max_new_tokens=32, eos_token_id=[], repetition_penalty=1.7)
    assert ours == [ref]
    assert ours != gen.generate(prompt, max_new_tokens=32, eos_token_id=[])


# ---- sampling ----------------------------------------------------------------------------------

def test_sampling_is_reproducible_and_top_k_1_is_greedy(models):
    _, _, gen = models["qwen2"]
    prompts = [[5, 9, 11], [7]]
    kwargs = dict(max_new_tokens=40, do_sample=True, eos_token_id=[], temperature=1.5)
    a = gen.generate(prompts, seed=123, **kwargs)
    assert a == gen.generate(prompts, seed=123, **kwargs)
    assert a != gen.generate(prompts, seed=124, **kwargs)
    greedy = gen.generate(prompts, max_new_tokens=40, eos_token_id=[])
    assert a != greedy
    assert gen.generate(prompts, seed=5, max_new_tokens=40, do_sample=True, top_k=1, eos_token_id=[]) == greedy
    assert gen.generate(prompts, seed=5, max_new_tokens=40, do_sample=True, top_p=1e-6, eos_token_id=[]) == greedy
    tokens, log_probs = gen.generate(prompts, seed=9, max_new_tokens=40, do_sample=True, top_k=3,
                                     return_log_probs=True, eos_token_id=[])
    # top_k=3: every chosen token is among the 3 most likely, and its probability is renormalised over them
    assert all(lp > np.log(1e-9) for row in log_probs for lp in row)
    logits = gen.logits(np.array([prompts[0] + tokens[0]]))[0]
    for step, token in enumerate(tokens[0]):
        row = logits[len(prompts[0]) - 1 + step]
        top3 = np.argsort(row)[-3:]
        assert token in top3
        z = row[top3].astype(np.float64)
        expected = row[token] - (z.max() + np.log(np.exp(z - z.max()).sum()))
        assert abs(log_probs[0][step] - expected) < 1e-3


def test_top_p_keeps_the_nucleus(models):
    _, _, gen = models["llama"]
    prompt = [4, 8, 15, 16, 23, 42]
    tokens = gen.generate(prompt, seed=1, max_new_tokens=30, do_sample=True, top_p=0.6, eos_token_id=[])[0]
    logits = gen.logits(np.array([prompt + tokens]))[0]
    for step, token in enumerate(tokens):
        row = logits[len(prompt) - 1 + step].astype(np.float64)
        p = np.exp(row - row.max())
        p /= p.sum()
        # the token is in the smallest set of most likely tokens whose mass reaches 0.6
        assert p[p > p[token]].sum() < 0.6 + 1e-6


# ---- beam search ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_beam_search_matches_transformers(models, name):
    _, model, gen = models[name]
    prompt = _prompt(np.random.default_rng(8), SMALL[name][2]["vocab_size"], 7)
    ref, _ = _hf_generate(model, prompt, max_new_tokens=16, num_beams=4, do_sample=False, eos_token_id=None)
    assert gen.generate(prompt, max_new_tokens=16, num_beams=4, eos_token_id=[]) == [ref]


@pytest.mark.parametrize("early_stopping", [False, True, "never"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0, -1.0])
def test_beam_search_with_eos_matches_transformers(models, early_stopping, length_penalty):
    _, model, gen = models["gpt2"]
    prompt = _prompt(np.random.default_rng(9), 101, 5)
    free, _ = _hf_generate(model, prompt, max_new_tokens=24, num_beams=3, do_sample=False, eos_token_id=None)
    eos = [free[6], free[2]]
    kwargs = dict(max_new_tokens=24, num_beams=3, eos_token_id=eos, length_penalty=length_penalty,
                  early_stopping=early_stopping)
    ref, _ = _hf_generate(model, prompt, do_sample=False, **kwargs)
    assert gen.generate(prompt, **kwargs) == [_strip(ref, eos, 0)]


def test_beam_search_with_min_new_tokens_and_repetition_penalty_matches_transformers(models):
    _, model, gen = models["qwen2"]
    prompt = _prompt(np.random.default_rng(12), 107, 6)
    free, _ = _hf_generate(model, prompt, max_new_tokens=20, num_beams=4, do_sample=False, eos_token_id=None)
    eos = [free[1]]
    kwargs = dict(max_new_tokens=20, min_new_tokens=6, num_beams=4, eos_token_id=eos, repetition_penalty=1.4)
    ref, _ = _hf_generate(model, prompt, do_sample=False, **kwargs)
    ours = gen.generate(prompt, **kwargs)
    assert ours == [_strip(ref, eos, 0)] and len(ours[0]) >= 6


def test_beam_search_batch_equals_each_prompt_alone(models):
    _, _, gen = models["llama"]
    rng = np.random.default_rng(10)
    prompts = [_prompt(rng, 103, n) for n in (3, 10)]
    kwargs = dict(max_new_tokens=12, num_beams=4, eos_token_id=[7, 9])
    batched = gen.generate(prompts, **kwargs)
    assert batched == [gen.generate(p, **kwargs)[0] for p in prompts]


# ---- streaming and text --------------------------------------------------------------------------

def test_stream_yields_the_generated_tokens(models):
    _, _, gen = models["qwen3"]
    prompt = [3, 1, 4, 1, 5]
    expected = gen.generate(prompt, max_new_tokens=25, eos_token_id=[])[0]
    assert list(gen.stream(prompt, max_new_tokens=25, eos_token_id=[])) == expected
    seen = gen.stream(prompt, max_new_tokens=25, do_sample=True, seed=3, eos_token_id=[])
    assert list(seen) == gen.generate(prompt, max_new_tokens=25, do_sample=True, seed=3, eos_token_id=[])[0]
    with pytest.raises(ValueError, match="stream\\(\\) takes one prompt, got 2"):
        gen.stream([[1, 2], [3]])


@pytest.fixture(scope="module")
def with_tokenizer(models, tmp_path_factory):
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models

    directory = tmp_path_factory.mktemp("llama_tok")
    source, _, _ = models["llama"]
    for file in os.listdir(source):
        os.symlink(os.path.join(source, file), directory / file)
    vocab = {f"t{i}": i for i in range(103)}
    tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    tokenizer.save(str(directory / "tokenizer.json"))
    return cf.Generator(directory)


def test_strings_in_strings_out(with_tokenizer):
    gen = with_tokenizer
    ids = gen.generate([5, 6, 7], max_new_tokens=10, eos_token_id=[])[0]
    text = " ".join(f"t{i}" for i in ids)
    assert gen.generate("t5 t6 t7", max_new_tokens=10, eos_token_id=[]) == text
    assert gen.generate(["t5 t6 t7", "t9"], max_new_tokens=10, eos_token_id=[])[0] == text
    pieces = list(gen.stream("t5 t6 t7", max_new_tokens=10, eos_token_id=[]))
    assert len(pieces) == 10 and "".join(pieces).split() == text.split()


# ---- loading, errors -----------------------------------------------------------------------------

def test_load_returns_a_generator(models):
    directory, _, _ = models["mistral"]
    gen = cf.load(directory)
    assert isinstance(gen, cf.Generator)
    assert "MistralForCausalLM" in repr(gen)
    gen.close()
    with pytest.raises(ValueError, match="this Generator is closed"):
        gen.generate([1, 2])


def test_rope_inv_freq_matches_transformers():
    from cpuformer.arch.native import rope_inv_freq

    for name in ("llama", "llama_tied_linear_rope", "llama3_rope"):
        cfg = transformers.LlamaConfig(**SMALL[name][2])
        rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        ours = rope_inv_freq(cfg.to_dict(), head_dim)
        np.testing.assert_allclose(ours, rotary.inv_freq.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="unknown rope_scaling type 'yarn'"):
        rope_inv_freq({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, 16)
    with pytest.raises(ValueError, match="unknown rope_scaling type 'dynamic'"):
        rope_inv_freq({"rope_parameters": {"type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, 16)


def _with_config(src, dst, **changes):
    os.makedirs(dst)
    for file in os.listdir(src):
        if file != "config.json":
            os.symlink(os.path.join(src, file), os.path.join(dst, file))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return str(dst)


def test_unknown_rope_scaling_type_is_refused_at_load(models, tmp_path):
    directory, _, _ = models["llama"]
    bad = _with_config(directory, tmp_path / "bad",
                       rope_parameters={"rope_type": "longrope", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="unknown rope_scaling type 'longrope'"):
        cf.Generator(bad)


def test_bad_input_raises_clear_errors(models):
    _, _, gen = models["llama"]
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        gen.generate([[]])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        gen.generate([[1], []])
    with pytest.raises(ValueError, match="prompts is empty"):
        gen.generate([])
    with pytest.raises(ValueError, match=r"prompt length 100 \+ max_new_tokens 29 exceeds the model's maximum of "
                                         r"128 tokens \(max_position_embeddings\)"):
        gen.generate([1] * 100, max_new_tokens=29)
    with pytest.raises(ValueError, match="temperature must be > 0 when sampling, got 0.0"):
        gen.generate([1], do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="temperature must be > 0 when sampling, got -1.0"):
        gen.generate([1], do_sample=True, temperature=-1)
    for top_p in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
            gen.generate([1], do_sample=True, top_p=top_p)
    with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
        gen.generate([1], do_sample=True, top_k=-1)
    with pytest.raises(ValueError, match="num_beams must be an integer >= 1, got 0"):
        gen.generate([1], num_beams=0)
    for penalty in (0.0, -1.0):
        with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
            gen.generate([1], repetition_penalty=penalty)
    with pytest.raises(ValueError, match=r"eos_token_id 103 is out of range; token ids must be in \[0, 103\)"):
        gen.generate([1], eos_token_id=103)
    with pytest.raises(ValueError, match=r"eos_token_id -1 is out of range"):
        gen.generate([1], eos_token_id=[2, -1])
    with pytest.raises(ValueError, match=r"token id 103 is out of range; token ids must be in \[0, 103\)"):
        gen.generate([1, 103])
    with pytest.raises(ValueError, match=r"token id -5 is out of range"):
        gen.logits(np.array([[1, -5]]))
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        gen.generate([1], max_new_tokens=-1)
    with pytest.raises(ValueError, match="early_stopping must be False, True or 'never'"):
        gen.generate([1], num_beams=2, early_stopping="sometimes")
    with pytest.raises(NotImplementedError, match="beam sampling"):
        gen.generate([1], num_beams=2, do_sample=True)
    with pytest.raises(TypeError, match="prompt 0 must hold integer token ids, got float 1.5"):
        gen.generate([[1.5]])
    with pytest.raises(TypeError, match="input_ids must hold integers, got dtype float32"):
        gen.logits(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="prompts must hold integer token ids, got dtype float64"):
        gen.generate(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"has no tokenizer \(tokenizer.json or SentencePiece model\)"):
        gen.generate("hello")
    with pytest.raises(ValueError, match=r"sequence length 129 exceeds the model's maximum of 128"):
        gen.logits(np.ones((1, 129), dtype=np.int64))
    with pytest.raises(ValueError, match="attention_mask entries must be 0 \\(padding\\) or 1 \\(token\\)"):
        gen.logits(np.ones((1, 3), dtype=np.int64), np.full((1, 3), 2))
    assert gen.generate([1, 2], max_new_tokens=0) == [[]]


def test_bad_constructor_arguments(models):
    directory, _, _ = models["gpt2"]
    with pytest.raises(TypeError, match="dtype must be None or a string"):
        cf.Generator(directory, dtype=np.float32)
    with pytest.raises(ValueError, match="dtype must be one of 'float32', 'float16', 'bfloat16', 'int8'"):
        cf.Generator(directory, dtype="float64")
    with pytest.raises(ValueError, match="num_threads must be an integer >= 1 or None, got 0"):
        cf.Generator(directory, num_threads=0)


# ---- GPT-2 124M shape ----------------------------------------------------------------------------

def test_gpt2_124m_shape(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(initializer_range=0.1, n_positions=256)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(tmp_path)
    gen = cf.Generator(tmp_path, num_threads=2)
    ids = np.random.default_rng(11).integers(0, cfg.vocab_size, (1, 9))
    with torch.inference_mode():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = gen.logits(ids)
    assert np.abs(ours - ref).max() <= TOLERANCE * np.abs(ref).max()
    prompt = ids[0, :4].tolist()
    hf, logits = _hf_generate(model, prompt, max_new_tokens=4, do_sample=False, eos_token_id=None)
    assert _top2_gap(logits) > GAP
    assert gen.generate(prompt, max_new_tokens=4, eos_token_id=[]) == [hf]
