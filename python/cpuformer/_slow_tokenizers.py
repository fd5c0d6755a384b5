"""A ``tokenizers.Tokenizer`` built from a model directory's "slow" tokenizer files, for directories
that have no ``tokenizer.json`` (docs/tokenizers.md, "Directories without tokenizer.json").

transformers 5 reads such a directory with its tokenizer class (chosen by tokenizer_config.json's
``tokenizer_class``, else by config.json's ``model_type``), and every class builds a
``tokenizers.Tokenizer`` in its constructor from the vocabulary file and tokenizer_config.json's
settings. This module builds the same pipeline (normalizer, pre-tokenizer, model, post-processor,
decoder, added tokens) for these families:

==============================  ==============================  ====================================
class (model_type)              files                           model
==============================  ==============================  ====================================
BertTokenizer (bert,            vocab.txt                       WordPiece, BertNormalizer
distilbert, electra)
MPNetTokenizer (mpnet)          vocab.txt                       WordPiece, ``<s> A </s></s> B </s>``
GPT2Tokenizer (gpt2)            vocab.json, merges.txt          byte-level BPE
RobertaTokenizer (roberta,      vocab.json, merges.txt          byte-level BPE, ``<s> A </s></s> B </s>``
bart)
AlbertTokenizer (albert)        spiece.model                    Unigram
XLNetTokenizer (xlnet)          spiece.model                    Unigram, ``A <sep> <cls>``
DebertaV2Tokenizer              spm.model                       Unigram
(deberta-v2)
XLMRobertaTokenizer             sentencepiece.bpe.model         Unigram with fairseq ids
(xlm-roberta)
CamembertTokenizer (camembert)  sentencepiece.bpe.model         Unigram with CamemBERT's ids
==============================  ==============================  ====================================

The SentencePiece ``.model`` files are protobufs, read here (pieces, scores, types, unk_id and the
normalizer's precompiled_charsmap) with no extra package: every family needs only ``tokenizers``.
"""

from __future__ import annotations

import os
import pathlib
import struct
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ._model_dir import _read_json_object
from ._tokenizer import _token_text, read_tokenizer_settings

SPIECE_UNDERLINE = "\u2581"


# ---- SentencePiece model files -----------------------------------------------------------------

class SentencePieceProto:
    """What the tokenizer classes read from a SentencePiece ModelProto: the pieces (text, score,
    type: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte), trainer_spec's unk_id and the
    normalizer_spec's precompiled_charsmap."""

    def __init__(self, pieces: List[Tuple[str, float, int]], unk_id: int, precompiled_charsmap: bytes) -> None:
        self.pieces = pieces
        self.unk_id = unk_id
        self.precompiled_charsmap = precompiled_charsmap


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 70:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[Tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: varints as int, 32-bit fields as
    their 4 bytes, length-delimited fields as bytes."""
    pos = 0
    while pos < len(data):
        key = data[pos]
        if key < 0x80:  # (one-byte keys: every field of a ModelProto but trainer_spec's 40+)
            pos += 1
        else:
            key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data) or number == 0:
            raise ValueError("truncated field")
        yield number, wire, value


def _int32(value: int) -> int:
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= 1 << 63 else value


_FLOAT = struct.Struct("<f")


def _piece(message: bytes) -> Tuple[str, float, int]:
    """(piece, score, type) of a ModelProto.SentencePiece message (type 1, NORMAL, when absent).
    Its usual layout (piece, score, type, in that order, short texts) is read without _fields: a
    250,000-piece model reads in well under a second."""
    text, score, kind = "", 0.0, 1
    pos, end = 0, len(message)
    while pos < end:
        key = message[pos]
        if key == 0x0A and pos + 1 < end and message[pos + 1] < 0x80:  # piece, length < 128
            length = message[pos + 1]
            text = message[pos + 2:pos + 2 + length].decode("utf-8")
            pos += 2 + length
        elif key == 0x15:  # score (float)
            if pos + 5 > end:
                raise ValueError("truncated field")
            score = _FLOAT.unpack_from(message, pos + 1)[0]
            pos += 5
        elif key == 0x18 and pos + 1 < end and message[pos + 1] < 0x80:  # type
            kind = message[pos + 1]
            pos += 2
        else:  # anything else: the general reader over the rest
            for n, w, v in _fields(message[pos:]):
                if n == 1 and w == 2:
                    text = v.decode("utf-8")
                elif n == 2 and w == 5:
                    score = _FLOAT.unpack(v)[0]
                elif n == 3 and w == 0:
                    kind = v
            break
    if pos > end:
        raise ValueError("truncated field")
    return text, score, kind


def read_sentencepiece_model(path: pathlib.Path) -> SentencePieceProto:
    """The pieces, unk_id and precompiled_charsmap of a SentencePiece model file; ValueError
    naming the file for one that is not a SentencePiece model."""
    data = path.read_bytes()
    try:
        pieces: List[Tuple[str, float, int]] = []
        unk_id, charsmap = 0, b""
        for number, wire, value in _fields(data):
            if number == 1 and wire == 2:
                pieces.append(_piece(value))
            elif number == 2 and wire == 2:
                for n, w, v in _fields(value):
                    if n == 40 and w == 0:
                        unk_id = _int32(v)
            elif number == 3 and wire == 2:
                for n, w, v in _fields(value):
                    if n == 2 and w == 2:
                        charsmap = v
    except (ValueError, UnicodeDecodeError, struct.error) as error:
        raise ValueError(f"{path}: not a valid SentencePiece model ({error})") from None
    if not pieces:
        raise ValueError(f"{path}: not a valid SentencePiece model (it has no pieces)")
    return SentencePieceProto(pieces, unk_id, charsmap)


# ---- settings ----------------------------------------------------------------------------------

class _Settings:
    """tokenizer_config.json's values with the class's defaults, type-checked with errors naming the
    file."""

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        self.values = settings
        self.source = directory / "tokenizer_config.json"

    def flag(self, key: str, default: Optional[bool]) -> Optional[bool]:
        value = self.values.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"{self.source}: {key} must be true or false, got {value!r}")
        return value

    def unk_id(self, proto: "SentencePieceProto") -> int:
        """tokenizer_config.json's unk_id, else the SentencePiece model's; an id of a piece."""
        value = self.values.get("unk_id", proto.unk_id)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(proto.pieces):
            raise ValueError(f"{self.source}: unk_id must be the id of a piece (0 to {len(proto.pieces) - 1}), "
                             f"got {value!r}")
        return value

    def token(self, key: str, default: Optional[str]) -> Optional[str]:
        """A special token's text (None: the family has none, or tokenizer_config.json sets null)."""
        if key in self.values:
            value = self.values[key]
            if value is None:
                return None
            text = _token_text(value)
            if text is None:
                raise ValueError(f"{self.source}: {key} must be a string or an AddedToken object, got {value!r}")
            return text
        return default


def _added_token(value: Any, **defaults: Any) -> Any:
    """A tokenizers.AddedToken from tokenizer_config.json's text or AddedToken object."""
    from tokenizers import AddedToken

    if isinstance(value, str):
        options = {"special": True, "normalized": False, **defaults}
        return AddedToken(value, **options)
    options = {key: bool(value[key]) for key in ("single_word", "lstrip", "rstrip", "normalized", "special")
               if key in value}
    options = {**{"special": True}, **options}
    if "normalized" not in options:
        options["normalized"] = not options["special"]
    return AddedToken(value["content"], **options)


def _legacy_files(directory: pathlib.Path, settings: Dict[str, Any]) -> Dict[str, Any]:
    """tokenizer_config.json's settings with what transformers reads from the older files when it
    has no added_tokens_decoder: special_tokens_map.json's tokens replace its named tokens
    (an object there is a special AddedToken), and added_tokens.json ({text: id}) becomes
    added_tokens_decoder (special when the text is a named or extra special token)."""
    if "added_tokens_decoder" in settings:
        return settings
    merged = dict(settings)
    path = directory / "special_tokens_map.json"
    if path.is_file():
        for key, value in _read_json_object(path).items():
            if isinstance(value, dict) and key != "extra_special_tokens":
                value = {**{k: v for k, v in value.items() if k != "special"}, "special": True}
            elif key == "extra_special_tokens" and isinstance(value, list):
                existing = list(merged.get("extra_special_tokens") or [])
                value = existing + [t for t in value if t not in existing]
            merged[key] = value
    path = directory / "added_tokens.json"
    if path.is_file():
        special = {_token_text(merged.get(k)) for k in _NAMED} - {None}
        extra = merged.get("extra_special_tokens")  # (not additional_special_tokens, as in transformers 5)
        special |= {_token_text(t) for t in (extra.values() if isinstance(extra, dict) else extra or [])}
        table: Dict[str, Any] = {}
        for text, index in _read_json_object(path).items():
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"{path}: the id of {text!r} must be an integer >= 0, got {index!r}")
            table[str(index)] = {"content": text, "lstrip": False, "rstrip": False, "normalized": text not in special,
                                 "special": text in special}
        merged["added_tokens_decoder"] = table
    return merged


# ---- the families ------------------------------------------------------------------------------

#: named special tokens, in the order transformers' special tokens map lists them
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class _Family:
    """One tokenizer class of transformers 5: its files, default special tokens and pipeline."""

    name = ""
    files: Tuple[str, ...] = ()
    defaults: Dict[str, Optional[str]] = {}
    #: named tokens transformers adds with lstrip (the mask token that swallows the space before it)
    lstrip: Tuple[str, ...] = ()
    #: additional special tokens of the class when tokenizer_config.json names none
    extra: Tuple[str, ...] = ()

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        self.directory = directory
        self.settings = _Settings(directory, _legacy_files(directory, settings))
        self.tokens = {key: self.settings.token(key, self.defaults.get(key)) for key in _NAMED}
        self.spm_added: List[Any] = []  # control / user-defined SentencePiece pieces (AddedToken)

    def tok(self, key: str) -> str:
        return str(self.tokens.get(key) or "")

    def build(self) -> Any:
        raise NotImplementedError

    def post_process(self, backend: Any) -> None:
        """Sets the post-processor once the special tokens have their ids."""

    # -- SentencePiece helpers --
    def read_spm(self, file: str) -> SentencePieceProto:
        from tokenizers import AddedToken

        proto = read_sentencepiece_model(self.directory / file)
        # transformers' SentencePieceExtractor: control and user-defined pieces become added tokens
        self.spm_added = [AddedToken(text, normalized=False, special=kind == 3)
                          for text, _, kind in proto.pieces if kind in (3, 4)]
        return proto

    def template(self, backend: Any, single: str, pair: str, names: Tuple[str, ...]) -> None:
        from tokenizers import processors

        special = []
        for key in names:
            token = self.tok(key)
            if not token:
                raise ValueError(f"{self.directory}: the {self.name} tokenizer needs a {key}, but "
                                 "tokenizer_config.json sets none")
            token_id = backend.token_to_id(token)
            if token_id is None:  # (named tokens are added tokens: only a broken vocabulary lacks one)
                raise ValueError(f"{self.directory}: the {self.name} tokenizer's {key} {token!r} is not in its "
                                 "vocabulary")
            special.append((token, token_id))
        backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


class _Bert(_Family):
    name = "BERT (WordPiece)"
    files = ("vocab.txt",)
    defaults = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "mask_token": "[MASK]"}
    lower_default = True

    def build(self) -> Any:
        from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
        from tokenizers.models import WordPiece

        vocab = WordPiece.read_file(os.fspath(self.directory / "vocab.txt"))
        backend = Tokenizer(WordPiece(vocab, unk_token=self.tok("unk_token")))
        strip = self.settings.values.get("strip_accents")
        if strip is not None and not isinstance(strip, bool):
            raise ValueError(f"{self.settings.source}: strip_accents must be true, false or null, got {strip!r}")
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=bool(self.settings.flag("tokenize_chinese_chars", True)),
            strip_accents=strip, lowercase=bool(self.settings.flag("do_lower_case", self.lower_default)))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        return backend

    def post_process(self, backend: Any) -> None:
        cls, sep = self.tok("cls_token"), self.tok("sep_token")
        self.template(backend, f"{cls}:0 $A:0 {sep}:0", f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
                      ("cls_token", "sep_token"))


class _MPNet(_Bert):
    name = "MPNet (WordPiece)"
    defaults = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                "unk_token": "[UNK]", "pad_token": "<pad>", "mask_token": "<mask>"}
    lstrip = ("mask_token",)

    def post_process(self, backend: Any) -> None:
        from tokenizers import processors

        cls, sep = self.tok("cls_token"), self.tok("sep_token")
        cls_id, sep_id = backend.token_to_id(cls), backend.token_to_id(sep)
        backend.post_processor = processors.RobertaProcessing(
            (sep, 2 if sep_id is None else sep_id), (cls, 0 if cls_id is None else cls_id), True, False)


class _GPT2(_Family):
    name = "GPT-2 (byte-level BPE)"
    files = ("vocab.json", "merges.txt")
    defaults = {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}

    def build(self) -> Any:
        from tokenizers import Tokenizer, decoders, pre_tokenizers
        from tokenizers.models import BPE

        try:
            vocab, merges = BPE.read_file(os.fspath(self.directory / "vocab.json"),
                                          os.fspath(self.directory / "merges.txt"))
        except Exception as error:  # the library's own error text
            reason = " ".join(str(error).split()) or type(error).__name__
            raise ValueError(f"{self.directory}: vocab.json / merges.txt are not a valid BPE vocabulary "
                             f"({reason})") from None
        backend = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                end_of_word_suffix="", fuse_unk=False))
        self.prefix_space = bool(self.settings.flag("add_prefix_space", False))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=self.prefix_space)
        backend.decoder = decoders.ByteLevel()
        return backend

    def post_process(self, backend: Any) -> None:
        # TokenizersBackend.update_post_processor: bos / eos only with add_bos_token / add_eos_token
        names = tuple(key for key, flag in (("bos_token", "add_bos_token"), ("eos_token", "add_eos_token"))
                      if self.settings.flag(flag, False) and self.tok(key))  # (transformers drops an unset one)
        bos = self.tok("bos_token") if "bos_token" in names else ""
        eos = self.tok("eos_token") if "eos_token" in names else ""
        single = f"{bos + ':0 ' if bos else ''}$A:0{' ' + eos + ':0' if eos else ''}"
        pair = f"{single}{' ' + bos + ':1' if bos else ''} $B:1{' ' + eos + ':1' if eos else ''}"
        self.template(backend, single, pair, names)


class _Roberta(_GPT2):
    name = "RoBERTa (byte-level BPE)"
    defaults = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}

    def post_process(self, backend: Any) -> None:
        from tokenizers import processors

        cls, sep = self.tok("cls_token"), self.tok("sep_token")
        trim = bool(self.settings.flag("trim_offsets", True))
        backend.post_processor = processors.RobertaProcessing(
            (sep, backend.token_to_id(sep)), (cls, backend.token_to_id(cls)), trim, self.prefix_space)


def _metaspace(scheme: str, split: bool = True) -> Tuple[Any, Any]:
    from tokenizers import decoders, pre_tokenizers

    return (pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme=scheme, split=split),
            decoders.Metaspace(replacement=SPIECE_UNDERLINE, prepend_scheme=scheme, split=split))


class _Albert(_Family):
    name = "ALBERT (SentencePiece)"
    files = ("spiece.model",)
    defaults = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "<unk>", "sep_token": "[SEP]",
                "pad_token": "<pad>", "cls_token": "[CLS]", "mask_token": "[MASK]"}

    def _normalizers(self, proto: SentencePieceProto, keep_accents: bool, lower: bool) -> Any:
        from tokenizers import normalizers

        steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
        if not keep_accents:
            steps += [normalizers.NFKD(), normalizers.StripAccents()]
        if lower:
            steps.append(normalizers.Lowercase())
        if proto.precompiled_charsmap:
            steps.append(normalizers.Precompiled(proto.precompiled_charsmap))
        return steps

    def build(self) -> Any:
        from tokenizers import Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import Unigram

        proto = self.read_spm("spiece.model")
        backend = Tokenizer(Unigram([(p, s) for p, s, _ in proto.pieces], unk_id=1, byte_fallback=False))
        backend.normalizer = normalizers.Sequence(self._normalizers(
            proto, bool(self.settings.flag("keep_accents", False)), bool(self.settings.flag("do_lower_case", True))))
        scheme = "always" if self.settings.flag("add_prefix_space", True) else "never"
        pre, backend.decoder = _metaspace(scheme)
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre])
        return backend

    def post_process(self, backend: Any) -> None:
        self.template(backend, "[CLS]:0 $A:0 [SEP]:0", "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1", ())

    def template(self, backend: Any, single: str, pair: str, names: Tuple[str, ...]) -> None:
        if names:
            return super().template(backend, single, pair, names)
        # AlbertTokenizer's template names "[CLS]" / "[SEP]" and gives them the cls/sep tokens' ids
        from tokenizers import processors

        ids = [backend.token_to_id(self.tok(key)) for key in ("cls_token", "sep_token")]
        if None in ids:
            raise ValueError(f"{self.directory}: the {self.name} tokenizer's cls_token / sep_token "
                             f"({self.tok('cls_token')!r}, {self.tok('sep_token')!r}) are not in its vocabulary")
        backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[("[CLS]", ids[0]), ("[SEP]", ids[1])])


class _XLNet(_Albert):
    name = "XLNet (SentencePiece)"
    defaults = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>",
                "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>"}
    lstrip = ("mask_token",)
    extra = ("<eop>", "<eod>")

    def build(self) -> Any:
        from tokenizers import Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import Unigram

        proto = self.read_spm("spiece.model")
        unk_id = self.settings.unk_id(proto)
        backend = Tokenizer(Unigram([(p, s) for p, s, _ in proto.pieces], unk_id=unk_id, byte_fallback=False))
        # XLNetTokenizer strips accents whatever keep_accents says
        backend.normalizer = normalizers.Sequence(self._normalizers(
            proto, False, bool(self.settings.flag("do_lower_case", False))))
        pre, backend.decoder = _metaspace("always")
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre])
        return backend

    def post_process(self, backend: Any) -> None:
        sep, cls = self.tok("sep_token"), self.tok("cls_token")
        _Family.template(self, backend, f"$A:0 {sep}:0 {cls}:2", f"$A:0 {sep}:0 $B:1 {sep}:1 {cls}:2",
                        ("sep_token", "cls_token"))


class _DebertaV2(_Family):
    name = "DeBERTa-v2 (SentencePiece)"
    files = ("spm.model",)
    defaults = {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]", "sep_token": "[SEP]",
                "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}

    def build(self) -> Any:
        from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import Unigram

        proto = self.read_spm("spm.model")
        vocab = [(p, s) for p, s, _ in proto.pieces]
        unk = (self.tok("unk_token"), 0.0)
        unk_id = vocab.index(unk) if unk in vocab else self.settings.unk_id(proto)
        backend = Tokenizer(Unigram(vocab, unk_id=unk_id, byte_fallback=False))
        steps = [normalizers.Lowercase()] if self.settings.flag("do_lower_case", False) else []
        steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                  normalizers.Strip(left=False, right=True)]
        backend.normalizer = normalizers.Sequence(steps)
        pres = [pre_tokenizers.Punctuation(behavior="isolated")] if self.settings.flag("split_by_punct", False) else []
        pre, backend.decoder = _metaspace("always" if self.settings.flag("add_prefix_space", True) else "first")
        backend.pre_tokenizer = pre_tokenizers.Sequence(pres + [pre])
        return backend

    def post_process(self, backend: Any) -> None:
        cls, sep = self.tok("cls_token"), self.tok("sep_token")
        self.template(backend, f"{cls}:0 $A:0 {sep}:0", f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
                      ("cls_token", "sep_token"))


class _XLMRoberta(_Family):
    name = "XLM-RoBERTa (SentencePiece)"
    files = ("sentencepiece.bpe.model",)
    defaults = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}
    split = True

    def vocab(self, proto: SentencePieceProto) -> Tuple[List[Tuple[str, float]], int]:
        # XLMRobertaConverter.convert_from_spm: fairseq's <s> <pad> </s> <unk>, the pieces after
        # SentencePiece's first three, <mask> last
        vocab = [(self.tok(k), 0.0) for k in ("bos_token", "pad_token", "eos_token", "unk_token")]
        vocab += [(p, s) for p, s, _ in proto.pieces[3:]]
        vocab.append((self.tok("mask_token"), 0.0))
        return vocab, 3

    def build(self) -> Any:
        from tokenizers import Tokenizer, normalizers, pre_tokenizers
        from tokenizers.models import Unigram

        proto = self.read_spm("sentencepiece.bpe.model")
        vocab, unk_id = self.vocab(proto)
        backend = Tokenizer(Unigram(vocab, unk_id=unk_id, byte_fallback=False))
        if proto.precompiled_charsmap:
            backend.normalizer = normalizers.Precompiled(proto.precompiled_charsmap)
        pre, backend.decoder = _metaspace("always" if self.settings.flag("add_prefix_space", True) else "never")
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre])
        return backend

    def post_process(self, backend: Any) -> None:
        bos, eos = self.tok("bos_token"), self.tok("eos_token")
        self.template(backend, f"{bos} $A {eos}", f"{bos} $A {eos} {eos} $B {eos}", ("bos_token", "eos_token"))


class _Camembert(_XLMRoberta):
    name = "CamemBERT (SentencePiece)"
    lstrip = ("mask_token",)
    extra = ("<s>NOTUSED", "</s>NOTUSED", "<unk>NOTUSED")

    def vocab(self, proto: SentencePieceProto) -> Tuple[List[Tuple[str, float]], int]:
        # CamembertConverter.convert_from_spm
        vocab = [("<s>NOTUSED", 0.0), (self.tok("pad_token"), 0.0), ("</s>NOTUSED", 0.0),
                 (self.tok("unk_token"), 0.0), ("<unk>NOTUSED", -100.0)]
        vocab += [(p, s) for p, s, _ in proto.pieces[1:]]
        vocab.append((self.tok("mask_token"), 0.0))
        unk = next((i for i, (t, _) in enumerate(vocab) if t == self.tok("unk_token")), 0)
        return vocab, unk


#: tokenizer_config.json tokenizer_class (without "Fast") -> family
CLASSES: Dict[str, Callable[..., _Family]] = {
    "BertTokenizer": _Bert, "DistilBertTokenizer": _Bert, "ElectraTokenizer": _Bert, "MPNetTokenizer": _MPNet,
    "GPT2Tokenizer": _GPT2, "RobertaTokenizer": _Roberta, "BartTokenizer": _Roberta, "AlbertTokenizer": _Albert,
    "XLNetTokenizer": _XLNet, "DebertaV2Tokenizer": _DebertaV2, "XLMRobertaTokenizer": _XLMRoberta,
    "CamembertTokenizer": _Camembert}
#: config.json model_type -> family (transformers' TOKENIZER_MAPPING), without a tokenizer_class
MODEL_TYPES: Dict[str, Callable[..., _Family]] = {
    "bert": _Bert, "distilbert": _Bert, "electra": _Bert, "mpnet": _MPNet, "gpt2": _GPT2, "roberta": _Roberta,
    "bart": _Roberta,
    "albert": _Albert, "xlnet": _XLNet, "deberta-v2": _DebertaV2, "xlm-roberta": _XLMRoberta,
    "camembert": _Camembert}
#: the files that make a directory a "slow tokenizer" one
SLOW_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spiece.model", "spm.model", "sentencepiece.bpe.model")


def slow_family(directory: pathlib.Path, settings: Dict[str, Any]) -> Optional[Callable[..., _Family]]:
    """The family of a directory's tokenizer by tokenizer_config.json's tokenizer_class, else by
    config.json's model_type (as transformers' AutoTokenizer chooses); None for neither."""
    name = settings.get("tokenizer_class")
    if isinstance(name, str) and name:
        return CLASSES.get(name[:-4] if name.endswith("Fast") else name)
    config_path = directory / "config.json"
    model_type = _read_json_object(config_path).get("model_type") if config_path.is_file() else None
    return MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def _describe(directory: pathlib.Path, settings: Dict[str, Any]) -> str:
    name = settings.get("tokenizer_class")
    if isinstance(name, str) and name:
        return f"tokenizer_class {name}"
    config_path = directory / "config.json"
    model_type = _read_json_object(config_path).get("model_type") if config_path.is_file() else None
    return f"model_type {model_type!r}"


def build_slow_tokenizer(directory: pathlib.Path, settings: Dict[str, Any],
                         family: Optional[Callable[..., _Family]] = None) -> Any:
    """The ``tokenizers.Tokenizer`` transformers 5 builds for a directory without tokenizer.json
    whose family (``slow_family``) is one of this module's; ValueError naming the files found and
    the files needed when one is missing or unreadable."""
    family = family or slow_family(directory, settings)
    if family is None:
        raise ValueError(f"{directory}: no tokenizer family of {_describe(directory, settings)} is read from slow "
                         "tokenizer files")
    maker = family(directory, settings)
    missing = [f for f in maker.files if not (directory / f).is_file()]
    if missing:
        found = [f for f in SLOW_FILES + ("tokenizer.model", "source.spm") if (directory / f).is_file()]
        raise ValueError(f"{directory} has no tokenizer.json, and its {maker.name} tokenizer "
                         f"({_describe(directory, settings)}) needs {' and '.join(maker.files)}; "
                         f"found {', '.join(found) if found else 'no tokenizer file'}")
    backend = maker.build()
    _add_tokens(maker, backend)
    maker.post_process(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend


def _present(directory: pathlib.Path) -> List[str]:
    return [f for f in SLOW_FILES if (directory / f).is_file()]


def has_slow_tokenizer(directory: pathlib.Path) -> bool:
    """Whether a directory has any of the slow tokenizer files (SLOW_FILES)."""
    return bool(_present(directory))


def unsupported_error(directory: pathlib.Path, settings: Dict[str, Any]) -> ValueError:
    """The error for slow tokenizer files of a family this module does not read."""
    return ValueError(f"{directory} has no tokenizer.json, and its tokenizer files ({', '.join(_present(directory))}) "
                      f"belong to {_describe(directory, settings)}, which cpuformer does not build a tokenizer for "
                      f"(it reads the tokenizer classes {', '.join(CLASSES)}, or config.json model_type "
                      f"{', '.join(MODEL_TYPES)}); save the tokenizer with transformers to write tokenizer.json")


def open_slow_tokenizer(directory: pathlib.Path) -> Any:
    """The ``tokenizers.Tokenizer`` of a directory's slow tokenizer files, None when it has none;
    ValueError for files of a family this module does not read."""
    directory = pathlib.Path(os.fspath(directory))
    if not has_slow_tokenizer(directory):
        return None
    settings = read_tokenizer_settings(directory)
    family = slow_family(directory, settings)
    if family is None:
        raise unsupported_error(directory, settings)
    return build_slow_tokenizer(directory, settings, family)


def slow_tokenizer_file(directory: pathlib.Path) -> Optional[pathlib.Path]:
    """The vocabulary file the directory's slow tokenizer is built from (vocab.txt, spm.model, ...),
    None when there is none of a family this module reads."""
    family = slow_family(directory, read_tokenizer_settings(directory))
    path = directory / family.files[0] if family is not None else None  # type: ignore[attr-defined]
    return path if path is not None and path.is_file() else None


def _add_tokens(maker: _Family, backend: Any) -> None:
    """The added tokens transformers' TokenizersBackend adds, in its order: tokenizer_config.json's
    added_tokens_decoder (by id), the additional special tokens, the named special tokens."""
    settings = maker.settings
    table = settings.values.get("added_tokens_decoder")
    table = {} if table is None else table
    if not isinstance(table, dict):
        raise ValueError(f"{settings.source}: added_tokens_decoder must be an object of id -> token, got "
                         f"{type(table).__name__}")
    tokens = []
    for key in sorted(table, key=lambda k: int(k) if str(k).isdigit() else -1):
        value = table[key]
        if not str(key).isdigit() or _token_text(value) is None:
            raise ValueError(f"{settings.source}: added_tokens_decoder entry {key!r} must map an integer id to a "
                             f"token ({{\"content\": ...}}), got {value!r}")
        tokens.append(_added_token(value))
    # the SentencePiece model's control and user-defined pieces, tokenizer_config.json's
    # extra_special_tokens (or the class's defaults), then the named special tokens
    extra = settings.values.get("extra_special_tokens", settings.values.get("additional_special_tokens"))
    if isinstance(extra, dict):
        extra = list(extra.values())
    if extra is None:
        extra = list(maker.extra)
    if not isinstance(extra, list) or any(_token_text(t) is None for t in extra):
        raise ValueError(f"{settings.source}: extra_special_tokens must be a list of tokens, got {extra!r}")
    candidates = list(maker.spm_added) + [_added_token(t) for t in extra]
    for key in _NAMED:
        text = maker.tokens.get(key)
        if text is not None:
            raw = settings.values.get(key)
            candidates.append(_added_token(raw if isinstance(raw, dict) else text,
                                           **({"lstrip": True} if key in maker.lstrip else {})))
    named = {text for text in maker.tokens.values() if text is not None}
    seen = {str(t.content) for t in tokens}
    for token in candidates:
        if str(token.content) not in seen:
            if not token.special and str(token.content) in named:
                token.special = True  # a named special token is special whatever the model file says
            tokens.append(token)
            seen.add(str(token.content))
    for token in tokens:
        if token.special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])


__all__ = ["CLASSES", "MODEL_TYPES", "SLOW_FILES", "build_slow_tokenizer", "has_slow_tokenizer",
           "open_slow_tokenizer", "read_sentencepiece_model", "slow_family", "slow_tokenizer_file", "unsupported_error"]
