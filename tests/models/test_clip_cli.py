"""CLIP on the command line: ``cpuformer embed CLIP_DIR TEXT...`` / ``--images``, and
``cpuformer classify CLIP_DIR IMAGE... --labels ...`` against transformers' zero-shot-image-
classification pipeline (hypothesis "This is a photo of {}.", softmax over the labels); the error
messages of the CLIP forms and of --labels elsewhere."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import cli

from .test_clip import LABELS, TEXTS, _build, _image_files, _train_tokenizer
from .test_vit import VIT_B16, _save

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    directory = tmp_path_factory.mktemp("clip")
    _build(directory, "b32", _train_tokenizer(), seed=3)
    return directory


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    directory = tmp_path_factory.mktemp("clip-images")
    paths = [str(p) for p in _image_files(directory)]
    (directory / "notes.txt").write_text("not an image\n")
    return directory, sorted(paths)


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vit")
    _save(directory, "ViTForImageClassification", "ViTConfig", **dict(VIT_B16, image_size=32, num_labels=3))
    return directory


def _run(capsys, *args):
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_embed_images_writes_npy(clip, images, tmp_path, capsys):
    directory, paths = images
    out = tmp_path / "images.npy"
    code, _, err = _run(capsys, "embed", clip, "--images", directory, "-o", out, "--batch-size", 3)
    assert code == 0, err
    vectors = np.load(out)
    expected = cf.CLIP(clip).embed_images(paths)  # every image file of the directory, sorted by name
    assert vectors.shape == expected.shape and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    code, text, err = _run(capsys, "embed", clip, "--images", paths[1], paths[0], "--format", "json",
                           "--no-normalize")
    assert code == 0, err
    rows = [json.loads(line) for line in text.splitlines()]
    assert [row["image"] for row in rows] == [paths[1], paths[0]]
    np.testing.assert_allclose(np.array([row["embedding"] for row in rows], dtype=np.float32),
                               cf.CLIP(clip).embed_images([paths[1], paths[0]], normalize=False), rtol=1e-5,
                               atol=1e-6)


def test_embed_texts(clip, tmp_path, capsys):
    model = cf.CLIP(clip)
    code, text, err = _run(capsys, "embed", clip, *TEXTS)
    assert code == 0, err
    np.testing.assert_allclose(np.array(json.loads(text), dtype=np.float32), model.embed_texts(TEXTS), rtol=1e-5,
                               atol=1e-6)
    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "texts.npy"
    code, _, err = _run(capsys, "embed", clip, "--file", lines, "--format", "npy", "-o", out, "--no-normalize",
                        "--batch-size", 2)
    assert code == 0, err
    np.testing.assert_allclose(np.load(out), model.embed_texts(TEXTS, normalize=False), rtol=1e-5, atol=1e-6)
    ids = model.tokenizer.encode(TEXTS[2])
    code, text, err = _run(capsys, "embed", clip, " ".join(map(str, ids)), "--ids")
    assert code == 0, err
    np.testing.assert_allclose(np.array(json.loads(text), dtype=np.float32), model.embed_texts(TEXTS[2:3]),
                               rtol=1e-5, atol=1e-6)


def test_classify_equals_the_zero_shot_pipeline(clip, images, capsys):
    _, paths = images
    pipe = transformers.pipeline("zero-shot-image-classification", model=str(clip))
    code, text, err = _run(capsys, "classify", clip, *paths, "--labels", *LABELS, "--top-k", 0, "--batch-size", 3)
    assert code == 0, err
    rows = [json.loads(line) for line in text.splitlines()]
    assert [row["image"] for row in rows] == paths
    for row, path in zip(rows, paths):
        expected = pipe(path, candidate_labels=LABELS)  # hypothesis_template "This is a photo of {}."
        assert [item["label"] for item in row["labels"]] == [item["label"] for item in expected]
        np.testing.assert_allclose([item["score"] for item in row["labels"]],
                                   [item["score"] for item in expected], atol=1e-5)
    # The API with the pipeline's template gives the same; --top-k 2 the first two.
    api = cf.CLIP(clip).classify(paths, LABELS, top_k=2, hypothesis_template=cli.HYPOTHESIS_TEMPLATE)
    code, text, err = _run(capsys, "classify", clip, *paths, "--labels", *LABELS, "--top-k", 2)
    assert code == 0, err
    for line, top in zip(text.splitlines(), api):
        labels = json.loads(line)["labels"]
        assert [item["label"] for item in labels] == [label for label, _ in top]
        np.testing.assert_allclose([item["score"] for item in labels], [p for _, p in top], rtol=1e-6)
    # '{}': the labels as the texts, CLIP.classify's default.
    code, text, err = _run(capsys, "classify", clip, paths[0], "--labels", *LABELS, "--hypothesis-template", "{}")
    assert code == 0, err
    top = cf.CLIP(clip).classify([paths[0]], LABELS)[0]
    assert [item["label"] for item in json.loads(text)["labels"]] == [label for label, _ in top]


def test_classify_api_template_and_batches(clip, images):
    _, paths = images
    model = cf.CLIP(clip)
    hypotheses = [cli.HYPOTHESIS_TEMPLATE.format(label) for label in LABELS]
    probs = model.scores(paths, hypotheses)
    top = model.classify(paths, LABELS, top_k=3, hypothesis_template=cli.HYPOTHESIS_TEMPLATE, batch_size=1)
    for row, result in zip(probs, top):
        order = np.argsort(-row, kind="stable")[:3]
        assert [label for label, _ in result] == [LABELS[j] for j in order]
        np.testing.assert_allclose([p for _, p in result], row[order], rtol=1e-5)
    with pytest.raises(ValueError, match=r"hypothesis_template must contain \{\} \(where each label goes\), got 'a'"):
        model.classify(paths, LABELS, hypothesis_template="a")
    with pytest.raises(ValueError, match=r"hypothesis_template 'a \{\} \{x\}': only one \{\} placeholder is allowed"):
        model.classify(paths, LABELS, hypothesis_template="a {} {x}")
    with pytest.raises(TypeError, match="labels.1. must be a string, got int"):
        model.classify(paths, ["a", 1])
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        model.classify(paths, LABELS, batch_size=0)


def test_errors(clip, vit, images, tmp_path, capsys):
    directory, paths = images

    def error(*args):
        code, _, err = _run(capsys, *args)
        assert code == 2
        return err

    assert "--labels is for CLIP models (zero-shot image classification); " in error("classify", vit, paths[0],
                                                                                      "--labels", "a", "b")
    assert "holds ViTForImageClassification, an image model, which classifies with its own labels" in error(
        "classify", vit, paths[0], "--hypothesis-template", "a {}")
    assert ("holds CLIPModel, a CLIP model: zero-shot classification needs the candidate labels, --labels LABEL "
            "[LABEL ...] (after the image files)") in error("classify", clip, paths[0])
    assert "a cat: no such file; " in error("classify", clip, "a cat", "--labels", "x")
    assert "--ids and --function are for text classifiers" in error("classify", clip, paths[0], "--labels", "x",
                                                                    "--function", "softmax")
    assert "hypothesis_template must contain {}" in error("classify", clip, paths[0], "--labels", "x",
                                                          "--hypothesis-template", "a photo")
    assert "image 1: " in error("classify", clip, paths[0], str(directory / "notes.txt"), "--labels", "x")
    assert "--pooling is for encoders and image models; " in error("embed", clip, "a", "--pooling", "mean")
    assert "give texts (or --file, --ids) or --images, not both" in error("embed", clip, "a", "--images", paths[0])
    assert "to embed texts, or --images DIR_OR_FILE to embed images" in error("embed", clip)
    assert "holds an image model: give the images with --images" in error("embed", vit, "a text")  # texts, image model
    assert "use `cpuformer embed` or `cpuformer classify --labels`" in error("generate", clip, "hello")


def test_progress_counts_image_batches(clip, images, tmp_path, monkeypatch, capsys):
    """The progress bar (shown on a terminal) is given the batches of images, as for image models."""
    _, paths = images
    seen = []

    def progress(steps, desc):
        seen.append((desc, list(steps)))
        return steps

    monkeypatch.setattr(cli, "_progress", progress)
    assert cli.main(["embed", str(clip), "--images", *paths, "--batch-size", "3", "-o", str(tmp_path / "e.npy")]) == 0
    assert cli.main(["classify", str(clip), *paths, "--labels", "a", "b", "--batch-size", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(paths) == 4
    assert seen == [("embed", [0, 3]), ("classify", [0, 2])]
