"""A model directory's tokenizer: ``tokenizer.json`` through the ``tokenizers`` library when the
directory has one, else a ``tokenizers.Tokenizer`` built from the slow tokenizer files of the
families ``_slow_tokenizers.py`` reads, else the SentencePiece files of the families
``_sentencepiece.py`` reads (docs/tokenizers.md)."""

from __future__ import annotations

import os
import pathlib
from typing import Optional

from ._sentencepiece import open_sentencepiece
from ._slow_tokenizers import build_slow_tokenizer, has_slow_tokenizer, slow_family, unsupported_error
from ._tokenizer import PathLike, Tokenizer, load_tokenizer, read_tokenizer_settings


def open_tokenizer(directory: PathLike) -> Optional[Tokenizer]:
    """The tokenizer of a model directory, None when it has no tokenizer file: tokenizer.json when
    present, else the slow tokenizer files of the families _slow_tokenizers.py reads (BERT, MPNet,
    GPT-2, RoBERTa, BART, ALBERT, XLNet, DeBERTa-v2, XLM-R, CamemBERT), else the SentencePiece files of
    the families _sentencepiece.py reads (Marian, T5, Llama, mBART-50, NLLB, M2M100;
    docs/tokenizers.md). ValueError for slow tokenizer files of another family."""
    directory = pathlib.Path(os.fspath(directory))
    path = directory / "tokenizer.json"
    if path.is_file():
        backend = load_tokenizer(path)
        # transformers' tokenizer(text) pads and truncates only when asked to, whatever the file says
        backend.no_padding()
        backend.no_truncation()
        return Tokenizer(backend, path, read_tokenizer_settings(directory))
    settings = read_tokenizer_settings(directory)
    # the families of _slow_tokenizers.py (BERT, GPT-2, RoBERTa, ALBERT, XLNet, DeBERTa-v2,
    # XLM-R, CamemBERT) first: chosen by tokenizer_class / model_type, they never name a family
    # of _sentencepiece.py (which reads T5, Llama, Marian, mBART-50, NLLB, M2M100)
    family = slow_family(directory, settings)
    if family is not None and has_slow_tokenizer(directory):
        backend = build_slow_tokenizer(directory, settings, family)
        return Tokenizer(backend, directory / family.files[0], settings)  # type: ignore[attr-defined]
    tokenizer = open_sentencepiece(directory, settings)
    if tokenizer is None and has_slow_tokenizer(directory):
        raise unsupported_error(directory, settings)
    return tokenizer


__all__ = ["open_tokenizer"]
