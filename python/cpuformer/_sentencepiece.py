"""Tokenizers of model directories that ship SentencePiece files instead of tokenizer.json.

One class per family, each giving the ids transformers 5's tokenizer class gives for the same
files (docs/tokenizers.md):

============  ============================================  ==================================================
family        files                                         ids
============  ============================================  ==================================================
Marian        source.spm, target.spm, vocab.json            pieces looked up in vocab.json (target_vocab.json
              (target_vocab.json with separate_vocabs)      for decoding with separate_vocabs), ``</s>`` after;
                                                            a leading ``>>xx<<`` is the language token
T5 / mT5      spiece.model                                  SentencePiece ids, ``</s>`` after; ``<extra_id_N>``
                                                            sentinels after the pieces, in reverse order
Llama         tokenizer.model                               SentencePiece ids, ``<s>`` before (add_bos_token),
                                                            ``</s>`` after only with add_eos_token
mBART-50      sentencepiece.bpe.model                       fairseq ids (SentencePiece id + 1; <s> <pad> </s>
                                                            <unk> are 0-3), language codes (en_XX) then <mask>
                                                            after the pieces; ``[src_lang] text </s>``
NLLB          sentencepiece.bpe.model                       as mBART-50 with NLLB's codes (eng_Latn);
                                                            legacy_behaviour puts ``</s> src_lang`` after
M2M100        vocab.json, sentencepiece.bpe.model           pieces looked up in vocab.json, ``__xx__`` codes
                                                            after it; ``[__src__] text </s>``
============  ============================================  ==================================================

Pieces come from ``SentencePieceProcessor.encode`` on the whole batch (the library's C++), and a
NumPy table maps its ids to the model's. The ``sentencepiece`` package is an optional extra
(``pip install "cpuformer[sentencepiece]"``); without it such a directory raises ImportError.
"""

from __future__ import annotations

import itertools
import pathlib
import re
from typing import Any, Dict, List, Optional, Sequence, Set

import numpy as np

from ._model_dir import _read_json_object
from ._slow_tokenizers import _varint
from ._tokenizer import Tokenizer, _token_text

SPIECE_UNDERLINE = "\u2581"
_INSTALL = 'pip install "cpuformer[sentencepiece]"'

# the language codes of transformers' tokenizer classes, in their order (their position gives the id)
MBART50_CODES = (
    "ar_AR cs_CZ de_DE en_XX es_XX et_EE fi_FI fr_XX gu_IN hi_IN it_IT ja_XX kk_KZ ko_KR lt_LT lv_LV my_MM "
    "ne_NP nl_XX ro_RO ru_RU si_LK tr_TR vi_VN zh_CN af_ZA az_AZ bn_IN fa_IR he_IL hr_HR id_ID ka_GE km_KH "
    "mk_MK ml_IN mn_MN mr_IN pl_PL ps_AF pt_XX sv_SE sw_KE ta_IN te_IN th_TH tl_XX uk_UA ur_PK xh_ZA gl_ES "
    "sl_SI"
).split()
NLLB_CODES = (
    "ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi apc_Arab arb_Arab ars_Arab "
    "ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab azj_Latn bak_Cyrl bam_Latn ban_Latn bel_Cyrl "
    "bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn bod_Tibt bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn "
    "cjk_Latn ckb_Arab crh_Latn cym_Latn dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt ell_Grek eng_Latn epo_Latn "
    "est_Latn eus_Latn ewe_Latn fao_Latn pes_Arab fij_Latn fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn "
    "gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva hrv_Latn hun_Latn hye_Armn "
    "ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan kab_Latn kac_Latn kam_Latn kan_Knda kas_Arab "
    "kas_Deva kat_Geor knc_Arab knc_Latn kaz_Cyrl kbp_Latn kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn "
    "kon_Latn kor_Hang kmr_Latn lao_Laoo lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn "
    "lua_Latn lug_Latn luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl plt_Latn mlt_Latn "
    "mni_Beng khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva nso_Latn nus_Latn "
    "nya_Latn oci_Latn gaz_Latn ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn por_Latn prs_Arab pbt_Arab quy_Latn "
    "ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng scn_Latn shn_Mymr sin_Sinh slk_Latn slv_Latn smo_Latn "
    "sna_Latn snd_Arab som_Latn sot_Latn spa_Latn als_Latn srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn "
    "szl_Latn tam_Taml tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi taq_Latn taq_Tfng tpi_Latn tsn_Latn "
    "tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn urd_Arab uzn_Latn vec_Latn "
    "vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn yue_Hant zho_Hans zho_Hant zul_Latn "
).split()
M2M100_CODES = (
    "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr ht "
    "hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps "
    "pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu "
).split()
WMT21_CODES = (
    "en ha is ja cs ru zh de "
).split()


def _import_sentencepiece(directory: pathlib.Path, file: str) -> Any:
    try:
        import sentencepiece
    except ImportError:
        raise ImportError(f"{directory} has no tokenizer.json but a SentencePiece model ({file}); reading it needs "
                          f"the sentencepiece package: {_INSTALL}") from None
    return sentencepiece


def _load_processor(directory: pathlib.Path, file: str, edit: Any = None) -> Any:
    """A SentencePieceProcessor of ``directory/file`` (its serialized model passed through
    ``edit`` first when given); ValueError naming the file for one the library cannot read."""
    module = _import_sentencepiece(directory, file)
    path = directory / file
    data = path.read_bytes()
    processor = module.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(edit(data) if edit is not None else data)
    except Exception as error:  # the library raises RuntimeError/OSError with its own text
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ValueError(f"{path}: not a valid SentencePiece model ({reason})") from None
    return processor


def _identity_normalizer(proto: bytes) -> bytes:
    """A serialized SentencePiece ModelProto with its normalizer_spec (field 3) replaced by one
    that does nothing but turn spaces into "▁": name "identity", no dummy prefix, no removal of
    extra whitespace. The other fields are copied byte for byte (protobuf wire format)."""
    out = bytearray()
    pos = 0
    try:
        while pos < len(proto):
            start = pos
            key, pos = _varint(proto, pos)
            wire = key & 7
            if wire == 0:
                _, pos = _varint(proto, pos)
            elif wire == 1:
                pos += 8
            elif wire == 2:
                length, pos = _varint(proto, pos)
                pos += length
            elif wire == 5:
                pos += 4
            else:
                raise ValueError(f"wire type {wire}")
            if pos > len(proto):
                raise ValueError("truncated field")
            if key != (3 << 3 | 2):
                out += proto[start:pos]
    except ValueError:
        return proto  # not a valid model: loading it reports the error
    spec = b"\x0a\x08identity" + b"\x18\x00" + b"\x20\x00" + b"\x28\x01"
    return bytes(out + bytes([3 << 3 | 2, len(spec)]) + spec)


def _read_vocab_json(path: pathlib.Path) -> Dict[str, int]:
    """vocab.json: an object of token text -> id, the ids distinct integers >= 0."""
    vocab = _read_json_object(path)
    seen: Dict[int, str] = {}
    for token, index in vocab.items():
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"{path}: the id of {token!r} must be an integer >= 0, got {index!r}")
        if index in seen:
            raise ValueError(f"{path}: {seen[index]!r} and {token!r} have the same id {index}")
        seen[index] = token
    return dict(vocab)


def _check_pieces_fit(processor: Any, spm_path: pathlib.Path, vocab: Dict[str, int], vocab_path: pathlib.Path) -> None:
    """ValueError when most of the SentencePiece model's pieces are missing from vocab.json (the
    two files belong to different tokenizers, so most text would encode to <unk>)."""
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())
              if not (processor.is_control(i) or processor.is_unknown(i))]
    missing = [p for p in pieces if p not in vocab]
    if pieces and 2 * len(missing) > len(pieces):
        raise ValueError(f"{vocab_path}: {len(missing)} of the {len(pieces)} pieces of {spm_path.name} are not in it "
                         f"(e.g. {missing[0]!r}); the two files belong to different tokenizers")


def _byte_piece(token: str) -> Optional[int]:
    """The byte of a byte-fallback piece <0xAB>, else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


class SentencePieceTokenizer(Tokenizer):
    """A tokenizer over a SentencePiece model: the pieces of ``SentencePieceProcessor.encode``
    mapped to the model's ids, the family's special tokens added around them. ``backend`` is None
    (there is no tokenizers.Tokenizer); ``path`` is the SentencePiece model that encodes."""

    #: the family's name in messages and repr
    family = ""
    #: how decode() joins tokens: "metaspace" (tokenizers' Metaspace decoder), "bytes" (Llama:
    #: Metaspace plus byte fallback), "marian", "m2m100" (transformers' slow tokenizers)
    _decode_style = "metaspace"
    #: whether tokenizer_config.json's clean_up_tokenization_spaces applies (transformers ignores
    #: it for tokenizers built on a BPE model)
    _clean_up_allowed = True
    #: whether a text segment ending in a space gets a "▁" piece (tokenizers' Metaspace without
    #: whitespace splitting, where SentencePiece drops trailing spaces)
    _trailing_space_piece = False

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any], processor: Any, spm_file: str) -> None:
        super().__init__(None, directory / spm_file, settings)
        self.directory = directory
        self._sp = processor
        self._table = np.zeros(0, dtype=np.int64)  # SentencePiece id -> model id
        self._str_vocab: Optional[Dict[str, int]] = None  # pieces looked up by text (vocab.json families)
        self._unk = 0
        self._tokens: Dict[int, str] = {}  # model id -> token text
        self._vocab: Dict[str, int] = {}  # token text -> model id (encoding side)
        self._added: Dict[str, int] = {}  # texts split out of the input before SentencePiece
        self._lstrip: Set[str] = set()  # added tokens that swallow the whitespace before them
        self._special: Set[int] = set()  # ids decode(skip_special_tokens=True) drops
        self._special_text: Set[str] = set()  # their text (the slow tokenizers' all_special_tokens)
        self._prefix: List[int] = []
        self._suffix: List[int] = []
        self._added_re: Optional["re.Pattern[str]"] = None

    # ---- helpers for the subclasses ----------------------------------------------------------

    def _token(self, name: str, default: str) -> str:
        return self.special_token(name) or default

    def _require(self, token: str, source: Any) -> int:
        index = self._vocab.get(token)
        if index is None:
            raise ValueError(f"{source}: has no {token!r} token")
        return index

    def _add(self, token: str, index: int, special: bool = True) -> None:
        self._tokens[index] = token
        self._vocab[token] = index
        self._added[token] = index
        if special:
            self._special.add(index)
            self._special_text.add(token)

    def _read_added_tokens_decoder(self) -> None:
        """tokenizer_config.json's added_tokens_decoder ({id: {"content", "special", "lstrip"}}, as
        transformers saves it): those tokens at those ids."""
        table = self.settings.get("added_tokens_decoder")
        if table is None:
            return
        source = self.directory / "tokenizer_config.json"
        if not isinstance(table, dict):
            raise ValueError(f"{source}: added_tokens_decoder must be an object of id -> token, got "
                             f"{type(table).__name__}")
        for key, value in table.items():
            content = _token_text(value)
            if not str(key).isdigit() or content is None:
                raise ValueError(f"{source}: added_tokens_decoder entry {key!r} must map an integer id to a token "
                                 f"({{\"content\": ...}}), got {value!r}")
            special = bool(value.get("special", True)) if isinstance(value, dict) else True
            self._add(content, int(key), special)
            if isinstance(value, dict) and value.get("lstrip"):
                self._lstrip.add(content)

    def _finish(self) -> None:
        """Compiles the added tokens' pattern (longest first, as a trie matches)."""
        if self._added:
            texts = sorted(self._added, key=len, reverse=True)
            self._added_re = re.compile("(" + "|".join(re.escape(t) for t in texts) + ")")

    # ---- encoding ----------------------------------------------------------------------------

    def _split(self, text: str) -> List[Any]:
        """The text as segments for SentencePiece (str) and ids of added tokens found in it (int)."""
        if self._added_re is None or not text:
            return [text] if text else []
        parts = self._added_re.split(text)
        out: List[Any] = []
        for i, part in enumerate(parts):
            if i % 2:
                if part in self._lstrip and out and isinstance(out[-1], str):
                    out[-1] = out[-1].rstrip()
                out.append(self._added[part])
            elif part:
                out.append(part)
        return [p for p in out if p != ""]

    def _segment_ids(self, segments: List[str]) -> List[List[int]]:
        """The model ids of each text segment (SentencePiece on the whole list at once)."""
        if not segments:
            return []
        rows = self._sp.encode(segments)
        # one table lookup for the whole batch
        total = sum(len(row) for row in rows)
        mapped = self._table[np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=total)].tolist()
        unk = self._sp.unk_id()
        result = []
        start = 0
        for segment, row in zip(segments, rows):
            ids = mapped[start:start + len(row)]
            start += len(row)
            if self._str_vocab is not None and unk in row:
                # an unknown piece is looked up by its text, as the slow tokenizers do
                ids = [self._str_vocab.get(p, self._unk) for p in self._sp.encode(segment, out_type=str)]
            if self._trailing_space_piece and segment.endswith(" "):
                ids.append(self._space)
            result.append(ids)
        return result

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> List[List[int]]:
        texts = list(texts)
        plans: List[List[int]] = []  # per text: segment indexes (>= 0) and added-token ids as ~id (< 0)
        segments: List[str] = []
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"encode() takes strings, got {type(text).__name__}")
            plan = []
            for part in self._split(text):
                if isinstance(part, str):
                    plan.append(len(segments))
                    segments.append(part)
                else:
                    plan.append(~part)
            plans.append(plan)
        encoded = self._segment_ids(segments)
        out = []
        for plan in plans:
            ids: List[int] = list(self._prefix) if add_special_tokens else []
            for item in plan:
                if item >= 0:
                    ids.extend(encoded[item])
                else:
                    ids.append(~item)
            if add_special_tokens:
                ids.extend(self._suffix)
            out.append(ids)
        return out

    # ---- decoding ----------------------------------------------------------------------------

    def _decode_tokens(self, tokens: List[str]) -> str:
        style = self._decode_style
        if style == "metaspace":
            text = "".join(tokens).replace(SPIECE_UNDERLINE, " ")
            return text[1:] if tokens and tokens[0].startswith(SPIECE_UNDERLINE) else text
        if style == "bytes":
            parts: List[str] = []
            pending = bytearray()
            for token in tokens:
                byte = _byte_piece(token)
                if byte is not None:
                    pending.append(byte)
                    continue
                if pending:
                    parts.append(_bytes_text(pending))
                    pending = bytearray()
                parts.append(token.replace(SPIECE_UNDERLINE, " "))
            if pending:
                parts.append(_bytes_text(pending))
            return "".join(parts)
        # the slow tokenizers: runs of pieces through SentencePiece, special tokens as they are
        out = ""
        run: List[str] = []
        for token in tokens:
            if token in self._special_text:
                if style == "marian":
                    out += self._decode_sp.decode_pieces(run) + token + " "
                else:
                    out += self._decode_sp.decode(run) + token
                run = []
            else:
                run.append(token)
        out += self._decode_sp.decode_pieces(run) if style == "marian" else self._decode_sp.decode(run)
        if style == "marian":
            out = out.replace(SPIECE_UNDERLINE, " ")
        return out.strip()

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> List[str]:
        clean_up = self._clean_up_allowed and self.settings.get("clean_up_tokenization_spaces") is True
        out = []
        for sequence in sequences:
            tokens = []
            for t in sequence:
                t = int(t)
                if skip_special_tokens and t in self._special:
                    continue
                token = self._decode_token(t)
                if token is not None:
                    tokens.append(token)
            text = self._decode_tokens(tokens)
            out.append(_clean_up(text) if clean_up else text)
        return out

    def _decode_token(self, token_id: int) -> Optional[str]:
        return self._tokens.get(token_id)

    @property
    def _decode_sp(self) -> Any:
        return self._sp

    # ---- vocabulary --------------------------------------------------------------------------

    def token_to_id(self, token: str) -> Optional[int]:
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self._decode_token(int(token_id))

    def get_vocab(self) -> Dict[str, int]:
        return dict(self._vocab)

    @property
    def vocab_size(self) -> int:
        return max(max(self._tokens, default=-1), max(self._vocab.values(), default=-1)) + 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.directory}, vocab_size={self.vocab_size})"


def _bytes_text(data: bytearray) -> str:
    """Byte-fallback pieces as text: valid UTF-8 decodes, otherwise one U+FFFD per byte (as the
    tokenizers library's ByteFallback decoder)."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)


def _clean_up(text: str) -> str:
    """transformers' clean_up_tokenization (tokenizer_config.json clean_up_tokenization_spaces)."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",").replace(" ' ", "'")
            .replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s").replace(" 've", "'ve")
            .replace(" 're", "'re"))


def _sp_pieces(processor: Any) -> List[str]:
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def _setting_bool(settings: Dict[str, Any], key: str, default: bool, source: pathlib.Path) -> bool:
    value = settings.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key} must be true or false, got {value!r}")
    return value


class T5SentencePiece(SentencePieceTokenizer):
    """T5 and mT5 (spiece.model): transformers' T5Tokenizer. SentencePiece ids as they are,
    ``</s>`` after the text, ``<extra_id_0>`` ... ``<extra_id_{n-1}>`` (tokenizer_config.json
    extra_ids, default 100) after the pieces with ``<extra_id_0>`` last."""

    family = "T5"
    FILES = ("spiece.model",)

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        super().__init__(directory, settings, _load_processor(directory, "spiece.model"), "spiece.model")
        pieces = _sp_pieces(self._sp)
        self._table = np.arange(len(pieces), dtype=np.int64)
        self._tokens = dict(enumerate(pieces))
        self._vocab = {p: i for i, p in enumerate(pieces)}
        for name, default in (("pad_token", "<pad>"), ("eos_token", "</s>"), ("unk_token", "<unk>")):
            token = self._token(name, default)
            self._add(token, self._require(token, self.path))
        extra = settings.get("extra_ids", 100)
        if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
            raise ValueError(f"{directory / 'tokenizer_config.json'}: extra_ids must be an integer >= 0, got {extra!r}")
        for i in range(extra):
            self._add(f"<extra_id_{i}>", len(pieces) + extra - 1 - i)
        self._read_added_tokens_decoder()
        self._suffix = [self._vocab[self._token("eos_token", "</s>")]]
        self._finish()


class LlamaSentencePiece(SentencePieceTokenizer):
    """Llama-style tokenizer.model: transformers' LlamaTokenizer. SentencePiece ids as they are,
    ``<s>`` before the text (add_bos_token, default true), ``</s>`` after only with add_eos_token;
    byte-fallback pieces decode to their UTF-8 text."""

    family = "Llama"
    FILES = ("tokenizer.model",)
    _decode_style = "bytes"
    _clean_up_allowed = False
    #: tokenizer_class LlamaTokenizer (no normalizer, "▁" before the text's start only); without
    #: it transformers converts the model generically, keeping its normalizer and dummy prefix
    _llama_class = True

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        # transformers' LlamaTokenizer has no normalizer and puts "▁" only before the start of
        # the text: the model's own normalization and dummy prefix are switched off here
        processor = _load_processor(directory, "tokenizer.model", _identity_normalizer if self._llama_class else None)
        super().__init__(directory, settings, processor, "tokenizer.model")
        pieces = _sp_pieces(self._sp)
        self._table = np.arange(len(pieces), dtype=np.int64)
        self._tokens = dict(enumerate(pieces))
        self._vocab = {p: i for i, p in enumerate(pieces)}
        bos, eos, unk = (self._token("bos_token", "<s>"), self._token("eos_token", "</s>"),
                         self._token("unk_token", "<unk>"))
        for token in (unk, bos, eos):
            self._add(token, self._require(token, self.path))
        self._read_added_tokens_decoder()
        source = directory / "tokenizer_config.json"
        if _setting_bool(settings, "add_bos_token", False, source):
            self._prefix = [self._vocab[bos]]
        if _setting_bool(settings, "add_eos_token", False, source):
            self._suffix = [self._vocab[eos]]
        self._prefix_space = _setting_bool(settings, "add_prefix_space", True, source) and self._llama_class
        self._finish()

    def _split(self, text: str) -> List[Any]:
        parts = super()._split(text)
        if self._prefix_space and parts and isinstance(parts[0], str) and not parts[0].startswith(" "):
            parts[0] = " " + parts[0]  # Metaspace(prepend_scheme="first")
        return parts

    def _decode_tokens(self, tokens: List[str]) -> str:
        text = super()._decode_tokens(tokens)
        if not self._llama_class:  # the generic conversion's Metaspace decoder
            return text[1:] if tokens and tokens[0].startswith(SPIECE_UNDERLINE) else text
        return text[1:] if self._prefix_space and text.startswith(" ") else text


class SentencePieceModel(LlamaSentencePiece):
    """A tokenizer.model named by config.json's model_type (llama, mistral) without a
    tokenizer_class: transformers converts it generically (SentencePiece's own normalization)."""

    family = "SentencePiece"
    _llama_class = False


class _FairseqSentencePiece(SentencePieceTokenizer):
    """sentencepiece.bpe.model with fairseq's ids: <s> <pad> </s> <unk> are 0-3, SentencePiece
    id i >= 3 is i + 1, the language codes follow the pieces, then <mask>."""

    FILES = ("sentencepiece.bpe.model",)
    CODES: List[str] = []
    DEFAULT_SRC = ""
    _trailing_space_piece = True

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        file = "sentencepiece.bpe.model"
        super().__init__(directory, settings, _load_processor(directory, file), file)
        pieces = _sp_pieces(self._sp)
        size = len(pieces)
        table = np.arange(1, size + 1, dtype=np.int64)
        table[:3] = [3, 0, 2][:size]  # SentencePiece's <unk> <s> </s>
        self._table = table
        specials = [self._token("bos_token", "<s>"), self._token("pad_token", "<pad>"),
                    self._token("eos_token", "</s>"), self._token("unk_token", "<unk>")]
        self._tokens = {i + 1: p for i, p in enumerate(pieces) if i >= 3}
        self._vocab = {p: i for i, p in self._tokens.items()}
        for index, token in enumerate(specials):
            self._add(token, index)
        for k, code in enumerate(self.CODES):
            self._add(code, size + 1 + k)
        mask = self._token("mask_token", "<mask>")
        self._add(mask, size + 1 + len(self.CODES))
        self._lstrip.add(mask)
        self._read_added_tokens_decoder()
        self._unk = self._vocab[specials[3]]
        self._space = self._vocab.get(SPIECE_UNDERLINE, self._unk)
        source = directory / "tokenizer_config.json"
        src_lang = settings.get("src_lang") or self.DEFAULT_SRC
        if not isinstance(src_lang, str) or src_lang not in self._added:
            raise ValueError(f"{source}: src_lang {src_lang!r} is not a language code of the {self.family} tokenizer "
                             f"(e.g. {self.DEFAULT_SRC!r})")
        self.src_lang = src_lang
        eos, code = self._vocab[specials[2]], self._vocab[src_lang]
        if _setting_bool(settings, "legacy_behaviour", False, source) and self.family == "NLLB":
            self._prefix, self._suffix = [], [eos, code]
        else:
            self._prefix, self._suffix = [code], [eos]
        self._finish()


class MBart50SentencePiece(_FairseqSentencePiece):
    """mBART-50 (sentencepiece.bpe.model, tokenizer_class MBart50Tokenizer): ``[src_lang] text
    </s>``, src_lang from tokenizer_config.json (default en_XX)."""

    family = "mBART-50"
    CODES = MBART50_CODES
    DEFAULT_SRC = "en_XX"


class NllbSentencePiece(_FairseqSentencePiece):
    """NLLB (sentencepiece.bpe.model, tokenizer_class NllbTokenizer): ``[src_lang] text </s>``
    (``text </s> [src_lang]`` with legacy_behaviour), src_lang default eng_Latn."""

    family = "NLLB"
    CODES = NLLB_CODES
    DEFAULT_SRC = "eng_Latn"
    _clean_up_allowed = False


class M2M100SentencePiece(SentencePieceTokenizer):
    """M2M100 (vocab.json + sentencepiece.bpe.model): transformers' M2M100Tokenizer. Pieces looked
    up in vocab.json, the ``__xx__`` language tokens after it; ``[__src_lang__] text </s>``."""

    family = "M2M100"
    FILES = ("sentencepiece.bpe.model", "vocab.json")
    _decode_style = "m2m100"

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        file = "sentencepiece.bpe.model"
        super().__init__(directory, settings, _load_processor(directory, file), file)
        vocab_path = directory / "vocab.json"
        encoder = _read_vocab_json(vocab_path)
        _check_pieces_fit(self._sp, self.path, encoder, vocab_path)
        self._vocab = dict(encoder)
        self._tokens = {i: t for t, i in encoder.items()}
        unk = self._token("unk_token", "<unk>")
        self._unk = self._require(unk, vocab_path)
        self._str_vocab = encoder
        self._table = np.array([encoder.get(p, self._unk) for p in _sp_pieces(self._sp)], dtype=np.int64)
        for name, default in (("bos_token", "<s>"), ("eos_token", "</s>"), ("sep_token", "</s>"),
                              ("pad_token", "<pad>"), ("unk_token", "<unk>")):
            token = self._token(name, default)
            if token in encoder:
                self._add(token, encoder[token])
        source = directory / "tokenizer_config.json"
        language_codes = settings.get("language_codes", "m2m100")
        codes = {"m2m100": M2M100_CODES, "wmt21": WMT21_CODES}.get(language_codes)  # type: ignore[arg-type]
        if codes is None:
            raise ValueError(f"{source}: language_codes must be 'm2m100' or 'wmt21', got {language_codes!r}")
        for k, code in enumerate(codes):
            # vocabulary entries, but (as in transformers) neither split out of a text nor special
            self._tokens[len(encoder) + k] = f"__{code}__"
            self._vocab[f"__{code}__"] = len(encoder) + k
        self._read_added_tokens_decoder()
        src_lang = settings.get("src_lang") or "en"
        if not isinstance(src_lang, str) or f"__{src_lang}__" not in self._vocab:
            raise ValueError(f"{source}: src_lang {src_lang!r} is not a language code of the M2M100 tokenizer "
                             "(e.g. 'en')")
        self.src_lang = src_lang
        eos = self._require(self._token("eos_token", "</s>"), vocab_path)
        self._prefix, self._suffix = [self._vocab[f"__{src_lang}__"]], [eos]
        self._finish()


class MarianSentencePiece(SentencePieceTokenizer):
    """Marian / opus-mt (source.spm, target.spm, vocab.json; target_vocab.json with separate_vocabs):
    transformers' MarianTokenizer. Source pieces looked up in vocab.json, ``</s>`` after the text;
    a ``>>xx<<`` at the start of the text is the target-language token. Decoding reads the target
    vocabulary and target.spm with separate_vocabs, else vocab.json and source.spm (as
    transformers does)."""

    family = "Marian"
    FILES = ("source.spm", "target.spm", "vocab.json")
    _decode_style = "marian"

    def __init__(self, directory: pathlib.Path, settings: Dict[str, Any]) -> None:
        super().__init__(directory, settings, _load_processor(directory, "source.spm"), "source.spm")
        self._target_sp = _load_processor(directory, "target.spm")
        vocab_path = directory / "vocab.json"
        encoder = _read_vocab_json(vocab_path)
        source = directory / "tokenizer_config.json"
        self.separate_vocabs = _setting_bool(settings, "separate_vocabs", False, source)
        _check_pieces_fit(self._sp, self.path, encoder, vocab_path)
        if self.separate_vocabs:
            target_path = directory / "target_vocab.json"
            if not target_path.is_file():
                raise ValueError(f"{source}: separate_vocabs is true, but {target_path} is missing")
            target = _read_vocab_json(target_path)
            _check_pieces_fit(self._target_sp, directory / "target.spm", target, target_path)
        else:
            target = encoder
        self._vocab = dict(encoder)
        self._tokens = {i: t for t, i in target.items()}
        self._str_vocab = encoder
        unk = self._token("unk_token", "<unk>")
        self._unk = self._require(unk, vocab_path)
        self._table = np.array([encoder.get(p, self._unk) for p in _sp_pieces(self._sp)], dtype=np.int64)
        eos = self._token("eos_token", "</s>")
        for token in (eos, unk, self._token("pad_token", "<pad>")):
            if token in encoder:
                # at its vocab.json id, also when decoding with target_vocab.json (transformers'
                # added tokens come before the vocabulary)
                self._add(token, encoder[token])
        self._read_added_tokens_decoder()
        self._suffix = [self._require(eos, vocab_path)]
        self._finish()

    @property
    def _decode_sp(self) -> Any:
        return self._target_sp if self.separate_vocabs else self._sp

    def _split(self, text: str) -> List[Any]:
        out: List[Any] = []
        for part in super()._split(text):
            if isinstance(part, str) and part.startswith(">>"):
                end = part.find("<<")
                if end != -1:
                    code = part[:end + 2]
                    out.append(self._vocab.get(code, self._unk))
                    part = part[end + 2:]
                    if not part:
                        continue
            out.append(part)
        return out

    @property
    def vocab_size(self) -> int:
        return max(self._vocab.values(), default=-1) + 1


#: tokenizer_config.json tokenizer_class (without "Fast") -> class
_CLASSES = {"MarianTokenizer": MarianSentencePiece, "T5Tokenizer": T5SentencePiece, "MT5Tokenizer": T5SentencePiece,
            "LlamaTokenizer": LlamaSentencePiece, "MBart50Tokenizer": MBart50SentencePiece,
            "NllbTokenizer": NllbSentencePiece, "M2M100Tokenizer": M2M100SentencePiece}
#: config.json model_type -> class, for directories whose tokenizer_config.json names no class
_MODEL_TYPES = {"marian": MarianSentencePiece, "t5": T5SentencePiece, "mt5": T5SentencePiece,
                "umt5": T5SentencePiece, "llama": SentencePieceModel, "mistral": SentencePieceModel,
                "nllb-moe": NllbSentencePiece}
#: the files that make a directory a SentencePiece one (any of them)
SENTENCEPIECE_FILES = ("source.spm", "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")


def _family(directory: pathlib.Path, settings: Dict[str, Any], file: str) -> type:
    name = settings.get("tokenizer_class")
    if isinstance(name, str) and name:
        base = name[:-4] if name.endswith("Fast") else name
        if base in _CLASSES:
            return _CLASSES[base]
        raise NotImplementedError(f"{directory} has no tokenizer.json, and its SentencePiece tokenizer ({file}, "
                                  f"tokenizer_class {name}) is not one cpuformer reads ({', '.join(_CLASSES)}); "
                                  "save the tokenizer with transformers to write tokenizer.json")
    config_path = directory / "config.json"
    model_type = _read_json_object(config_path).get("model_type") if config_path.is_file() else None
    if model_type == "m2m_100":
        return M2M100SentencePiece if (directory / "vocab.json").is_file() else NllbSentencePiece
    if isinstance(model_type, str) and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    raise NotImplementedError(f"{directory} has no tokenizer.json, and its SentencePiece tokenizer ({file}) is of "
                              f"model_type {model_type!r}, which cpuformer does not read without tokenizer.json "
                              f"(it reads {', '.join(sorted(_MODEL_TYPES))} and m2m_100, or a tokenizer_class of "
                              f"{', '.join(_CLASSES)}); save the tokenizer with transformers to write tokenizer.json")


def open_sentencepiece(directory: pathlib.Path, settings: Dict[str, Any]) -> Optional[SentencePieceTokenizer]:
    """The SentencePiece tokenizer of a directory without tokenizer.json; None when it has no
    SentencePiece file."""
    present = [f for f in SENTENCEPIECE_FILES if (directory / f).is_file()]
    if not present:
        return None
    cls = _family(directory, settings, present[0])
    for file in cls.FILES:  # type: ignore[attr-defined]
        if not (directory / file).is_file():
            raise ValueError(f"{directory}: the {cls.family} tokenizer needs {file}, which is missing "  # type: ignore[attr-defined]
                             f"(it reads {', '.join(cls.FILES)})")  # type: ignore[attr-defined]
    return cls(directory, settings)  # type: ignore[no-any-return]


__all__ = ["SentencePieceTokenizer", "T5SentencePiece", "LlamaSentencePiece", "MBart50SentencePiece",
           "NllbSentencePiece", "M2M100SentencePiece", "MarianSentencePiece", "open_sentencepiece"]
