"""The one rule that tells pixel_values from images (``cpuformer.models.vision.is_pixel_values``),
the same for ViT / DeiT (ImageEncoder, ImageClassifier) and CLIP (CLIP, CLIPVision): a float32 4-D
array with num_channels entries in axis 1 is pixel_values, used as given; everything else is
images, preprocessed with preprocessor_config.json (float images in [0, 1] stand for the 8-bit
image x · 255). Each input form gives the same outputs on every model, and the same errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer.models.vision import is_pixel_values

from ._hf import assert_close
from .test_clip import _build, _train_tokenizer
from .test_vit import VIT_B16, _save

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A ViT classifier (32x32, ViT preprocessing), a DeiT base model and a CLIP (64x64, CLIP
    preprocessing), each with its preprocessor_config.json; (name, model, embed function)."""
    vit = tmp_path_factory.mktemp("vit")
    _save(vit, "ViTForImageClassification", "ViTConfig", **dict(VIT_B16, image_size=32, num_labels=3))
    (vit / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "size": {"height": 32, "width": 32}}))
    deit = tmp_path_factory.mktemp("deit")
    _save(deit, "DeiTModel", "DeiTConfig", **dict(VIT_B16, image_size=32))
    (deit / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 40, "width": 40},
                                                                "crop_size": {"height": 32, "width": 32}}))
    clip = tmp_path_factory.mktemp("clip")
    _build(clip, "b32", _train_tokenizer(), seed=2)
    vit_model, deit_model, clip_model = cf.load(vit), cf.load(deit), cf.load(clip)
    vision = cf.CLIPVision(clip)
    return [("vit", vit_model, vit_model.logits), ("deit", deit_model, deit_model.embed),
            ("clip", clip_model, clip_model.embed_images), ("clip-image-features", clip_model,
                                                            clip_model.get_image_features),
            ("clip-vision", vision, vision.last_hidden_state)]


def _images(n=2, seed=0):
    """uint8 images NHWC, 37x53 (resized by every preprocessing)."""
    return np.random.default_rng(seed).integers(0, 256, (n, 37, 53, 3), dtype=np.uint8)


def test_the_rule():
    assert is_pixel_values(np.zeros((2, 3, 8, 8), np.float32), 3)
    assert not is_pixel_values(np.zeros((2, 3, 8, 8), np.float64), 3)  # float64: images
    assert not is_pixel_values(np.zeros((2, 3, 8, 8), np.float16), 3)
    assert not is_pixel_values(np.zeros((2, 3, 8, 8), np.uint8), 3)
    assert not is_pixel_values(np.zeros((2, 8, 8, 3), np.float32), 3)  # NHWC: images
    assert not is_pixel_values(np.zeros((3, 8, 8), np.float32), 3)  # one CHW image
    assert not is_pixel_values(np.zeros((2, 1, 8, 8), np.float32), 3)  # grayscale NCHW images
    assert is_pixel_values(np.zeros((2, 1, 8, 8), np.float32), 1)  # pixel_values of a 1-channel model
    assert not is_pixel_values([np.zeros((2, 3, 8, 8), np.float32)], 3)  # a list: images
    assert not is_pixel_values("cat.png", 3)


@pytest.mark.parametrize("index", range(5), ids=["vit", "deit", "clip", "clip-image-features", "clip-vision"])
def test_every_form_gives_the_same_outputs(models, index):
    name, model, run = models[index]
    images = _images()
    expected = run(model.preprocess(images))  # uint8 NHWC: images
    pixels = model.preprocess(images)
    assert pixels.dtype == np.float32 and pixels.shape[1] == 3
    assert model.preprocess(pixels) is pixels  # pixel_values are returned as they are
    np.testing.assert_array_equal(run(pixels), expected)
    np.testing.assert_array_equal(run(images), expected)
    forms = {
        "float32 NHWC in [0, 1]": images.astype(np.float32) / 255,
        "float64 NHWC in [0, 1]": images / 255.0,
        "float64 NCHW in [0, 1]": images.transpose(0, 3, 1, 2) / 255.0,
        "uint8 NCHW": np.ascontiguousarray(images.transpose(0, 3, 1, 2)),
        "list of uint8 HWC": list(images),
        "list of float32 CHW in [0, 1]": [image.transpose(2, 0, 1).astype(np.float32) / 255 for image in images],
    }
    for form, value in forms.items():
        np.testing.assert_allclose(run(value), expected, rtol=1e-6, atol=1e-6, err_msg=f"{name}: {form}")
    one = run(images[1].transpose(2, 0, 1).astype(np.float32) / 255)  # a float32 CHW image, no batch axis
    assert_close(one, expected[1:2], 1e-5)  # (a batch of one: the GEMM's float rounding may differ)


@pytest.mark.parametrize("index", range(5), ids=["vit", "deit", "clip", "clip-image-features", "clip-vision"])
def test_the_same_errors(models, index):
    _, model, run = models[index]
    normalized = model.preprocess(_images()).astype(np.float64)  # normalized values outside [0, 1]
    with pytest.raises(ValueError, match=r"image: a float image must have values in \[0, 1\] .*\(pixel_values, "
                                         r"already preprocessed, must be float32; got float64\)"):
        run(normalized)
    with pytest.raises(ValueError, match=r"image: a float image must have values in \[0, 1\]"):
        run(np.full((1, 16, 16, 3), 2.0, np.float32))  # a float32 NHWC batch is images
    with pytest.raises(ValueError, match="NaN or infinite"):
        run(np.full((1, 3) + tuple(model.preprocess(_images(1)).shape[2:]), np.nan, np.float32))
    with pytest.raises(ValueError, match="images: an empty batch"):
        run([])
