"""MPNet (relative position bias over learned positions) and ELECTRA (embedding projection)
against transformers, beyond the registry's parity rows: padding in a batch, sequences longer than
MPNet's max_distance, both ELECTRA layouts (embedding_size != and == hidden_size), every claimed
task-head checkpoint, the refusals, and the reduced-precision dtypes (bounds of
tests/models/test_quantized.py, docs/precision.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer._model_dir import ModelDir, save_safetensors
from cpuformer.arch import by_family
from cpuformer.weights import graph_format

from ._hf import assert_close, cosine_rows, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# initializer_range 0.2: attention (and so the relative bias) changes the states far beyond the tolerance.
_MPNET = dict(vocab_size=71, hidden_size=45, num_hidden_layers=2, num_attention_heads=3, intermediate_size=53,
              max_position_embeddings=160, initializer_range=0.2)
_ELECTRA = dict(vocab_size=67, embedding_size=24, hidden_size=40, num_hidden_layers=2, num_attention_heads=5,
                intermediate_size=37, max_position_embeddings=48, type_vocab_size=2)
BOUND_16 = {"float16": 0.005, "bfloat16": 0.02}


def _build(directory, model_class, config_class, seed=0, **config):
    config_object = getattr(transformers, config_class)(**config)
    return save_random_model(directory, getattr(transformers, model_class), config_object, seed)


def _base(model):
    return getattr(model, model.base_model_prefix, model)


def _reference(model, ids, mask=None, types=None):
    kwargs = {"input_ids": torch.tensor(ids)}
    if mask is not None:
        kwargs["attention_mask"] = torch.tensor(mask)
    if types is not None:
        kwargs["token_type_ids"] = torch.tensor(types)
    with torch.no_grad():
        return _base(model)(**kwargs).last_hidden_state.numpy()


@pytest.fixture(scope="module")
def mpnet(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mpnet")
    return directory, _build(directory, "MPNetModel", "MPNetConfig", seed=3, **_MPNET)


@pytest.fixture(scope="module")
def electra(tmp_path_factory):
    directory = tmp_path_factory.mktemp("electra")
    return directory, _build(directory, "ElectraModel", "ElectraConfig", seed=4, **_ELECTRA)


# ---- MPNet ------------------------------------------------------------------------------------

def test_mpnet_padded_batch(mpnet):
    """Right- and left-padded rows (pad id 1, transformers' padding_idx): positions count the real
    tokens only, and the relative bias is combined with each row's key mask."""
    directory, hf = mpnet
    rng = np.random.default_rng(1)
    ids = rng.integers(3, _MPNET["vocab_size"], size=(3, 13))
    mask = np.ones_like(ids)
    ids[1, 8:], mask[1, 8:] = 1, 0  # right-padded
    ids[2, :4], mask[2, :4] = 1, 0  # left-padded
    model = cf.load(directory)
    assert model.family == "mpnet" and model.pad_token_id == 1
    ours = model(ids, mask)
    reference = _reference(hf, ids, mask)
    for row in range(3):
        kept = mask[row] == 1
        assert_close(ours[row][kept], reference[row][kept])
    # a row alone, unpadded, gives the same states as inside the padded batch
    assert_close(model(ids[1:2, :8])[0], ours[1, :8])
    assert_close(model(ids[2:3, 4:])[0], ours[2, 4:])
    # ragged lists are padded with id 1 and masked
    ragged = model([ids[0].tolist(), ids[1, :8].tolist()])
    assert_close(ragged[1, :8], ours[1, :8])


def test_mpnet_beyond_max_distance(mpnet):
    """150 tokens: relative positions past max_distance (128) share the last bucket."""
    directory, hf = mpnet
    ids = np.random.default_rng(2).integers(3, _MPNET["vocab_size"], size=(2, 150))
    mask = np.ones_like(ids)
    mask[1, 140:] = 0
    ours = cf.load(directory)(ids, mask)
    reference = _reference(hf, ids, mask)
    assert_close(ours[0], reference[0])
    assert_close(ours[1, :140], reference[1, :140])
    # The bias matters beyond the tolerance, so a wrong bucket would fail the comparison above.
    table = _base(hf).encoder.relative_attention_bias.weight
    saved = table.detach().clone()
    with torch.no_grad():
        table.zero_()
    try:
        without = _reference(hf, ids, mask)
    finally:
        with torch.no_grad():
            table.copy_(saved)
    assert np.abs(without[0] - reference[0]).max() > 100 * 1e-4 * np.abs(reference[0]).max()


@pytest.mark.parametrize("model_class", ["MPNetForMaskedLM", "MPNetForSequenceClassification",
                                         "MPNetForTokenClassification", "MPNetForQuestionAnswering",
                                         "MPNetForMultipleChoice"])
def test_mpnet_task_head_checkpoints(model_class, tmp_path):
    hf = _build(tmp_path, model_class, "MPNetConfig", seed=5, **dict(_MPNET, vocab_size=43))
    with ModelDir(tmp_path) as md:
        assert any(name.startswith("mpnet.") for name in md.names())
    model = cf.Encoder(tmp_path, head=False)  # the body under its prefix (the heads: tests/models/test_heads.py)
    assert model.family == "mpnet" and by_family()["mpnet"].claims(model_class)
    ids = np.random.default_rng(6).integers(3, 43, size=(2, 11))
    assert_close(model(ids), _reference(hf, ids))


def test_mpnet_pooler(mpnet):
    directory, hf = mpnet
    ids = np.random.default_rng(7).integers(3, _MPNET["vocab_size"], size=(2, 9))
    with torch.no_grad():
        reference = hf(input_ids=torch.tensor(ids)).pooler_output.numpy()
    assert_close(cf.load(directory).pooler_output(ids), reference)


def test_mpnet_refuses_other_bucket_counts(mpnet, tmp_path):
    directory, _ = mpnet
    config = json.loads((directory / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, relative_attention_num_buckets=16)))
    (tmp_path / "model.safetensors").symlink_to(directory / "model.safetensors")
    with pytest.raises(NotImplementedError, match=r"^config.json: relative_attention_num_buckets 16 is not supported; "
                                                  r"transformers' MPNet always computes 32 relative position buckets"):
        cf.load(tmp_path)


def test_mpnet_token_types_are_refused(mpnet):
    directory, _ = mpnet
    with pytest.raises(ValueError, match="this model has no token type embeddings; token_type_ids must be None"):
        cf.load(directory)([[3, 4, 5]], token_type_ids=[[0, 0, 0]])


# ---- ELECTRA ----------------------------------------------------------------------------------

@pytest.mark.parametrize("embedding_size", [24, 40])
def test_electra_embedding_projection(embedding_size, tmp_path):
    """embedding_size != hidden_size: embeddings_project maps the normed embeddings into the
    hidden size; == hidden_size: no projection."""
    hf = _build(tmp_path, "ElectraModel", "ElectraConfig", seed=8, **dict(_ELECTRA, embedding_size=embedding_size))
    with ModelDir(tmp_path) as md:
        assert ("embeddings_project.weight" in md) == (embedding_size != 40)
    model = cf.load(tmp_path)
    assert model.family == "electra" and model.hparams.embedding_size == embedding_size
    rng = np.random.default_rng(9)
    ids = rng.integers(1, _ELECTRA["vocab_size"], size=(2, 12))
    types = rng.integers(0, 2, size=ids.shape)
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    ours = model(ids, mask, types)
    reference = _reference(hf, ids, mask, types)
    assert_close(ours[0], reference[0])
    assert_close(ours[1, :7], reference[1, :7])


@pytest.mark.parametrize("model_class", ["ElectraForPreTraining", "ElectraForMaskedLM",
                                         "ElectraForSequenceClassification", "ElectraForTokenClassification",
                                         "ElectraForQuestionAnswering", "ElectraForMultipleChoice"])
def test_electra_task_head_checkpoints(model_class, tmp_path):
    hf = _build(tmp_path, model_class, "ElectraConfig", seed=10, **_ELECTRA)
    with ModelDir(tmp_path) as md:
        assert "electra.embeddings_project.weight" in md
    model = cf.Encoder(tmp_path, head=False)  # the body under its prefix (the heads: tests/models/test_heads.py)
    assert model.family == "electra" and by_family()["electra"].claims(model_class)
    ids = np.random.default_rng(11).integers(1, _ELECTRA["vocab_size"], size=(2, 10))
    assert_close(model(ids), _reference(hf, ids))


def _rewrite(src, dst, change):
    """A copy of the checkpoint directory src with its tensors passed through change(dict)."""
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    with ModelDir(src) as md:
        tensors = {name: np.array(md.tensor(name)) for name in md.names()}
    save_safetensors(dst / "model.safetensors", change(tensors), metadata={"format": "pt"})
    return dst


def test_electra_projection_is_accounted_for(electra, tmp_path):
    directory, _ = electra
    missing = _rewrite(directory, tmp_path / "missing",
                       lambda t: {k: v for k, v in t.items() if not k.startswith("embeddings_project.")})
    with pytest.raises(ValueError, match=r"has no tensor 'embeddings_project.weight'"):
        cf.load(missing)
    # embedding_size == hidden_size: a projection the config does not call for is named, not dropped
    square = tmp_path / "square"
    square.mkdir()
    _build(square, "ElectraModel", "ElectraConfig", seed=1, **dict(_ELECTRA, embedding_size=40))
    projection = {"embeddings_project.weight": np.eye(40, dtype=np.float32),
                  "embeddings_project.bias": np.zeros(40, np.float32)}
    stray = _rewrite(square, tmp_path / "stray", lambda t: dict(t, **projection))
    with pytest.raises(ValueError, match=r"ELECTRA models do not use: embeddings_project.weight, "
                                         r"embeddings_project.bias;"):
        cf.load(stray)


def test_electra_defaults_are_electras(electra):
    """A config without size keys gets ElectraConfig's defaults (ELECTRA-small), not BERT's."""
    hp = by_family()["electra"].hparams({"model_type": "electra"})
    reference = transformers.ElectraConfig()
    assert (hp.embedding_size, hp.hidden_size, hp.num_heads, hp.intermediate_size) == (
        reference.embedding_size, reference.hidden_size, reference.num_attention_heads, reference.intermediate_size)
    hp = by_family()["mpnet"].hparams({"model_type": "mpnet"})
    assert hp.vocab_size == transformers.MPNetConfig().vocab_size


def test_the_binding_checks_the_new_fields():
    from cpuformer import _core

    hp = by_family()["electra"].hparams({"model_type": "electra", **_ELECTRA})
    config = dict(hp.as_dict(), **graph_format("float32"))
    E, H, V = 24, 40, _ELECTRA["vocab_size"]
    rng = np.random.default_rng(0)
    tensors = {"embed.tokens": rng.standard_normal((V, E), dtype=np.float32),
               "embed.token_types": rng.standard_normal((2, E), dtype=np.float32),
               "encoder.embed.positions": rng.standard_normal((48, E), dtype=np.float32),
               "encoder.embed.norm": np.ones(E, np.float32), "encoder.embed.norm.bias": np.zeros(E, np.float32)}
    with pytest.raises(ValueError, match=r"missing encoder tensor 'embed.project'"):
        _core.EncoderModel(config, tensors)
    _core.EncoderModel(config, dict(tensors, **{"embed.project": np.ones((H, E), np.float32)}))
    square = dict(config, embedding_size=H)
    with pytest.raises(ValueError, match=r"encoder tensor 'embed.tokens' must have shape \[67, 40\], got \[67, 24\]"):
        _core.EncoderModel(square, tensors)
    decoder = dict(by_family()["llama"].hparams({"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2,
                                                 "intermediate_size": 24, "vocab_size": 40,
                                                 "num_hidden_layers": 1}).as_dict(), **graph_format("float32"))
    with pytest.raises(ValueError, match=r"invalid model config: embedding_size must equal hidden_size outside "
                                         r"encoders"):
        _core.DecoderModel(dict(decoder, embedding_size=8), {})
    with pytest.raises(ValueError, match=r"invalid model config: relative_bias \(with learned positions\) is "
                                         r"implemented for encoders only"):
        _core.DecoderModel(dict(decoder, relative_bias=True), {})
    with pytest.raises(ValueError, match=r"invalid model config: embedding_size must be >= 0, got -1"):
        _core.EncoderModel(dict(config, embedding_size=-1), {})


# ---- reduced precision ------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["mpnet", "electra"])
def test_int8_and_16_bit(family, mpnet, electra):
    directory = {"mpnet": mpnet, "electra": electra}[family][0]
    ids = np.random.default_rng(12).integers(3, 60, size=(3, 17))
    reference = cf.load(directory)(ids)
    int8 = cf.load(directory, dtype="int8")(ids)
    assert cosine_rows(int8, reference).min() >= 0.99
    assert not np.array_equal(int8, reference)
    for dtype, bound in BOUND_16.items():
        ours = cf.load(directory, dtype=dtype)(ids)
        err = np.abs(ours - reference).max()
        assert 0 < err <= bound * np.abs(reference).max(), (dtype, err)


@pytest.mark.parametrize("family, dtype", [("mpnet", "int8"), ("electra", "int8"), ("electra", "bfloat16")])
def test_converted_directory_gives_identical_outputs(family, dtype, mpnet, electra, tmp_path):
    directory = {"mpnet": mpnet, "electra": electra}[family][0]
    dst = tmp_path / "converted"
    cf.convert(directory, dst, dtype, progress=False)
    ids = np.random.default_rng(13).integers(3, 60, size=(2, 15))
    np.testing.assert_array_equal(cf.load(dst)(ids), cf.load(directory, dtype=dtype)(ids))
    with ModelDir(dst) as md:
        if family == "electra":  # the projection is a matmul weight, stored in the dtype
            assert md.tensor_info("embeddings_project.weight")[0] == {"int8": "I8", "bfloat16": "BF16"}[dtype]
            assert md.tensor_info("embeddings.word_embeddings.weight")[0] == "F32"
        else:  # the relative bias table is not
            assert md.tensor_info("encoder.relative_attention_bias.weight") == ("F32", (32, 3))
