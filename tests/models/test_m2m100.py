"""M2M100 / NLLB (``M2M100ForConditionalGeneration``) against transformers on random, seeded weights.

Two shapes: NLLB-200-distilled-600M's config scaled down (pre-norm, ReLU, sqrt(d) embedding scale,
tied head, pad 1) and an odd one (d_model 45 with 3 heads, so the sinusoidal table has its zero
column; 3 encoder and 1 decoder layers; GELU; no embedding scale; pad 3, so the
position rows start at 4). The decoders are made peaky (the final norm scaled up) and every token
test checks the top-2 gap of the scores that decided each token, as tests/models/test_seq2seq.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer.arch import by_family  # noqa: E402

from ._hf import cosine_rows, save_random_model  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
GAP = 2e-3

# NLLB-200-distilled-600M: d_model 1024, 12 + 12 layers, 16 heads, ffn 4096, vocab 256206, 1024 positions.
SHAPES = {
    "nllb": dict(vocab_size=211, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64,
                 activation_function="relu", scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                 decoder_start_token_id=2, init_std=0.1),
    "odd": dict(vocab_size=97, d_model=45, encoder_layers=3, decoder_layers=1, encoder_attention_heads=3,
                decoder_attention_heads=3, encoder_ffn_dim=53, decoder_ffn_dim=53, max_position_embeddings=40,
                activation_function="gelu", scale_embedding=False, pad_token_id=3,
                bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, init_std=0.15),
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _peaky(model):
    model.model.decoder.layer_norm.weight.mul_(8.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for i, (name, config) in enumerate(SHAPES.items()):
        directory = tmp_path_factory.mktemp(name)
        hf = save_random_model(directory, transformers.M2M100ForConditionalGeneration,
                               transformers.M2M100Config(**config), seed=40 + i, prepare=_peaky)
        out[name] = (str(directory), hf, cf.load(directory))
    return out


def _sources(rng, vocab, lengths, pad):
    """Random sources (no special or pad token) and their right-padded ids and mask."""
    sources = [[int(t) for t in rng.integers(4, vocab, n)] for n in lengths]
    T = max(lengths)
    ids = np.full((len(sources), T), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, s in enumerate(sources):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    return sources, ids, mask


def _top2_gap(scores):
    top = np.sort(np.where(np.isfinite(scores), scores, -1e30), axis=-1)[..., -2:]
    return float((top[..., 1] - top[..., 0]).min())


def test_family_and_hparams(models):
    s2s = models["nllb"][2]
    assert isinstance(s2s, cf.Seq2Seq) and s2s.family == "m2m100"
    hp = s2s.hparams
    assert (hp.pre_norm, hp.final_norm, hp.embedding_norm, hp.activation) == (True, True, False, "relu")
    assert (hp.positions, hp.position_offset, hp.embed_scale) == ("sinusoidal", 2, 8.0)
    odd = models["odd"][2].hparams
    assert (odd.position_offset, odd.embed_scale, odd.activation) == (4, 1.0, "gelu")


def test_untied_refused():
    config = dict(SHAPES["nllb"], architectures=["M2M100ForConditionalGeneration"], tie_word_embeddings=False)
    with pytest.raises(NotImplementedError, match="tie_word_embeddings=false .* is not supported"):
        by_family()["m2m100"].hparams(config)


@pytest.mark.parametrize("dim", [64, 45])
def test_position_table_is_transformers(dim):
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding

    ref = M2M100SinusoidalPositionalEmbedding.get_embedding(70, dim, 3).numpy()
    # The table the registry computes for pad 3: max_position_embeddings + pad + 1 = 70 rows.
    m2m100 = by_family()["m2m100"]
    config = dict(SHAPES["nllb"], d_model=dim, encoder_attention_heads=5 if dim % 5 == 0 else 4,
                  decoder_attention_heads=5 if dim % 5 == 0 else 4, pad_token_id=3, max_position_embeddings=66)
    ours = m2m100.stack_tensors(config, m2m100.hparams(config), "encoder")["embed.positions"]
    assert ours.shape == (70, dim)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=2e-6)
    assert not ours[3].any() and (dim % 2 == 0 or not ours[:, -1].any())


def test_too_small_for_positions():
    config = dict(SHAPES["nllb"], d_model=2, encoder_attention_heads=1, decoder_attention_heads=1)
    with pytest.raises(ValueError, match="d_model 2 is too small for sinusoidal positions"):
        by_family()["m2m100"].stack_tensors(config, by_family()["m2m100"].hparams(config), "encoder")


@pytest.mark.parametrize("name", list(SHAPES))
def test_encoder_and_logits_match_transformers(models, name):
    _, hf, s2s = models[name]
    config = SHAPES[name]
    rng = np.random.default_rng(1)
    _, ids, mask = _sources(rng, config["vocab_size"], (17, 5, 11), config["pad_token_id"])
    tgt = rng.integers(4, config["vocab_size"], size=(3, 7))
    with torch.inference_mode():
        enc_ref = hf.get_encoder()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    enc_ref = enc_ref.numpy()
    keep = mask.astype(bool)  # padded positions of the encoder output carry no meaning
    enc = s2s.encode(ids, mask)
    assert np.abs(enc - enc_ref)[keep].max() <= TOLERANCE * np.abs(enc_ref[keep]).max()
    out = s2s.logits(ids, tgt, mask)
    assert np.abs(out - ref).max() <= TOLERANCE * np.abs(ref).max()


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("beams", [1, 3])
def test_generation_matches_transformers(models, name, beams):
    """A batch of sources of different lengths, padded with the pad token (transformers numbers
    positions from the non-pad tokens; cpuformer's loop runs each source from position 0)."""
    _, hf, s2s = models[name]
    config = SHAPES[name]
    sources, ids, mask = _sources(np.random.default_rng(2), config["vocab_size"], (13, 6), config["pad_token_id"])
    with torch.inference_mode():
        out = hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=12, min_new_tokens=12,
                          do_sample=False, num_beams=beams, return_dict_in_generate=True, output_scores=True)
    if beams == 1:
        assert _top2_gap(torch.stack(out.scores).numpy()) > GAP
    expected = out.sequences[:, 1:].tolist()
    assert s2s.generate(sources, max_new_tokens=12, min_new_tokens=12, num_beams=beams) == expected


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "int4"])
def test_every_dtype(models, dtype):
    directory, _, s2s = models["nllb"]
    config = SHAPES["nllb"]
    _, ids, mask = _sources(np.random.default_rng(3), config["vocab_size"], (9, 14), 1)
    tgt = np.random.default_rng(4).integers(4, config["vocab_size"], size=(2, 6))
    ref = s2s.logits(ids, tgt, mask)
    model = cf.load(directory, dtype=dtype)
    assert model.dtype == dtype
    ours = model.logits(ids, tgt, mask)
    assert not np.array_equal(ours, ref)
    assert cosine_rows(ours, ref).min() >= (0.9 if dtype == "int4" else 0.99)
    assert len(model.generate(ids[0].tolist(), max_new_tokens=4, min_new_tokens=4)[0]) == 4


def test_converted_directory(models, tmp_path):
    directory, _, _ = models["odd"]
    config = SHAPES["odd"]
    cf.convert(directory, tmp_path / "int8", "int8", progress=False)
    ids = np.random.default_rng(5).integers(4, config["vocab_size"], size=(2, 8))
    tgt = np.random.default_rng(6).integers(4, config["vocab_size"], size=(2, 5))
    np.testing.assert_array_equal(cf.load(tmp_path / "int8").logits(ids, tgt),
                                  cf.load(directory, dtype="int8").logits(ids, tgt))


def test_saved_position_buffer_is_ignored(models, tmp_path):
    """Converted checkpoints that saved the sinusoidal table still load (it is computed here)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    directory, hf, s2s = models["nllb"]
    for file in os.listdir(directory):
        shutil.copy(os.path.join(directory, file), tmp_path / file)
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    tensors["model.encoder.embed_positions.weights"] = hf.model.encoder.embed_positions.weights.numpy()
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = [[5, 9, 40, 2]]
    np.testing.assert_array_equal(cf.load(tmp_path).encode(ids), s2s.encode(ids))


def test_random_checkpoint_of_the_spec(tmp_path):
    """The registry's own random checkpoint (cpuformer bench's models) has M2M100's tensors: no
    final_logits_bias, no position table."""
    import json

    from cpuformer._bench import random_checkpoint
    from cpuformer._model_dir import save_safetensors

    arch = by_family()["m2m100"]
    config = arch.example_config(**{k: v for k, v in SHAPES["odd"].items() if k != "init_std"})
    tensors = random_checkpoint(arch, config, np.random.default_rng(0))
    assert "final_logits_bias" not in tensors and not any("embed_positions" in name for name in tensors)
    save_safetensors(str(tmp_path / "model.safetensors"), tensors, metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert len(cf.load(tmp_path).generate([5, 6, 7], max_new_tokens=3, min_new_tokens=3)[0]) == 3
