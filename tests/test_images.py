"""cpuformer._images against transformers' image processors (the PIL backend AutoImageProcessor returns without
torchvision): configs written here, a test image set made here (gradients, shapes, noise; PNG and JPEG files,
RGBA, L, P, I;16, 1x1), both resize paths (Pillow and the NumPy port), the array paths without Pillow, and every
refusal with its message."""

from __future__ import annotations

import json
import logging
import sys
import warnings

import numpy as np
import pytest
from PIL import Image  # the test extra installs Pillow (the vision extra)

from cpuformer import _images
from cpuformer._images import ImageConfig, load_image, preprocess, read_image_config, resize

TOL = 1e-5

CONFIGS = {
    # ViT: fixed size, bilinear; upscaling the small images, downscaling the large one
    "vit": {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 40, "width": 40},
            "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    # non-square, nearest, own mean/std
    "vit_nearest": {"image_processor_type": "ViTImageProcessor", "size": {"height": 24, "width": 50}, "resample": 0,
                    "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.3, 0.25]},
    # DeiT: bicubic resize then a center crop
    "deit": {"image_processor_type": "DeiTImageProcessor", "size": {"height": 36, "width": 36},
             "crop_size": {"height": 30, "width": 29}},
    # a crop larger than the resized image: zero padding; lanczos
    "deit_pad": {"image_processor_type": "DeiTImageProcessorFast", "size": {"height": 20, "width": 26},
                 "crop_size": {"height": 28, "width": 24}, "resample": 1},
    # CLIP: shortest edge (aspect ratio kept), bicubic, crop, OpenAI mean/std by default
    "clip": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 32},
             "crop_size": {"height": 28, "width": 28}},
    # legacy files: a feature extractor type, int sizes; box and hamming filters
    "legacy_box": {"feature_extractor_type": "ViTFeatureExtractor", "size": 30, "resample": 4,
                   "do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
    "clip_hamming": {"image_processor_type": "CLIPImageProcessorFast", "size": 25, "crop_size": 25, "resample": 5},
    # no rescale, no normalize
    "raw": {"image_processor_type": "ViTImageProcessor", "size": {"height": 16, "width": 12}, "do_rescale": False,
            "do_normalize": False, "resample": 3},
    # only the type: every value from the class defaults (224 x 224 bilinear)
    "vit_defaults": {"image_processor_type": "ViTImageProcessor"},
}


def _picture(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Gradients, a rectangle, a disc and noise, uint8 RGB [h, w, 3]."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * 3 + y * 5) % 256], -1)
    img[h // 4:h // 2, w // 3:w // 2] = [200, 30, 60]
    img[(y - h * 0.7) ** 2 + (x - w * 0.3) ** 2 < (min(h, w) * 0.2) ** 2] = [20, 220, 90]
    img = img + rng.integers(-25, 26, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


PICTURES = {"60x45": _picture(60, 45, 1), "17x23": _picture(17, 23, 2), "45x60": _picture(45, 60, 3),
            "1x1": _picture(1, 1, 4), "75x100": _picture(75, 100, 5)}


@pytest.fixture(scope="module")
def processors(tmp_path_factory):
    """name -> (our ImageConfig, transformers' processor from the same file)."""
    from transformers import AutoImageProcessor

    logging.getLogger("transformers").setLevel(logging.ERROR)
    out = {}
    for name, settings in CONFIGS.items():
        directory = tmp_path_factory.mktemp(name)
        (directory / "preprocessor_config.json").write_text(json.dumps(settings))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[name] = (read_image_config(directory), AutoImageProcessor.from_pretrained(str(directory)))
    return out


def _reference(processor, images, **kwargs) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return processor(images, return_tensors="np", do_convert_rgb=True, **kwargs)["pixel_values"]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.flags.c_contiguous
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= TOL


def test_auto_image_processor_is_the_pil_backend(processors):
    """What the comparisons compare against: without torchvision, AutoImageProcessor gives the Pil classes."""
    names = {name: type(processor).__name__ for name, (_, processor) in processors.items()}
    assert names["vit"] == "ViTImageProcessorPil"
    assert names["deit"] == "DeiTImageProcessorPil"
    assert names["clip"] == "CLIPImageProcessorPil"


@pytest.mark.parametrize("backend", ["pil", "numpy"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_arrays_and_pil_images_match_transformers(processors, name, backend):
    config, processor = processors[name]
    for picture in PICTURES.values():
        want = _reference(processor, Image.fromarray(picture))
        _close(preprocess(picture, config, backend=backend), want)  # uint8 HWC
        _close(preprocess(Image.fromarray(picture), config, backend=backend), want)  # PIL image
        _close(preprocess(picture.astype(np.float32) / 255, config, backend=backend), want)  # float HWC in [0, 1]
        chw = np.ascontiguousarray(picture.transpose(2, 0, 1)).astype(np.float64) / 255
        _close(preprocess(chw, config, backend=backend, layout="CHW"), want)
        # the array path also equals transformers given the same uint8 array
        _close(preprocess(picture, config, backend=backend),
               _reference(processor, picture, input_data_format="channels_last"))


def test_batches_match_transformers(processors):
    config, processor = processors["deit"]
    pictures = [PICTURES["60x45"], PICTURES["45x60"], PICTURES["17x23"]]
    want = _reference(processor, [Image.fromarray(p) for p in pictures])
    _close(preprocess(pictures, config), want)
    _close(preprocess([Image.fromarray(p) for p in pictures], config, backend="numpy"), want)
    same = np.stack([_picture(30, 20, s) for s in range(3)])  # NHWC uint8 and NCHW float batches
    want = _reference(processor, [Image.fromarray(p) for p in same])
    _close(preprocess(same, config), want)
    _close(preprocess(same.transpose(0, 3, 1, 2).astype(np.float32) / 255, config), want)


def test_files_match_transformers(processors, tmp_path):
    """PNG and JPEG files (decoded by Pillow, as transformers' load_image does), mixed with arrays."""
    config, processor = processors["clip"]
    png, jpeg = tmp_path / "a.png", tmp_path / "b.jpg"
    Image.fromarray(PICTURES["75x100"]).save(png)
    Image.fromarray(PICTURES["45x60"]).save(jpeg, quality=85)
    for backend in ("pil", "numpy"):
        want = _reference(processor, [str(png), str(jpeg)])
        _close(preprocess([str(png), jpeg], config, backend=backend), want)
        _close(preprocess(str(jpeg), config, backend=backend), want[1:])
    np.testing.assert_array_equal(load_image(jpeg), np.asarray(Image.open(jpeg).convert("RGB")))
    rotated = tmp_path / "rotated.jpg"  # EXIF orientation 6: stored 100 wide, shown 100 high
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(PICTURES["75x100"]).save(rotated, exif=exif)
    assert load_image(rotated).shape == (100, 75, 3)
    _close(preprocess(rotated, config), _reference(processor, str(rotated)))


def test_image_modes_match_transformers(processors, tmp_path):
    """Grayscale, RGBA (composited onto white), palette (with and without transparency), 16-bit, bilevel: PIL
    images and the files transformers' load_image reads (RGB conversion drops alpha there)."""
    config, processor = processors["vit"]
    rgb = PICTURES["60x45"]
    alpha = np.linspace(0, 255, rgb.shape[0] * rgb.shape[1]).reshape(rgb.shape[:2]).astype(np.uint8)
    palette = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    transparent = palette.copy()
    transparent.info["transparency"] = 3
    modes = {
        "L": Image.fromarray(rgb[..., 0]),
        "RGBA": Image.fromarray(np.dstack([rgb, alpha])),
        "LA": Image.fromarray(np.dstack([rgb[..., 1], alpha])),
        "P": palette,
        "P+transparency": transparent,
        "I;16": Image.fromarray(rgb[..., 2].astype(np.uint16)),
        "1": Image.fromarray(rgb[..., 0] > 128),
    }
    assert modes["I;16"].mode == "I;16" and modes["LA"].mode == "LA" and modes["1"].mode == "1"
    for name, image in modes.items():
        want = _reference(processor, image)
        for backend in ("pil", "numpy"):
            _close(preprocess(image, config, backend=backend), want)
        path = tmp_path / f"{name.replace(';', '_').replace('+', '_')}.png"
        image.save(path)
        _close(preprocess(str(path), config), _reference(processor, str(path)))
    # arrays with 1 (HW and HW1) and 4 channels, as transformers' convert_rgb treats them
    _close(preprocess(rgb[..., 0], config), _reference(processor, modes["L"]))
    _close(preprocess(rgb[..., :1], config), _reference(processor, modes["L"]))
    rgba = np.dstack([rgb, alpha])
    want = _reference(processor, rgba, input_data_format="channels_last")
    _close(preprocess(rgba, config), want)
    _close(preprocess(rgba.astype(np.float64) / 255, config), want)


@pytest.mark.parametrize("resample", [0, 1, 2, 3, 4, 5])
def test_numpy_resize_equals_pillow(resample):
    """The NumPy port gives Pillow's bytes: up and down, square and not, both pass orders, 1 and 3 channels."""
    rng = np.random.default_rng(resample)
    shapes = [(1, 1), (5, 3), (37, 53), (100, 64), (120, 90)]
    targets = [(1, 1), (3, 2), (7, 7), (64, 48), (10, 31), (95, 127), (2, 130), (130, 3)]
    for h, w in shapes:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for oh, ow in targets:
            want = np.asarray(Image.fromarray(image).resize((ow, oh), resample=resample))
            np.testing.assert_array_equal(resize(image, (oh, ow), resample), want)
        gray = np.asarray(Image.fromarray(image[..., 0]).resize((29, 41), resample=resample))
        np.testing.assert_array_equal(resize(image[..., :1], (41, 29), resample)[..., 0], gray)


def test_arrays_work_without_pillow(processors, monkeypatch, tmp_path):
    config, processor = processors["deit_pad"]
    picture = PICTURES["60x45"]
    want = _reference(processor, Image.fromarray(picture))
    path = tmp_path / "a.png"
    Image.fromarray(picture).save(path)
    for name in [module for module in sys.modules if module == "PIL" or module.startswith("PIL.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert not _images.pil_available()
    _close(preprocess(picture, config), want)  # "auto" falls back to the NumPy resize
    _close(preprocess(picture.astype(np.float16) / 255, config), want)
    with pytest.raises(ImportError, match=r'needs Pillow: pip install "cpuformer\[vision\]"'):
        preprocess(str(path), config)
    with pytest.raises(ImportError, match=r'pip install "cpuformer\[vision\]"'):
        preprocess(picture, config, backend="pil")
    with pytest.raises(ImportError, match=r'pip install "cpuformer\[vision\]"'):
        load_image(path)


def test_config_values(processors, tmp_path):
    config = processors["clip"][0]
    assert config.image_processor_type == "CLIPImageProcessor"
    assert (config.shortest_edge, config.size, config.crop_size, config.resample) == (32, None, (28, 28), 3)
    assert config.image_mean == _images._OPENAI_CLIP_MEAN and config.output_size == (28, 28)
    defaults = processors["vit_defaults"][0]
    assert (defaults.size, defaults.resample, defaults.do_center_crop, defaults.output_size) == (
        (224, 224), 2, False, (224, 224))
    legacy = processors["legacy_box"][0]
    assert (legacy.image_processor_type, legacy.size, legacy.resample) == ("ViTImageProcessor", (30, 30), 4)
    assert ImageConfig.from_dict({"size": 20}, default_type="DeiTImageProcessorPil").size == (20, 20)
    square = ImageConfig.from_dict({"image_processor_type": "CLIPImageProcessor", "use_square_size": True})
    assert (square.size, square.shortest_edge) == ((224, 224), None)
    file = tmp_path / "preprocessor_config.json"
    file.write_text(json.dumps(CONFIGS["deit"]))
    assert read_image_config(file) == read_image_config(tmp_path)


def _write(tmp_path, content) -> str:
    path = tmp_path / "preprocessor_config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


BAD_CONFIGS = [
    ({"size": 224}, r"'image_processor_type' is missing"),
    ({"image_processor_type": "ConvNextImageProcessor"}, r"'image_processor_type' is 'ConvNextImageProcessor'"),
    ({"feature_extractor_type": 7}, r"'feature_extractor_type' is 7"),
    ({"image_processor_type": "ViTImageProcessor", "size": {"height": 0, "width": 4}}, r"'size' must hold positive"),
    ({"image_processor_type": "ViTImageProcessor", "size": {"height": 4.5, "width": 4}}, r"'size' must hold posit"),
    ({"image_processor_type": "ViTImageProcessor", "size": {"longest_edge": 4}}, r"'size' has keys \['longest_edge'\]"),
    ({"image_processor_type": "ViTImageProcessor", "size": "big"}, r"'size' must be \{'height'"),
    ({"image_processor_type": "ViTImageProcessor", "size": [4, 5, 6]}, r"'size' must be \{'height'"),
    ({"image_processor_type": "ViTImageProcessor", "resample": 9}, r"'resample' is 9: PIL's codes are 0 \(nearest\)"),
    ({"image_processor_type": "ViTImageProcessor", "resample": "bilinear"}, r"'resample' is 'bilinear'"),
    ({"image_processor_type": "ViTImageProcessor", "do_resize": "yes"}, r"'do_resize' must be true or false"),
    ({"image_processor_type": "ViTImageProcessor", "do_center_crop": True}, r"'crop_size' is missing"),
    ({"image_processor_type": "DeiTImageProcessor", "crop_size": {"shortest_edge": 3}}, r"'crop_size' must be"),
    ({"image_processor_type": "ViTImageProcessor", "rescale_factor": -1}, r"'rescale_factor' must be a finite pos"),
    ({"image_processor_type": "ViTImageProcessor", "rescale_factor": "1/255"}, r"'rescale_factor' must be"),
    ({"image_processor_type": "ViTImageProcessor", "image_mean": [0.5, 0.5]}, r"'image_mean' must be a number or"),
    ({"image_processor_type": "ViTImageProcessor", "image_std": [0.5, 0, 0.5]}, r"'image_std' must hold finite pos"),
    ({"image_processor_type": "ViTImageProcessor", "image_std": ["a", 1, 1]}, r"'image_std' must be a number or"),
]


@pytest.mark.parametrize("settings, message", BAD_CONFIGS)
def test_bad_configs(tmp_path, settings, message):
    path = _write(tmp_path, settings)
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: " + message):
        read_image_config(path)


def test_bad_config_files(tmp_path):
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: no such file \(a vision model directory"):
        read_image_config(tmp_path)
    _write(tmp_path, "{not json")
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: not a readable JSON file"):
        read_image_config(tmp_path)
    _write(tmp_path, "[1, 2]")
    with pytest.raises(ValueError, match=r"preprocessor_config\.json: expected a JSON object, got list"):
        read_image_config(tmp_path)
    with pytest.raises(TypeError, match=r"config must be an ImageConfig \(read_image_config\), got dict"):
        preprocess(PICTURES["1x1"], {"size": 3})  # type: ignore[arg-type]


def test_bad_files(processors, tmp_path):
    config = processors["vit"][0]
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    with pytest.raises(ValueError, match=r"image 0: .*corrupt\.png: cannot read the image"):
        preprocess([str(corrupt)], config)
    with pytest.raises(ValueError, match=r"corrupt\.png: cannot read the image \(UnidentifiedImageError"):
        load_image(corrupt)
    for suffix in ("png", "jpg"):
        whole = tmp_path / f"whole.{suffix}"
        Image.fromarray(PICTURES["75x100"]).save(whole)
        truncated = tmp_path / f"truncated.{suffix}"
        truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
        with pytest.raises(ValueError, match=rf"image 1: .*truncated\.{suffix}: cannot read the image"):
            preprocess([str(whole), str(truncated)], config)
    with pytest.raises(ValueError, match=r"image 0: .*missing\.png: no such image file"):
        preprocess(str(tmp_path / "missing.png"), config)
    wide = Image.fromarray((np.arange(64).reshape(8, 8) * 1000).astype(np.uint16))
    with pytest.raises(ValueError, match=r"image 0: a I;16 image with values in \[0, 63000\]; converting it to "
                                         r"RGB \(as transformers does\) would clip them"):
        preprocess(wide, config)
    with pytest.raises(ValueError, match=r"image 1: an empty image \(0x5 pixels\)"):
        preprocess([Image.fromarray(PICTURES["1x1"]), Image.new("RGB", (0, 5))], config)
    wide.save(tmp_path / "wide.png")
    with pytest.raises(ValueError, match=r"wide\.png: a I;16 image with values in \[0, 63000\]"):
        preprocess(str(tmp_path / "wide.png"), config)


BAD_ARRAYS = [
    (np.zeros((2, 3, 4, 5, 6), np.uint8), ValueError, r"image: an image array has 2 \(HW\), 3 \(HWC or CHW\) or 4"),
    (np.zeros((5,), np.float32), ValueError, r"image: an image array has 2"),
    (np.zeros((6, 7, 2), np.uint8), ValueError, r"image: an image has 1, 3 or 4 channels \(gray, RGB, RGBA\) on "
                                                r"its first or last axis, got shape \(6, 7, 2\)"),
    (np.zeros((2, 6, 7, 5), np.uint8), ValueError, r"on its first or last axis, got shape \(2, 6, 7, 5\)"),
    (np.zeros((0, 7, 3), np.uint8), ValueError, r"image: an empty image \(shape \(0, 7, 3\)"),
    (np.zeros((0, 3, 8, 8), np.float32), ValueError, r"image: an empty batch \(shape \(0, 8, 8, 3\)\)"),
    (np.full((4, 4, 3), 1.5, np.float32), ValueError, r"image: a float image must have values in \[0, 1\] \(uint8 "
                                                      r"images: \[0, 255\]\), got \[1\.5, 1\.5\]"),
    (np.full((4, 4, 3), 255.0), ValueError, r"float image must have values in \[0, 1\].*got \[255, 255\]"),
    (np.full((4, 4, 3), -0.25), ValueError, r"got \[-0\.25, -0\.25\]"),
    (np.full((4, 4, 3), np.nan), ValueError, r"image: a float image holds NaN or infinite values"),
    (np.zeros((4, 4, 3), np.int64), ValueError, r"image: arrays of dtype int64 are not images; give uint8"),
    (np.zeros((4, 4, 3), bool), ValueError, r"arrays of dtype bool are not images"),
    (np.zeros((4, 4, 3), np.uint16), ValueError, r"arrays of dtype uint16 are not images"),
]


@pytest.mark.parametrize("array, error, message", BAD_ARRAYS)
def test_bad_arrays(processors, array, error, message):
    with pytest.raises(error, match=message):
        preprocess(array, processors["vit"][0])


def test_bad_batches_and_arguments(processors):
    config = processors["vit"][0]
    good = PICTURES["17x23"]
    with pytest.raises(ValueError, match=r"images: an empty batch"):
        preprocess([], config)
    with pytest.raises(ValueError, match=r"image 1: a float image must have values in \[0, 1\]"):
        preprocess([good, good * 2.0], config)
    with pytest.raises(TypeError, match=r"image 1: expected a file path, a PIL image or a NumPy array, got int"):
        preprocess([good, 3], config)
    with pytest.raises(TypeError, match=r"images: expected a file path, a PIL image, a NumPy array or a list"):
        preprocess({"a": good}, config)
    with pytest.raises(ValueError, match=r"image 0: a 4-D array inside a list"):
        preprocess([good[None]], config)
    with pytest.raises(ValueError, match=r"layout must be one of HWC, CHW, NHWC, NCHW or None, got 'WHC'"):
        preprocess(good, config, layout="WHC")
    with pytest.raises(ValueError, match=r"image: a 3-D array is one image; layout must be HWC or CHW, got NCHW"):
        preprocess(good, config, layout="NCHW")
    with pytest.raises(ValueError, match=r"image: a 4-D array is a batch; layout must be NCHW or NHWC, got HWC"):
        preprocess(good[None], config, layout="HWC")
    with pytest.raises(ValueError, match=r"image: an image has 1, 3 or 4 channels .*got shape \(7, 2, 6\) read as HWC"):
        preprocess(np.zeros((6, 7, 2), np.uint8), config, layout="CHW")
    with pytest.raises(ValueError, match=r"backend must be 'auto', 'pil' or 'numpy', got 'cv2'"):
        preprocess(good, config, backend="cv2")
    clip_no_crop = ImageConfig.from_dict({"image_processor_type": "CLIPImageProcessor", "do_center_crop": False,
                                          "size": {"shortest_edge": 8}}, source="clip.json")
    assert preprocess(PICTURES["60x45"], clip_no_crop).shape == (1, 3, 10, 8)
    with pytest.raises(ValueError, match=r"image 1: preprocessed to 8x10 but image 0 to 10x8; clip\.json has no "
                                         r"center crop"):
        preprocess([PICTURES["60x45"], PICTURES["45x60"]], clip_no_crop)
    with pytest.raises(ValueError, match=r"resize takes a uint8 \[H, W, C\] array, got float64 of shape \(2, 2\)"):
        resize(np.zeros((2, 2)), (3, 3))
    with pytest.raises(ValueError, match=r"resample must be one of PIL's codes \[0, 1, 2, 3, 4, 5\], got 6"):
        resize(good, (3, 3), 6)
    with pytest.raises(ValueError, match=r"resize to 0x3: sizes must be positive"):
        resize(good, (0, 3))


def test_layout_rule():
    """Which axis holds the channels when no layout is given (documented in the module and docs/vision.md)."""
    config = ImageConfig.from_dict({"image_processor_type": "ViTImageProcessor", "do_resize": False,
                                    "do_normalize": False, "do_rescale": False})
    hwc = np.arange(2 * 5 * 3, dtype=np.uint8).reshape(2, 5, 3)
    np.testing.assert_array_equal(preprocess(hwc, config)[0], hwc.transpose(2, 0, 1))
    np.testing.assert_array_equal(preprocess(hwc.transpose(2, 0, 1).copy(), config)[0], hwc.transpose(2, 0, 1))
    one = np.array([[[0.2, 0.4, 0.6]]])  # 1x1 RGB, HWC
    np.testing.assert_allclose(preprocess(one, config)[0, :, 0, 0], [51, 102, 153], rtol=1e-6)
    np.testing.assert_allclose(preprocess(one.reshape(3, 1, 1), config)[0, :, 0, 0], [51, 102, 153], rtol=1e-6)
    gray = np.array([[[0.2], [0.4]]])  # 1x2 gray HW1 -> repeated
    assert preprocess(gray, config).shape == (1, 3, 1, 2)
    square = np.zeros((3, 4, 4, 3), np.uint8)  # NHWC and NCHW both plausible: the last axis wins
    assert preprocess(square, config).shape == (3, 3, 4, 4)
    assert preprocess(square, config, layout="NCHW").shape == (3, 3, 4, 3)  # 4 channels (RGBA) of 4x3
