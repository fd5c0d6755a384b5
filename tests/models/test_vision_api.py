"""Images into the image models: ``classify`` / ``embed`` / the encoder call on file paths, PIL images and
NumPy arrays, preprocessed with the checkpoint's preprocessor_config.json, against transformers' image
processor + model (the image-classification pipeline's numbers: softmax of the logits); the image forms of
``cpuformer classify`` and ``cpuformer embed``; every error message. Images are made in the test (PNG, JPEG,
grayscale) and the checkpoints are random ViT / DeiT models with a preprocessor_config.json written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import cpuformer as cf
from cpuformer import cli

from ._hf import assert_close, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LABELS = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "horse", 5: "cow"}
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
             patch_size=8, initializer_range=0.2)
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cf.__file__)))


def _save(directory, model_class, config_class, preprocessor, seed=0, **config):
    model = save_random_model(directory, getattr(transformers, model_class), getattr(transformers, config_class)(
        **config), seed)
    if preprocessor is not None:
        (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model


def _image(height, width, seed):
    """A gradient with a rectangle and noise, uint8 HWC."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([255 * x / width, 255 * y / height, 128 + 60 * np.sin((x + y) / 5)], axis=-1)
    image[height // 4:height // 2, width // 3:2 * width // 3] = rng.integers(0, 256, 3)
    image += rng.normal(0, 12, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Five image files: PNG, JPEG, grayscale PNG, square and not, up- and downscaled."""
    directory = tmp_path_factory.mktemp("images")
    paths = []
    for i, (height, width, name, mode) in enumerate([(50, 70, "a.png", "RGB"), (37, 29, "b.jpg", "RGB"),
                                                      (64, 64, "c.png", "L"), (20, 45, "d.jpeg", "RGB"),
                                                      (33, 33, "e.png", "RGB")]):
        picture = Image.fromarray(_image(height, width, i))
        if mode == "L":
            picture = picture.convert("L")
        path = directory / name
        picture.save(path, quality=90) if name.endswith(("jpg", "jpeg")) else picture.save(path)
        paths.append(str(path))
    (directory / "notes.txt").write_text("not an image\n")
    return directory, paths


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    """A ViT classifier with a typed ViT preprocessor_config.json (resize to 32x32, bilinear, own mean/std)."""
    directory = tmp_path_factory.mktemp("vit")
    preprocessor = {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                    "size": {"height": 32, "width": 32}, "resample": 2, "do_normalize": True,
                    "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.25, 0.3]}
    hf = _save(directory, "ViTForImageClassification", "ViTConfig", preprocessor, seed=3, id2label=LABELS,
               label2id={v: k for k, v in LABELS.items()}, **SMALL)
    return directory, hf


@pytest.fixture(scope="module")
def deit(tmp_path_factory):
    """A DeiT base model with a pooler, and a preprocessor_config.json without a type (read as DeiT's:
    bicubic resize, center crop)."""
    directory = tmp_path_factory.mktemp("deit")
    preprocessor = {"size": {"height": 40, "width": 40}, "crop_size": {"height": 32, "width": 32}}
    hf = _save(directory, "DeiTModel", "DeiTConfig", preprocessor, seed=4, **SMALL)
    return directory, hf


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A ViT classifier without preprocessor_config.json."""
    directory = tmp_path_factory.mktemp("bare")
    hf = _save(directory, "ViTForImageClassification", "ViTConfig", None, seed=5, id2label=LABELS,
               label2id={v: k for k, v in LABELS.items()}, **SMALL)
    return directory, hf


def _hf_pixels(directory, paths):
    """transformers' pipeline preprocessing: load_image, then AutoImageProcessor (the PIL backend)."""
    from transformers import AutoImageProcessor
    from transformers.image_utils import load_image

    processor = AutoImageProcessor.from_pretrained(str(directory))
    return processor([load_image(path) for path in paths], return_tensors="np")["pixel_values"]


def _hf_run(model, pixels):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(pixels))


def _softmax(logits):
    logits = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


def _assert_same(ours, expected, atol=1e-6):
    """The same labels in the same order, scores within atol (batch composition changes the last bits)."""
    assert [[label for label, _ in row] for row in ours] == [[label for label, _ in row] for row in expected]
    np.testing.assert_allclose([[s for _, s in row] for row in ours], [[s for _, s in row] for row in expected],
                               atol=atol)


# ---- API ---------------------------------------------------------------------------------------------

def test_classify_paths_equals_transformers_pipeline(vit, images):
    directory, hf = vit
    _, paths = images
    model = cf.load(directory)
    pixels = _hf_pixels(directory, paths)
    np.testing.assert_allclose(model.preprocess(paths), pixels, atol=1e-5)
    probabilities = _softmax(_hf_run(hf, pixels).logits.numpy())
    top = model.classify(paths, top_k=3)
    assert len(top) == len(paths)
    for row, expected in zip(top, probabilities):
        order = np.argsort(-expected, kind="stable")[:3]
        assert [label for label, _ in row] == [LABELS[i] for i in order]
        np.testing.assert_allclose([score for _, score in row], expected[order], atol=1e-5)
    # the same as classify on cpuformer's own preprocessing, and on transformers'
    _assert_same(model.classify(model.preprocess(paths), top_k=3), top)
    _assert_same(model.classify(pixels, top_k=3), top, atol=1e-5)
    # one path, batching, PIL images, arrays (uint8 HWC, a float [0, 1] NHWC batch), a mixed list
    _assert_same(model.classify(paths[0], top_k=3), top[:1])
    _assert_same(model.classify(paths, top_k=3, batch_size=2), top)
    opened = [Image.open(path) for path in paths]
    _assert_same(model.classify(opened, top_k=3), top)
    arrays = [np.asarray(Image.open(path).convert("RGB")) for path in paths]
    _assert_same(model.classify(arrays[1], top_k=3), top[1:2])
    _assert_same(model.classify([paths[0], arrays[1], opened[2]], top_k=3), top[:3])
    batch = np.stack([arrays[0], arrays[0]]).astype(np.float32) / 255  # float32 NHWC: images, not pixel_values
    _assert_same(model.classify(batch, top_k=6), model.classify(arrays[0], top_k=6) * 2, atol=1e-5)
    assert_close(model.logits(paths), _hf_run(hf, pixels).logits.numpy())


def test_encoder_call_and_embed_equal_transformers_hidden_states(deit, images):
    directory, hf = deit
    _, paths = images
    model = cf.load(directory)
    assert type(model) is cf.ImageEncoder and model.has_pooler
    assert model.image_config.crop_size == (32, 32) and model.image_config.resample == 3  # DeiT's defaults
    pixels = _hf_pixels(directory, paths)
    np.testing.assert_allclose(model.preprocess(paths), pixels, atol=1e-5)
    ref = _hf_run(hf, pixels)
    hidden = ref.last_hidden_state.numpy()
    assert_close(model(paths), hidden)
    cls = model.embed(paths)
    assert cls.shape == (5, 32) and cls.dtype == np.float32
    assert_close(cls, hidden[:, 0])
    assert_close(model.embed(paths, pooling="mean"), hidden[:, 2:].mean(axis=1))  # patches: CLS, distillation out
    assert_close(model.embed(paths, pooling="pooler"), ref.pooler_output.numpy())
    normalized = model.embed(paths, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1, atol=1e-6)
    assert_close(normalized, hidden[:, 0] / np.linalg.norm(hidden[:, 0], axis=1, keepdims=True))
    np.testing.assert_allclose(model.embed(paths, batch_size=2), cls, atol=1e-6)
    np.testing.assert_allclose(model.embed(pixels, batch_size=3), cls, atol=1e-4 * np.abs(cls).max())
    assert model.embed(paths[3]).shape == (1, 32)


def test_pixel_values_without_preprocessor_config(bare, images):
    directory, hf = bare
    _, paths = images
    model = cf.load(directory)
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    assert_close(model.logits(pixels), _hf_run(hf, pixels).logits.numpy())
    assert len(model.classify(pixels)) == 2 and model.embed(pixels).shape == (2, 32)
    message = (r"bare\d* has no preprocessor_config.json, so ImageClassifier cannot preprocess images; give float32 "
               r"pixel_values \[batch, 3, height, width\], preprocessed as the checkpoint's image processor does")
    with pytest.raises(ValueError, match=message + r" \(got list\)"):
        model.classify(paths)
    with pytest.raises(ValueError, match=message + r" \(got str\)"):
        model.embed(paths[0])
    with pytest.raises(ValueError, match=message + r" \(got a uint8 array of shape \[32, 32, 3\]\)"):
        model(np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match=message):
        _ = model.image_config


def test_image_errors(vit, deit, images):
    model = cf.load(vit[0])
    directory, paths = images
    with pytest.raises(ValueError, match=r"image 1: .*notes.txt: cannot read the image"):
        model.classify([paths[0], str(directory / "notes.txt")])
    with pytest.raises(ValueError, match=r"image 5: .*notes.txt: cannot read the image"):  # counted over batches
        model.classify(paths + [str(directory / "notes.txt")], batch_size=2)
    arrays = np.zeros((5, 8, 8, 3), np.float32)
    arrays[3, 0, 0, 0] = 2
    with pytest.raises(ValueError, match=r"image\[2:4\]: a float image must have values in \[0, 1\]"):
        model.embed(arrays, batch_size=2)
    with pytest.raises(ValueError, match=r"image\[0:4\]: a float image must have values in \[0, 1\]"):
        model.embed(arrays, batch_size=4)
    with pytest.raises(ValueError, match=r"^image: a float image must have values in \[0, 1\]"):
        model.embed(arrays)  # one batch: the input itself
    with pytest.raises(TypeError, match="image 4: expected a file path, a PIL image or a NumPy array, got int"):
        model.embed(paths[:4] + [3], batch_size=3)
    with pytest.raises(ValueError, match=r"image 0: .*missing.png: no such image file"):
        model.classify(str(directory / "missing.png"))
    with pytest.raises(ValueError, match="images: an empty batch"):
        model.classify([])
    with pytest.raises(ValueError, match="images: an empty batch"):
        model.embed([])
    with pytest.raises(TypeError, match="image 0: expected a file path, a PIL image or a NumPy array, got int"):
        model.classify([3])
    # float64 pixel_values are images: outside [0, 1], with a hint
    with pytest.raises(ValueError, match=r"a float image must have values in \[0, 1\].*\(pixel_values, already "
                                         r"preprocessed, must be float32; got float64\)"):
        model.classify(np.full((1, 3, 32, 32), -2.0))
    with pytest.raises(ValueError, match="top_k must be an integer >= 1, got 0"):
        model.classify(paths, top_k=0)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        model.classify(paths, batch_size=0)
    with pytest.raises(ValueError, match="pooling must be 'cls', 'mean' or 'pooler', got 'max'"):
        model.embed(paths, pooling="max")
    with pytest.raises(TypeError, match="normalize must be True or False, got 1"):
        model.embed(paths, normalize=1)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got -1"):
        model.embed(paths, batch_size=-1)
    with pytest.raises(ValueError, match=r"ViTForImageClassification: this checkpoint has no pooler \(pooler.dense "
                                         r"weights\); use pooling='cls' or 'mean'"):
        model.embed(paths, pooling="pooler")
    model.close()
    with pytest.raises(ValueError, match="this ImageClassifier is closed"):
        model.embed(paths)
    with pytest.raises(ValueError, match="this ImageClassifier is closed"):
        model.preprocess(paths)


# ---- CLI ---------------------------------------------------------------------------------------------

def run_cli(*args):
    environment = dict(os.environ)
    environment["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + environment.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "cpuformer", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=environment)


def test_cli_classify_images(vit, images, tmp_path):
    directory, _ = vit
    _, paths = images
    model = cf.load(directory)
    out = run_cli("classify", directory, paths[0], paths[1], "--top-k", "3")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    expected = model.classify(paths[:2], top_k=3)
    assert [row["image"] for row in rows] == paths[:2]
    for row, want in zip(rows, expected):
        assert [item["label"] for item in row["labels"]] == [label for label, _ in want]
        np.testing.assert_allclose([item["score"] for item in row["labels"]], [s for _, s in want], atol=1e-6)
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(paths) + "\n\n")
    out = run_cli("classify", directory, "--file", listing, "--top-k", "0", "--batch-size", "2")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [row["image"] for row in rows] == paths
    assert all(len(row["labels"]) == 6 for row in rows)
    assert [row["labels"][0]["label"] for row in rows] == [r[0][0] for r in model.classify(paths, top_k=1)]
    assert len(rows[0]["labels"]) == 6
    out = run_cli("classify", directory, paths[2])  # default top-k 5 for images
    assert out.returncode == 0 and len(json.loads(out.stdout)["labels"]) == 5


def test_cli_embed_images(deit, images, tmp_path):
    directory, _ = deit
    image_dir, paths = images
    model = cf.load(directory)
    output = tmp_path / "out.npy"
    out = run_cli("embed", directory, "--images", image_dir, "-o", output, "--batch-size", "2")
    assert out.returncode == 0, out.stderr
    ordered = sorted(paths)  # a directory's image files, by name (notes.txt left out)
    np.testing.assert_allclose(np.load(output), model.embed(ordered, normalize=True), atol=1e-6)
    out = run_cli("embed", directory, "--images", paths[1], paths[0], "--format", "json", "--pooling", "mean",
                  "--no-normalize")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [row["image"] for row in rows] == [paths[1], paths[0]]
    np.testing.assert_allclose([row["embedding"] for row in rows], model.embed([paths[1], paths[0]], pooling="mean"),
                               atol=1e-6)


def _cli_error(capsys, *args):
    assert cli.main([str(arg) for arg in args]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"cpuformer {args[0]}: error: "), error
    return error


def test_cli_errors(vit, deit, images, tmp_path, capsys):
    image_dir, paths = images
    error = _cli_error(capsys, "classify", vit[0], "a photo of a cat")
    assert ("a photo of a cat: no such file; " + f"{vit[0]} holds an image classifier: give image files (it does not "
            "classify text)") in error
    error = _cli_error(capsys, "classify", vit[0], image_dir / "notes.txt")
    assert "image 0: " in error and "notes.txt: cannot read the image" in error
    error = _cli_error(capsys, "classify", vit[0], *paths, image_dir / "notes.txt", "--batch-size", "2")
    assert "image 5: " in error and "notes.txt: cannot read the image" in error  # counted over the batches
    error = _cli_error(capsys, "classify", vit[0], image_dir)
    assert "a directory; " in error
    error = _cli_error(capsys, "classify", vit[0], paths[0], "--function", "sigmoid")
    assert "holds an image classifier; --ids and --function are for text classifiers" in error
    error = _cli_error(capsys, "classify", deit[0], paths[0])
    assert ("holds DeiTModel, an image model without a classification head; `cpuformer classify` needs an image "
            "classifier (use `cpuformer embed --images`)") in error
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.md").write_text("no images here")
    error = _cli_error(capsys, "embed", deit[0], "--images", empty)
    assert f"--images {empty}: the directory has no image files (.jpg, .jpeg, .png" in error
    error = _cli_error(capsys, "embed", deit[0], "--images", tmp_path / "nothing")
    assert "nothing: no such image file or directory" in error
    error = _cli_error(capsys, "embed", deit[0], "--images", image_dir / "notes.txt", "-o", tmp_path / "x.npy")
    assert "notes.txt: cannot read the image" in error
    error = _cli_error(capsys, "embed", deit[0], "a photo of a cat")
    assert "holds an image model: give the images with --images DIR_OR_FILES (it does not embed text)" in error
    error = _cli_error(capsys, "embed", deit[0], "--images", paths[0], "--pooling", "max")
    assert "--pooling max is for text models; image models pool with cls (default), mean or pooler" in error
    error = _cli_error(capsys, "embed", deit[0], "--images", paths[0], "--ids")
    assert "--images takes the images; texts, --file and --ids are for text models" in error
    error = _cli_error(capsys, "embed", vit[0], "--images", paths[0], "--pooling", "pooler", "-o", tmp_path / "y.npy")
    assert "this checkpoint has no pooler" in error
    bert = tmp_path / "bert"
    save_random_model(bert, transformers.BertModel, transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40))
    capsys.readouterr()  # transformers' saving progress
    error = _cli_error(capsys, "embed", bert, "--images", paths[0])
    assert f"{bert} holds BertModel, an encoder; --images needs an image model (ViT, DeiT, Swin)" in error
    error = _cli_error(capsys, "embed", bert, "--ids", "1 2 3", "--pooling", "pooler")
    assert "--pooling pooler is for image models (--images)" in error
    assert not (tmp_path / "x.npy").exists()


def test_cli_progress_counts_image_batches(vit, deit, images, tmp_path, monkeypatch, capsys):
    """The progress bar (shown on a terminal) is given the batches of images, as for the text commands."""
    _, paths = images
    seen = []

    def progress(steps, desc):
        seen.append((desc, list(steps)))
        return steps

    monkeypatch.setattr(cli, "_progress", progress)
    output = str(tmp_path / "e.npy")
    assert cli.main(["embed", str(deit[0]), "--images", *paths, "--batch-size", "2", "-o", output]) == 0
    assert cli.main(["classify", str(vit[0]), *paths, "--batch-size", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert seen == [("embed", [0, 2, 4]), ("classify", [0, 3])]
