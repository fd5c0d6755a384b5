"""ALBERT specifics beyond its parity row (tests/models/test_registry.py): six layers served by the one
group a checkpoint stores (the loader reads group 0 once; a group 1..5 would be a missing tensor),
and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = dict(vocab_size=77, embedding_size=16, hidden_size=32, num_hidden_layers=6, num_hidden_groups=1,
              num_attention_heads=4, intermediate_size=40, max_position_embeddings=32, initializer_range=0.2)


def _save(directory, **overrides):
    torch.manual_seed(0)
    model = transformers.AlbertModel(transformers.AlbertConfig(**dict(CONFIG, **overrides))).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def test_one_group_serves_every_layer(tmp_path):
    model = _save(tmp_path)
    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], (2, 11))
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    enc = cf.load(tmp_path)
    assert enc.hparams.layer_groups == 1 and enc.hparams.num_layers == 6
    ours = enc(ids, mask)
    keep = mask.astype(bool)
    np.testing.assert_allclose(ours[keep], reference[keep], rtol=0, atol=1e-4 * np.abs(reference).max())


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_refusals(tmp_path):
    _save(tmp_path)
    _edit_config(tmp_path, inner_group_num=2)
    with pytest.raises(NotImplementedError, match=r"^config.json: inner_group_num 2 is not supported; only groups of "
                                                  r"one layer are"):
        cf.load(tmp_path)
    _edit_config(tmp_path, inner_group_num=1, num_hidden_groups=4)
    with pytest.raises(ValueError, match=r"^config.json: num_hidden_layers 6 is not a multiple of num_hidden_groups "
                                         r"4$"):
        cf.load(tmp_path)
