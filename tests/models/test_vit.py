"""ViT and DeiT (cpuformer.ImageEncoder / ImageClassifier) against transformers on random-weight
checkpoints: ViT-B/16's shape scaled down (hidden 64, 2 layers, patch 16, 64x64 images) and odd
shapes (patch 14 on non-square images, patch 32, no query/key/value biases, no pooler, 5 labels,
DeiT with its distillation token and teacher head), position interpolation at other image sizes,
every dtype within its bound, and the error messages."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from cpuformer.models.vision import interpolate_positions

from ._hf import assert_close, cosine_rows, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LABELS5 = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "horse"}
#: ViT-B/16 reduced: hidden 64, 2 layers, patch 16, 64x64 images (a 4x4 grid).
VIT_B16 = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=64,
               patch_size=16, initializer_range=0.2)
#: float16 / bfloat16: max |error| relative to the output's largest magnitude (tests/models/test_quantized.py's
#: bounds); int8 / int4: the lowest per-token cosine to float32.
BOUND_16 = {"float16": 0.005, "bfloat16": 0.02}
COSINE = {"int8": 0.99, "int4": 0.97}


def _save(directory, model_class, config_class, seed=0, **config):
    cls = getattr(transformers, config_class)
    return save_random_model(directory, getattr(transformers, model_class), cls(**config), seed)


def _pixels(batch, height, width, seed=0, channels=3):
    return np.random.default_rng(seed).standard_normal((batch, channels, height, width)).astype(np.float32)


def _hf(model, pixels, **kwargs):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(pixels), **kwargs)


@pytest.fixture(scope="module")
def vit_base(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vit_base")
    return directory, _save(directory, "ViTModel", "ViTConfig", **VIT_B16)


@pytest.fixture(scope="module")
def vit_classifier(tmp_path_factory):
    """Patch 14 on 56x42 images (a 4x3 grid), 5 labels, no pooler."""
    directory = tmp_path_factory.mktemp("vit_classifier")
    config = dict(VIT_B16, image_size=[56, 42], patch_size=14, hidden_size=48, num_attention_heads=3,
                  intermediate_size=100, id2label=LABELS5, label2id={v: k for k, v in LABELS5.items()})
    return directory, _save(directory, "ViTForImageClassification", "ViTConfig", seed=1, **config)


@pytest.fixture(scope="module")
def deit_teacher(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deit_teacher")
    config = dict(VIT_B16, image_size=48, num_labels=7, hidden_act="gelu_new")
    return directory, _save(directory, "DeiTForImageClassificationWithTeacher", "DeiTConfig", seed=2, **config)


# ---- float32 parity ----------------------------------------------------------------------------------

def test_vit_base_hidden_states_and_pooler(vit_base):
    directory, hf = vit_base
    model = cf.load(directory)
    assert type(model) is cf.ImageEncoder and model.family == "vit" and model.has_pooler
    pixels = _pixels(3, 64, 64)
    ref = _hf(hf, pixels)
    hidden, pooled = model(pixels, return_pooler=True)
    assert hidden.shape == (3, 17, 64)
    assert_close(hidden, ref.last_hidden_state.numpy())
    assert_close(pooled, ref.pooler_output.numpy())
    assert_close(model.forward(pixels), ref.last_hidden_state.numpy())
    assert_close(model.pooler_output(pixels), ref.pooler_output.numpy())
    assert_close(model.embeddings(pixels), hf.embeddings(torch.tensor(pixels)).detach().numpy(), 1e-5)
    assert "image=64x64, patch=16x16" in repr(model)


def test_vit_classifier_patch14_non_square(vit_classifier):
    directory, hf = vit_classifier
    model = cf.load(directory)
    assert type(model) is cf.ImageClassifier and not model.has_pooler
    assert model.labels == list(LABELS5.values()) and model.image_size == (56, 42)
    pixels = _pixels(4, 56, 42, seed=3)
    ref = _hf(hf, pixels)
    logits = model.logits(pixels)
    assert logits.shape == (4, 5)
    assert_close(logits, ref.logits.numpy())
    assert_close(model(pixels), hf.vit(torch.tensor(pixels)).last_hidden_state.detach().numpy())
    top = model.classify(pixels, top_k=3)
    expected = torch.softmax(ref.logits, dim=-1).numpy()
    for row, probabilities in zip(top, expected):
        order = np.argsort(-probabilities, kind="stable")[:3]
        assert [label for label, _ in row] == [LABELS5[i] for i in order]
        np.testing.assert_allclose([p for _, p in row], probabilities[order], rtol=1e-4, atol=1e-6)
    assert len(model.classify(pixels, top_k=100)[0]) == 5  # capped at the number of labels


def test_vit_patch32_without_qkv_bias(tmp_path):
    hf = _save(tmp_path, "ViTModel", "ViTConfig", seed=4, **dict(VIT_B16, patch_size=32, qkv_bias=False,
                                                                    hidden_act="gelu_pytorch_tanh"))
    model = cf.load(tmp_path)
    pixels = _pixels(2, 64, 64, seed=5)
    ref = _hf(hf, pixels)
    hidden, pooled = model(pixels, return_pooler=True)
    assert hidden.shape == (2, 5, 64)
    assert_close(hidden, ref.last_hidden_state.numpy())
    assert_close(pooled, ref.pooler_output.numpy())


def test_deit_with_teacher_averages_its_two_heads(deit_teacher):
    directory, hf = deit_teacher
    model = cf.load(directory)
    assert type(model) is cf.ImageClassifier and model.family == "deit" and model.num_labels == 7
    pixels = _pixels(2, 48, 48, seed=6)
    ref = _hf(hf, pixels)
    assert_close(model.logits(pixels), ref.logits.numpy())
    assert_close(model(pixels), hf.deit(torch.tensor(pixels)).last_hidden_state.detach().numpy())
    assert [row[0][0] for row in model.classify(pixels, top_k=1)] == [
        f"LABEL_{i}" for i in ref.logits.argmax(-1).tolist()]
    # the average, not one head: each head alone differs
    cls_logits = ref.cls_logits.numpy()
    assert np.abs(cls_logits - ref.logits.numpy()).max() > 1e-2


def test_deit_classifier_and_base_model(tmp_path):
    config = dict(VIT_B16, image_size=32, patch_size=8, num_labels=3)
    hf = _save(tmp_path / "cls", "DeiTForImageClassification", "DeiTConfig", seed=7, **config)
    pixels = _pixels(2, 32, 32, seed=8)
    assert_close(cf.load(tmp_path / "cls").logits(pixels), _hf(hf, pixels).logits.numpy())
    hf = _save(tmp_path / "base", "DeiTModel", "DeiTConfig", seed=9, **config)
    ref = _hf(hf, pixels)
    hidden, pooled = cf.load(tmp_path / "base")(pixels, return_pooler=True)
    assert hidden.shape == (2, 18, 64)  # CLS, distillation, 16 patches
    assert_close(hidden, ref.last_hidden_state.numpy())
    assert_close(pooled, ref.pooler_output.numpy())


def test_image_encoder_opens_a_classification_checkpoint(vit_classifier):
    directory, hf = vit_classifier
    pixels = _pixels(1, 56, 42)
    encoder = cf.ImageEncoder(directory)
    assert type(encoder) is cf.ImageEncoder
    assert_close(encoder(pixels), hf.vit(torch.tensor(pixels)).last_hidden_state.detach().numpy())


# ---- position interpolation ------------------------------------------------------------------------

@pytest.mark.parametrize("size, out", [((4, 4), (5, 3)), ((4, 4), (2, 7)), ((7, 7), (14, 14)), ((14, 14), (3, 5)),
                                       ((3, 3), (1, 1)), ((2, 2), (9, 4))])
def test_interpolate_positions_matches_torch_bicubic(size, out):
    grid = np.random.default_rng(0).standard_normal(size + (6,)).astype(np.float32)
    ref = torch.nn.functional.interpolate(torch.tensor(grid).permute(2, 0, 1)[None], size=out, mode="bicubic",
                                          align_corners=False)[0].permute(1, 2, 0).numpy()
    ours = interpolate_positions(grid, *out)
    assert ours.dtype == np.float32 and ours.shape == out + (6,)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("height, width", [(80, 48), (96, 96), (48, 48), (64, 64), (70, 53)])
def test_vit_interpolate_pos_encoding(vit_base, height, width):
    directory, hf = vit_base
    model = cf.load(directory)
    pixels = _pixels(2, height, width, seed=10)
    ref = _hf(hf, pixels, interpolate_pos_encoding=True)
    hidden, pooled = model(pixels, interpolate_pos_encoding=True, return_pooler=True)
    assert hidden.shape == (2, 1 + (height // 16) * (width // 16), 64)
    assert_close(hidden, ref.last_hidden_state.numpy())
    assert_close(pooled, ref.pooler_output.numpy())


def test_deit_interpolate_pos_encoding(deit_teacher):
    directory, hf = deit_teacher
    model = cf.load(directory)
    pixels = _pixels(2, 64, 32, seed=11)
    assert_close(model.logits(pixels, interpolate_pos_encoding=True),
                 _hf(hf, pixels, interpolate_pos_encoding=True).logits.numpy())


# ---- dtypes ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def realistic(tmp_path_factory):
    """The dtype checkpoints: transformers' initialization (std 0.02, as trained checkpoints' scale;
    the parity checkpoints' std 0.2 amplifies 4-bit weight error layer by layer, see
    tests/models/test_registry.py): ViT-B/16 reduced with its pooler, and the patch-14 classifier."""
    base, classifier = tmp_path_factory.mktemp("vit_realistic"), tmp_path_factory.mktemp("vit_realistic_cls")
    _save(base, "ViTModel", "ViTConfig", seed=20, **dict(VIT_B16, initializer_range=0.02))
    _save(classifier, "ViTForImageClassification", "ViTConfig", seed=21,
          **dict(VIT_B16, image_size=[56, 42], patch_size=14, initializer_range=0.02, id2label=LABELS5))
    return (base, (64, 64)), (classifier, (56, 42))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "int4"])
def test_every_dtype_within_its_bound(realistic, dtype):
    for directory, size in realistic:
        pixels = _pixels(3, *size, seed=12)
        reference = cf.load(directory)
        model = cf.load(directory, dtype=dtype)
        assert model.dtype == dtype
        ref, ours = reference(pixels), model(pixels)
        if dtype in BOUND_16:
            error = np.abs(ours - ref).max()
            assert 0 < error <= BOUND_16[dtype] * np.abs(ref).max(), (error, np.abs(ref).max())
        else:
            cosine = cosine_rows(ours, ref).min()
            assert COSINE[dtype] <= cosine < 1, cosine
        if isinstance(model, cf.ImageClassifier):
            logits, ref_logits = model.logits(pixels), reference.logits(pixels)
            assert cosine_rows(logits, ref_logits).min() >= COSINE.get(dtype, 0.999)
        else:
            pooled, ref_pooled = model.pooler_output(pixels), reference.pooler_output(pixels)
            assert cosine_rows(pooled, ref_pooled).min() >= COSINE.get(dtype, 0.999)


def test_int4_is_really_four_bits(realistic):
    (directory, _), _ = realistic
    pixels = _pixels(2, 64, 64, seed=13)
    ref = cf.load(directory)(pixels)
    int8 = cosine_rows(cf.load(directory, dtype="int8")(pixels), ref).mean()
    int4 = cosine_rows(cf.load(directory, dtype="int4")(pixels), ref).mean()
    assert int4 < int8


def test_labels_identical_in_16_bits(deit_teacher):
    directory, hf = deit_teacher
    pixels = _pixels(8, 48, 48, seed=14)
    expected = _hf(hf, pixels).logits.argmax(-1).tolist()
    for dtype in ("float32", "float16", "bfloat16"):
        assert cf.load(directory, dtype=dtype).logits(pixels).argmax(-1).tolist() == expected, dtype


# ---- errors ------------------------------------------------------------------------------------------

def test_pixel_value_errors(vit_base, vit_classifier):
    model = cf.load(vit_base[0])
    good = _pixels(1, 64, 64)
    # Anything but float32 [B, 3, H, W] is images, and these directories have no preprocessor_config.json
    # (tests/models/test_vision_api.py preprocesses).
    no_config = "has no preprocessor_config.json, so ImageEncoder cannot preprocess images; give float32 pixel_values"
    with pytest.raises(ValueError, match=no_config + r".*\(got list\)"):
        model(good.tolist())
    with pytest.raises(ValueError, match=no_config + r".*\(got a float64 array of shape \[1, 3, 64, 64\]\)"):
        model(good.astype(np.float64))
    with pytest.raises(ValueError, match=no_config + r".*\(got a float32 array of shape \[3, 64, 64\]\)"):
        model(good[0])
    with pytest.raises(ValueError, match=r"at least one image of at least one pixel, got shape \[0, 3, 64, 64\]"):
        model(good[:0])
    with pytest.raises(ValueError, match=no_config + r".*\(got a float32 array of shape \[1, 64, 64, 3\]\)"):
        model(np.zeros((1, 64, 64, 3), np.float32))  # channels last: images
    with pytest.raises(ValueError, match="pixel_values are 64x48 .height x width. but the model's image size is 64x64; "
                                         "resize the images, or pass interpolate_pos_encoding=True"):
        model(_pixels(1, 64, 48))
    with pytest.raises(ValueError, match=r"pixel_values are 8x64 \(height x width\), smaller than one patch \(16x16\)"):
        model(_pixels(1, 8, 64), interpolate_pos_encoding=True)
    bad = good.copy()
    bad[0, 1, 2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        model(bad)
    with pytest.raises(TypeError, match="interpolate_pos_encoding must be True or False, got 1"):
        model(good, interpolate_pos_encoding=1)
    classifier = cf.load(vit_classifier[0])
    with pytest.raises(ValueError, match="this checkpoint has no pooler"):
        classifier(_pixels(1, 56, 42), return_pooler=True)
    with pytest.raises(ValueError, match="interpolate_pos_encoding needs a square grid of position embeddings; this "
                                         r"checkpoint's is 4x3 \(image_size \[56, 42\]\)"):
        classifier(_pixels(1, 70, 42), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="top_k must be an integer >= 1, got 0"):
        classifier.classify(_pixels(1, 56, 42), top_k=0)
    with pytest.raises(ValueError, match=r"has no preprocessor_config.json, so ImageClassifier cannot preprocess "
                                         r"images.*\(got a uint8 array of shape \[1, 56, 42, 3\]\)"):
        classifier.classify(np.zeros((1, 56, 42, 3), np.uint8))
    with pytest.raises(ValueError, match=r"has no preprocessor_config.json.*\(got str\)"):
        classifier.classify("cat.jpg")
    model.close()
    with pytest.raises(ValueError, match="this ImageEncoder is closed"):
        model(good)


def test_opening_errors(vit_base, tmp_path):
    directory, _ = vit_base
    with pytest.raises(ValueError, match="ViTModel has no classification head; open it with cpuformer.ImageEncoder"):
        cf.ImageClassifier(directory)
    with pytest.raises(ValueError, match="ViTModel is an image model architecture; open it with cpuformer.ImageEncoder "
                                         "or cpuformer.load"):
        cf.Encoder(directory)
    _save(tmp_path / "bert", "BertModel", "BertConfig", vocab_size=50, hidden_size=32, num_hidden_layers=1,
          num_attention_heads=2, intermediate_size=40)
    with pytest.raises(ValueError, match="BertModel is an encoder architecture; open it with cpuformer.Encoder"):
        cf.ImageEncoder(tmp_path / "bert")


def test_missing_qkv_bias(tmp_path):
    import json

    _save(tmp_path, "ViTModel", "ViTConfig", **dict(VIT_B16, num_hidden_layers=1, qkv_bias=False))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), qkv_bias=True)))
    with pytest.raises(ValueError, match="config.json: qkv_bias is true .its default., but the checkpoint has no "
                                         "tensor 'encoder.layer.0.attention.attention.query.bias'"):
        cf.load(tmp_path)


def test_config_errors(tmp_path):
    import json

    _save(tmp_path, "ViTModel", "ViTConfig", **dict(VIT_B16, num_hidden_layers=1))
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    for key, value, error, message in [
            ("pooler_act", "relu", NotImplementedError, "pooler_act 'relu' is not supported; only 'tanh' is"),
            ("patch_size", 128, ValueError, r"image_size \[64, 64\] is smaller than patch_size \[128, 128\]"),
            ("image_size", [64, 64, 3], ValueError, "'image_size' must be an integer or a .height, width. pair"),
            ("hidden_act", "tanh", ValueError, "hidden_act 'tanh' is not supported")]:
        path.write_text(json.dumps(dict(config, **{key: value})))
        with pytest.raises(error, match=message):
            cf.load(tmp_path)


def test_cli_names_the_kind(vit_base, capsys):
    from cpuformer import cli

    assert cli.main(["generate", str(vit_base[0]), "hello"]) != 0
    error = capsys.readouterr().err
    assert "holds ViTModel, an image model; `cpuformer generate` needs a decoder (causal LM) (use " \
           "`cpuformer classify` or `cpuformer embed --images`)" in error, error
    assert cli.main(["embed", str(vit_base[0]), "hello"]) != 0
    error = capsys.readouterr().err
    assert "holds an image model: give the images with --images DIR_OR_FILES (it does not embed text)" in error, error
