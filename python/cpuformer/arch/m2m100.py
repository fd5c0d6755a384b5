"""M2M100 and NLLB (``M2M100ForConditionalGeneration``, model_type "m2m_100"): mBART's pre-norm
network (a final norm per stack, embeddings scaled by sqrt(d_model)) without a norm over the
embeddings, with fairseq's sinusoidal positions (computed from the config, never stored) and ReLU.

transformers' ``M2M100SinusoidalPositionalEmbedding`` numbers the positions from the input ids:
a non-pad token at index t of a sequence gets row ``pad_token_id + 1 + t`` of the table (pad
tokens get row ``pad_token_id``, zeros). cpuformer's encoder runs each source right-aligned from
index 0 (the loop strips the padding first) and its decoder counts the cache length, so the
table is declared with ``position_offset = pad_token_id + 1``: the same rows for every real token,
left- or right-padded.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping

import numpy as np

from .._model_dir import config_int
from .bart import MBart
from .spec import Hparams, Source, not_supported, weight_and_bias


def fairseq_positions(n_pos: int, dim: int, padding_idx: int) -> np.ndarray:
    """fairseq's (tensor2tensor's) sinusoidal table [n_pos, dim] float32, as transformers'
    ``M2M100SinusoidalPositionalEmbedding.get_embedding`` computes it (in float32): sin of
    pos · exp(-j · ln(10000) / (half - 1)) over the first half, cos over the second, a zero column
    when dim is odd, and row ``padding_idx`` zero."""
    half = dim // 2
    if half < 2:
        raise ValueError(f"config.json: d_model {dim} is too small for sinusoidal positions (at least 4)")
    step = math.log(10000) / (half - 1)
    # float32 exponents and angles as transformers; exp, sin and cos rounded once from float64
    # (within an ulp of torch's float32 functions, where NumPy's own float32 ones drift further).
    freq = np.exp((np.arange(half, dtype=np.float32) * np.float32(-step)).astype(np.float64)).astype(np.float32)
    angles = (np.arange(n_pos, dtype=np.float32)[:, None] * freq[None, :]).astype(np.float64)
    out = np.zeros((n_pos, dim), dtype=np.float32)
    out[:, :half] = np.sin(angles)
    out[:, half:2 * half] = np.cos(angles)
    if 0 <= padding_idx < n_pos:
        out[padding_idx] = 0.0
    return out


class M2M100(MBart):
    family = "m2m100"
    title = "M2M100 / NLLB"
    architectures = ("M2M100ForConditionalGeneration",)
    model_types = ("m2m_100",)
    example = dict(activation_function="relu", scale_embedding=True, pad_token_id=1, bos_token_id=0,
                   eos_token_id=2, decoder_start_token_id=2)
    # embed_positions: the sinusoidal table (a buffer some converted checkpoints saved; computed
    # from the config here).
    ignored = MBart.ignored + (r"(model\.)?(encoder|decoder)\.embed_positions\..*",)

    def hparams(self, config: Mapping[str, Any]) -> Hparams:
        # transformers' M2M100Config defaults: relu, scale_embedding, pad 1, a tied head.
        # transformers 5 unties the encoder's and decoder's embed_tokens from the shared table too
        # when tie_word_embeddings is false (released M2M100 / NLLB checkpoints are all tied).
        not_supported(config.get("tie_word_embeddings", True) is False,
                      "tie_word_embeddings=false (separate encoder, decoder and output embedding tables) is not "
                      "supported")
        defaults = {"activation_function": "relu", "scale_embedding": True}
        hp = super().hparams({**defaults, **{k: v for k, v in config.items() if v is not None}})
        pad = config_int(config, "pad_token_id", default=1)
        d = hp.hidden_size
        return dataclasses.replace(
            hp, positions="sinusoidal", position_offset=pad + 1, pad_token_id=pad, embedding_norm=False,
            embed_scale=math.sqrt(d) if config.get("scale_embedding", True) else 1.0)

    def model_tensors(self, config: Mapping[str, Any], hp: Hparams) -> Dict[str, Source]:
        out = super().model_tensors(config, hp)
        del out["lm_head.bias"]  # no final_logits_bias
        return out

    def stack_tensors(self, config: Mapping[str, Any], hp: Hparams, stack: str) -> Dict[str, Source]:
        rows = hp.max_positions + hp.position_offset
        return {"embed.positions": fairseq_positions(rows, hp.hidden_size, hp.pad_token_id),
                **weight_and_bias("final_norm", f"{stack}.layer_norm")}


ARCHS = (M2M100(),)
