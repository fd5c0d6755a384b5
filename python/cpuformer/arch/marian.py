"""Marian (opus-mt): BART's post-norm network with sinusoidal positions, embeddings scaled by
sqrt(d_model), no norm over the embeddings, and a final_logits_bias."""

from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np

from .bart import Bart
from .spec import Hparams, Source, not_supported


def sinusoidal_positions(n_pos: int, dim: int) -> np.ndarray:
    """Marian's position table [n_pos, dim] float32: sin of pos / 10000^(2·(j//2)/dim) over the
    even j in the first half, cos over the odd j in the second (not interleaved)."""
    j = np.arange(dim)
    angles = np.arange(n_pos, dtype=np.float64)[:, None] / np.power(10000.0, 2 * (j // 2) / dim)[None, :]
    sentinel = dim // 2 if dim % 2 == 0 else dim // 2 + 1
    out = np.empty((n_pos, dim), dtype=np.float32)
    out[:, :sentinel] = np.sin(angles[:, 0::2])
    out[:, sentinel:] = np.cos(angles[:, 1::2])
    return out


class Marian(Bart):
    family = "marian"
    title = "Marian"
    architectures = ("MarianMTModel",)
    model_types = ("marian",)
    # embed_positions: the sinusoidal table some checkpoints save (computed from the config here).
    example = dict(activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
                   tie_word_embeddings=True)
    ignored = Bart.ignored + (r"(model\.)?(encoder|decoder)\.embed_positions\.weight",)

    def check(self, config: Mapping[str, Any]) -> None:
        not_supported(config.get("share_encoder_decoder_embeddings", True) is False,
                      "share_encoder_decoder_embeddings=false (separate source and target vocabularies) is not "
                      "supported")

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        return {"embed.positions": sinusoidal_positions(hp.max_positions, hp.hidden_size)}


ARCHS = (Marian(),)
