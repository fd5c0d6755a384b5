"""Reading a model directory's tokenizer files, with errors that name the file.

The ``tokenizers`` library reports a corrupt ``tokenizer.json`` as a bare ``Exception`` (its Rust
error text, e.g. "expected `,` or `}` at line 1 column 5"), naming no file; the JSON side files
(``tokenizer_config.json``, ``sentence_bert_config.json``) may hold anything. Everything that
reads them goes through here and gets a ValueError naming the file and the reason.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Dict, List, Optional, Sequence, Union

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


def _token_text(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object
    ({"content": ...}); None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class Tokenizer:
    """A model directory's tokenizer (``model.tokenizer``): text to token ids and back, with the
    same ids as transformers' tokenizer of that directory.

    Backed by ``tokenizer.json`` through the ``tokenizers`` library (``backend``). Subclasses
    implement the same methods over other files (SentencePiece models). ``settings`` is
    tokenizer_config.json's content ({} without one): the special tokens' text and the chat
    template are read from it.
    """

    def __init__(self, backend: Any, path: Optional[pathlib.Path] = None,
                 settings: Optional[Dict[str, Any]] = None) -> None:
        #: The ``tokenizers.Tokenizer`` (None for a tokenizer that is not read from tokenizer.json).
        self.backend = backend
        #: The file the vocabulary was read from.
        self.path = path
        self.settings: Dict[str, Any] = dict(settings or {})

    # ---- what a subclass overrides -------------------------------------------------------

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> List[List[int]]:
        """Token ids of each text; add_special_tokens adds what the tokenizer adds around a
        text (BOS, EOS, language codes), as transformers' tokenizer(text) does."""
        return [list(e.ids) for e in self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> List[str]:
        """The text of each token-id sequence."""
        return list(self.backend.decode_batch([[int(t) for t in s] for s in sequences],
                                              skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of a token's text (None when the vocabulary has no such token)."""
        result = self.backend.token_to_id(token)
        return None if result is None else int(result)

    def id_to_token(self, token_id: int) -> Optional[str]:
        """The text of a token id as the vocabulary spells it (None outside the vocabulary)."""
        return self.backend.id_to_token(int(token_id))

    def get_vocab(self) -> Dict[str, int]:
        """Every token's text and id, added tokens included."""
        return dict(self.backend.get_vocab(True))

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce (added tokens included)."""
        return int(self.backend.get_vocab_size(True))

    # ---- derived ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of one text."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a string, got {type(text).__name__}")
        return self.encode_batch([text], add_special_tokens)[0]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of one token-id sequence."""
        return self.decode_batch([ids], skip_special_tokens)[0]

    def count(self, text: str, add_special_tokens: bool = True) -> int:
        """How many tokens ``text`` encodes to."""
        return len(self.encode(text, add_special_tokens))

    def tokens(self, text: str, add_special_tokens: bool = False) -> List[str]:
        """The tokens of ``text`` as the vocabulary spells them."""
        return [self.id_to_token(t) or "" for t in self.encode(text, add_special_tokens)]

    def special_token(self, name: str) -> Optional[str]:
        """tokenizer_config.json's ``bos_token``, ``eos_token``, ``pad_token``, ``unk_token`` ... (its
        text; None when unset)."""
        return _token_text(self.settings.get(name))

    @property
    def bos_token(self) -> Optional[str]:
        return self.special_token("bos_token")

    @property
    def eos_token(self) -> Optional[str]:
        return self.special_token("eos_token")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path}, vocab_size={self.vocab_size})"


def read_tokenizer_settings(directory: PathLike) -> Dict[str, Any]:
    """tokenizer_config.json's content ({} without one); ValueError naming the file for one that
    is not a JSON object."""
    path = pathlib.Path(os.fspath(directory)) / "tokenizer_config.json"
    return _read_json_object(path) if path.is_file() else {}


__all__ = ["Tokenizer", "load_tokenizer", "read_length_limit", "read_tokenizer_settings"]
