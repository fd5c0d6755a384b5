"""Per-call languages of multilingual translation models: ``Seq2Seq.generate(tgt_lang=, src_lang=)``.

The language codes are tokens of the model's vocabulary, in one of four spellings:

- NLLB: ``fra_Latn`` (NllbTokenizer); mBART-50 and mBART: ``fr_XX`` (MBart50Tokenizer,
  MBartTokenizer); M2M100: ``__fr__`` (M2M100Tokenizer; ``fr`` is accepted too). The target
  language is forced as the first generated token (transformers' ``forced_bos_token_id`` =
  ``tokenizer.convert_tokens_to_ids(tgt_lang)``, as its translation pipeline does). The source
  language re-encodes string sources with that language's code around the text, as the
  transformers tokenizer with ``src_lang`` set does: ``[code] text [eos]`` (NLLB, mBART-50,
  M2M100), ``text [eos] [code]`` (mBART, and NLLB with ``legacy_behaviour``).
- Marian multilingual models (opus-mt-en-mul ...): ``>>fra<<`` (``fra`` is accepted too). The
  target language is a token at the start of the source, as MarianTokenizer reads a text that
  begins with ``>>fra<<``; they have no source-language token.

Only ``cpuformer.Tokenizer``'s interface is used (``encode``, ``token_to_id``, ``get_vocab``,
``settings``), so any tokenizer the model directory has works.
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Tuple

#: The spellings of language-code tokens (whole token text).
CODE_PATTERNS = {
    "nllb": re.compile(r"[a-z]{3}_[A-Z][a-z]{3}"),
    "mbart": re.compile(r"[a-z]{2}_[A-Z]{2}"),
    "m2m100": re.compile(r"__[a-z]{2,3}__"),
    "marian": re.compile(r">>[A-Za-z_]{2,12}<<"),
}

#: How a source is wrapped with its language code, by transformers tokenizer class ("prefix":
#: [code] tokens [eos]; "suffix": tokens [eos] [code]).
SOURCE_LAYOUT = {"NllbTokenizer": "prefix", "MBart50Tokenizer": "prefix", "M2M100Tokenizer": "prefix",
                 "MBartTokenizer": "suffix"}

_HELP = "NLLB fra_Latn, mBART-50 fr_XX, M2M100 fr or __fr__, Marian fra or >>fra<<"


def language_codes(tokenizer: Any) -> List[str]:
    """The vocabulary's language-code tokens, sorted (the spelling with the most tokens)."""
    vocab = tokenizer.get_vocab()
    found = {kind: sorted(t for t in vocab if pattern.fullmatch(t)) for kind, pattern in CODE_PATTERNS.items()}
    return max(found.values(), key=len)


def _tokenizer_class(tokenizer: Any) -> str:
    name = tokenizer.settings.get("tokenizer_class")
    name = name if isinstance(name, str) else ""
    return name[:-len("Fast")] if name.endswith("Fast") else name


def _check_name(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{key} must be a language code string such as 'fra_Latn', got {type(value).__name__}")
    return value


def resolve(tokenizer: Any, key: str, code: str) -> Tuple[str, int]:
    """(token, id) of a language code as given (``fra_Latn``, ``fr_XX``, ``__fr__``, ``>>fra<<``) or
    in M2M100's or Marian's short form (``fr``, ``fra``). ValueError for a model without
    language codes, or listing some of its codes for an unknown one."""
    candidates = [code] if any(p.fullmatch(code) for p in CODE_PATTERNS.values()) else []
    if re.fullmatch(r"[a-z]{2,3}", code):
        candidates += [f"__{code}__"]
    if re.fullmatch(r"[A-Za-z_]{2,12}", code):
        candidates += [f">>{code}<<"]
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, token_id
    codes = language_codes(tokenizer)
    if not codes:
        raise ValueError(f"{key}={code!r}: this model's vocabulary has no language codes ({_HELP}); "
                         f"{key} is for multilingual translation models")
    shown = ", ".join(codes[:8]) + (f", ... ({len(codes)} codes)" if len(codes) > 8 else "")
    raise ValueError(f"{key}={code!r} is not a language code of this model; its codes: {shown}")


def _tokenizer(model: Any, key: str) -> Any:
    try:
        return model.tokenizer
    except ValueError:
        raise ValueError(f"{key} needs the model's tokenizer files (the language codes are tokens of its "
                         f"vocabulary); {model._model_dir.path} has none") from None


def _eos_id(tokenizer: Any) -> int:
    eos = tokenizer.eos_token or "</s>"
    eos_id = tokenizer.token_to_id(eos)
    if eos_id is None:
        raise ValueError(f"src_lang: the tokenizer has no end-of-sequence token {eos!r} to end the source with")
    return eos_id


def _source_layout(tokenizer: Any) -> str:
    layout = SOURCE_LAYOUT.get(_tokenizer_class(tokenizer), "prefix")
    if _tokenizer_class(tokenizer) == "NllbTokenizer" and tokenizer.settings.get("legacy_behaviour"):
        layout = "suffix"
    return layout


def apply_languages(model: Any, sources: Any, tgt_lang: Optional[str],
                    src_lang: Optional[str]) -> Tuple[List[List[int]], str, Optional[int]]:
    """(source ids, kind as TextMixin._prompts gives it, forced BOS token id or None) for
    generate()'s sources with these languages."""
    forced = None
    marian_prefix: List[int] = []
    if tgt_lang is not None:
        tokenizer = _tokenizer(model, "tgt_lang")
        token, token_id = resolve(tokenizer, "tgt_lang", _check_name("tgt_lang", tgt_lang))
        if CODE_PATTERNS["marian"].fullmatch(token):
            marian_prefix = [token_id]
        else:
            forced = token_id
    texts = None
    if src_lang is not None:
        if isinstance(sources, str):
            texts, kind = [sources], "str"
        elif isinstance(sources, (list, tuple)) and sources and all(isinstance(s, str) for s in sources):
            texts, kind = list(sources), "strs"
    if texts is None:
        ids, kind = model._prompts(sources)  # its errors for malformed sources
        if src_lang is not None:
            raise ValueError("src_lang applies to string sources (it encodes them with the language code); "
                             "token-id sources already hold their codes")
    else:
        tokenizer = _tokenizer(model, "src_lang")
        token, code_id = resolve(tokenizer, "src_lang", _check_name("src_lang", src_lang))
        if CODE_PATTERNS["marian"].fullmatch(token):
            raise ValueError(f"src_lang={src_lang!r}: Marian models have no source-language token (a "
                             "multilingual one takes only tgt_lang)")
        eos = _eos_id(tokenizer)
        suffix = _source_layout(tokenizer) == "suffix"
        ids = []
        for text in texts:
            body = tokenizer.encode(text, add_special_tokens=False)
            ids.append(body + [eos, code_id] if suffix else [code_id] + body + [eos])
    if marian_prefix:
        ids = [marian_prefix + list(s) for s in ids]
    for token_id in [forced or 0] + [max(s) for s in ids]:
        if token_id >= model.vocab_size:
            raise ValueError(f"token id {token_id} from the tokenizer is outside the model's vocabulary "
                             f"({model.vocab_size}); the tokenizer does not belong to this model")
    return ids, kind, forced


__all__ = ["CODE_PATTERNS", "apply_languages", "language_codes", "resolve"]
