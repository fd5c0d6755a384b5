"""CLIP (``cpuformer.CLIP``) against transformers' CLIPModel on random-weight checkpoints.

Two checkpoints: ViT-B/32's layout scaled down (patch 32, quick GELU, the first end-of-text token
pooled) and an odd one (patch 14 on 44-pixel images, whose last 2 rows and columns the
convolution drops; head_dim 12; projection_dim different from both hidden sizes; the legacy
eos_token_id 2, which pools the largest id). The tokenizer is a small byte-pair model trained
here, with CLIP's <|startoftext|> / <|endoftext|> added last (the largest ids, as in CLIP's
vocabulary) and <|endoftext|> as the pad token.

Float32: text and image features within 1e-4 (relative to the largest magnitude) of
transformers', logits_per_image too, zero-shot labels identical. The other dtypes: the cosine
between their features and float32's (bounds in DTYPE_COSINE, docs/vision.md "CLIP").
"""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf

from ._hf import assert_close, cosine_rows, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = ["a photo of a cat", "a photo of a dog", "a drawing of a red car", "two birds on a wire",
          "the quick brown fox jumps over the lazy dog", "a bowl of fruit on a table", "a small house",
          "an aerial view of a city at night", "a person riding a bike", "snow on the mountains"] * 3
TEXTS = ["a photo of a cat", "a dog", "a red car on a city street at night", "fruit"]
LABELS = ["a photo of a cat", "a photo of a dog", "a drawing of a car", "a bowl of fruit", "mountains"]

BOS, EOS = "<|startoftext|>", "<|endoftext|>"

SHAPES = {
    # ViT-B/32's layout, narrower: patch 32, 4 patches a side would be 128 pixels; 64 keeps it fast.
    "b32": dict(text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          max_position_embeddings=32),
                vision=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                            image_size=64, patch_size=32),
                projection_dim=24, legacy_eos=False),
    "odd": dict(text=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                          max_position_embeddings=28),
                vision=dict(hidden_size=36, intermediate_size=60, num_hidden_layers=2, num_attention_heads=3,
                            image_size=44, patch_size=14),
                projection_dim=20, legacy_eos=True),
}

#: Lowest cosine between a dtype's features and float32's, per row (text and image features).
DTYPE_COSINE = {"float16": 0.99999, "bfloat16": 0.9998, "int8": 0.995, "int4": 0.9}
#: int4 text features of the odd checkpoint (a 24-wide text tower: every row one padded int4
#: group): measured 0.85-0.94 depending on the build's float rounding (the wheel's scalar level gave
#: 0.849, the source build's 0.935), so its bound is lower.
ODD_INT4_TEXT_COSINE = 0.75


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(vocab_size=160, end_of_word_suffix="</w>", show_progress=False,
                                             initial_alphabet=list("abcdefghijklmnopqrstuvwxyz"))
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([BOS, EOS])  # the last ids, as in CLIP's vocabulary
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}", special_tokens=[(BOS, bos),
                                                                                                   (EOS, eos)])
    return tok


@pytest.fixture(scope="module")
def tokenizer():
    return _train_tokenizer()


def _build(directory, name, tok, seed=0):
    shape = SHAPES[name]
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    text = dict(shape["text"], vocab_size=vocab, bos_token_id=bos, eos_token_id=2 if shape["legacy_eos"] else eos,
                pad_token_id=eos)
    config = transformers.CLIPConfig(text_config=text, vision_config=shape["vision"],
                                     projection_dim=shape["projection_dim"])
    model = save_random_model(directory, transformers.CLIPModel, config, seed)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                                unk_token=EOS)
    fast.save_pretrained(directory)
    size = shape["vision"]["image_size"]
    transformers.CLIPImageProcessor(size={"shortest_edge": size},
                                    crop_size={"height": size, "width": size}).save_pretrained(directory)
    return model, fast


@pytest.fixture(scope="module", params=sorted(SHAPES))
def checkpoint(request, tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp(f"clip-{request.param}")
    model, fast = _build(directory, request.param, tokenizer, seed=len(request.param))
    return request.param, directory, model, fast


def _pixels(n, size, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, size, size)).astype(np.float32)


def _ids(fast, texts):
    batch = fast(texts, padding=True, return_tensors="np")
    return batch["input_ids"].astype(np.int64), batch["attention_mask"].astype(np.int64)


def _hf_text(model, ids, mask):
    with torch.no_grad():
        out = model.get_text_features(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    return out.pooler_output.numpy()


def _hf_image(model, pixels):
    with torch.no_grad():
        return model.get_image_features(pixel_values=torch.from_numpy(pixels)).pooler_output.numpy()


def test_load_returns_clip(checkpoint):
    name, directory, _, _ = checkpoint
    model = cf.load(directory)
    assert isinstance(model, cf.CLIP) and model.family == "clip" and model.architecture == "CLIPModel"
    assert model.image_size == SHAPES[name]["vision"]["image_size"]
    assert model.projection_dim == SHAPES[name]["projection_dim"]
    assert model.hparams.causal and model.hparams.activation == "quick_gelu"
    assert "CLIPModel" in repr(model)
    with pytest.raises(ValueError, match="a CLIP .* open it with cpuformer.CLIP"):
        cf.Encoder(directory)


def test_text_features(checkpoint):
    _, directory, model, fast = checkpoint
    ids, mask = _ids(fast, TEXTS)
    assert (mask == 0).any()  # a padded batch
    clip = cf.CLIP(directory)
    ours = clip.get_text_features(ids, mask)
    reference = _hf_text(model, ids, mask)
    assert ours.shape == (len(TEXTS), SHAPES[checkpoint[0]]["projection_dim"])
    assert_close(ours, reference)
    # Each text alone (no padding) gives its row of the padded batch.
    for i, text in enumerate(TEXTS):
        single_ids, single_mask = _ids(fast, [text])
        assert_close(clip.get_text_features(single_ids, single_mask)[0], reference[i])
    # The text tower is causal: a token after the pooled one changes nothing before it.
    np.testing.assert_allclose(clip.text_hidden_states(ids[:1, :3]), clip.text_hidden_states(ids[:1, :4])[:, :3],
                               rtol=1e-5, atol=1e-6)


def test_embed_texts_tokenizes_as_transformers(checkpoint):
    _, directory, model, fast = checkpoint
    clip = cf.CLIP(directory)
    assert clip.tokenizer.encode(TEXTS[2]) == fast(TEXTS[2])["input_ids"]
    ids, mask = _ids(fast, TEXTS)
    reference = _hf_text(model, ids, mask)
    reference = reference / np.linalg.norm(reference, axis=-1, keepdims=True)
    assert_close(clip.embed_texts(TEXTS), reference)
    assert_close(clip.embed_texts(TEXTS, normalize=False), _hf_text(model, ids, mask))
    # In batches of 3 and 1 (each padded to its own longest text): the same embeddings.
    assert_close(clip.embed_texts(TEXTS, batch_size=3), reference)
    assert_close(clip.embed_texts(TEXTS, batch_size=1), reference)


def test_legacy_eos_pools_the_largest_id(checkpoint):
    name, directory, model, fast = checkpoint
    clip = cf.CLIP(directory)
    ids, mask = _ids(fast, TEXTS[:2])
    # An end-of-text token in the middle: the legacy rule pools the largest id's first position,
    # the other rule the first end-of-text token; both are what transformers pools.
    ids = ids.copy()
    ids[:, 1] = fast.convert_tokens_to_ids(EOS)
    assert_close(clip.get_text_features(ids, mask), _hf_text(model, ids, mask))
    assert (clip.eos_token_id == 2) == SHAPES[name]["legacy_eos"]


def test_image_features(checkpoint):
    name, directory, model, _ = checkpoint
    size = SHAPES[name]["vision"]["image_size"]
    pixels = _pixels(3, size)
    clip = cf.CLIP(directory)
    ours = clip.get_image_features(pixels)
    assert ours.shape == (3, SHAPES[name]["projection_dim"])
    assert_close(ours, _hf_image(model, pixels))
    reference = _hf_image(model, pixels)
    assert_close(clip.embed_images(pixels), reference / np.linalg.norm(reference, axis=-1, keepdims=True))
    # One image alone gives its row of the batch, and so do batches of 2.
    assert_close(clip.get_image_features(pixels[1:2])[0], reference[1])
    assert_close(clip.embed_images(pixels, normalize=False, batch_size=2), reference)


def test_position_interpolation(checkpoint):
    name, directory, model, _ = checkpoint
    size, patch = SHAPES[name]["vision"]["image_size"], SHAPES[name]["vision"]["patch_size"]
    clip = cf.CLIP(directory)
    # Non-square (more patches one way, fewer the other), larger, and the model's own size.
    for height, width in ((size + 2 * patch + 3, size - patch), (2 * size, 2 * size), (size, size)):
        pixels = _pixels(2, height, seed=height)[:, :, :, :width].copy()
        with torch.no_grad():
            reference = model.get_image_features(pixel_values=torch.from_numpy(pixels),
                                                 interpolate_pos_encoding=True).pooler_output.numpy()
        assert_close(clip.get_image_features(pixels, interpolate_pos_encoding=True), reference)
    with pytest.raises(ValueError, match=rf"smaller than one patch \({patch}×{patch}\)"):
        clip.get_image_features(_pixels(1, patch - 1), interpolate_pos_encoding=True)
    with pytest.raises(TypeError, match="interpolate_pos_encoding must be True or False, got 1"):
        clip.get_image_features(_pixels(1, size), interpolate_pos_encoding=1)


def _image_files(directory):
    """Gradients and shapes of several sizes and aspect ratios, saved as PNG and JPEG."""
    from PIL import Image

    rng = np.random.default_rng(3)
    paths = []
    for i, (height, width) in enumerate([(50, 80), (97, 64), (64, 64), (31, 45)]):
        y, x = np.mgrid[0:height, 0:width]
        image = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                          np.full_like(x, 40 * i)], axis=-1).astype(np.uint8)
        image[height // 4:height // 2, width // 3:width // 2] = rng.integers(0, 256, 3, dtype=np.uint8)
        path = directory / f"image{i}.{'png' if i % 2 == 0 else 'jpg'}"
        Image.fromarray(image).save(path)
        paths.append(path)
    return paths


def test_images_are_preprocessed_as_transformers(checkpoint, tmp_path):
    from PIL import Image

    _, directory, model, fast = checkpoint
    paths = _image_files(tmp_path)
    processor = transformers.CLIPImageProcessor.from_pretrained(directory)
    pil_images = [Image.open(path).convert("RGB") for path in paths]
    pixels = processor(images=pil_images, return_tensors="np")["pixel_values"].astype(np.float32)
    reference = _hf_image(model, pixels)
    clip = cf.CLIP(directory)
    np.testing.assert_allclose(clip.preprocess(paths), pixels, atol=1e-5)
    normalized = reference / np.linalg.norm(reference, axis=-1, keepdims=True)
    assert_close(clip.embed_images([str(path) for path in paths]), normalized)
    assert_close(clip.embed_images(pil_images, normalize=False), reference)
    assert_close(clip.embed_images(np.asarray(pil_images[2])), normalized[2:3])  # one uint8 HWC array
    ids, mask = _ids(fast, LABELS)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    pixel_values=torch.from_numpy(pixels))
    assert_close(clip.scores(paths, LABELS), out.logits_per_image.softmax(dim=1).numpy())
    top = clip.classify(paths, LABELS, top_k=1)
    assert [row[0][0] for row in top] == [LABELS[j] for j in out.logits_per_image.numpy().argmax(axis=1)]
    (directory / "preprocessor_config.json").rename(tmp_path / "saved.json")
    try:
        with pytest.raises(ValueError, match=r"has no preprocessor_config.json, so CLIP cannot preprocess images; give "
                                             r"float32 pixel_values \[batch, 3, height, width\].* \(got list\)"):
            cf.CLIP(directory).embed_images(paths)
        assert_close(cf.CLIP(directory).embed_images(pixels), normalized)  # pixel values need no such file
    finally:
        (tmp_path / "saved.json").rename(directory / "preprocessor_config.json")


def test_logits_and_zero_shot_labels(checkpoint):
    name, directory, model, fast = checkpoint
    size = SHAPES[name]["vision"]["image_size"]
    pixels = _pixels(4, size, seed=5)
    ids, mask = _ids(fast, LABELS)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    pixel_values=torch.from_numpy(pixels))
    reference = out.logits_per_image.numpy()
    clip = cf.CLIP(directory)
    assert clip.logit_scale == pytest.approx(float(model.logit_scale.detach().exp()), rel=1e-6)
    assert_close(clip.logits_per_image(pixels, LABELS), reference)
    assert_close(clip.logits_per_image(pixels, ids, mask), reference)
    probs = clip.scores(pixels, LABELS)
    assert_close(probs, out.logits_per_image.softmax(dim=1).numpy())
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert probs.argmax(axis=1).tolist() == reference.argmax(axis=1).tolist()
    top = clip.classify(pixels, LABELS, top_k=2)
    assert [row[0][0] for row in top] == [LABELS[j] for j in reference.argmax(axis=1)]
    assert all(len(row) == 2 and row[0][1] >= row[1][1] for row in top)


@pytest.mark.parametrize("dtype", sorted(DTYPE_COSINE))
def test_dtypes(checkpoint, dtype):
    name, directory, _, fast = checkpoint
    pixels = _pixels(3, SHAPES[name]["vision"]["image_size"], seed=9)
    ids, mask = _ids(fast, TEXTS)
    full = cf.CLIP(directory)
    reduced = cf.CLIP(directory, dtype=dtype)
    assert reduced.dtype == dtype
    bound = DTYPE_COSINE[dtype]
    text_bound = ODD_INT4_TEXT_COSINE if (name, dtype) == ("odd", "int4") else bound
    text = cosine_rows(reduced.get_text_features(ids, mask), full.get_text_features(ids, mask))
    image = cosine_rows(reduced.get_image_features(pixels), full.get_image_features(pixels))
    assert text.min() > text_bound and image.min() > bound, (text.min(), image.min())


def test_bad_input(checkpoint):
    name, directory, _, fast = checkpoint
    size = SHAPES[name]["vision"]["image_size"]
    limit = SHAPES[name]["text"]["max_position_embeddings"]
    clip = cf.CLIP(directory)
    # Not pixel_values (models.vision.is_pixel_values): images, preprocessed and checked as images.
    with pytest.raises(ValueError, match=r"image: a float image must have values in \[0, 1\] .*got \[-1, -1\]$"):
        clip.get_image_features(np.full((2, 1, size, size), -1.0, np.float32))
    with pytest.raises(ValueError, match=r"got \[-0.5, -0.5\] \(pixel_values, already preprocessed, must be float32; "
                                         r"got float64\)"):
        clip.get_image_features(np.full((1, 3, size, size), -0.5))
    with pytest.raises(ValueError, match=rf"are {size + 1}×{size} images, but the model takes {size}×{size} "
                       r"\(vision_config.image_size\); resize them, or pass interpolate_pos_encoding=True"):
        clip.get_image_features(np.zeros((1, 3, size + 1, size), np.float32))
    with pytest.raises(ValueError, match="batch size 0"):
        clip.get_image_features(np.zeros((0, 3, size, size), np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        clip.get_image_features(np.full((1, 3, size, size), np.nan, np.float32))
    with pytest.raises(TypeError, match="image 0: expected a file path, a PIL image or a NumPy array, got list"):
        clip.get_image_features([[0.0]])
    with pytest.raises(ValueError, match="cat.jpg: no such image file"):
        clip.embed_images("cat.jpg")
    long_text = " ".join(["cat"] * (limit + 1))
    with pytest.raises(ValueError, match=rf"texts\[1\] is \d+ tokens long; the text tower takes at most {limit}"):
        clip.embed_texts(["a dog", long_text])
    with pytest.raises(ValueError, match=rf"more than the text tower's max_position_embeddings \({limit}\)"):
        clip.get_text_features(np.ones((1, limit + 1), np.int64))
    with pytest.raises(ValueError, match="texts must be a non-empty list of strings"):
        clip.embed_texts([])
    with pytest.raises(TypeError, match=r"texts\[0\] must be a string, got int"):
        clip.embed_texts([3])
    with pytest.raises(ValueError, match="token id"):
        clip.get_text_features([[0, clip.hparams.vocab_size]])
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        clip.embed_texts(["a dog"], batch_size=0)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 1.5"):
        clip.embed_images(_pixels(1, size), batch_size=1.5)
    with pytest.raises(ValueError, match="labels must be a non-empty list of strings"):
        clip.classify(_pixels(1, size), [])
    clip.close()
    with pytest.raises(ValueError, match="this CLIP is closed"):
        clip.get_text_features([[0, 1]])


def test_config_errors(tmp_path, tokenizer):
    import json

    _build(tmp_path, "b32", tokenizer)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vision_config"]["hidden_act"] = "tanh"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="hidden_act 'tanh' is not supported .in vision_config."):
        cf.CLIP(tmp_path)
    config["vision_config"]["hidden_act"] = "quick_gelu"
    config["text_config"]["num_attention_heads"] = 5
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="text_config: hidden_size 32 is not a multiple of num_attention_heads 5"):
        cf.CLIP(tmp_path)


def test_cli_names_the_kind(checkpoint, capsys):
    from cpuformer import cli

    assert cli.main(["generate", str(checkpoint[1]), "hello"]) != 0
    error = capsys.readouterr().err
    assert ("holds CLIPModel, a CLIP (text and image) model; `cpuformer generate` needs a decoder (causal LM) (use "
            "`cpuformer embed` or `cpuformer classify --labels`)") in error


def test_causal_needs_a_plain_encoder_stack():
    from cpuformer import _core
    from cpuformer.arch import by_family
    from cpuformer.weights import graph_format

    bert = by_family()["bert"]
    config = bert.example_config(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=24, max_position_embeddings=32)
    hp = dict(bert.hparams(config).as_dict(), **graph_format("float32"), causal=True)
    message = "causal .a causal mask in an encoder stack. needs an encoder without disentangled or Transformer-XL"
    with pytest.raises(ValueError, match=message):
        _core.EncoderModel(dict(hp, content_to_position=True, max_relative_positions=8), {})
    with pytest.raises(ValueError, match=message):
        _core.EncoderModel(dict(hp, transformer_xl_attention=True, positions="none", type_vocab_size=0), {})
