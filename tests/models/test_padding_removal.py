"""Padding removal (``skip_padding=True``, docs/encoders.md "Padding removal"): the layers run on
the unpadded tokens only, one attention per sequence. Checked against transformers on the same
weights: the unpadded positions and the pooler output match at the encoders' tolerance, the padded
positions are exactly zero; layouts the encoder cannot pack (left padding under a pooler, a gap in
a mask, disentangled attention) are computed padded and zeroed all the same; the text paths
(embed, classify, score) that use it give what transformers gives."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf

from ._hf import save_families, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4

#: name -> (transformers class, config class, config keyword arguments); head_dim 16, 9, 16, 12.
FAMILIES = {
    "bert": ("BertModel", "BertConfig",
             dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=65,
                  max_position_embeddings=48, type_vocab_size=2)),
    "roberta": ("RobertaModel", "RobertaConfig",  # positions count the non-pad tokens
                dict(vocab_size=103, hidden_size=36, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                     max_position_embeddings=50, type_vocab_size=1, pad_token_id=1)),
    "modernbert": ("ModernBertModel", "ModernBertConfig",  # RoPE; local layers see |i - j| <= 2
                   dict(vocab_size=89, hidden_size=48, num_hidden_layers=4, num_attention_heads=3,
                        intermediate_size=29, max_position_embeddings=48, global_attn_every_n_layers=3,
                        local_attention=5, global_rope_theta=500.0, local_rope_theta=30.0, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "deberta": ("DebertaV2Model", "DebertaV2Config",  # disentangled attention: computed padded, zeroed
                dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=53,
                     max_position_embeddings=64, relative_attention=True, position_buckets=8,
                     max_relative_positions=24, pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
                     position_biased_input=False, type_vocab_size=0)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_families(tmp_path_factory, FAMILIES)


def _mask(lengths, T, left=False):
    mask = np.zeros((len(lengths), T), dtype=np.int64)
    for row, n in enumerate(lengths):
        if left:
            mask[row, T - n:] = 1
        else:
            mask[row, :n] = 1
    return mask


def _ids(config, mask, seed=0):
    pad = config.get("pad_token_id", 0)
    ids = np.random.default_rng(seed).integers(3, config["vocab_size"], size=mask.shape)
    ids[ids == pad] = pad + 2  # real tokens are never the pad id (RoBERTa's positions count them)
    return np.where(mask == 1, ids, pad)


def _reference(hf, ids, mask):
    with torch.inference_mode():
        out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    pooled = getattr(out, "pooler_output", None)
    return out.last_hidden_state.numpy(), None if pooled is None else pooled.numpy()


def _check(ours, reference, mask):
    keep = mask == 1
    error = float(np.abs(ours[keep] - reference[keep]).max() / np.abs(reference[keep]).max())
    assert error <= TOLERANCE, error
    assert not ours[~keep].any(), "padded positions must be exactly zero"


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("lengths", [[7, 3, 5], [33, 1, 20, 33], [16, 16]])
@pytest.mark.parametrize("left", [False, True])
def test_matches_transformers(models, name, lengths, left):
    directory, hf, config = models[name]
    mask = _mask(lengths, max(lengths), left)
    ids = _ids(config, mask, seed=len(lengths))
    reference, _ = _reference(hf, ids, mask)
    model = cf.Encoder(directory)
    ours = model(ids, mask, skip_padding=True)
    assert ours.shape == reference.shape and ours.dtype == np.float32
    _check(ours, reference, mask)
    # The unpadded rows are those of the padded computation, up to float32 rounding.
    padded = model(ids, mask)
    keep = mask == 1
    assert np.abs(padded[keep] - ours[keep]).max() <= 1e-5 * np.abs(padded[keep]).max()


@pytest.mark.parametrize("left", [False, True])
def test_pooler(models, left):
    """Right padding packs the tokens; left padding puts a pad at row 0, which the pooler reads: that
    batch is computed padded (the pooled rows as transformers gives them), its padded rows zeroed."""
    directory, hf, config = models["bert"]
    mask = _mask([9, 4, 12], 12, left)
    ids = _ids(config, mask, seed=3)
    reference, pooled_reference = _reference(hf, ids, mask)
    hidden, pooled = cf.Encoder(directory)(ids, mask, return_pooler=True, skip_padding=True)
    _check(hidden, reference, mask)
    assert np.abs(pooled - pooled_reference).max() <= TOLERANCE * np.abs(pooled_reference).max()


def test_gaps_and_empty_sequences(models):
    """A mask with a gap inside a sequence is computed padded (positions and windows count the gap);
    a sequence without any token comes out all zeros, the others unchanged."""
    directory, hf, config = models["modernbert"]
    model = cf.Encoder(directory)
    mask = _mask([10, 6, 10], 10)
    mask[0, 3:5] = 0
    ids = _ids(config, mask, seed=4)
    reference, _ = _reference(hf, ids, mask)
    _check(model(ids, mask, skip_padding=True), reference, mask)

    mask = _mask([10, 0, 4], 10)
    ids = _ids(config, mask, seed=5)
    ours = model(ids, mask, skip_padding=True)
    assert not ours[1].any()
    keep = [0, 2]
    reference, _ = _reference(hf, ids[keep], mask[keep])
    _check(ours[keep], reference, mask[keep])


def test_without_padding_and_with_threads(models):
    directory, hf, config = models["bert"]
    model = cf.Encoder(directory)
    mask = np.ones((2, 11), dtype=np.int64)
    ids = _ids(config, mask, seed=6)
    np.testing.assert_array_equal(model(ids, mask, skip_padding=True), model(ids, mask))
    mask = _mask([11, 2], 11)
    ids = _ids(config, mask, seed=7)
    model.num_threads = 1
    one = model(ids, mask, skip_padding=True)
    model.num_threads = 2
    np.testing.assert_array_equal(model(ids, mask, skip_padding=True), one)


def test_int8(models):
    """int8 weights quantize each row on its own: the packed rows match the padded computation
    within the int8 path's own noise."""
    directory, _, config = models["bert"]
    model = cf.Encoder(directory, dtype="int8")
    mask = _mask([20, 5, 13], 20)
    ids = _ids(config, mask, seed=8)
    ours, padded = model(ids, mask, skip_padding=True), model(ids, mask)
    keep = mask == 1
    assert not ours[~keep].any()
    assert np.abs(ours[keep] - padded[keep]).max() <= 1e-3 * np.abs(padded[keep]).max()


def test_sequence_logits_and_embed(tmp_path):
    """The sequence-level paths skip padding: logits of a padded batch, classify() and embed() over
    texts of mixed lengths give what transformers gives."""
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=40, max_position_embeddings=64, num_labels=3)
    hf = save_random_model(tmp_path, transformers.BertForSequenceClassification, config, seed=9)
    model = cf.load(tmp_path)
    mask = _mask([30, 3, 17, 8], 30)
    ids = _ids({"vocab_size": 120}, mask, seed=10)
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    np.testing.assert_allclose(model.logits(ids, mask), logits, rtol=TOLERANCE, atol=TOLERANCE * np.abs(logits).max())
    # embed (mean pooling over the unpadded tokens) of token-id lists of mixed lengths
    lists = [row[m == 1].tolist() for row, m in zip(ids, mask)]
    with torch.inference_mode():
        hidden = hf.bert(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    mean = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(model.embed(lists, batch_size=4), mean, rtol=TOLERANCE, atol=1e-5)


@pytest.mark.parametrize("layout", ["right", "left", "gap"])
def test_seq2seq_encoder(tmp_path, layout):
    """A seq2seq encoder (BART) packs its sources the same way: the encoder output matches
    transformers at the unpadded positions, padded ones are zero where packed (right or left
    padding; a gap runs padded), and the logits over it match too."""
    config = transformers.BartConfig(vocab_size=97, d_model=48, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=67,
                                     decoder_ffn_dim=67, max_position_embeddings=64)
    hf = save_random_model(tmp_path, transformers.BartForConditionalGeneration, config, seed=11)
    mask = _mask([19, 4, 11], 19, left=layout == "left")
    if layout == "gap":
        mask[0, 5:8] = 0
    ids = _ids({"vocab_size": 97, "pad_token_id": 1}, mask, seed=12)
    tgt = np.random.default_rng(13).integers(3, 97, size=(3, 5))
    with torch.inference_mode():
        encoded = hf.get_encoder()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        logits = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    model = cf.load(tmp_path)
    ours = model.encode(ids, mask)
    reference = encoded.last_hidden_state.numpy()
    keep = mask == 1
    assert np.abs(ours[keep] - reference[keep]).max() <= TOLERANCE * np.abs(reference[keep]).max()
    if layout != "gap":
        assert not ours[~keep].any()
    np.testing.assert_allclose(model.logits(ids, tgt, mask), logits, rtol=TOLERANCE,
                               atol=TOLERANCE * np.abs(logits).max())
