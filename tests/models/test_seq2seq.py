"""Encoder-decoder models (Marian, BART, mBART, T5 v1.0, T5 v1.1 / flan-T5 style, mT5) against
Hugging Face transformers on the same random, seeded weights.

Every model is built once per module from a real config class, saved with save_pretrained and
loaded by cpuformer. Random weights give near-tied next-token logits, so the decoders are made
peaky (the norm feeding the head is scaled up) and every token-identity test checks that the
top-2 gap of the scores that decided each token exceeds GAP (far above the ~1e-5 numeric
difference of two float32 implementations): a mismatch then means a real bug, not a rounding tie.
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
GAP = 2e-3

_BART_SIZES = dict(d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=67, decoder_ffn_dim=67, max_position_embeddings=64,
                   init_std=0.1)
# name -> (model class, config class, config kwargs, the parameter scaled to make outputs peaky)
SMALL = {
    "marian": ("MarianMTModel", "MarianConfig",
               dict(vocab_size=101, pad_token_id=100, decoder_start_token_id=100, eos_token_id=0, **_BART_SIZES),
               "model.decoder.layers.1.final_layer_norm.weight"),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(vocab_size=97, **_BART_SIZES),
             "model.decoder.layers.1.final_layer_norm.weight"),
    "mbart": ("MBartForConditionalGeneration", "MBartConfig",
              dict(vocab_size=103, scale_embedding=True, **_BART_SIZES),
              "model.decoder.layer_norm.weight"),
    "t5": ("T5ForConditionalGeneration", "T5Config",
           dict(vocab_size=99, d_model=40, d_kv=12, d_ff=65, num_layers=2, num_heads=4, decoder_start_token_id=0,
                relative_attention_num_buckets=16, relative_attention_max_distance=20),
           "decoder.final_layer_norm.weight"),
    "t5_gated": ("T5ForConditionalGeneration", "T5Config",
                 dict(vocab_size=95, d_model=32, d_kv=8, d_ff=47, num_layers=2, num_heads=3, decoder_start_token_id=0,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      relative_attention_num_buckets=16, relative_attention_max_distance=20),
                 "decoder.final_layer_norm.weight"),
    "mt5": ("MT5ForConditionalGeneration", "MT5Config",
            dict(vocab_size=93, d_model=32, d_kv=16, d_ff=33, num_layers=2, num_heads=2, decoder_start_token_id=0,
                 relative_attention_num_buckets=16, relative_attention_max_distance=20),
            "decoder.final_layer_norm.weight"),
}
NAMES = list(SMALL)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """PyTorch's OpenMP pool and ours spin-wait on the same cores: alternating calls (a reference,
    then ours) would slow each other down. The references need no parallelism."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# generation_config.json settings (transformers 5 keeps generation parameters out of config.json)
GENERATION = {"mbart": dict(forced_bos_token_id=7)}


def _build(directory, model_class, config_class, config, peaky, seed, generation=None):
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    for key, value in (generation or {}).items():
        setattr(model.generation_config, key, value)
    with torch.no_grad():
        params = dict(model.named_parameters())
        params[peaky].mul_(8.0)
        if "final_logits_bias" in dict(model.named_buffers()):
            model.final_logits_bias.normal_(0.0, 1.0)
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config, peaky)) in enumerate(SMALL.items()):
        directory = tmp_path_factory.mktemp(name)
        model = _build(directory, model_class, config_class, config, peaky, seed=20 + i,
                       generation=GENERATION.get(name))
        out[name] = (str(directory), model, cf.load(directory))
    return out


def _vocab(name):
    return SMALL[name][2]["vocab_size"]


def _source(rng, vocab, n):
    return [int(t) for t in rng.integers(3, vocab - 2, n)]


def _padded(sources, pad):
    T = max(len(s) for s in sources)
    ids = np.full((len(sources), T), pad, dtype=np.int64)
    mask = np.zeros((len(sources), T), dtype=np.int64)
    for i, s in enumerate(sources):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def _hf_generate(model, sources, **kwargs):
    """(new tokens per returned sequence, processed scores per step [steps, rows, V])."""
    ids, mask = _padded(sources, model.config.pad_token_id or 0)
    with torch.inference_mode():
        out = model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), return_dict_in_generate=True,
                             output_scores=True, **kwargs)
    return out.sequences[:, 1:].tolist(), torch.stack(out.scores, dim=0).numpy()


def _strip(tokens, eos, pad):
    """HF pads a sequence after its EOS; keep up to and including the first EOS."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos:
            break
    return out


def _eos(model):
    e = model.generation_config.eos_token_id
    return set(e if isinstance(e, list) else [e])


def _top2_gap(scores):
    finite = np.where(np.isfinite(scores), scores, -1e30)
    top = np.sort(finite, axis=-1)[..., -2:]
    return float((top[..., 1] - top[..., 0]).min())


# ---- encoder output and logits ------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_encoder_and_logits_match_transformers(models, name):
    _, model, s2s = models[name]
    assert isinstance(s2s, cf.Seq2Seq)
    rng = np.random.default_rng(1)
    V = _vocab(name)
    sources = [_source(rng, V, n) for n in (17, 5, 11)]
    ids, mask = _padded(sources, 1)
    tgt = rng.integers(3, V, size=(3, 7))
    with torch.inference_mode():
        enc_ref = model.get_encoder()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        enc_ref = enc_ref.last_hidden_state.numpy()
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    enc = s2s.encode(ids, mask)
    assert enc.shape == enc_ref.shape and enc.dtype == np.float32
    # padded positions of the encoder output carry no meaning; compare the tokens
    keep = mask.astype(bool)
    assert np.abs(enc - enc_ref)[keep].max() <= TOLERANCE * np.abs(enc_ref[keep]).max()
    out = s2s.logits(ids, tgt, mask)
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() <= TOLERANCE * np.abs(ref).max()
    # no mask = all tokens
    with torch.inference_mode():
        ref1 = model(input_ids=torch.tensor(ids[:1]), decoder_input_ids=torch.tensor(tgt[:1])).logits.numpy()
    out1 = s2s.logits(ids[:1].tolist(), tgt[:1].tolist())
    assert np.abs(out1 - ref1).max() <= TOLERANCE * np.abs(ref1).max()


def test_relative_buckets_beyond_max_distance(models):
    """T5 sources longer than max_distance (20) reach the logarithmic and the clamped buckets."""
    _, model, s2s = models["t5"]
    rng = np.random.default_rng(2)
    ids = rng.integers(3, _vocab("t5"), size=(2, 65))
    tgt = rng.integers(3, _vocab("t5"), size=(2, 33))
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor(ids), decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    out = s2s.logits(ids, tgt)
    assert np.abs(out - ref).max() <= TOLERANCE * np.abs(ref).max()


# ---- generation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_greedy_identical(models, name):
    _, model, s2s = models[name]
    rng = np.random.default_rng(3)
    source = _source(rng, _vocab(name), 13)
    tokens, scores = _hf_generate(model, [source], max_new_tokens=40, min_new_tokens=34, do_sample=False,
                                  num_beams=1)
    assert _top2_gap(scores) > GAP
    expected = _strip(tokens[0], _eos(model), None)
    assert len(expected) >= 34
    assert s2s.generate(source, max_new_tokens=40, min_new_tokens=34) == [expected]


@pytest.mark.parametrize("name", NAMES)
def test_beam_search_identical(models, name):
    _, model, s2s = models[name]
    rng = np.random.default_rng(4)
    sources = [_source(rng, _vocab(name), n) for n in (9, 14)]
    kwargs = dict(max_new_tokens=36, min_new_tokens=32, num_beams=4, length_penalty=1.3, early_stopping=False)
    for source in sources:
        tokens, _ = _hf_generate(model, [source], do_sample=False, **kwargs)
        expected = _strip(tokens[0], _eos(model), None)
        # the chosen path's next-token scores are far from ties at every step
        tgt = np.array([[s2s.decoder_start_token_id] + expected[:-1]])
        logits = s2s.logits([source], tgt)[0]
        assert _top2_gap(logits) > GAP
        assert len(expected) >= 32
        assert s2s.generate(source, **kwargs) == [expected]


def test_beam_search_return_sequences_and_early_stopping(models):
    _, model, s2s = models["marian"]
    rng = np.random.default_rng(5)
    source = _source(rng, _vocab("marian"), 10)
    for early in (True, False, "never"):
        kwargs = dict(max_new_tokens=12, num_beams=4, num_return_sequences=3, early_stopping=early,
                      length_penalty=0.7)
        tokens, _ = _hf_generate(model, [source], do_sample=False, **kwargs)
        expected = [_strip(t, _eos(model), None) for t in tokens]
        assert s2s.generate(source, **kwargs) == expected


@pytest.mark.parametrize("name", ["marian", "t5"])
def test_padded_batch_matches_one_by_one_and_transformers(models, name):
    _, model, s2s = models[name]
    rng = np.random.default_rng(6)
    sources = [_source(rng, _vocab(name), n) for n in (4, 19, 1, 11)]
    for kwargs in (dict(max_new_tokens=20), dict(max_new_tokens=16, num_beams=3)):
        batched = s2s.generate(sources, **kwargs)
        assert batched == [s2s.generate(s, **kwargs)[0] for s in sources]
        tokens, _ = _hf_generate(model, sources, do_sample=False, **kwargs)
        assert batched == [_strip(t, _eos(model), None) for t in tokens]


def test_processors_match_transformers(models):
    """repetition_penalty, no_repeat_ngram_size and the config's forced BOS token (mBART)."""
    for name, kwargs in (("bart", dict(repetition_penalty=1.7)), ("t5", dict(no_repeat_ngram_size=2)),
                         ("marian", dict(no_repeat_ngram_size=3, repetition_penalty=1.3)), ("mbart", {})):
        _, model, s2s = models[name]
        rng = np.random.default_rng(7)
        source = _source(rng, _vocab(name), 8)
        tokens, scores = _hf_generate(model, [source], max_new_tokens=24, do_sample=False, **kwargs)
        assert _top2_gap(scores) > GAP
        expected = _strip(tokens[0], _eos(model), None)
        if name == "mbart":
            assert expected[0] == 7
        assert s2s.generate(source, max_new_tokens=24, **kwargs) == [expected]


def test_forced_eos_at_max_length(models):
    _, model, s2s = models["marian"]  # generation_config: forced_eos_token_id = eos = 0
    assert model.generation_config.forced_eos_token_id == 0
    out = s2s.generate([5, 6, 7], max_new_tokens=6, min_new_tokens=0)
    assert len(out[0]) <= 6 and out[0][-1] == 0


def test_sampling_reproducible(models):
    _, _, s2s = models["t5_gated"]
    a = s2s.generate([[4, 5, 6], [7, 8]], do_sample=True, top_k=5, top_p=0.9, temperature=0.8, seed=3,
                     max_new_tokens=10)
    b = s2s.generate([[4, 5, 6], [7, 8]], do_sample=True, top_k=5, top_p=0.9, temperature=0.8, seed=3,
                     max_new_tokens=10)
    assert a == b and all(0 <= t < _vocab("t5_gated") for row in a for t in row)
    tokens, log_probs = s2s.generate([4, 5, 6], max_new_tokens=5, return_log_probs=True)
    assert len(log_probs[0]) == len(tokens[0]) and all(lp <= 0 for lp in log_probs[0])


def test_text_in_text_out(models, tmp_path):
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    directory, _, s2s = models["bart"]
    V = _vocab("bart")
    tokenizer = Tokenizer(tok_models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t3"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    text_model = cf.Seq2Seq(directory)
    ids = [tokenizer.token_to_id(w) for w in "t5 t9 t12".split()]
    expected = tokenizer.decode(text_model.generate(ids, max_new_tokens=6)[0], skip_special_tokens=True)
    assert text_model.generate("t5 t9 t12", max_new_tokens=6) == expected
    assert text_model.generate(["t5 t9 t12"], max_new_tokens=6) == [expected]
    # stream(): text pieces joining to generate()'s text (greedy, beams at the end, seeded sampling)
    for options in ({}, {"num_beams": 3}, {"do_sample": True, "seed": 4, "top_k": 8}, {"stop": "t2"}):
        text = text_model.generate("t5 t9 t12", max_new_tokens=10, **options)
        stream = text_model.stream("t5 t9 t12", max_new_tokens=10, **options)
        assert stream.finish_reason is None and stream.num_tokens == 0
        assert "".join(stream) == text
        result = text_model.generate("t5 t9 t12", max_new_tokens=10, return_scores=True, **options)[0]
        assert stream.finish_reason == result.finish_reason
        if "stop" not in options:
            assert stream.num_tokens == len(result.token_ids)
    tokens = list(text_model.stream(ids, max_new_tokens=6))
    assert tokens == text_model.generate(ids, max_new_tokens=6)[0]
    with pytest.raises(ValueError, match="stream\\(\\) takes one source, got 2"):
        text_model.stream(["t5", "t9"])
    with pytest.raises(TypeError, match="return_scores is for generate\\(\\)"):
        text_model.stream("t5", return_scores=True)
    with pytest.raises(TypeError, match="stream\\(\\) got unexpected keyword arguments \\['bogus'\\]"):
        text_model.stream("t5", bogus=1)
    os.remove(os.path.join(directory, "tokenizer.json"))


def test_base_shape_marian(tmp_path):
    """d_model 512, 6 + 6 layers, 8 heads, ffn 2048 (Marian base; small vocabulary)."""
    config = dict(vocab_size=1001, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                  decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                  max_position_embeddings=128, pad_token_id=1000, decoder_start_token_id=1000, eos_token_id=0,
                  init_std=0.05)
    model = _build(tmp_path, "MarianMTModel", "MarianConfig", config,
                   "model.decoder.layers.5.final_layer_norm.weight", seed=99)
    s2s = cf.Seq2Seq(tmp_path, num_threads=2)
    rng = np.random.default_rng(8)
    sources = [_source(rng, 1001, n) for n in (24, 15)]
    ids, mask = _padded(sources, 1000)
    tgt = rng.integers(3, 1000, size=(2, 9))
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    out = s2s.logits(ids, tgt, mask)
    assert np.abs(out - ref).max() <= TOLERANCE * np.abs(ref).max()
    tokens, scores = _hf_generate(model, sources[:1], max_new_tokens=34, min_new_tokens=32, do_sample=False)
    assert _top2_gap(scores) > GAP
    assert s2s.generate(sources[0], max_new_tokens=34, min_new_tokens=32) == [_strip(tokens[0], {0}, None)]


# ---- errors -------------------------------------------------------------------------------------

def test_errors(models, tmp_path):
    directory, _, s2s = models["marian"]
    V = _vocab("marian")
    with pytest.raises(ValueError, match=r"source 0 has 65 tokens; the model allows at most 64"):
        s2s.generate([[5] * 65])
    with pytest.raises(ValueError, match=r"source length 65 exceeds the model's maximum of 64"):
        s2s.encode([[5] * 65])
    with pytest.raises(ValueError, match=r"max_new_tokens 64 exceeds the model's maximum of 64 target tokens"):
        s2s.generate([5, 6], max_new_tokens=64)
    with pytest.raises(ValueError, match=r"decoder_input_ids must have shape \[batch, target_len\] with batch 2"):
        s2s.logits([[5, 6], [7, 8]], [[1, 2, 3]])
    with pytest.raises(ValueError, match=r"decoder_input_ids must have 2 dimensions"):
        s2s.logits([[5, 6]], np.zeros((1, 2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"decoder_input_ids length 65 exceeds"):
        s2s.logits([[5, 6]], [[1] * 65])
    with pytest.raises(ValueError, match=r"decoder_input_ids: token id 101 is out of range"):
        s2s.logits([[5, 6]], [[1, V]])
    with pytest.raises(ValueError, match=r"num_return_sequences \(5\) must be between 1 and num_beams \(4\)"):
        s2s.generate([5, 6], num_beams=4, num_return_sequences=5)
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size must be an integer >= 0"):
        s2s.generate([5, 6], no_repeat_ngram_size=-1)
    with pytest.raises(ValueError, match=r"attention_mask row 1 has no token"):
        s2s.encode([[5, 6], [7, 8]], [[1, 1], [0, 0]])
    with pytest.raises(ValueError, match=r"source token ids: token id 101 is out of range"):
        s2s.generate([5, V])
    with pytest.raises(ValueError, match="dtype must be one of 'float32', 'float16', 'bfloat16', 'int8', 'int4'"):
        cf.Seq2Seq(directory, dtype="int2")

    def variant(name, **changes):
        src, _, _ = models[name]
        dst = tmp_path / f"{name}_{len(os.listdir(tmp_path))}"
        dst.mkdir()
        for f in os.listdir(src):
            if f != "config.json":
                os.symlink(os.path.join(src, f), dst / f)
        with open(os.path.join(src, "config.json")) as f:
            config = json.load(f)
        config.update(changes)
        with open(dst / "config.json", "w") as f:
            json.dump(config, f)
        return dst

    with pytest.raises(NotImplementedError, match=r"feed_forward_proj 'gated-swirl' is not supported"):
        cf.load(variant("t5", feed_forward_proj="gated-swirl"))
    with pytest.raises(NotImplementedError, match=r"activation_function 'tanh' is not supported"):
        cf.load(variant("bart", activation_function="tanh"))
    with pytest.raises(NotImplementedError, match=r"share_encoder_decoder_embeddings=false"):
        cf.load(variant("marian", share_encoder_decoder_embeddings=False))
    with pytest.raises(NotImplementedError, match=r"encoder_attention_heads != decoder_attention_heads"):
        cf.load(variant("bart", decoder_attention_heads=2))
    s2s2 = cf.load(variant("t5"))
    s2s2.close()
    with pytest.raises(ValueError, match="this Seq2Seq is closed"):
        s2s2.generate([5, 6])


def test_repr_and_load(models):
    _, _, s2s = models["t5_gated"]
    assert repr(s2s).startswith("Seq2Seq(T5ForConditionalGeneration, layers=2+2, d_model=32, heads=3, dtype=float32, "
                                "parameters=")
    assert s2s.max_positions is None and models["bart"][2].max_positions == 64


def test_model_classes_refuse_other_kinds(tmp_path):
    import json
    import shutil

    import numpy as np

    from cpuformer._model_dir import save_safetensors

    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    save_safetensors(d / "model.safetensors", {"x": np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel is a decoder \(causal LM\) architecture; "
                                         r"open it with cpuformer.Generator or cpuformer.load"):
        cf.Seq2Seq(d)
    b = tmp_path / "bert"
    shutil.copytree(d, b)
    (b / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    with pytest.raises(ValueError, match=r"BertModel is an encoder architecture; "
                                         r"open it with cpuformer.Encoder or cpuformer.load"):
        cf.Generator(b)
