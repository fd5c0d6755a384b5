"""Reading a model directory's tokenizer files, with errors that name the file.

The ``tokenizers`` library reports a corrupt ``tokenizer.json`` as a bare ``Exception`` (its Rust
error text, e.g. "expected `,` or `}` at line 1 column 5"), naming no file; the JSON side files
(``tokenizer_config.json``, ``sentence_bert_config.json``) may hold anything. Everything that
reads them goes through here and gets a ValueError naming the file and the reason.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Optional, Union

from ._model_dir import _read_json_object, config_int

PathLike = Union[str, "os.PathLike[str]"]


def load_tokenizer(path: PathLike) -> Any:
    """A ``tokenizers.Tokenizer`` from ``path`` (tokenizer.json); ValueError "<path>: not a valid
    tokenizer file (<reason>)" for whatever the library refuses."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(os.fspath(path))
    except Exception as error:  # the library raises plain Exception for a corrupt file
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ValueError(f"{path}: not a valid tokenizer file ({reason})") from None


def read_length_limit(directory: PathLike, file: str, key: str) -> Optional[int]:
    """An optional length limit such as tokenizer_config.json's model_max_length: None when the
    file or the key is absent (or null); otherwise an integer >= 1 (transformers writes 1e30-sized
    integers for "no limit"), else ValueError naming the file and the key."""
    path = pathlib.Path(os.fspath(directory)) / file
    if not path.is_file():
        return None
    settings = _read_json_object(path)  # ValueError naming the file for unreadable or non-object JSON
    return config_int(settings, key, default=None, minimum=1, maximum=None, source=str(path))


__all__ = ["load_tokenizer", "read_length_limit"]
