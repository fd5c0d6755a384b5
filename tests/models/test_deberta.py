"""DeBERTa-v2/v3 (disentangled attention) against transformers on the same random weights.

The configurations cover what the family declares: both position terms or one, the layer's own
key/query projections or separate ones (share_att_key), log buckets shorter than the sequence,
plain clamped relative positions (no buckets), absolute positions and token types as DeBERTa-v2
allows, and the real DeBERTa-v3 bucket configuration over a full 512-token sequence. Outputs are
compared at the unpadded positions (padded rows carry no meaning; see Encoder).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer.arch import by_family  # noqa: E402

from ._hf import assert_close, cosine_rows, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# initializer_range 0.3 (transformers: 0.02) makes the position terms large enough that a position
# one bucket off changes the outputs beyond the tolerance.
_V3 = dict(vocab_size=97, hidden_size=45, num_hidden_layers=2, num_attention_heads=3, intermediate_size=53,
           max_position_embeddings=64, relative_attention=True, position_buckets=8, max_relative_positions=24,
           pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
           type_vocab_size=0, layer_norm_eps=1e-7, initializer_range=0.3)

#: name -> (transformers model class, config keyword arguments)
CONFIGS = {
    "v3": ("DebertaV2Model", _V3),
    # One position term each, projected with their own weights (pos_key_proj / pos_query_proj).
    "c2p_own_key": ("DebertaV2Model", dict(_V3, pos_att_type=["c2p"], share_att_key=False, num_attention_heads=5)),
    "p2c_own_query": ("DebertaV2ForTokenClassification", dict(_V3, pos_att_type="p2c", share_att_key=False)),
    # DeBERTa-v2 without buckets: relative positions clamped to ±12, absolute positions, token types.
    "v2_unbucketed": ("DebertaV2ForMaskedLM", dict(_V3, position_buckets=-1, max_relative_positions=12,
                                                   position_biased_input=True, type_vocab_size=2,
                                                   norm_rel_ebd="none", hidden_act="gelu_new")),
    # No relative attention, but pos_att_type still sets transformers' scale 1 / sqrt(3 · head_dim).
    "plain": ("DebertaV2ForQuestionAnswering", dict(_V3, relative_attention=False, position_biased_input=True)),
}


def _build(directory, model_class, kwargs, seed=0):
    model = save_random_model(directory, getattr(transformers, model_class), transformers.DebertaV2Config(**kwargs),
                              seed)
    return getattr(model, "deberta", model)


def _compare(model, hf, ids, mask, types=None):
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=None if types is None else torch.tensor(types)).last_hidden_state.numpy()
    ours = model(ids, mask, types)
    for row, length in enumerate(mask.sum(axis=1)):
        assert_close(ours[row, :length], ref[row, :length])
    return ours


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_against_transformers_with_padding(name, tmp_path):
    model_class, kwargs = CONFIGS[name]
    hf = _build(tmp_path, model_class, kwargs)
    model = cf.load(tmp_path)
    assert model.family == "deberta-v2"
    rng = np.random.default_rng(1)
    ids = rng.integers(1, kwargs["vocab_size"], size=(3, 37))  # longer than 2 · 8 buckets and than ±12
    mask = np.ones_like(ids)
    mask[1, 29:] = 0
    mask[2, 6:] = 0
    types = rng.integers(0, 2, size=ids.shape) if kwargs["type_vocab_size"] else None
    ours = _compare(model, hf, ids, mask, types)
    # A padded batch gives each sequence what it gives alone.
    alone = model(ids[2:, :6], None, None if types is None else types[2:, :6])
    assert_close(ours[2, :6], alone[0], tolerance=1e-5)
    _compare(model, hf, ids[:1, :1], mask[:1, :1], None if types is None else types[:1, :1])  # one token


def test_v3_bucket_configuration_over_512_tokens(tmp_path):
    """deberta-v3-base's positions (256 buckets, max_relative_positions = max_position_embeddings =
    512) over a full-length batch: every relative distance to ±511, log buckets included, and a
    batch large enough that the attention bias is built in two chunks of sequences."""
    kwargs = dict(_V3, hidden_size=16, num_attention_heads=2, num_hidden_layers=1, intermediate_size=24,
                  position_buckets=256, max_relative_positions=-1, max_position_embeddings=512)
    hf = _build(tmp_path, "DebertaV2Model", kwargs)
    model = cf.load(tmp_path)
    rng = np.random.default_rng(2)
    ids = rng.integers(1, kwargs["vocab_size"], size=(6, 512))
    mask = np.ones_like(ids)
    mask[3, 300:] = 0
    _compare(model, hf, ids, mask)
    with pytest.raises(ValueError, match=r"sequence length 513 exceeds the model's maximum of 512 tokens "
                                         r"\(max_position_embeddings\)"):
        model(np.ones((1, 513), dtype=np.int64))


@pytest.fixture(scope="module")
def quantized_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("deberta")
    # Separate position projections: quantized and converted like the other projections. The
    # initializer range is transformers' default (as for the other families' bounds): the larger
    # one of the parity checks sharpens the attention enough to amplify int8's error.
    _build(directory, "DebertaV2Model", dict(_V3, hidden_size=64, num_attention_heads=4, intermediate_size=96,
                                             share_att_key=False, initializer_range=0.02), seed=3)
    return str(directory)


def _ids(seed=0):
    return np.random.default_rng(seed).integers(0, 97, size=(3, 21), dtype=np.int64)


def test_int8_and_16_bit_bounds(quantized_dir):
    """The bounds of tests/models/test_quantized.py (docs/precision.md): int8 per-token cosine ≥ 0.99,
    float16 / bfloat16 within 0.005 / 0.02 of max|float32|."""
    ids = _ids()
    ref = cf.load(quantized_dir)(ids)
    int8 = cf.load(quantized_dir, dtype="int8")(ids)
    assert cosine_rows(int8, ref).min() >= 0.99
    assert not np.array_equal(int8, ref)
    for dtype, bound in (("float16", 0.005), ("bfloat16", 0.02)):
        ours = cf.load(quantized_dir, dtype=dtype)(ids)
        err = np.abs(ours - ref).max()
        assert 0 < err <= bound * np.abs(ref).max(), (dtype, err)


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_converted_directory_gives_identical_outputs(quantized_dir, tmp_path, dtype):
    cf.convert(quantized_dir, tmp_path / "converted", dtype, progress=False)
    ids = _ids(1)
    np.testing.assert_array_equal(cf.load(tmp_path / "converted")(ids), cf.load(quantized_dir, dtype=dtype)(ids))


def _hparams(**changes):
    arch = by_family()["deberta-v2"]
    config = arch.example_config(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                 intermediate_size=40)
    config.update(changes)
    return arch.hparams(config)


def test_v3_example_hparams():
    hp = _hparams()
    assert hp.positions == "none" and hp.content_to_position and hp.position_to_content
    assert hp.position_buckets == 256 and hp.max_relative_positions == 512 and hp.relative_span == 256
    assert hp.attention_scale == pytest.approx(1 / np.sqrt(8 * 3), rel=1e-7)


@pytest.mark.parametrize("changes, error, message", [
    (dict(conv_kernel_size=3), NotImplementedError, r"conv_kernel_size > 0 .* is not supported"),
    (dict(embedding_size=16), NotImplementedError, r"embedding_size 16 != hidden_size 32 .* is not supported"),
    (dict(pos_att_type="p2c|p2p"), NotImplementedError, r"pos_att_type \['p2p'\] is not supported; only 'c2p' and"),
    (dict(norm_rel_ebd="rms_norm"), NotImplementedError, r"norm_rel_ebd 'rms_norm' is not supported"),
    (dict(attention_head_size=16), NotImplementedError, r"attention_head_size 16 is not supported"),
    (dict(max_relative_positions=100, position_buckets=256), ValueError,
     r"max_relative_positions 100 .* must exceed position_buckets / 2 \+ 1 = 129"),
    (dict(position_buckets=1), ValueError, r"position_buckets must be >= 2"),
    (dict(relative_attention="yes"), ValueError, r"relative_attention must be true or false"),
    (dict(pos_att_type=3), ValueError, r"pos_att_type must be a '\|'-separated string or a list"),
    (dict(num_attention_heads=5), ValueError, r"hidden size 32 is not a multiple of the number of attention heads 5"),
])
def test_refusals_name_the_config_key(changes, error, message):
    with pytest.raises(error, match=message):
        _hparams(**changes)


def test_refusal_when_loading(tmp_path):
    _build(tmp_path, "DebertaV2Model", _V3)
    config = json.loads((tmp_path / "config.json").read_text())
    config["conv_kernel_size"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="config.json: conv_kernel_size > 0"):
        cf.load(tmp_path)
