"""``EncoderModel.forward_embeddings``: the encoder stack on given input embeddings (the entry of
the vision towers, tests/models/test_vit.py) against ``forward`` on a BERT, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core

from ._hf import save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=20, type_vocab_size=2)
    hf = save_random_model(directory, transformers.BertModel, config)
    return directory, hf


def test_forward_embeddings_is_forward_after_the_embedding_tables(bert):
    """BERT's word + position + token type rows through forward_embeddings (which applies the
    embedding LayerNorm, the layers and the pooler) give what forward gives on the ids."""
    directory, hf = bert
    encoder = cf.Encoder(directory)
    ids = np.random.default_rng(0).integers(0, 60, size=(2, 7))
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    e = hf.embeddings
    summed = (e.word_embeddings.weight[torch.tensor(ids)] + e.position_embeddings.weight[:7][None]
              + e.token_type_embeddings.weight[0]).detach().numpy()
    graph = encoder._model
    ref_hidden, ref_pooled = graph.forward(ids, mask, None, True)
    hidden, pooled = graph.forward_embeddings(summed, mask, True)
    np.testing.assert_allclose(hidden[0], ref_hidden[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(hidden[1, :5], ref_hidden[1, :5], rtol=0, atol=1e-5)
    np.testing.assert_allclose(pooled, ref_pooled, rtol=0, atol=1e-5)
    alone = graph.forward_embeddings(summed[:1], None, False, 1)
    np.testing.assert_allclose(alone, ref_hidden[:1], rtol=0, atol=1e-5)


def test_forward_embeddings_errors(bert):
    graph = cf.Encoder(bert[0])._model
    good = np.zeros((1, 3, 32), np.float32)
    with pytest.raises(TypeError, match="embeddings"):
        graph.forward_embeddings(good.astype(np.float64))
    with pytest.raises(ValueError, match=r"embeddings must have 3 dimensions \[batch, seq_len, hidden\]"):
        graph.forward_embeddings(good[0])
    with pytest.raises(ValueError, match=r"embeddings must have shape \[batch, seq_len, 32\] \(the model's embedding "
                                         r"width\), got \[1, 3, 31\]"):
        graph.forward_embeddings(np.zeros((1, 3, 31), np.float32))
    with pytest.raises(ValueError, match="at least one sequence of at least one position"):
        graph.forward_embeddings(np.zeros((1, 0, 32), np.float32))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[batch, seq_len\] = \[1, 3\]"):
        graph.forward_embeddings(good, np.ones((1, 4), np.int64))
    with pytest.raises(ValueError, match=r"attention_mask\[0, 1\] = 2; attention_mask entries must be 0"):
        graph.forward_embeddings(good, np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        graph.forward_embeddings(good, None, False, -1)
    assert isinstance(graph, _core.EncoderModel)
