"""``cpuformer convert`` for image models (ViT, DeiT) and CLIP: the converted directory loads in its
dtype with the outputs of loading the original checkpoint with that dtype, bit for bit (compared
with ``assert_array_equal``: the same packed weights, the same kernels), and keeps the metadata
(config.json plus the "cpuformer" entry, preprocessor_config.json and the tokenizer files byte for
byte, the labels, the quantization settings)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf

from .test_clip import SHAPES, TEXTS, _build, _train_tokenizer
from .test_vit import LABELS5, VIT_B16, _pixels, _save

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DTYPES = ("int8", "int4", "float16", "bfloat16")
PREPROCESSOR = {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 48, "width": 48},
                "resample": 2, "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.25, 0.3]}


@pytest.fixture(scope="module")
def vit_base(tmp_path_factory):
    """ViTModel with a pooler and a preprocessor_config.json."""
    directory = tmp_path_factory.mktemp("vit_base")
    _save(directory, "ViTModel", "ViTConfig", **dict(VIT_B16, image_size=48))
    (directory / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return directory


@pytest.fixture(scope="module")
def deit_teacher(tmp_path_factory):
    """DeiT with its distillation token and two heads; patch 14 on non-square images, 5 labels."""
    directory = tmp_path_factory.mktemp("deit_teacher")
    config = dict(VIT_B16, image_size=[56, 42], patch_size=14, hidden_size=48, num_attention_heads=3,
                  intermediate_size=100, id2label=LABELS5, label2id={v: k for k, v in LABELS5.items()})
    _save(directory, "DeiTForImageClassificationWithTeacher", "DeiTConfig", seed=2, **config)
    return directory


@pytest.fixture(scope="module")
def clip_dirs(tmp_path_factory):
    tokenizer = _train_tokenizer()
    out = {}
    for name in sorted(SHAPES):
        directory = tmp_path_factory.mktemp(f"clip-{name}")
        _build(directory, name, tokenizer, seed=len(name))
        out[name] = directory
    return out


def _converted(src, tmp_path, dtype, **kwargs):
    dst = tmp_path / f"converted-{dtype}"
    cf.convert(src, dst, dtype, progress=False, **kwargs)
    return dst


def _same_metadata(src, dst, dtype):
    """config.json is the source's plus the "cpuformer" entry; the other files are copied byte for byte."""
    config, converted = (json.loads((d / "config.json").read_text()) for d in (src, dst))
    entry = converted.pop("cpuformer")
    assert entry["dtype"] == dtype and entry["format_version"] == 1
    assert converted == config
    copied = sorted(p.name for p in src.iterdir() if p.name not in ("config.json", "model.safetensors"))
    assert sorted(p.name for p in dst.iterdir() if p.name not in ("config.json", "model.safetensors")) == copied
    for name in copied:
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_vit_base_converted_equals_quantize_at_load(vit_base, tmp_path, dtype):
    dst = _converted(vit_base, tmp_path, dtype)
    _same_metadata(vit_base, dst, dtype)
    assert "preprocessor_config.json" in {p.name for p in dst.iterdir()}
    from cpuformer._model_dir import ModelDir

    with ModelDir(dst) as md:  # the layers' matrices stored in the dtype, the vision tensors in float32
        stored = {"int8": "I8", "int4": "U8", "float16": "F16", "bfloat16": "BF16"}[dtype]
        assert md.tensor_info("encoder.layer.0.attention.attention.query.weight")[0] == stored
        assert md.tensor_info("pooler.dense.weight")[0] == stored
        assert md.tensor_info("embeddings.patch_embeddings.projection.weight")[0] == "F32"
    reference = cf.load(vit_base, dtype=dtype)
    model = cf.load(dst)
    assert type(model) is cf.ImageEncoder and model.dtype == dtype and model.quantization == reference.quantization
    pixels = _pixels(2, 48, 48, seed=3)
    for ours, theirs in zip(model(pixels, return_pooler=True), reference(pixels, return_pooler=True)):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(model(_pixels(1, 64, 32), interpolate_pos_encoding=True),
                                  reference(_pixels(1, 64, 32), interpolate_pos_encoding=True))
    image = np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)  # preprocessed from the copy
    np.testing.assert_array_equal(model.embed(image, pooling="pooler"), reference.embed(image, pooling="pooler"))
    import dataclasses

    assert dataclasses.replace(model.image_config, source="") == dataclasses.replace(reference.image_config, source="")
    assert cf.ImageEncoder(dst, dtype=dtype).dtype == dtype  # naming the stored dtype is allowed


@pytest.mark.parametrize("dtype", DTYPES)
def test_deit_teacher_converted_equals_quantize_at_load(deit_teacher, tmp_path, dtype):
    dst = _converted(deit_teacher, tmp_path, dtype)
    _same_metadata(deit_teacher, dst, dtype)
    reference = cf.load(deit_teacher, dtype=dtype)
    model = cf.load(dst)
    assert type(model) is cf.ImageClassifier and model.labels == reference.labels == list(LABELS5.values())
    pixels = _pixels(3, 56, 42, seed=4)
    np.testing.assert_array_equal(model.logits(pixels), reference.logits(pixels))
    np.testing.assert_array_equal(model(pixels), reference(pixels))
    assert model.classify(pixels, top_k=2) == reference.classify(pixels, top_k=2)
    encoder = cf.ImageEncoder(dst)  # the hidden states alone, the heads not read
    np.testing.assert_array_equal(encoder(pixels), reference(pixels))


def test_int4_settings_round_trip(deit_teacher, tmp_path):
    quantization = {"group_size": 64, "zero_point": True, "lm_head": "float16"}
    dst = _converted(deit_teacher, tmp_path, "int4", quantization=quantization)
    entry = json.loads((dst / "config.json").read_text())["cpuformer"]
    assert entry == {"dtype": "int4", "format_version": 1, "group_size": 64, "zero_point": True,
                     "lm_head": "float16", "embeddings": "int8"}
    reference = cf.load(deit_teacher, dtype="int4", quantization=quantization)
    model = cf.load(dst)
    assert model.quantization == reference.quantization == dict(quantization, embeddings="int8")
    pixels = _pixels(2, 56, 42, seed=5)
    np.testing.assert_array_equal(model.logits(pixels), reference.logits(pixels))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_clip_converted_equals_quantize_at_load(clip_dirs, tmp_path, name, dtype):
    src = clip_dirs[name]
    dst = _converted(src, tmp_path, dtype)
    _same_metadata(src, dst, dtype)
    assert {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"} <= {p.name for p in dst.iterdir()}
    reference = cf.load(src, dtype=dtype)
    model = cf.load(dst)
    assert isinstance(model, cf.CLIP) and model.dtype == dtype and model.quantization == reference.quantization
    assert model.logit_scale == reference.logit_scale
    size = SHAPES[name]["vision"]["image_size"]
    pixels = _pixels(2, size, size, seed=6)
    np.testing.assert_array_equal(model.get_image_features(pixels), reference.get_image_features(pixels))
    np.testing.assert_array_equal(model.image_hidden_states(pixels), reference.image_hidden_states(pixels))
    np.testing.assert_array_equal(model.embed_texts(TEXTS), reference.embed_texts(TEXTS))  # the copied tokenizer
    image = np.random.default_rng(1).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    np.testing.assert_array_equal(model.scores(image, TEXTS), reference.scores(image, TEXTS))


def test_converted_directory_errors(vit_base, clip_dirs, tmp_path):
    dst = _converted(vit_base, tmp_path, "int8")
    with pytest.raises(ValueError, match="this directory was converted to dtype 'int8'; load it with dtype='int8'"):
        cf.ImageEncoder(dst, dtype="float16")
    with pytest.raises(ValueError, match="is already converted .dtype 'int8'.; convert the original checkpoint"):
        cf.convert(dst, tmp_path / "again", "int4", progress=False)
    clip = _converted(clip_dirs["b32"], tmp_path, "int4")
    with pytest.raises(ValueError, match="this directory was converted with group_size=32; load it without "
                                         r"quantization\['group_size'\]"):
        cf.CLIP(clip, quantization={"group_size": 64})
    with pytest.raises(ValueError, match="this directory was converted to dtype 'int4'"):
        cf.load(clip, dtype="int8")
    # A tensor dropped from the converted directory is named, as for the text models.
    from cpuformer._model_dir import _STORAGE_DTYPES, ModelDir, save_safetensors

    with ModelDir(dst) as md:
        tensors = {name: np.array(md.tensor(name, dtype=_STORAGE_DTYPES[md.tensor_info(name)[0]]))
                   for name in md.names() if name != "embeddings.patch_embeddings.projection.weight"}
    save_safetensors(dst / "model.safetensors", tensors, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="embeddings.patch_embeddings.projection.weight"):
        cf.load(dst)


def test_unsupported_families_are_refused(vit_base, tmp_path, monkeypatch):
    """An image family whose model class does not read converted directories (no ``convertible``)."""
    from cpuformer._model_dir import ModelDir
    from cpuformer.arch import find

    arch, _ = find(ModelDir(vit_base).config)
    monkeypatch.setattr(type(arch), "convertible", False)
    with pytest.raises(NotImplementedError, match="cpuformer convert does not convert ViT checkpoints .ViTModel. yet; "
                                                  "load the original directory with dtype=..."):
        cf.convert(vit_base, tmp_path / "out", "int8", progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_convert_image_and_clip(deit_teacher, clip_dirs, tmp_path):
    from cpuformer import cli

    for src, name in ((deit_teacher, "deit"), (clip_dirs["odd"], "clip")):
        dst = tmp_path / name
        assert cli.main(["convert", str(src), str(dst), "--dtype", "bfloat16"]) == 0
        assert json.loads((dst / "config.json").read_text())["cpuformer"] == {"dtype": "bfloat16",
                                                                            "format_version": 1}
    pixels = _pixels(2, 56, 42, seed=7)
    np.testing.assert_array_equal(cf.load(tmp_path / "deit").logits(pixels),
                                  cf.load(deit_teacher, dtype="bfloat16").logits(pixels))
