"""One CLIP tower (``cpuformer.CLIPText``, ``cpuformer.CLIPVision``) against transformers'
CLIPTextModel, CLIPTextModelWithProjection, CLIPVisionModel and CLIPVisionModelWithProjection on
random-weight checkpoints of test_clip.py's two shapes (transformers 5 saves the towers without
projection at the root, the ones with projection below text_model. / vision_model.): hidden
states, pooler outputs and projected embeds within 1e-4 at float32; a full CLIP checkpoint's
towers; conversion; the command line; the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import cli

from ._hf import assert_close, save_random_model
from .test_clip import BOS, EOS, SHAPES, TEXTS, _build, _ids, _image_files, _train_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CLASSES = ("CLIPTextModel", "CLIPTextModelWithProjection", "CLIPVisionModel", "CLIPVisionModelWithProjection")


@pytest.fixture(scope="module")
def tokenizer():
    return _train_tokenizer()


def _save_tower(directory, cls, shape_name, tok, seed=0):
    shape = SHAPES[shape_name]
    if "Text" in cls:
        bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
        config = transformers.CLIPTextConfig(**shape["text"], vocab_size=tok.get_vocab_size(), bos_token_id=bos,
                                             eos_token_id=2 if shape["legacy_eos"] else eos, pad_token_id=eos,
                                             projection_dim=shape["projection_dim"])
    else:
        config = transformers.CLIPVisionConfig(**shape["vision"], projection_dim=shape["projection_dim"])
    model = save_random_model(directory, getattr(transformers, cls), config, seed)
    if "Text" in cls:
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                                    pad_token=EOS, unk_token=EOS)
        fast.save_pretrained(directory)
        return model, fast
    size = shape["vision"]["image_size"]
    transformers.CLIPImageProcessor(size={"shortest_edge": size},
                                    crop_size={"height": size, "width": size}).save_pretrained(directory)
    return model, None


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    """(class, shape) -> (class, shape, directory, transformers model, tokenizer), built once."""
    cache = {}

    def get(cls, shape):
        if (cls, shape) not in cache:
            directory = tmp_path_factory.mktemp(f"{cls}-{shape}")
            model, fast = _save_tower(directory, cls, shape, tokenizer, seed=CLASSES.index(cls) + len(shape))
            cache[cls, shape] = cls, shape, directory, model, fast
        return cache[cls, shape]

    return get


def _params(classes):
    return dict(params=[(cls, shape) for cls in classes for shape in sorted(SHAPES)], ids=lambda p: f"{p[0]}-{p[1]}")


@pytest.fixture(**_params(CLASSES))
def tower(request, saved):
    return saved(*request.param)


@pytest.fixture(**_params(CLASSES[:2]))
def text_tower(request, saved):
    return saved(*request.param)


@pytest.fixture(**_params(CLASSES[2:]))
def vision_tower(request, saved):
    return saved(*request.param)


def _pixels(n, height, width=None, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, height, width or height)).astype(np.float32)


def test_names_and_prefixes(tower):
    """transformers 5 saves the towers without projection at the checkpoint's root."""
    cls, _, directory, _, _ = tower
    from cpuformer._model_dir import ModelDir

    with ModelDir(directory) as md:
        names = md.names()
    prefix = ("text_model." if "Text" in cls else "vision_model.") if cls.endswith("WithProjection") else ""
    assert all(name.startswith(prefix) or name.endswith("projection.weight") for name in names)
    model = cf.load(directory)
    assert type(model) is (cf.CLIPText if "Text" in cls else cf.CLIPVision)
    assert model.architecture == cls and model.has_projection == cls.endswith("WithProjection")
    assert cls in repr(model)


def test_text_tower_equals_transformers(text_tower):
    cls, shape, directory, hf, fast = text_tower
    ids, mask = _ids(fast, TEXTS)
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    model = cf.CLIPText(directory)
    assert_close(model.last_hidden_state(ids, mask), out.last_hidden_state.numpy())
    assert_close(model(ids, mask), out.last_hidden_state.numpy())
    if cls.endswith("WithProjection"):
        reference = out.text_embeds.numpy()
        assert_close(model.text_embeds(ids, mask), reference)
        assert_close(model.get_text_features(ids, mask), reference)
        pooled = out.last_hidden_state.numpy()[np.arange(len(ids)), model._pool_positions(ids)]
        assert_close(model.pooler_output(ids, mask), pooled)
    else:
        reference = out.pooler_output.numpy()
        assert_close(model.pooler_output(ids, mask), reference)
        with pytest.raises(ValueError, match="CLIPTextModel has no text_projection .the text tower without its "
                                             "projection.; use pooler_output"):
            model.text_embeds(ids, mask)
    normalized = reference / np.linalg.norm(reference, axis=-1, keepdims=True)
    assert_close(model.embed_texts(TEXTS, batch_size=3), normalized)
    assert_close(model.embed_texts(TEXTS, normalize=False), reference)


def test_vision_tower_equals_transformers(vision_tower, tmp_path):
    cls, shape, directory, hf, _ = vision_tower
    from PIL import Image

    size = SHAPES[shape]["vision"]["image_size"]
    pixels = _pixels(3, size, seed=4)
    with torch.no_grad():
        out = hf(pixel_values=torch.from_numpy(pixels))
        odd = hf(pixel_values=torch.from_numpy(_pixels(1, size + 20, size - 8)), interpolate_pos_encoding=True)
    model = cf.CLIPVision(directory)
    assert_close(model.last_hidden_state(pixels), out.last_hidden_state.numpy())
    assert_close(model(_pixels(1, size + 20, size - 8), interpolate_pos_encoding=True), odd.last_hidden_state.numpy())
    pooled = model.pooler_output(pixels)
    if cls.endswith("WithProjection"):
        reference = out.image_embeds.numpy()
        assert_close(model.image_embeds(pixels), reference)
        assert_close(model.get_image_features(pixels), reference)
    else:
        reference = out.pooler_output.numpy()
        assert_close(pooled, reference)
        with pytest.raises(ValueError, match="CLIPVisionModel has no visual_projection"):
            model.image_embeds(pixels)
    assert_close(model.embed_images(pixels, normalize=False, batch_size=2), reference)
    # Image files through the copied preprocessor_config.json, as transformers' CLIPImageProcessor.
    paths = _image_files(tmp_path)
    processed = transformers.CLIPImageProcessor.from_pretrained(directory)(
        images=[Image.open(p).convert("RGB") for p in paths],
        return_tensors="np")["pixel_values"].astype(np.float32)
    with torch.no_grad():
        out = hf(pixel_values=torch.from_numpy(processed))
    reference = (out.image_embeds if cls.endswith("WithProjection") else out.pooler_output).numpy()
    assert_close(model.embed_images([str(p) for p in paths]),
                 reference / np.linalg.norm(reference, axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def full(tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp("clip-full")
    _build(directory, "b32", tokenizer, seed=8)
    return directory


def test_towers_of_a_full_checkpoint(full):
    """CLIPText / CLIPVision open the towers of a CLIPModel checkpoint with its projections."""
    clip = cf.CLIP(full)
    text, vision = cf.CLIPText(full), cf.CLIPVision(full)
    assert text.has_projection and vision.has_projection
    ids, mask = clip._encode_texts(TEXTS)
    np.testing.assert_array_equal(text.text_embeds(ids, mask), clip.get_text_features(ids, mask))
    np.testing.assert_array_equal(text.embed_texts(TEXTS), clip.embed_texts(TEXTS))
    pixels = _pixels(2, clip.image_size, seed=1)
    np.testing.assert_array_equal(vision.image_embeds(pixels), clip.get_image_features(pixels))
    np.testing.assert_array_equal(vision.last_hidden_state(pixels), clip.image_hidden_states(pixels))


def test_wrong_class_errors(tower, full):
    cls, _, directory, _, _ = tower
    tower_name, other = ("text", "vision") if "Text" in cls else ("vision", "text")
    use = "CLIPText" if tower_name == "text" else "CLIPVision"
    with pytest.raises(ValueError, match=f"{cls} holds CLIP's {tower_name} tower alone; cpuformer.CLIP needs the "
                                         f"{other} tower; open it with cpuformer.{use} .or cpuformer.load."):
        cf.CLIP(directory)
    wrong = cf.CLIPVision if tower_name == "text" else cf.CLIPText
    with pytest.raises(ValueError, match=f"cpuformer.{wrong.__name__} needs the {other} tower"):
        wrong(directory)
    with pytest.raises(ValueError, match=f"{cls} is a CLIP .* architecture; open it with cpuformer.CLIP"):
        cf.Encoder(directory)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_convert_towers(tower, tmp_path, dtype):
    cls, shape, directory, _, fast = tower
    dst = tmp_path / "converted"
    cf.convert(directory, dst, dtype, progress=False)
    model, reference = cf.load(dst), cf.load(directory, dtype=dtype)
    assert type(model) is type(reference) and model.dtype == dtype
    if "Text" in cls:
        ids, mask = _ids(fast, TEXTS)
        np.testing.assert_array_equal(model.last_hidden_state(ids, mask), reference.last_hidden_state(ids, mask))
        np.testing.assert_array_equal(model.embed_texts(TEXTS), reference.embed_texts(TEXTS))
    else:
        pixels = _pixels(2, SHAPES[shape]["vision"]["image_size"], seed=2)
        np.testing.assert_array_equal(model.embed_images(pixels), reference.embed_images(pixels))
        np.testing.assert_array_equal(model.last_hidden_state(pixels), reference.last_hidden_state(pixels))


def test_cli(tower, tmp_path, capsys):
    cls, shape, directory, _, _ = tower
    paths = [str(p) for p in _image_files(tmp_path)]
    if "Text" in cls:
        assert cli.main(["embed", str(directory), *TEXTS]) == 0
        vectors = np.array(json.loads(capsys.readouterr().out), dtype=np.float32)
        np.testing.assert_allclose(vectors, cf.CLIPText(directory).embed_texts(TEXTS), rtol=1e-5, atol=1e-6)
        assert cli.main(["embed", str(directory), "--images", *paths]) == 2
        assert f"holds {cls}, CLIP's text tower alone; it does not embed images (give texts)" in capsys.readouterr().err
    else:
        out = tmp_path / "images.npy"
        assert cli.main(["embed", str(directory), "--images", *paths, "-o", str(out)]) == 0
        np.testing.assert_allclose(np.load(out), cf.CLIPVision(directory).embed_images(paths), rtol=1e-5, atol=1e-6)
        assert cli.main(["embed", str(directory), "a text"]) == 2
        assert (f"holds {cls}, CLIP's vision tower alone; it does not embed text (give the images with --images "
                "DIR_OR_FILE)") in capsys.readouterr().err
    assert cli.main(["classify", str(directory), paths[0], "--labels", "a", "b"]) == 2
    assert (f"holds {cls}, one CLIP tower; zero-shot classification needs both (a full CLIP checkpoint)"
            in capsys.readouterr().err)
