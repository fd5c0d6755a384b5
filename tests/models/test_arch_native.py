"""The C++ architecture registry (csrc/models/arch/) as the Python package sees it: the families
declared there, their config.json rules with the Python config readers' messages, and the RoPE
frequencies."""

import math
import re

import numpy as np
import pytest

import cpuformer.arch as arch
from cpuformer import _core
from cpuformer._model_dir import config_float, config_int
from cpuformer.arch.native import DECODERS, NativeArch, rope_inv_freq

NATIVE = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")


def test_the_decoder_families_come_from_the_cpp_registry():
    families = {info["family"]: info for info in _core.arch_families()}
    assert set(NATIVE) <= set(families)
    by_family = arch.by_family()
    for name in NATIVE:
        assert isinstance(by_family[name], NativeArch)
        assert by_family[name].kind == "decoder"
    assert [a.family for a in DECODERS] == list(NATIVE)
    gpt2 = by_family["gpt2"]
    assert gpt2.architectures == ("GPT2LMHeadModel", "GPT2Model")
    assert gpt2.prefixes == ("transformer.", "")
    assert gpt2.example == {"activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    assert arch.find({"architectures": ["Qwen3ForCausalLM"]})[0].family == "qwen3"
    assert arch.find({"model_type": "phi3"})[0].family == "phi3"


def test_hparams_and_tensors():
    llama = arch.by_family()["llama"]
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "intermediate_size": 96, "vocab_size": 100, "rms_norm_eps": 1e-5}
    hp = llama.hparams(config)
    assert (hp.hidden_size, hp.num_heads, hp.num_kv_heads, hp.head_dim, hp.norm, hp.activation) == \
        (64, 4, 2, 16, "rms", "silu")
    assert hp.max_positions == 2048 and not hp.tie_word_embeddings and hp.gated_ffn and hp.positions == "rope"
    layer = llama.layer_tensors(hp, "decoder", 1)
    assert layer["attn.q"] == arch.Tensor("model.layers.1.self_attn.q_proj.weight")
    assert layer["attn.q.bias"] == arch.Tensor("model.layers.1.self_attn.q_proj.bias", optional=True)
    stack = llama.stack_tensors(config, hp, "decoder")
    assert stack["rope.inv_freq"].dtype == np.float32 and stack["rope.inv_freq"].shape == (8,)
    gpt2 = arch.by_family()["gpt2"]
    ghp = gpt2.hparams({"n_embd": 48, "n_head": 4, "n_layer": 1})
    q = gpt2.layer_tensors(ghp, "decoder", 0)["attn.k"]
    assert q == arch.Tensor("h.0.attn.c_attn.weight", transpose=True, rows=(48, 96))
    gemma = arch.by_family()["gemma"]
    ghp = gemma.hparams(dict(config, head_dim=16))
    assert ghp.embed_scale == float(np.float32(math.sqrt(64))) and ghp.activation == "gelu_tanh"
    assert gemma.layer_tensors(ghp, "decoder", 0)["attn_norm"].plus_one


def test_unknown_family_and_part():
    with pytest.raises(ValueError, match="unknown architecture family 'nope'"):
        _core.arch_hparams("nope", {})
    hp = arch.by_family()["gpt2"].hparams({}).as_dict()
    with pytest.raises(ValueError, match="part must be 'model', 'stack' or 'layer'"):
        _core.arch_tensors("gpt2", "head", {}, hp)
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        arch.by_family()["gpt2"].hparams([])
    with pytest.raises(TypeError, match="is not a JSON value"):
        _core.arch_hparams("gpt2", {"n_head": object()})


# Values a config.json can hold, for the message comparisons (the C++ messages must read as the
# Python readers' do: same key, range and repr of the value).
ODD_VALUES = [-3, 0, 2.5, -3.0, "abc", "it's", 'say "x"', "tab\there", "\x01", True, False, [1, 2], {"a": 1},
              [list(range(20))], {"k%d" % i: i for i in range(6)}, [[[[1]]]], 1e300, 10 ** 30, -10 ** 30,
              float("nan"), float("inf"), 1e-7, 123456789.0, "x" * 300, 2 ** 31 + 1, 1e16, 1e15]


def _message(fn, *args, **kwargs):
    with pytest.raises((ValueError, NotImplementedError)) as info:
        fn(*args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize("value", ODD_VALUES, ids=repr)
def test_integer_messages_match_the_python_readers(value):
    config = {"n_head": value}
    try:
        expected = config_int(config, "n_head", default=12, aliases=("num_attention_heads",))
    except ValueError as error:
        assert _message(_core.arch_hparams, "gpt2", config) == str(error)
    else:
        if expected and 768 % expected == 0:
            assert _core.arch_hparams("gpt2", config)["num_heads"] == expected


@pytest.mark.parametrize("value", ODD_VALUES, ids=repr)
def test_float_messages_match_the_python_readers(value):
    config = {"layer_norm_epsilon": value}
    try:
        expected = config_float(config, "layer_norm_epsilon", default=1e-5, minimum=0.0)
    except ValueError as error:
        assert _message(_core.arch_hparams, "gpt2", config) == str(error)
    else:
        if expected < 1e30:
            assert _core.arch_hparams("gpt2", config)["norm_eps"] == float(np.float32(expected))


def test_alias_and_required_messages():
    assert _message(_core.arch_hparams, "gpt2", {"n_embd": 64, "hidden_size": 32}) == (
        "config.json: 'n_embd' (64) and 'hidden_size' (32) name the same setting but differ; keep one of them")
    assert _core.arch_hparams("gpt2", {"n_embd": 64, "hidden_size": 64.0, "n_head": 4})["hidden_size"] == 64
    assert _message(_core.arch_hparams, "gpt2", {"n_embd": 1, "hidden_size": True}).endswith(
        "name the same setting but differ; keep one of them")
    assert _message(_core.arch_hparams, "llama", {}) == "config.json: 'hidden_size' is missing"
    assert _message(_core.arch_hparams, "gpt2", {"n_embd": 10, "n_head": 4}) == (
        "config.json: n_embd 10 is not a multiple of n_head 4")


def test_choices_and_refusals():
    message = _message(_core.arch_hparams, "gpt2", {"activation_function": "swish"})
    assert message == ("config.json: activation_function 'swish' is not supported; use one of "
                       "['gelu', 'gelu_fast', 'gelu_new', 'gelu_pytorch_tanh', 'relu']")
    with pytest.raises(NotImplementedError, match="config.json: scale_attn_weights=false is not supported"):
        _core.arch_hparams("gpt2", {"scale_attn_weights": False})
    with pytest.raises(NotImplementedError, match="reorder_and_upcast_attn=true is not supported"):
        _core.arch_hparams("gpt2", {"reorder_and_upcast_attn": 1})
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 96,
            "vocab_size": 100}
    with pytest.raises(ValueError, match=r"hidden_act None is not supported; the Llama family uses 'silu'"):
        _core.arch_hparams("llama", dict(base, hidden_act=None))
    with pytest.raises(NotImplementedError, match=r"MLP biases \(mlp_bias=true\)"):
        _core.arch_hparams("llama", dict(base, mlp_bias=True))
    with pytest.raises(NotImplementedError, match="use_sliding_window=true"):
        _core.arch_hparams("qwen2", dict(base, use_sliding_window=True, sliding_window=16))
    assert _core.arch_hparams("qwen2", dict(base, use_sliding_window=True, sliding_window=0))["sliding_window"] == 0
    assert _core.arch_hparams("mistral", dict(base, sliding_window=16))["sliding_window"] == 16
    with pytest.raises(ValueError, match="num_attention_heads 4 is not a multiple of num_key_value_heads 3"):
        _core.arch_hparams("llama", dict(base, num_key_value_heads=3))
    with pytest.raises(ValueError, match="RoPE needs an even head_dim, got 15"):
        _core.arch_hparams("llama", dict(base, head_dim=15))
    with pytest.raises(ValueError, match=r"hidden_act 'relu' is not supported by Gemma; use one of \['gelu', "):
        _core.arch_hparams("gemma", dict(base, hidden_act="relu"))
    with pytest.raises(NotImplementedError, match=r"rope_scaling type 'su' \(Phi-3's long-context RoPE"):
        _core.arch_hparams("phi3", dict(base, rope_scaling={"type": "su"}))
    with pytest.raises(ValueError, match="config.json: rope_parameters type 'linear' is not a Phi-3 RoPE type"):
        _core.arch_hparams("phi3", dict(base, rope_parameters={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(NotImplementedError, match=r"partial_rotary_factor 0.5 \(RoPE on part of each head\)"):
        _core.arch_hparams("phi3", dict(base, partial_rotary_factor=0.5))
    with pytest.raises(ValueError, match="config.json rope_scaling: 'partial_rotary_factor' must be a finite number"):
        _core.arch_hparams("phi3", dict(base, rope_scaling={"partial_rotary_factor": "x"}))


def _numpy_inv_freq(theta, head_dim, rope_type="default", factor=1.0, low=1.0, high=4.0, old=8192):
    """transformers' computation in NumPy float32 (the reference the registry follows)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (1.0 / (np.float64(theta) ** exponent.astype(np.float64))).astype(np.float32)
    if rope_type == "linear":
        return (inv / np.float32(factor)).astype(np.float32)
    if rope_type == "llama3":
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = np.float32(2 * math.pi) / inv
        scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rope_frequencies_match_numpy_bit_for_bit(head_dim):
    np.testing.assert_array_equal(rope_inv_freq({"rope_theta": 500000.0}, head_dim),
                                  _numpy_inv_freq(500000.0, head_dim))
    np.testing.assert_array_equal(rope_inv_freq({}, head_dim), _numpy_inv_freq(10000.0, head_dim))
    linear = {"rope_scaling": {"type": "linear", "factor": 3.0}}
    np.testing.assert_array_equal(rope_inv_freq(linear, head_dim), _numpy_inv_freq(10000.0, head_dim, "linear", 3.0))
    llama3 = {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192}}
    np.testing.assert_array_equal(rope_inv_freq(llama3, head_dim),
                                  _numpy_inv_freq(500000.0, head_dim, "llama3", 8.0, 1.0, 4.0, 8192))


def test_rope_messages():
    assert _message(rope_inv_freq, {"rope_scaling": [1]}, 8) == "config.json: rope_scaling must be an object, got [1]"
    assert _message(rope_inv_freq, {"rope_theta": None, "rope_scaling": {"rope_theta": None}}, 8) == (
        "config.json: 'rope_theta' is missing")
    assert _message(rope_inv_freq, {"rope_theta": 0}, 8) == (
        "config.json: 'rope_theta' must be a finite number >= 1e-09, got 0")
    assert _message(rope_inv_freq, {"rope_scaling": {"type": "linear"}}, 8) == (
        "config.json rope_scaling: 'factor' is missing")
    llama3 = {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
              "original_max_position_embeddings": 0}
    assert _message(rope_inv_freq, {"rope_scaling": llama3}, 8) == (
        "config.json rope_scaling: 'original_max_position_embeddings' must be a finite number >= 1, got 0")
    llama3["original_max_position_embeddings"] = 8192
    assert _message(rope_inv_freq, {"rope_scaling": llama3}, 8) == (
        "config.json rope_scaling: high_freq_factor (1.0) must exceed low_freq_factor (4.0)")
    assert _message(rope_inv_freq, {"rope_scaling": {"rope_type": None}}, 8) == (
        "config.json: unknown rope_scaling type None; supported: default, linear, llama3")


def _plain_gpt2(tmp_path):
    """A tiny plain GPT-2 directory written without transformers (config.json + model.safetensors)."""
    import json

    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1,
              "vocab_size": 11, "n_positions": 4}
    rng = np.random.default_rng(0)
    tensors = {"wte.weight": (11, 8), "wpe.weight": (4, 8), "ln_f.weight": (8,), "ln_f.bias": (8,),
               "h.0.attn.c_attn.weight": (8, 24), "h.0.attn.c_attn.bias": (24,), "h.0.attn.c_proj.weight": (8, 8),
               "h.0.attn.c_proj.bias": (8,), "h.0.mlp.c_fc.weight": (8, 32), "h.0.mlp.c_fc.bias": (32,),
               "h.0.mlp.c_proj.weight": (32, 8), "h.0.mlp.c_proj.bias": (8,), "h.0.ln_1.weight": (8,),
               "h.0.ln_1.bias": (8,), "h.0.ln_2.weight": (8,), "h.0.ln_2.bias": (8,)}
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in tensors.items()}
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return arrays


def test_plain_directory_refusals_name_the_file(tmp_path):
    import json

    from cpuformer._model_dir import save_safetensors

    arrays = _plain_gpt2(tmp_path)
    with pytest.raises(ValueError, match="has no model.safetensors or model.safetensors.index.json"):
        _core.graph_manifest(str(tmp_path))
    # Sharded: the index's rules, as the Python loader's.
    names = sorted(arrays)
    save_safetensors(tmp_path / "a.safetensors", {n: arrays[n] for n in names[:8]})
    save_safetensors(tmp_path / "b.safetensors", {n: arrays[n] for n in names[8:]})
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {n: "a.safetensors" if i < 8 else "b.safetensors" for i, n in enumerate(names)}
    index.write_text(json.dumps({"weight_map": weight_map}))
    manifest = _core.graph_manifest(str(tmp_path))
    assert manifest["tensors"]["decoder"][0]["attn.q"]["name"] == "h.0.attn.c_attn.weight"
    cases = [({"weight_map": []}, "'weight_map' must be an object of tensor name -> shard file"),
             ({"weight_map": {}}, "'weight_map' names no tensors"),
             ({"weight_map": {names[0]: 3}}, f"shard for tensor '{names[0]}' must be a file name"),
             ({"weight_map": {names[0]: "../a.safetensors"}}, "must be a plain file name in the model directory"),
             ({"weight_map": dict(weight_map, **{names[0]: "b.safetensors"})},
              f"maps tensor '{names[0]}' to b.safetensors, which has no such tensor")]
    for content, message in cases:
        index.write_text(json.dumps(content))
        with pytest.raises(ValueError, match=re.escape(message)):
            _core.graph_manifest(str(tmp_path))
    save_safetensors(tmp_path / "b.safetensors", {n: arrays[n] for n in names[7:]})  # names[7] in both
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=re.escape(f"tensor '{names[7]}' is in both")):
        _core.graph_manifest(str(tmp_path))
    # One file: an integer tensor where a weight is declared.
    for shard in ("a.safetensors", "b.safetensors", "model.safetensors.index.json"):
        (tmp_path / shard).unlink()
    save_safetensors(tmp_path / "model.safetensors", dict(arrays, **{"ln_f.weight": np.ones(8, np.int32)}))
    with pytest.raises(ValueError, match="'ln_f.weight' is stored as I32; a plain checkpoint's weights are F32"):
        _core.graph_manifest(str(tmp_path))


def test_binding_argument_checks():
    hp = arch.by_family()["gpt2"].hparams({}).as_dict()
    with pytest.raises(ValueError, match="task must be 'token_classification' or 'question_answering'"):
        _core.arch_linear_head({}, "masked_lm", 8)
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        _core.rope_inv_freq({}, 0)
    with pytest.raises(ValueError, match="unknown canonical weight 'attn.x'"):
        _core.canonical_shape("attn.x", hp)
    assert arch.canonical_shape("attn.q.bias", arch.by_family()["gpt2"].hparams({})) == (768,)


def test_one_plan_for_both_front_ends(tmp_path):
    """The Python loader reads the entries the C API's manifest names (one C++ procedure), F64 and
    F16 tensors widened alike; the tensor checks run before any weight is read, missing first, then
    stray, then shapes."""
    import cpuformer as cf
    from cpuformer._model_dir import save_safetensors

    arrays = _plain_gpt2(tmp_path)
    save_safetensors(tmp_path / "model.safetensors", arrays)
    ids = [[1, 2, 3]]
    with cf.load(tmp_path) as model:
        want = model.logits(ids)
    manifest = _core.graph_manifest(str(tmp_path))
    for dtype in (np.float64, np.float16):
        stored = {n: a.astype(dtype) for n, a in arrays.items()}
        save_safetensors(tmp_path / "model.safetensors", stored)
        assert _core.graph_manifest(str(tmp_path)) == manifest
        with cf.load(tmp_path) as model:
            got = model.logits(ids)
        widened = {n: a.astype(np.float32) for n, a in stored.items()}
        save_safetensors(tmp_path / "model.safetensors", widened)
        with cf.load(tmp_path) as model:
            np.testing.assert_array_equal(got, model.logits(ids))
        if dtype == np.float64:
            np.testing.assert_array_equal(got, want)  # float32 values stored as F64 read back exactly
    bad = dict(arrays, **{"ln_f.bias": np.zeros(9, np.float32), "extra.weight": np.zeros(2, np.float32)})
    save_safetensors(tmp_path / "model.safetensors", bad)
    for load in (cf.load, lambda p: _core.graph_manifest(str(p))):
        with pytest.raises(ValueError, match="tensors that GPT-2 models do not use: extra.weight"):
            load(tmp_path)
    del bad["extra.weight"]
    save_safetensors(tmp_path / "model.safetensors", bad)
    for load in (cf.load, lambda p: _core.graph_manifest(str(p))):
        with pytest.raises(ValueError, match=re.escape("tensor 'ln_f.bias' has shape [9], expected [8]")):
            load(tmp_path)
    del bad["h.0.ln_1.weight"]
    bad["extra.weight"] = np.zeros(2, np.float32)
    save_safetensors(tmp_path / "model.safetensors", bad)
    for load in (cf.load, lambda p: _core.graph_manifest(str(p))):
        with pytest.raises(ValueError, match=re.escape("model.safetensors has no tensor 'h.0.ln_1.weight'")):
            load(tmp_path)


def test_generation_defaults_are_the_cpp_registry_s(tmp_path):
    """Generator reads generate()'s defaults with the C++ code the C API's manifest uses."""
    import json

    import cpuformer as cf
    from cpuformer._model_dir import save_safetensors

    arrays = _plain_gpt2(tmp_path)
    save_safetensors(tmp_path / "model.safetensors", arrays)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, eos_token_id=[5, 7], bad_words_ids=[[3]])))
    (tmp_path / "generation_config.json").write_text(json.dumps({"pad_token_id": 4}))
    defaults = _core.generation_defaults(str(tmp_path), json.loads((tmp_path / "config.json").read_text()),
                                         {"pad_token_id": 4})
    assert defaults["eos_source"] == "config.json"
    generation = _core.graph_manifest(str(tmp_path))["generation"]
    with cf.load(tmp_path) as model:
        assert model.eos_token_ids == defaults["eos_token_ids"] == generation["eos_token_ids"] == [5, 7]
        assert model.pad_token_id == defaults["pad_token_id"] == generation["pad_token_id"] == 4
        assert model.bad_words_ids == defaults["bad_words_ids"] == generation["bad_words_ids"] == [[3]]
    (tmp_path / "generation_config.json").write_text(json.dumps({"bad_words_ids": [[11]]}))
    message = re.escape("generation_config.json: 'bad_words_ids' must be a list of non-empty lists of token ids "
                        "(integers in [0, 11)), got [[11]]")
    for load in (cf.load, lambda p: _core.graph_manifest(str(p))):
        with pytest.raises(ValueError, match=message):
            load(tmp_path)


def test_config_files_read_as_python_reads_them(tmp_path):
    """config.json may hold NaN and Infinity (Python's json writes and reads them): the C++ readers
    of the C API read it as the Python package does, and refuse a value with the same message."""
    import json

    import cpuformer as cf
    from cpuformer._model_dir import save_safetensors

    arrays = _plain_gpt2(tmp_path)
    save_safetensors(tmp_path / "model.safetensors", arrays)
    manifest = _core.graph_manifest(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, task_specific_params={"a": float("nan")},
                                                          unused_limit=float("inf"))))
    assert "NaN" in (tmp_path / "config.json").read_text()
    assert _core.graph_manifest(str(tmp_path)) == manifest
    with cf.load(tmp_path) as model:
        assert model.config["vocab_size"] == 11
    (tmp_path / "config.json").write_text(json.dumps(dict(config, layer_norm_epsilon=float("-inf"))))
    with pytest.raises(ValueError) as python:
        cf.load(tmp_path)
    with pytest.raises(ValueError) as cpp:
        _core.graph_manifest(str(tmp_path))
    assert "layer_norm_epsilon" in str(python.value) and "-inf" in str(python.value)
    assert str(cpp.value) == str(python.value)
