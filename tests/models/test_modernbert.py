"""What the ModernBERT spec promises beyond its parity row (tests/models/test_registry.py): padded
batches match transformers at the unpadded positions (right and left padding, sequences longer
than the local window), task-head checkpoints load as their body, the config formats of
transformers 4 and 5 read the same, biases are read when the checkpoint has them, reduced
precision stays within the encoders' bounds (tests/models/test_quantized.py), and what cpuformer
cannot run is refused naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer._model_dir import ModelDir, save_safetensors
from cpuformer.arch import by_family
from cpuformer.weights import graph_format

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Four layers: global, local, local, global (global_attn_every_n_layers=3); local layers see
# |i - j| <= 2 (local_attention 5: transformers halves it rounding down).
CONFIG = dict(vocab_size=89, hidden_size=36, num_hidden_layers=4, num_attention_heads=3, intermediate_size=29,
              max_position_embeddings=40, global_attn_every_n_layers=3, local_attention=5, global_rope_theta=500.0,
              local_rope_theta=30.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
BOUND_16 = {"float16": 0.005, "bfloat16": 0.02}


def _save(directory, model_class="ModernBertModel", seed=0, noise=True, **overrides):
    torch.manual_seed(seed)
    config = transformers.ModernBertConfig(**dict(CONFIG, **overrides))
    model = getattr(transformers, model_class)(config).eval()
    if noise:
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 1:  # norms and biases: values a misread would change the outputs with
                    parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _reference(hf, ids, mask):
    body = getattr(hf, "model", hf)
    with torch.no_grad():
        return body(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()


def _assert_unpadded_close(ours, reference, mask):
    scale = float(np.abs(reference).max())
    for row in range(mask.shape[0]):
        keep = mask[row].astype(bool)
        np.testing.assert_allclose(ours[row, keep], reference[row, keep], rtol=1e-4, atol=1e-4 * scale)


def _batch(vocab, lengths, T, left=False, seed=0):
    ids = np.random.default_rng(seed).integers(3, vocab, size=(len(lengths), T))
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        if left:
            mask[row, T - n:] = 1
        else:
            mask[row, :n] = 1
    return np.where(mask == 1, ids, 0), mask


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_padded_batches_match_transformers(tmp_path, left, attn_implementation):
    hf = _save(tmp_path)
    hf.set_attn_implementation(attn_implementation)
    ids, mask = _batch(CONFIG["vocab_size"], [13, 7, 1, 4], 13, left=left)
    model = cf.load(tmp_path)
    _assert_unpadded_close(model(ids, mask), _reference(hf, ids, mask), mask)
    # Without a mask, every position is a token.
    full = np.ones_like(mask)
    np.testing.assert_allclose(model(ids), _reference(hf, ids, full), rtol=1e-4,
                               atol=1e-4 * float(np.abs(_reference(hf, ids, full)).max()))


def test_long_sequences_with_a_wide_window(tmp_path):
    """Sequences of several of the attention kernel's key blocks, the window spanning block edges."""
    hf = _save(tmp_path, seed=8, local_attention=40, max_position_embeddings=300)
    ids, mask = _batch(CONFIG["vocab_size"], [200, 131], 200, seed=8)
    _assert_unpadded_close(cf.load(tmp_path)(ids, mask), _reference(hf, ids, mask), mask)


def test_ragged_lists_and_embed(tmp_path):
    hf = _save(tmp_path)
    ids, mask = _batch(CONFIG["vocab_size"], [11, 6], 11)
    model = cf.load(tmp_path)
    lists = [row[m == 1].tolist() for row, m in zip(ids, mask)]
    _assert_unpadded_close(model(lists), _reference(hf, ids, mask), mask)
    reference = _reference(hf, ids, mask)
    mean = (reference * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(model.embed(lists), mean, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_class", ["ModernBertForMaskedLM", "ModernBertForSequenceClassification",
                                         "ModernBertForTokenClassification", "ModernBertForQuestionAnswering",
                                         "ModernBertForMultipleChoice"])
def test_task_head_checkpoints_load_their_body(tmp_path, model_class):
    hf = _save(tmp_path, model_class, seed=1)
    model = cf.Encoder(tmp_path, head=False)  # the body under its prefix (the heads: tests/models/test_heads.py)
    assert model.family == "modernbert"
    ids, mask = _batch(CONFIG["vocab_size"], [9, 5], 9, seed=1)
    _assert_unpadded_close(model(ids, mask), _reference(hf, ids, mask), mask)


def test_biases_and_tanh_gelu(tmp_path):
    """attention_bias and norm_bias checkpoints: the Wqkv bias is sliced like its weight."""
    hf = _save(tmp_path, seed=2, attention_bias=True, norm_bias=True, hidden_activation="gelu_pytorch_tanh",
               global_attn_every_n_layers=2, local_attention=2)
    with ModelDir(tmp_path) as md:
        assert {"layers.1.attn.Wqkv.bias", "layers.1.attn_norm.bias", "final_norm.bias"} <= set(md.names())
    model = cf.load(tmp_path)
    assert model.hparams.activation == "gelu_tanh"
    ids, mask = _batch(CONFIG["vocab_size"], [10, 8], 10, seed=2)
    _assert_unpadded_close(model(ids, mask), _reference(hf, ids, mask), mask)


def test_transformers_4_config_format(tmp_path):
    """Hub checkpoints saved by transformers 4 have global_rope_theta / local_rope_theta and
    global_attn_every_n_layers instead of rope_parameters and layer_types."""
    hf = _save(tmp_path, seed=3)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    for key in ("layer_types", "rope_parameters"):
        del config[key]
    config.update(global_rope_theta=CONFIG["global_rope_theta"], local_rope_theta=CONFIG["local_rope_theta"])
    path.write_text(json.dumps(config))
    model = cf.load(tmp_path)
    ids, mask = _batch(CONFIG["vocab_size"], [12, 3], 12, seed=3)
    _assert_unpadded_close(model(ids, mask), _reference(hf, ids, mask), mask)
    # A null local_rope_theta means the global one (transformers 4).
    arch = by_family()["modernbert"]
    stack = arch.stack_tensors(dict(config, local_rope_theta=None), model.hparams, "encoder")
    np.testing.assert_array_equal(stack["rope.local_inv_freq"], stack["rope.inv_freq"])
    # layer_types without global_attn_every_n_layers: the pattern is read from the list.
    del config["global_attn_every_n_layers"]
    assert arch.hparams(dict(config, layer_types=["full_attention", "sliding_attention"] * 2)).global_attention_every \
        == 2
    assert arch.hparams(dict(config, layer_types=["full_attention"] + ["sliding_attention"] * 3)) \
        .global_attention_every == 4


@pytest.fixture(scope="module")
def default_init_dir(tmp_path_factory):
    """Default initialisation (std 0.02), as the reduced-precision bounds assume."""
    directory = tmp_path_factory.mktemp("modernbert")
    _save(directory, seed=4, noise=False, hidden_size=64, num_attention_heads=4, intermediate_size=96)
    return directory


def test_int8_cosine(default_init_dir):
    ids = np.random.default_rng(4).integers(0, CONFIG["vocab_size"], size=(3, 17))
    reference = cf.load(default_init_dir)(ids)
    ours = cf.load(default_init_dir, dtype="int8")(ids)
    a, b = (x.reshape(-1, x.shape[-1]).astype(np.float64) for x in (ours, reference))
    cosine = np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() >= 0.99, cosine.min()
    assert not np.array_equal(ours, reference)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_bound(default_init_dir, dtype):
    ids = np.random.default_rng(5).integers(0, CONFIG["vocab_size"], size=(3, 17))
    reference = cf.load(default_init_dir)(ids)
    ours = cf.load(default_init_dir, dtype=dtype)(ids)
    error = np.abs(ours - reference).max()
    assert 0 < error <= BOUND_16[dtype] * np.abs(reference).max(), (error, np.abs(reference).max())


def test_converted_directory_gives_identical_outputs(default_init_dir, tmp_path):
    """The fused Wqkv / Wi and the first layer without an attention norm survive conversion."""
    cf.convert(default_init_dir, tmp_path / "int8", "int8", progress=False)
    ids, mask = _batch(CONFIG["vocab_size"], [17, 9], 17, seed=6)
    expected = cf.load(default_init_dir, dtype="int8")(ids, mask)
    np.testing.assert_array_equal(cf.load(tmp_path / "int8")(ids, mask), expected)


@pytest.mark.parametrize("overrides, message", [
    (dict(mlp_bias=True), r"config.json: mlp_bias=true \(biases of the gated Wi projection\) is not supported"),
    (dict(layer_types=["full_attention", "full_attention", "sliding_attention", "full_attention"]),
     r"config.json: layer_types \[.*\] is not supported; cpuformer runs ModernBERT's pattern"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10.0}}),
     r"config.json: rope_parameters\['full_attention'\] type 'linear' is not supported"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
     r"config.json: rope_scaling type 'dynamic' is not supported"),
    (dict(head_dim=16), r"config.json: head_dim 16 other than hidden_size / num_attention_heads \(12\)"),
    (dict(hidden_activation="gelu_fast"), r"config.json: hidden_activation 'gelu_fast' is not supported"),
])
def test_refusals_name_the_key(overrides, message):
    config = dict(CONFIG, model_type="modernbert", architectures=["ModernBertModel"], **overrides)
    with pytest.raises(NotImplementedError, match=message):
        by_family()["modernbert"].hparams(config)


@pytest.mark.parametrize("overrides, message", [
    (dict(hidden_size=40), r"config.json: hidden size 40 is not a multiple of the number of attention heads 3"),
    (dict(hidden_size=30, num_attention_heads=6), r"RoPE needs an even head dimension .* got 5"),
    (dict(pad_token_id=89), r"config.json: pad_token_id 89 must be < vocab_size 89"),
    (dict(layer_types=["full_attention"]), r"config.json: layer_types must list 4 entries \(num_hidden_layers\)"),
    (dict(local_attention=-2), r"config.json: 'local_attention' must be an integer >= 0, got -2"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 10.0}),
     r"config.json: rope_parameters must map the layer types full_attention, sliding_attention to their RoPE "
     r"parameters, got the keys rope_theta, rope_type"),
])
def test_invalid_values_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        by_family()["modernbert"].hparams(dict(CONFIG, **overrides))


def test_unknown_head_tensor_is_named(tmp_path):
    """Only the known head modules are ignored: a stray body tensor is an error naming it."""
    _save(tmp_path, seed=7)
    with ModelDir(tmp_path) as md:
        tensors = {name: np.array(md.tensor(name)) for name in md.names()}
    tensors["layers.1.mlp.Wo.bias"] = np.zeros(CONFIG["hidden_size"], np.float32)
    save_safetensors(tmp_path / "model.safetensors", tensors, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"do not use: layers.1.mlp.Wo.bias"):
        cf.load(tmp_path)


def test_the_graph_refuses_a_layer_pattern_it_cannot_run():
    """global_attention_every chooses between a window and all keys: only encoders with a window."""
    from cpuformer import _core

    config = dict(by_family()["modernbert"].hparams(CONFIG).as_dict(), **graph_format("float32"))
    message = r"invalid model config: global_attention_every needs an encoder with a sliding_window"
    with pytest.raises(ValueError, match=message):
        _core.EncoderModel(dict(config, sliding_window=0), {})
    with pytest.raises(ValueError, match=r"invalid model config: global_attention_every must be >= 0, got -1"):
        _core.EncoderModel(dict(config, global_attention_every=-1), {})
    llama = by_family()["llama"]
    decoder = llama.hparams(llama.example_config(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=24))
    with pytest.raises(ValueError, match=message):
        _core.DecoderModel(dict(decoder.as_dict(), **graph_format("float32"), sliding_window=4,
                                global_attention_every=2), {})
