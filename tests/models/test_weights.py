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
from cpuformer.weights import graph_format

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


def test_task_head_tensors_load_and_convert_as_float32(models, tmp_path):
    head = {"classifier.weight": np.ones((3, 16), np.float32), "classifier.bias": np.ones(3, np.float32)}

    def with_head(tensors):
        for name in list(tensors):
            tensors["bert." + name] = tensors.pop(name)
        tensors.update(head)

    directory = _rewrite(models["encoder"], tmp_path / "head", with_head,
                         config={"architectures": ["BertForSequenceClassification"],
                                 "id2label": {"0": "a", "1": "b", "2": "c"}})
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


# ---- the binding seam (csrc/bindings/config.h, model_builder.h) ----------------------------------

def test_hparams_mirror_the_one_cpp_config():
    """TransformerConfig's fields are declared once in C++; arch.Hparams (plus the weight format) mirrors them."""
    import dataclasses

    from cpuformer import _core
    from cpuformer.arch import Hparams

    fields = [f.name for f in dataclasses.fields(Hparams)] + list(graph_format("float32"))
    assert sorted(fields) == sorted(_core.transformer_config_fields())


def _bert_config():
    from cpuformer.arch import by_family

    config = by_family()["bert"].example_config(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=24,
                                               max_position_embeddings=32)
    return dict(by_family()["bert"].hparams(config).as_dict(), **graph_format("float32"))


def test_the_binding_refuses_an_unknown_or_missing_config_field():
    from cpuformer import _core

    config = _bert_config()
    with pytest.raises(ValueError, match=r"model config: unknown field 'hidden_sizes'"):
        _core.EncoderModel(dict(config, hidden_sizes=16), {})
    del config["norm_eps"]
    with pytest.raises(ValueError, match=r"model config: missing 'norm_eps'"):
        _core.EncoderModel(config, {})
    with pytest.raises(ValueError, match=r"model config: norm must be one of 'layer', 'rms', got 'batch'"):
        _core.EncoderModel(dict(_bert_config(), norm="batch"), {})
    with pytest.raises(ValueError, match=r"invalid model config: num_heads \(3\) must be a multiple of "
                                         r"num_kv_heads \(2\)"):
        _core.EncoderModel(dict(_bert_config(), num_heads=3, num_kv_heads=2), {})
    with pytest.raises(ValueError, match=r"DecoderModel needs a config of kind 'decoder'"):
        _core.DecoderModel(_bert_config(), {})


def test_the_binding_refuses_a_tensor_the_config_does_not_use():
    from cpuformer import _core

    H, V = 16, 40
    rng = np.random.default_rng(0)
    tensors = {"embed.tokens": rng.standard_normal((V, H), dtype=np.float32),
               "encoder.embed.positions": rng.standard_normal((32, H), dtype=np.float32),
               "embed.token_types": rng.standard_normal((2, H), dtype=np.float32),
               "encoder.embed.norm": np.ones(H, np.float32), "encoder.embed.norm.bias": np.zeros(H, np.float32)}
    with pytest.raises(ValueError, match=r"unknown encoder model tensor 'encoder.final_norm'"):
        _core.EncoderModel(_bert_config(), dict(tensors, **{"encoder.final_norm": np.ones(H, np.float32)}))
    model = _core.EncoderModel(_bert_config(), tensors)
    layer = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in
             [("attn.q", (H, H)), ("attn.k", (H, H)), ("attn.v", (H, H)), ("attn.o", (H, H)), ("attn_norm", (H,)),
              ("ffn.up", (24, H)), ("ffn.down", (H, 24)), ("ffn_norm", (H,))]}
    with pytest.raises(ValueError, match=r"unknown encoder layer tensor 'ffn.gate'"):
        model.add_layer("encoder", dict(layer, **{"ffn.gate": np.ones((24, H), np.float32)}))
    with pytest.raises(ValueError, match=r"an encoder has one stack, 'encoder'; got 'decoder'"):
        model.add_layer("decoder", layer)
    with pytest.raises(ValueError, match=r"missing encoder tensor 'attn_norm'"):
        model.add_layer("encoder", {k: v for k, v in layer.items() if k != "attn_norm"})
    model.add_layer("encoder", layer)
    assert model.forward(np.array([[1, 2, 3]]), num_threads=1).shape == (1, 3, H)


def test_generation_options_are_read_by_one_parser(models):
    """Every generating binding reads its options with one parser (GenerationOptions::fields())."""
    generator = cf.load(models["decoder"])
    with pytest.raises(ValueError, match=r"generation options: unknown option 'max_tokens'"):
        generator._model.generate([[1, 2, 3]], {"max_tokens": 4})
    seq2seq = cf.load(models["seq2seq"])
    with pytest.raises(ValueError, match=r"missing option 'decoder_start_token_id'"):
        seq2seq._model.generate([[1, 2, 3]], {"max_new_tokens": 4})
    # a missing option keeps GenerationOptions' default (20 new tokens, greedy)
    tokens, log_probs, stats, reasons, scores = generator._model.generate([[1, 2, 3]], {"min_new_tokens": 20}, None, 1)
    assert len(tokens[0]) == 20 and log_probs is None and stats is None and reasons == ["length"] and scores is None
    assert tokens == generator.generate([[1, 2, 3]], max_new_tokens=20, min_new_tokens=20)


def test_a_gated_feed_forward_refuses_biases_it_cannot_apply(tmp_path):
    """A Llama-family checkpoint with up_proj.bias (but no mlp_bias in its config) is refused by
    name, and the binding refuses a gated up/gate bias, instead of dropping it silently."""
    from cpuformer import _core
    from cpuformer.arch import by_family
    from cpuformer.arch.checkpoint import random_checkpoint

    arch = by_family()["llama"]
    config = arch.example_config(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=24, max_position_embeddings=32)
    tensors = random_checkpoint(arch, config, np.random.default_rng(0))
    tensors["model.layers.0.mlp.up_proj.bias"] = np.ones(24, np.float32)
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    save_safetensors(tmp_path / "model.safetensors", tensors, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"do not use: model.layers.0.mlp.up_proj.bias;"):
        cf.load(tmp_path)
    hp = arch.hparams(config)
    model_tensors = {"embed.tokens": tensors["model.embed_tokens.weight"], "lm_head": tensors["lm_head.weight"],
                     "decoder.final_norm": tensors["model.norm.weight"],
                     "decoder.rope.inv_freq": np.ones(hp.head_dim // 2, np.float32)}
    model = _core.DecoderModel(dict(hp.as_dict(), **graph_format("float32")), model_tensors)
    p = "model.layers.0."
    layer = {"attn.q": tensors[p + "self_attn.q_proj.weight"], "attn.k": tensors[p + "self_attn.k_proj.weight"],
             "attn.v": tensors[p + "self_attn.v_proj.weight"], "attn.o": tensors[p + "self_attn.o_proj.weight"],
             "attn_norm": tensors[p + "input_layernorm.weight"],
             "ffn_norm": tensors[p + "post_attention_layernorm.weight"],
             "ffn.gate": tensors[p + "mlp.gate_proj.weight"], "ffn.up": tensors[p + "mlp.up_proj.weight"],
             "ffn.down": tensors[p + "mlp.down_proj.weight"], "ffn.up.bias": np.ones(24, np.float32)}
    with pytest.raises(ValueError, match=r"'ffn.gate.bias' / 'ffn.up.bias': a gated feed-forward has no bias"):
        model.add_layer("decoder", layer)
