"""The one loader (cpuformer/weights.py): every checkpoint tensor accounted for, the LM head rule,
tensors the architecture ignores, and the converted format they make."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _bench
from cpuformer._model_dir import ModelDir, save_safetensors

SHAPES = {
    "encoder": dict(name="weights-bert", vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=24, max_position_embeddings=32),
    "decoder": dict(name="weights-gpt2", vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32),
    "seq2seq": dict(name="weights-marian", vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24,
                    max_position_embeddings=32),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    return {kind: pathlib.Path(_bench.build_model(kind, shape, str(root / kind))) for kind, shape in SHAPES.items()}


def _rewrite(source: pathlib.Path, target: pathlib.Path, edit, config=None) -> pathlib.Path:
    """A copy of ``source`` whose tensors are ``edit(tensors)`` and whose config.json is updated by ``config``."""
    shutil.copytree(source, target)
    with ModelDir(source) as md:
        tensors = {name: np.array(md.tensor(name)) for name in md.names()}
    edit(tensors)
    save_safetensors(target / "model.safetensors", tensors, metadata={"format": "pt"})
    settings = json.loads((target / "config.json").read_text())
    settings.update(config or {})
    (target / "config.json").write_text(json.dumps(settings))
    return target


@pytest.mark.parametrize("kind,extra,title", [
    ("encoder", "encoder.layer.1.attention.self.rotary.weight", "BERT"),
    ("decoder", "transformer.h.0.mlp.c_gate.weight", "GPT-2"),
    ("seq2seq", "model.decoder.layers.0.adapter.weight", "Marian"),
])
def test_a_tensor_no_declaration_reads_is_an_error_naming_it(models, tmp_path, kind, extra, title):
    directory = _rewrite(models[kind], tmp_path / kind, lambda t: t.update({extra: np.zeros((4, 4), np.float32)}))
    message = rf"the checkpoint has tensors that {title} models do not use: {extra};"
    with pytest.raises(ValueError, match=message):
        cf.load(directory)
    with pytest.raises(ValueError, match=message):
        cf.convert(directory, tmp_path / "converted", "int8", progress=False)
    assert not (tmp_path / "converted").exists()


def test_many_stray_tensors_are_counted(models, tmp_path):
    extra = {f"junk.{i}": np.zeros(2, np.float32) for i in range(7)}
    directory = _rewrite(models["encoder"], tmp_path / "junk", lambda t: t.update(extra))
    with pytest.raises(ValueError, match=r"do not use: junk.0, junk.1, junk.2, junk.3, junk.4 and 2 more;"):
        cf.load(directory)


def test_ignored_task_head_tensors_load_and_convert_as_float32(models, tmp_path):
    head = {"classifier.weight": np.ones((3, 16), np.float32), "classifier.bias": np.ones(3, np.float32)}

    def with_head(tensors):
        for name in list(tensors):
            tensors["bert." + name] = tensors.pop(name)
        tensors.update(head)

    directory = _rewrite(models["encoder"], tmp_path / "head", with_head,
                         config={"architectures": ["BertForSequenceClassification"]})
    ids = [[1, 2, 3, 4]]
    reference = cf.load(models["encoder"])(ids)
    np.testing.assert_array_equal(cf.load(directory)(ids), reference)
    cf.convert(directory, tmp_path / "int8", "int8", progress=False)
    with ModelDir(tmp_path / "int8") as md:
        assert md.tensor_info("classifier.weight") == ("F32", (3, 16))
        assert "classifier.weight_scale" not in md
        assert md.tensor_info("bert.encoder.layer.0.attention.self.query.weight")[0] == "I8"
    np.testing.assert_array_equal(cf.load(tmp_path / "int8")(ids), cf.load(directory, dtype="int8")(ids))


def test_a_tied_head_ignores_a_saved_lm_head_and_an_untied_one_needs_it(models, tmp_path):
    def saved_head(tensors):
        tensors["lm_head.weight"] = np.array(tensors["transformer.wte.weight"])

    tied = _rewrite(models["decoder"], tmp_path / "tied", saved_head)
    ids = [[1, 2, 3]]
    np.testing.assert_array_equal(cf.load(tied).logits(ids), cf.load(models["decoder"]).logits(ids))

    def other_head(tensors):
        tensors["lm_head.weight"] = np.array(tensors["transformer.wte.weight"][::-1])

    untied = _rewrite(models["decoder"], tmp_path / "untied", other_head, config={"tie_word_embeddings": False})
    logits = cf.load(untied).logits(ids)
    assert not np.array_equal(logits, cf.load(models["decoder"]).logits(ids))
    hidden_reversed = cf.load(models["decoder"]).logits(ids)[..., ::-1]
    np.testing.assert_allclose(logits, hidden_reversed, rtol=1e-5, atol=1e-5)

    missing = _rewrite(models["decoder"], tmp_path / "missing", lambda t: None, config={"tie_word_embeddings": False})
    with pytest.raises(ValueError, match="the checkpoint has no lm_head.weight and tie_word_embeddings is false"):
        cf.load(missing)


def test_a_missing_tensor_is_named_before_any_stray_one(models, tmp_path):
    def rename(tensors):
        tensors["model.encoder.layers.0.fc1.weight_renamed"] = tensors.pop("model.encoder.layers.0.fc1.weight")

    directory = _rewrite(models["seq2seq"], tmp_path / "renamed", rename)
    with pytest.raises(ValueError, match=r"has no tensor 'model.encoder.layers.0.fc1.weight'"):
        cf.load(directory)
