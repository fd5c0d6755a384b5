"""The last layer run for the one token per sequence that is read (docs/encoders.md, "First-token
outputs"; docs/decoders.md, "The prompt's last layer").

Encoders: when only the first token of each sequence is read (a sequence classifier or reranker on
h[:, 0] or the pooler, CLS pooling, a ViT classifier, CLIP's image features), the last layer
carries on that token alone; its keys and values still come from every token. Checked against
transformers on the same weights (row 0 and the pooler at the encoders' tolerance, every other row
exactly zero) for post-norm, pre-norm, RoPE with a windowed last layer, shared layers, causal
attention, padding of every kind and int8; attention hooks (DeBERTa) compute every row and keep the
first; and the public paths that use it (logits, score, embed with CLS pooling, ViT logits, CLIP
image features) against transformers.

Decoders: a prompt pass reads the logits of each row's last token only, so its last layer runs for
that token alone (its keys and values still go to the cache): the first generated token and its
log-probability match transformers for left-padded batches, a sliding window shorter than the
prompt, GQA and q/k norms."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf

from ._hf import save_families, save_random_model
from .test_padding_removal import FAMILIES as PADDING_FAMILIES
from .test_padding_removal import _ids, _mask, _reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4

#: name -> (transformers class, config class, config keyword arguments)
FAMILIES = {
    "bert": ("BertModel", "BertConfig",  # post-norm, pooler
             dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=65,
                  max_position_embeddings=48, type_vocab_size=2)),
    "roberta": ("RobertaModel", "RobertaConfig",
                dict(vocab_size=103, hidden_size=36, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
                     max_position_embeddings=50, type_vocab_size=1, pad_token_id=1)),
    "albert": ("AlbertModel", "AlbertConfig",  # one layer shared by all, factorized embeddings
               dict(vocab_size=90, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                    intermediate_size=40, max_position_embeddings=40)),
    "modernbert": ("ModernBertModel", "ModernBertConfig",  # pre-norm, RoPE; the last of 5 layers is local
                   dict(vocab_size=89, hidden_size=48, num_hidden_layers=5, num_attention_heads=3,
                        intermediate_size=29, max_position_embeddings=48, global_attn_every_n_layers=3,
                        local_attention=5, global_rope_theta=500.0, local_rope_theta=30.0, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "mpnet": ("MPNetModel", "MPNetConfig",  # a relative position bias: a mask row per query
              dict(vocab_size=71, hidden_size=45, num_hidden_layers=2, num_attention_heads=3, intermediate_size=53,
                   max_position_embeddings=160, pad_token_id=1)),
    "deberta": PADDING_FAMILIES["deberta"],  # disentangled attention: every row computed, first kept
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_families(tmp_path_factory, FAMILIES, first_seed=20)


def _first_only(directory, ids, mask, skip_padding, pooler=False, dtype=None):
    core = cf.Encoder(directory, dtype=dtype)._live()
    return core.forward(ids, mask, None, pooler, 0, skip_padding, True)


def _close(ours, reference, tolerance=TOLERANCE):
    error = float(np.abs(ours - reference).max() / np.abs(reference).max())
    assert error <= tolerance, error


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("layout", ["none", "right", "left", "gap"])
@pytest.mark.parametrize("skip_padding", [False, True])
def test_first_rows_match_transformers(models, name, layout, skip_padding):
    directory, hf, config = models[name]
    lengths = [13, 4, 9, 1]
    if layout == "none":
        mask = np.ones((4, 13), dtype=np.int64)
    else:
        mask = _mask(lengths, 13, left=layout == "left")
        if layout == "gap":
            mask[0, 5:7] = 0
    ids = _ids(config, mask, seed=len(name))
    reference, _ = _reference(hf, ids, mask)
    ours = _first_only(directory, ids, mask, skip_padding)
    assert ours.shape == reference.shape and ours.dtype == np.float32
    assert not ours[:, 1:].any(), "rows other than the first must be exactly zero"
    unpadded = mask[:, 0] == 1  # a padded row 0 (left padding) holds no defined value
    if skip_padding:  # zero, as skip_padding makes padded rows
        assert not ours[~unpadded].any()
    _close(ours[unpadded, 0], reference[unpadded, 0])


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("layout", ["none", "right", "left"])
@pytest.mark.parametrize("skip_padding", [False, True])
def test_picked_rows_match_transformers(models, name, layout, skip_padding):
    """pick: a row of its own per sequence (here the last token, and a middle one)."""
    directory, hf, config = models[name]
    lengths = [13, 4, 9, 1]
    mask = np.ones((4, 13), dtype=np.int64) if layout == "none" else _mask(lengths, 13, left=layout == "left")
    ids = _ids(config, mask, seed=len(name) + 1)
    reference, _ = _reference(hf, ids, mask)
    core = cf.Encoder(directory)._live()
    for pick in (np.array([12, 3, 8, 0]) if layout == "right" else np.full(4, 12), np.array([6, 2, 5, 0])):
        ours = core.forward(ids, mask, None, False, 0, skip_padding, False, pick)
        rows = np.arange(4)
        others = np.ones((4, 13), dtype=bool)
        others[rows, pick] = False
        assert not ours[others].any(), "rows other than the picked ones must be exactly zero"
        real = mask[rows, pick] == 1  # a padded row holds no defined value (and is zero under skip_padding)
        if skip_padding:
            assert not ours[rows[~real], pick[~real]].any()
        _close(ours[rows[real], pick[real]], reference[rows[real], pick[real]])


def test_pick_errors(models):
    directory, _, config = models["bert"]
    core = cf.Encoder(directory)._live()
    ids = _ids(config, np.ones((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"pick must have shape \[batch 2\], got \[3\]"):
        core.forward(ids, None, None, False, 0, False, False, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"pick\[1\] = 5 is not a position of input_ids' 5 per row"):
        core.forward(ids, None, None, False, 0, False, False, np.array([0, 5]))
    with pytest.raises(ValueError, match=r"pick\[0\] = -1 is not a position"):
        core.forward(ids, None, None, False, 0, False, False, np.array([-1, 0]))
    with pytest.raises(ValueError, match="pick cannot go with return_pooler"):
        core.forward(ids, None, None, True, 0, False, False, np.array([0, 1]))


@pytest.mark.parametrize("skip_padding", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_pooler(models, skip_padding, left):
    directory, hf, config = models["bert"]
    mask = _mask([9, 4, 12], 12, left)
    ids = _ids(config, mask, seed=3)
    _, pooled_reference = _reference(hf, ids, mask)
    hidden, pooled = _first_only(directory, ids, mask, skip_padding, pooler=True)
    _close(pooled, pooled_reference)
    assert not hidden[:, 1:].any()


def test_causal_encoder(tmp_path):
    """A causal encoder stack (CLIP's text tower): the first token sees itself only."""
    config = transformers.CLIPTextConfig(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                                         num_attention_heads=4, max_position_embeddings=24, eos_token_id=2)
    hf = save_random_model(tmp_path, transformers.CLIPTextModel, config, seed=5)
    model = cf.load(tmp_path)
    mask = _mask([10, 6, 3], 10)
    ids = _ids({"vocab_size": 99}, mask, seed=6)
    with torch.inference_mode():
        reference = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    core = model._live_text()
    last = mask.sum(axis=1) - 1
    for skip_padding in (False, True):
        ours = core.forward(ids, mask, None, False, 0, skip_padding, True)
        assert not ours[:, 1:].any()
        _close(ours[:, 0], reference[:, 0])
        ours = core.forward(ids, mask, None, False, 0, skip_padding, False, last)  # the end-of-text rows
        _close(ours[np.arange(3), last], reference[np.arange(3), last])


def test_threads_and_int8(models):
    """The same result on 1 and 2 threads; int8 within its own noise of the full int8 computation."""
    directory, _, config = models["bert"]
    mask = _mask([20, 5, 13], 20)
    ids = _ids(config, mask, seed=8)
    encoder = cf.Encoder(directory)
    core = encoder._live()
    encoder.num_threads = 1
    one = core.forward(ids, mask, None, False, 1, True, True)
    np.testing.assert_array_equal(core.forward(ids, mask, None, False, 2, True, True), one)
    int8 = cf.Encoder(directory, dtype="int8")
    full = int8(ids, mask, skip_padding=True)
    first = int8._live().forward(ids, mask, None, False, 0, True, True)
    assert not first[:, 1:].any()
    _close(first[:, 0], full[:, 0], 1e-3)


def test_sequence_classifier_and_reranker(tmp_path):
    """logits() and score() of a classifier on the pooler (BERT) and on h[:, 0] (RoBERTa) match
    transformers, padded batches included; the heads declare that they read the first token."""
    bert = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=40, max_position_embeddings=64, num_labels=1)
    hf = save_random_model(tmp_path / "bert", transformers.BertForSequenceClassification, bert, seed=9)
    model = cf.load(tmp_path / "bert")
    assert model._head.reads_first_token
    mask = _mask([30, 3, 17, 8], 30)
    ids = _ids({"vocab_size": 120}, mask, seed=10)
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(model.logits(ids, mask), logits, rtol=TOLERANCE, atol=TOLERANCE * np.abs(logits).max())

    roberta = transformers.RobertaConfig(vocab_size=110, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=40, max_position_embeddings=70, num_labels=3,
                                         pad_token_id=1, type_vocab_size=1)
    hf = save_random_model(tmp_path / "roberta", transformers.RobertaForSequenceClassification, roberta, seed=11)
    model = cf.load(tmp_path / "roberta")
    assert model._head.reads_first_token
    mask = _mask([25, 7, 2], 25, left=True)
    ids = _ids({"vocab_size": 110, "pad_token_id": 1}, mask, seed=12)
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(model.logits(ids, mask), logits, rtol=TOLERANCE, atol=TOLERANCE * np.abs(logits).max())


@pytest.mark.parametrize("name, pooling, row", [("roberta", "cls", 0), ("modernbert", "last", -1)])
def test_embed_first_and_last_token_pooling(models, name, pooling, row):
    """embed(pooling="cls" / "last") of token-id lists of mixed lengths: each one's first / last
    token of transformers' last hidden state, L2-normalised."""
    directory, hf, config = models[name]
    lists = [_ids(config, np.ones((1, n), dtype=np.int64), seed=n)[0].tolist() for n in (17, 3, 9, 30)]
    ours = cf.Encoder(directory).embed(lists, pooling=pooling, batch_size=3)
    expected = []
    for ids in lists:
        reference, _ = _reference(hf, np.array([ids]), np.ones((1, len(ids)), dtype=np.int64))
        expected.append(reference[0, row] / np.linalg.norm(reference[0, row]))
    np.testing.assert_allclose(ours, np.array(expected), rtol=TOLERANCE, atol=1e-5)


def test_vit_logits_and_clip_image_features(tmp_path):
    """A ViT classifier and CLIP's image features read the class token only."""
    vit = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                                 image_size=32, patch_size=8, num_labels=5)
    hf = save_random_model(tmp_path / "vit", transformers.ViTForImageClassification, vit, seed=13)
    pixels = np.random.default_rng(14).standard_normal((3, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        logits = hf(pixel_values=torch.tensor(pixels)).logits.numpy()
    _close(cf.load(tmp_path / "vit").logits(pixels), logits)

    clip = transformers.CLIPConfig(
        text_config=dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=24, eos_token_id=2),
        vision_config=dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        projection_dim=16)
    hf = save_random_model(tmp_path / "clip", transformers.CLIPModel, clip, seed=15)
    with torch.inference_mode():
        features = hf.get_image_features(pixel_values=torch.tensor(pixels))
    features = getattr(features, "pooler_output", features).numpy()
    _close(cf.load(tmp_path / "clip").get_image_features(pixels), features)


@pytest.mark.parametrize("name", ["gpt2", "mistral", "qwen3"])
def test_decoder_prompt_pass(tmp_path, name):
    """generate(max_new_tokens=1) of a left-padded batch: the token and its log-probability from the
    last position's logits, as transformers computes them (same positions: cumsum(mask) - 1)."""
    from models.test_decoder import SMALL, _build

    model_class, config_class, config = SMALL[name]
    hf = _build(tmp_path, model_class, config_class, seed=30, **config)
    gen = cf.Generator(str(tmp_path))
    rng = np.random.default_rng(31)
    lengths = [21, 5, 14]  # mistral's sliding window is 8
    T = max(lengths)
    ids = np.zeros((3, T), dtype=np.int64)
    mask = np.zeros((3, T), dtype=np.int64)
    for b, n in enumerate(lengths):
        ids[b, T - n:] = rng.integers(3, config["vocab_size"], n)
        mask[b, T - n:] = 1
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.inference_mode():
        logits = hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions)).logits[:, -1].double()
    reference = torch.log_softmax(logits, dim=-1).numpy()
    prompts = [ids[b, T - n:].tolist() for b, n in enumerate(lengths)]  # left-padded by generate
    tokens, log_probs = gen.generate(prompts, max_new_tokens=1, eos_token_id=[], return_log_probs=True)
    for b in range(3):
        assert tokens[b] == [int(reference[b].argmax())]
        assert abs(log_probs[b][0] - reference[b, tokens[b][0]]) <= 1e-4
