"""BART-style checkpoints with tie_word_embeddings=false: transformers 5 then reads the encoder's
and decoder's embed_tokens as tables of their own. cpuformer reads one table (shared.weight): it
loads such a checkpoint when the stored copies hold the shared table's values (and matches
transformers), and refuses it when they differ, instead of computing with the wrong table."""

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import cpuformer as cf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=61, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
             pad_token_id=1, decoder_start_token_id=2, tie_word_embeddings=False)
FAMILIES = {"bart": ("BartForConditionalGeneration", "BartConfig"),
            "mbart": ("MBartForConditionalGeneration", "MBartConfig"),
            "marian": ("MarianMTModel", "MarianConfig")}


def _save(directory, family, tables_equal):
    model_class, config_class = FAMILIES[family]
    torch.manual_seed(3)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**SIZES)).eval()
    if tables_equal:
        with torch.no_grad():
            model.model.encoder.embed_tokens.weight.copy_(model.model.shared.weight)
            model.model.decoder.embed_tokens.weight.copy_(model.model.shared.weight)
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_separate_tables_are_refused(tmp_path, family):
    _save(tmp_path, family, tables_equal=False)
    message = (r"model\.encoder\.embed_tokens\.weight differs from model\.shared\.weight and config\.json has "
               r"tie_word_embeddings=false, so transformers uses separate tables there; cpuformer reads one table "
               r"\(model\.shared\.weight\) and does not support separate ones")
    with pytest.raises(NotImplementedError, match=message):
        cf.load(tmp_path)


def test_only_the_decoder_table_differs(tmp_path):
    _save(tmp_path, "bart", tables_equal=True)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.decoder.embed_tokens.weight"] = tensors["model.decoder.embed_tokens.weight"] + np.float32(0.5)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(NotImplementedError, match=r"model\.decoder\.embed_tokens\.weight differs from"):
        cf.load(tmp_path)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_equal_copies_load_and_match_transformers(tmp_path, family):
    model = _save(tmp_path, family, tables_equal=True)
    s2s = cf.load(tmp_path)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, SIZES["vocab_size"], size=(2, 9))
    tgt = rng.integers(3, SIZES["vocab_size"], size=(2, 5))
    with torch.inference_mode():
        ref = model(input_ids=torch.tensor(ids), decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    out = s2s.logits(ids, tgt)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()
