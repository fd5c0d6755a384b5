"""Swin Transformer (SwinModel, SwinForImageClassification; models/swin.py) against transformers on
random-weight checkpoints: Swin-T's layout scaled down (embed_dim 32, depths [2, 2, 6, 2], window 7,
224x224 images), odd shapes (non-square images whose size is a multiple of neither the patch nor the
window, odd patch-merging sizes, patch 2, absolute position embeddings interpolated, no query/key/value
biases, gelu_new), windows larger than a stage's resolution, every dtype within its bound, the error
messages, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import cli
from cpuformer.models.swin import SwinImageClassifier, SwinImageEncoder, relative_position_index

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

LABELS5 = {0: "cat", 1: "dog", 2: "bird", 3: "fish", 4: "horse"}
#: Swin-T's layout (patch 4, window 7, depths [2, 2, 6, 2], heads doubling) at embed_dim 32.
SWIN_T = dict(image_size=224, patch_size=4, embed_dim=32, depths=[2, 2, 6, 2], num_heads=[1, 2, 4, 8], window_size=7)
#: 58x45 images: patch grid 15x12 (neither a multiple of the patch), window 3 (15 and 12 padded to
#: a multiple of it in the first stages), an odd height (15) at the first patch merging, the last
#: stage 4x3 (window 3, no shift).
ODD = dict(image_size=64, patch_size=4, embed_dim=24, depths=[2, 2, 2], num_heads=[2, 3, 6], window_size=3,
           qkv_bias=False, hidden_act="gelu_new", mlp_ratio=3.0)
#: Patch 2 with absolute position embeddings (a 16x16 table), window 4.
ABSOLUTE = dict(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
                use_absolute_embeddings=True, mlp_ratio=2.0)
#: float16 / bfloat16: max |error| relative to the output's largest magnitude; int8 / int4: the lowest
#: per-token cosine of the hidden states to float32 (docs/vision.md).
BOUND_16 = {"float16": 0.005, "bfloat16": 0.02}
COSINE = {"int8": 0.99, "int4": 0.97}


def _save(directory, model_class, seed=0, noise=0.1, **config):
    """A transformers Swin model with seeded random weights (norms and biases noised, so that a
    tensor read from the wrong place changes the outputs), saved as safetensors."""
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(transformers.SwinConfig(**config)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * noise)
        for name, parameter in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                parameter.normal_(0.0, 1.0)  # transformers initializes it at 0: make it count
    model.save_pretrained(directory, safe_serialization=True)
    return model


def _pixels(batch, height, width, seed=0, channels=3):
    return np.random.default_rng(seed).standard_normal((batch, channels, height, width)).astype(np.float32)


def _hf(model, pixels, **kwargs):
    with torch.no_grad():
        return model(pixel_values=torch.tensor(pixels), **kwargs)


def assert_close(ours, reference, tolerance=1e-4):
    reference = np.asarray(reference, dtype=np.float32)
    scale = float(np.abs(reference).max())
    np.testing.assert_allclose(ours, reference, rtol=tolerance, atol=tolerance * scale)


def cosine_rows(a, b):
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _check(model, hf, pixels, **kwargs):
    """last_hidden_state, pooler_output and logits (top labels identical) against transformers."""
    base = hf.swin if hasattr(hf, "swin") else hf
    ref = _hf(base, pixels, **kwargs)
    hidden, pooled = model(pixels, return_pooler=True, **kwargs)
    assert hidden.shape == tuple(ref.last_hidden_state.shape)
    assert_close(hidden, ref.last_hidden_state.numpy())
    assert_close(pooled, ref.pooler_output.numpy())
    assert_close(model.pooler_output(pixels, **kwargs), ref.pooler_output.numpy())
    if isinstance(model, cf.ImageClassifier):
        logits, expected = model.logits(pixels, **kwargs), _hf(hf, pixels, **kwargs).logits.numpy()
        assert_close(logits, expected)
        assert logits.argmax(-1).tolist() == expected.argmax(-1).tolist()
        assert [row[0][0] for row in model.classify(pixels, top_k=2, **kwargs)] == \
            [model.labels[i] for i in expected.argmax(-1)]


@pytest.fixture(scope="module")
def swin_t(tmp_path_factory):
    directory = tmp_path_factory.mktemp("swin_t")
    return directory, _save(directory, "SwinForImageClassification", seed=1, id2label=LABELS5, **SWIN_T)


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    directory = tmp_path_factory.mktemp("swin_odd")
    return directory, _save(directory, "SwinForImageClassification", seed=2, num_labels=3, **ODD)


@pytest.fixture(scope="module")
def absolute(tmp_path_factory):
    directory = tmp_path_factory.mktemp("swin_absolute")
    return directory, _save(directory, "SwinModel", seed=3, **ABSOLUTE)


def test_swin_t_layout_matches_transformers(swin_t):
    directory, hf = swin_t
    model = cf.load(directory)
    assert type(model) is SwinImageClassifier and isinstance(model, cf.ImageClassifier)
    assert model.family == "swin" and model.hidden_size == 256 and model.labels == list(LABELS5.values())
    assert "depths=[2, 2, 6, 2]" in repr(model) and "window=7" in repr(model)
    # 224x224: stages 56, 28, 14, 7 (the last one window 7, no shift); shifted windows in the others.
    _check(model, hf, _pixels(2, 224, 224, seed=1))


def test_odd_shapes_match_transformers(odd):
    directory, hf = odd
    model = cf.load(directory)
    _check(model, hf, _pixels(2, 58, 45, seed=2))
    # The embeddings (patch GEMM over the zero-padded image, norm) as transformers' module.
    pixels = _pixels(1, 58, 45, seed=3)
    with torch.no_grad():
        expected, dims = hf.swin.embeddings(torch.tensor(pixels))
    assert dims == (15, 12)
    assert_close(model.embeddings(pixels), expected.numpy())


def test_other_sizes_without_position_table(odd):
    """Without absolute positions any image size runs (transformers needs no interpolation); a fresh
    transformers model per size (transformers keeps the clamped window of a call)."""
    directory, _ = odd
    model = cf.load(directory)
    for seed, (height, width) in enumerate([(64, 64), (37, 70), (100, 36)]):
        hf = _save(directory.parent / f"odd_{seed}", "SwinForImageClassification", seed=2, num_labels=3, **ODD)
        _check(model, hf, _pixels(1, height, width, seed=10 + seed))


def test_absolute_positions_and_interpolation(absolute):
    directory, hf = absolute
    model = cf.load(directory)
    assert type(model) is SwinImageEncoder and not isinstance(model, cf.ImageClassifier)
    _check(model, hf, _pixels(2, 32, 32, seed=4))
    _check(model, hf, _pixels(2, 32, 32, seed=4), interpolate_pos_encoding=True)  # the table as it is
    _check(model, hf, _pixels(2, 40, 56, seed=5), interpolate_pos_encoding=True)  # bicubic, non-square
    _check(model, hf, _pixels(1, 24, 24, seed=6), interpolate_pos_encoding=True)  # smaller
    embedded = model.embed(_pixels(3, 40, 56, seed=5), interpolate_pos_encoding=True, normalize=True)
    assert embedded.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(embedded, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("window", [1, 2, 7])
def test_relative_position_index_is_transformers(window):
    from transformers.models.swin.modeling_swin import SwinRelativePositionBias

    expected = SwinRelativePositionBias(2, (window, window))._create_relative_position_index().numpy()
    np.testing.assert_array_equal(relative_position_index(window, window), expected)
    # A smaller window's rows in the full window's table: the top-left corner's rows and columns.
    corner = (np.arange(2)[:, None] * 7 + np.arange(2)[None, :]).reshape(-1)
    full = SwinRelativePositionBias(2, (7, 7))._create_relative_position_index().numpy()
    np.testing.assert_array_equal(relative_position_index(2, 7), full[np.ix_(corner, corner)])


def _windows_of_transformers(hf, pixels, window_size, patch_size):
    """transformers 5.24 fails on a stage smaller than the window (its bias keeps the full window's
    ws² x ws² shape). Its reference here: each block of such a stage gets the rows and columns of
    transformers' own relative_position_index for the tokens of the top-left w x w corner of the
    ws x ws window (the bias of the same offsets), w = the stage's smaller side."""
    height, width = -(-pixels.shape[2] // patch_size), -(-pixels.shape[3] // patch_size)
    for stage in hf.swin.encoder.layers:
        if min(height, width) < window_size:
            w = min(height, width)
            corner = (np.arange(w)[:, None] * window_size + np.arange(w)[None, :]).reshape(-1)
            for block in stage.blocks:
                bias = block.attention.relative_position_bias
                full = bias._create_relative_position_index().numpy()
                bias.relative_position_index = torch.tensor(full[np.ix_(corner, corner)].reshape(-1))
                bias.window_area = w * w
        height, width = (height + 1) // 2, (width + 1) // 2


def test_window_larger_than_a_stage(tmp_path):
    config = dict(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2, 2], num_heads=[2, 2, 4], window_size=7,
                  num_labels=4)
    hf = _save(tmp_path, "SwinForImageClassification", seed=4, **config)
    model = cf.load(tmp_path)
    # 64x52: stages 16x13 (window 7, shifted, padded to 21x14), 8x7 (7 <= 7: window 7, no shift),
    # 4x4 (window 4 < 7: the bias of the smaller window).
    pixels = _pixels(2, 64, 52, seed=7)
    with pytest.raises(RuntimeError):  # transformers 5.24 itself
        _hf(hf, pixels)
    hf = _save(tmp_path / "again", "SwinForImageClassification", seed=4, **config)
    _windows_of_transformers(hf, pixels, 7, 4)
    _check(model, hf, pixels)


@pytest.fixture(scope="module")
def realistic(tmp_path_factory):
    """Real weight scales (initializer_range 0.02) on the Swin-T layout and on the odd shapes."""
    base, odd_dir = tmp_path_factory.mktemp("swin_real"), tmp_path_factory.mktemp("swin_real_odd")
    _save(base, "SwinModel", seed=20, noise=0.02, **dict(SWIN_T, image_size=112, depths=[2, 2, 2], num_heads=[1, 2, 4]))
    _save(odd_dir, "SwinForImageClassification", seed=21, noise=0.02, num_labels=5, **ODD)
    return (base, (112, 112)), (odd_dir, (58, 45))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "int4"])
def test_every_dtype_within_its_bound(realistic, dtype):
    for directory, size in realistic:
        pixels = _pixels(2, *size, seed=12)
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
        assert cosine_rows(model.pooler_output(pixels), reference.pooler_output(pixels)).min() >= \
            COSINE.get(dtype, 0.999)
        if isinstance(model, cf.ImageClassifier):
            assert cosine_rows(model.logits(pixels), reference.logits(pixels)).min() >= COSINE.get(dtype, 0.999)


def test_int4_is_really_four_bits(realistic):
    (directory, size), _ = realistic
    pixels = _pixels(2, *size, seed=13)
    ref = cf.load(directory)(pixels)
    int8 = cosine_rows(cf.load(directory, dtype="int8")(pixels), ref).mean()
    int4 = cosine_rows(cf.load(directory, dtype="int4")(pixels), ref).mean()
    assert int4 < int8


def test_bad_inputs(absolute, odd):
    model = cf.load(absolute[0])
    with pytest.raises(ValueError, match=r"has no preprocessor_config.json.*got a float32 array of shape \[1, 4, 32"):
        model(_pixels(1, 32, 32, channels=4))  # 4 channels: not pixel_values of this model, and no preprocessing
    with pytest.raises(ValueError, match=r"pixel_values are 40x56 \(height x width\) but the model's image size is "
                                         r"32x32 and it has absolute position embeddings; .*interpolate_pos_encoding"):
        model(_pixels(1, 40, 56))
    with pytest.raises(ValueError, match="interpolate_pos_encoding needs an image size that is a multiple of the patch "
                                         "size 2x2, got 41x56"):
        model(_pixels(1, 41, 56), interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="NaN or infinite"):
        model(np.full((1, 3, 32, 32), np.nan, dtype=np.float32))
    with pytest.raises(TypeError, match="interpolate_pos_encoding must be True or False"):
        model(_pixels(1, 32, 32), interpolate_pos_encoding=1)
    with pytest.raises(ValueError, match=r"pooling must be 'mean' or 'pooler' for Swin models \(they have no CLS "
                                         r"token\), got 'cls'"):
        model.embed(_pixels(1, 32, 32), pooling="cls")
    with pytest.raises(ValueError, match="SwinModel has no classification head; open it with cpuformer.ImageEncoder"):
        SwinImageClassifier(absolute[0])
    with pytest.raises(ValueError, match=r"runs stage by stage; open it with cpuformer.load"):
        cf.ImageEncoder(odd[0])
    classifier = cf.load(odd[0])
    with pytest.raises(ValueError, match=r"pixel_values must have 3 channels"):
        classifier._pixel_values(_pixels(1, 58, 45, channels=4), False)
    classifier.close()
    with pytest.raises(ValueError, match="this SwinImageClassifier is closed"):
        classifier.logits(_pixels(1, 58, 45))


def _edit(source, target, config=None, tensors=None):
    """A copy of checkpoint ``source`` with config.json entries replaced and tensors edited."""
    import shutil

    shutil.copytree(source, target)
    if config is not None:
        data = json.loads((target / "config.json").read_text())
        data.update(config)
        (target / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        weights = safetensors_torch.load_file(str(target / "model.safetensors"))
        tensors(weights)
        safetensors_torch.save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


@pytest.mark.parametrize("config, message", [
    (dict(window_size=0), "'window_size' must be an integer >= 1, got 0"),
    (dict(depths=[2, 2]), r"depths \[2, 2\] and num_heads \[2, 3, 6\] must have one entry per stage"),
    (dict(num_heads=[5, 3, 6]), r"stage 0's width 24 .embed_dim · 2\^stage. is not a multiple of its num_heads 5"),
    (dict(depths=[2, 0, 2]), r"'depths' must be a non-empty list of integers >= 1, got \[2, 0, 2\]"),
    (dict(patch_size=128), r"image_size \[64, 64\] is smaller than patch_size \[128, 128\]"),
    (dict(use_mask_token=True), "use_mask_token .masked image modelling. is not supported"),
])
def test_bad_configs(odd, tmp_path, config, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        cf.load(_edit(odd[0], tmp_path / "bad", config=config))


def test_bad_checkpoints(odd, tmp_path):
    name = "swin.encoder.layers.1.blocks.0.attention.self.relative_position_bias_table"
    missing = _edit(odd[0], tmp_path / "missing", tensors=lambda w: w.pop(name))
    with pytest.raises(ValueError, match=f"has no tensor '{name}'"):
        cf.load(missing)
    extra = _edit(odd[0], tmp_path / "extra", tensors=lambda w: w.update({"swin.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="the checkpoint has tensors that Swin models do not use: swin.extra.weight"):
        cf.load(extra)
    # transformers < 5 saved the relative_position_index buffers: ignored (recomputed from window_size).
    index = "swin.encoder.layers.0.blocks.0.attention.self.relative_position_index"
    buffered = _edit(odd[0], tmp_path / "buffer",
                     tensors=lambda w: w.update({index: torch.zeros(81, dtype=torch.int64)}))
    pixels = _pixels(1, 58, 45)
    np.testing.assert_array_equal(cf.load(buffered).logits(pixels), cf.load(odd[0]).logits(pixels))
    table = _edit(odd[0], tmp_path / "table", tensors=lambda w: w.update({name: torch.zeros(9, 3)}))
    with pytest.raises(ValueError, match=r"relative_position_bias_table.*shape"):
        cf.load(table)
    converted = _edit(odd[0], tmp_path / "converted", config={"cpuformer": {"dtype": "int8", "format_version": 1}})
    with pytest.raises(NotImplementedError, match=r"converted by `cpuformer convert` \(int8\) cannot be opened as a "
                                                  "Swin model; open the original checkpoint with dtype="):
        cf.load(converted)


@pytest.fixture(scope="module")
def with_images(odd, tmp_path_factory):
    """The odd classifier with a preprocessor_config.json (resize to 58x45) and 3 PNG images."""
    Image = pytest.importorskip("PIL.Image")
    import shutil

    directory = tmp_path_factory.mktemp("swin_images") / "model"
    shutil.copytree(odd[0], directory)
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 58, "width": 45},
         "resample": 2, "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.3, 0.25]}))
    paths = []
    for i in range(3):
        rng = np.random.default_rng(30 + i)
        y, x = np.mgrid[0:50, 0:70]
        picture = np.stack([(x * (3 + i)) % 256, (y * (5 - i)) % 256, rng.integers(0, 256, (50, 70))], axis=-1)
        path = directory.parent / f"image{i}.png"
        Image.fromarray(picture.astype(np.uint8)).save(path)
        paths.append(str(path))
    return directory, odd[1], paths


def test_images_and_cli(with_images, tmp_path, capsys):
    directory, hf, paths = with_images
    model = cf.load(directory)
    pixels = model.preprocess(paths)
    assert pixels.shape == (3, 3, 58, 45)
    from transformers import AutoImageProcessor
    from transformers.image_utils import load_image

    processor = AutoImageProcessor.from_pretrained(str(directory))  # transformers' pipeline preprocessing
    expected_pixels = processor([load_image(path) for path in paths], return_tensors="np")["pixel_values"]
    np.testing.assert_allclose(pixels, expected_pixels, atol=1e-5)
    expected = _hf(hf, pixels).logits.numpy()
    top = model.classify(paths, top_k=2)
    assert [row[0][0] for row in top] == [model.labels[i] for i in expected.argmax(-1)]
    assert cli.main(["classify", str(directory), *paths, "--top-k", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["image"] for row in rows] == paths
    for row, want in zip(rows, top):
        assert [item["label"] for item in row["labels"]] == [label for label, _ in want]
        np.testing.assert_allclose([item["score"] for item in row["labels"]], [s for _, s in want], atol=1e-6)
    output = tmp_path / "out.npy"
    assert cli.main(["embed", str(directory), "--images", *paths, "-o", str(output), "--batch-size", "2"]) == 0
    np.testing.assert_allclose(np.load(output), model.embed(paths, normalize=True), atol=1e-6)
    with torch.no_grad():
        pooled = hf.swin(pixel_values=torch.tensor(pixels)).pooler_output.numpy()
    assert_close(model.embed(paths), pooled)
    assert cli.main(["embed", str(directory), "--images", paths[0], "--pooling", "cls"]) == 2
    assert "pooling must be 'mean' or 'pooler' for Swin models" in capsys.readouterr().err


def test_cli_classify_needs_a_classifier(absolute, with_images, capsys):
    _, _, paths = with_images
    assert cli.main(["classify", str(absolute[0]), paths[0]]) == 2
    assert ("holds SwinModel, an image model without a classification head; `cpuformer classify` needs an image "
            "classifier") in capsys.readouterr().err


def test_window_layouts_are_cached_per_size(odd):
    model = cf.load(odd[0])
    block = model._live().stages[0][0][1]
    for size in range(20, 60, 4):  # 10 patch grids
        model(_pixels(1, size, size + 3))
    assert len(block._grids) == 8
    assert block.grid(9, 11) is block.grid(9, 11)


def test_num_threads_reaches_every_kernel(odd):
    """Each kernel call holds num_threads compute slots (_core._compute_slots): a model opened with
    num_threads=1 never holds more than one, so none of its kernels ran on the process default."""
    from cpuformer import _core

    pixels = _pixels(2, 58, 45, seed=40)
    one, default = cf.load(odd[0], num_threads=1), cf.load(odd[0])
    assert one.num_threads == 1
    _core._reset_compute_slots_peak()
    logits = one.logits(pixels)
    assert _core._compute_slots()["peak"] == 1
    assert_close(logits, default.logits(pixels))
    _core._reset_compute_slots_peak()
    default.logits(pixels)
    assert _core._compute_slots()["peak"] == min(_core.get_num_threads(), _core._compute_slots()["capacity"])


def test_threads_share_a_model(odd):
    """Threads calling one model on different sizes (more than the layout cache keeps) get what
    sequential calls give."""
    import threading

    model = cf.load(odd[0])
    sizes = [(20 + 4 * i, 30 + 3 * i) for i in range(12)]
    expected = [model.logits(_pixels(1, h, w, seed=i)) for i, (h, w) in enumerate(sizes)]
    results = [None] * len(sizes)

    def work(part):
        for i in part:
            h, w = sizes[i]
            results[i] = model.logits(_pixels(1, h, w, seed=i))

    threads = [threading.Thread(target=work, args=(range(t, len(sizes), 4),)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_transformers_5_module_names(odd, tmp_path):
    """A checkpoint with transformers 5's module names (q_proj, o_proj, mlp.fc1, ...) reads the same."""
    renames = [("attention.self.query.", "attention.q_proj."), ("attention.self.key.", "attention.k_proj."),
               ("attention.self.value.", "attention.v_proj."), ("attention.output.dense.", "attention.o_proj."),
               ("attention.self.relative_position_bias_table", "attention.relative_position_bias."
                                                               "relative_position_bias_table"),
               ("intermediate.dense.", "mlp.fc1."), ("blocks.0.output.dense.", "blocks.0.mlp.fc2."),
               ("blocks.1.output.dense.", "blocks.1.mlp.fc2.")]

    def rename(weights):
        for name in list(weights):
            new = name
            for old, replacement in renames:
                new = new.replace(old, replacement)
            if new != name:
                weights[new] = weights.pop(name)
        assert not [name for name in weights if any(old in name for old in ("self.", "intermediate", "output.dense"))]

    renamed = _edit(odd[0], tmp_path / "renamed", tensors=rename)
    pixels = _pixels(1, 58, 45, seed=41)
    np.testing.assert_array_equal(cf.load(renamed).logits(pixels), cf.load(odd[0]).logits(pixels))


def test_batch_equals_images_alone(odd):
    """The C++ block runs the windows of a batch together (unshifted) or image by image (shifted):
    each image of a batch gets what it gets alone."""
    model = cf.load(odd[0])
    pixels = _pixels(3, 58, 45, seed=42)
    together = model(pixels)
    for i in range(3):
        np.testing.assert_allclose(together[i:i + 1], model(pixels[i:i + 1]), rtol=1e-5, atol=1e-5)


def test_patch_merge_op():
    from cpuformer import _core

    rng = np.random.default_rng(43)
    for batch, height, width, C in [(2, 5, 4, 3), (1, 4, 7, 8), (3, 1, 1, 2)]:
        x = rng.standard_normal((batch * height * width, C)).astype(np.float32)
        weight, bias = rng.standard_normal(4 * C).astype(np.float32), rng.standard_normal(4 * C).astype(np.float32)
        h2, w2 = (height + 1) // 2, (width + 1) // 2
        grid = np.zeros((batch, 2 * h2, 2 * w2, C), dtype=np.float32)
        grid[:, :height, :width] = x.reshape(batch, height, width, C)
        merged = np.concatenate([grid[:, 0::2, 0::2], grid[:, 1::2, 0::2], grid[:, 0::2, 1::2], grid[:, 1::2, 1::2]],
                                axis=-1).reshape(-1, 4 * C)
        expected = _core.layer_norm(merged, weight, bias, 1e-5)
        got = _core.swin_patch_merge(x, batch, height, width, weight, bias, 1e-5, num_threads=1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    x = np.zeros((20, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"x must have batch · height · width = 2 · 5 · 3 rows, got shape \[20, 3\]"):
        _core.swin_patch_merge(x, 2, 5, 3, np.ones(12, np.float32), None, 1e-5)
    with pytest.raises(ValueError, match=r"weight must have shape \[12\], got \[3\]"):
        _core.swin_patch_merge(x, 2, 5, 2, np.ones(3, np.float32), None, 1e-5)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        _core.swin_patch_merge(x, 2, 5, 2, np.ones(12, np.float32), None, -1.0)
    with pytest.raises(TypeError, match="x"):
        _core.swin_patch_merge(x.astype(np.float64), 2, 5, 2, np.ones(12, np.float32), None, 1e-5)


def test_block_op_bad_inputs(odd):
    """_core.SwinBlock refuses what would read or write out of bounds, with a message naming it."""
    from cpuformer import _core

    model = cf.load(odd[0])
    block = model._live().stages[0][0][1]  # shifted, width 24, 2 heads, window 3
    assert block.core.dim == 24 and block.core.heads == 2
    g = block.grid(15, 12)
    x = np.random.default_rng(44).standard_normal((360, 24)).astype(np.float32)  # 2 images of 15x12 tokens
    reference = x.copy()
    assert block.core(x, 2, g.source, g.inverse, g.mask) is None and not np.array_equal(x, reference)  # in place
    assert model._live().scratch.idle_bytes > 0
    cases = [
        (dict(x=x[:, :12].copy()), ValueError, r"x must be .*\[batch · tokens, 24\], got shape \[360, 12\]"),
        (dict(x=x.astype(np.float64)), TypeError, "x must be a writeable C-contiguous float32"),
        (dict(x=x[::2]), TypeError, "x must be a writeable C-contiguous float32"),
        (dict(x=np.broadcast_to(x[:1], x.shape)), TypeError, "x must be a writeable C-contiguous float32"),
        (dict(batch=3), ValueError, r"x has 360 rows; batch 3 x 180 tokens \(the size of inverse\) needs 540"),
        (dict(batch=0), ValueError, "batch must be >= 1, got 0"),
        (dict(source=g.source.astype(np.int32)), TypeError, "source must be a"),
        (dict(source=np.where(g.source == 5, 180, g.source)), ValueError, r"source\[\d+\] = 180 is not in \[-1, 180\)"),
        (dict(inverse=np.where(g.inverse == 5, -1, g.inverse)), ValueError, r"inverse\[\d+\] = -1 is not in \[0, "),
        (dict(mask=g.mask[:, :1]), ValueError, r"mask must have shape \[1 \| windows, 2, area, area\]"),
        (dict(mask=g.mask[:2]), ValueError, r"mask must have shape \[1 \| windows, 2, area, area\]"),
        (dict(num_threads=-1), ValueError, "num_threads"),
    ]
    for change, error, message in cases:
        arguments = dict(x=x, batch=2, source=g.source, inverse=g.inverse, mask=g.mask, num_threads=0)
        arguments.update(change)
        with pytest.raises(error, match=message):
            block.core(**arguments)
    weights = {name: np.ones((24, 24), np.float32) for name in ("q", "k", "v", "o")}
    weights.update({name: np.ones(24, np.float32) for name in ("norm1", "norm2", "o.bias", "down.bias")})
    weights.update({"up": np.ones((48, 24), np.float32), "up.bias": np.ones(48, np.float32),
                    "down": np.ones((24, 48), np.float32)})
    scratch = _core.SwinScratch()
    assert _core.SwinBlock(weights, 2, 1e-5, "gelu", "float32", 32, False, scratch).dim == 24
    for change, error, message in [
        (dict(weights, extra=np.ones(3, np.float32)), ValueError, "SwinBlock: unknown tensor 'extra'"),
        ({k: v for k, v in weights.items() if k != "v"}, ValueError, "SwinBlock: tensor 'v' is missing"),
        (dict(weights, down=np.ones((24, 40), np.float32)), ValueError, r"down must have shape \[24, 48\]"),
    ]:
        with pytest.raises(error, match=message):
            _core.SwinBlock(change, 2, 1e-5, "gelu", "float32", 32, False, scratch)
    with pytest.raises(ValueError, match="heads must be >= 1 and divide the width 24, got 5"):
        _core.SwinBlock(weights, 5, 1e-5, "gelu", "float32", 32, False, scratch)
    with pytest.raises(ValueError, match="activation must be one of"):
        _core.SwinBlock(weights, 2, 1e-5, "tanh", "float32", 32, False, scratch)
    with pytest.raises(ValueError, match="dtype must be"):
        _core.SwinBlock(weights, 2, 1e-5, "gelu", "int2", 32, False, scratch)
