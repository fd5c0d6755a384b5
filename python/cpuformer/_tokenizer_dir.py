"""A model directory's tokenizer: ``tokenizer.json`` through the ``tokenizers`` library when the
directory has one, else the SentencePiece files of the families ``_sentencepiece.py`` reads
(docs/tokenizers.md)."""

from __future__ import annotations

import os
import pathlib
from typing import Optional

from ._sentencepiece import open_sentencepiece
from ._tokenizer import PathLike, Tokenizer, load_tokenizer, read_tokenizer_settings


def open_tokenizer(directory: PathLike) -> Optional[Tokenizer]:
    """The tokenizer of a model directory, None when it has no tokenizer file: tokenizer.json when
    present, else the SentencePiece files of the families _sentencepiece.py reads (Marian, T5,
    Llama, mBART-50, NLLB, M2M100; docs/tokenizers.md)."""
    directory = pathlib.Path(os.fspath(directory))
    path = directory / "tokenizer.json"
    if path.is_file():
        backend = load_tokenizer(path)
        # transformers' tokenizer(text) pads and truncates only when asked to, whatever the file says
        backend.no_padding()
        backend.no_truncation()
        return Tokenizer(backend, path, read_tokenizer_settings(directory))
    return open_sentencepiece(directory, read_tokenizer_settings(directory))


__all__ = ["open_tokenizer"]
