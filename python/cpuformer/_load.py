"""``cpuformer.load``: open a Hugging Face model directory as the right model class.

The model kind comes from ``config.json``: the first entry of ``architectures`` that we know,
else ``model_type``. Encoders and decoders (causal LMs) are supported; encoder-decoders are
opened as Seq2Seq.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Optional, Tuple, Union

if TYPE_CHECKING:
    from .encoder import Encoder
    from .generator import Generator
    from .seq2seq import Seq2Seq

# Encoder families: (model_type, tensor-name prefix used by task-head checkpoints).
ENCODER_FAMILIES = {
    "bert": "bert.",
    "roberta": "roberta.",
    "xlm-roberta": "roberta.",
    "distilbert": "distilbert.",
}
_ENCODER_CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "distilbert": "DistilBert"}
_HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
          "ForMultipleChoice"]
ENCODER_ARCHITECTURES = {
    _ENCODER_CLASS_PREFIX[family] + head: family for family in ENCODER_FAMILIES for head in _HEADS
}
ENCODER_ARCHITECTURES["BertForPreTraining"] = "bert"
ENCODER_ARCHITECTURES["BertForNextSentencePrediction"] = "bert"

# Recognised but not implemented yet (issue order: GPT-2, Llama family, Marian, BART, T5).
DECODER_MODEL_TYPES = {"gpt2", "llama", "mistral", "qwen2", "qwen3"}
SEQ2SEQ_MODEL_TYPES = {"marian", "bart", "mbart", "t5", "mt5"}
_DECODER_ARCHITECTURE_PREFIXES = ("GPT2", "Llama", "Mistral", "Qwen2", "Qwen3")
_SEQ2SEQ_ARCHITECTURE_PREFIXES = ("Marian", "Bart", "MBart", "T5", "MT5")


DTYPES = ("float32", "float16", "bfloat16", "int8")


def check_dtype(dtype: Optional[str]) -> Optional[str]:
    """dtype as given (None allowed); TypeError / ValueError listing the valid names otherwise."""
    if dtype is None:
        return None
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be None or a string such as 'int8', got {type(dtype).__name__}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(repr(d) for d in DTYPES)} (or None), got {dtype!r}")
    return dtype


def stored_dtype(config: Mapping[str, Any]) -> Optional[str]:
    """The dtype a ``cpuformer convert``ed directory stores (config.json "cpuformer" entry), else None."""
    entry = config.get("cpuformer")
    if entry is None:
        return None
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES or entry.get("format_version") != 1:
        raise ValueError("config.json: the 'cpuformer' entry must be {\"dtype\": one of "
                         f"{', '.join(DTYPES)}, \"format_version\": 1}}, got {entry!r}")
    return entry["dtype"]


def resolve_dtype(dtype: Optional[str], config: Mapping[str, Any]) -> Tuple[str, Optional[str]]:
    """(dtype to run in, dtype stored in the directory or None). dtype=None means the stored dtype,
    or float32 for a plain checkpoint; a converted directory runs only in the dtype it stores."""
    dtype = check_dtype(dtype)
    stored = stored_dtype(config)
    if stored is None:
        return dtype or "float32", None
    if dtype is not None and dtype != stored:
        raise ValueError(f"this directory was converted to dtype {stored!r}; load it with dtype={stored!r} "
                         f"(or dtype=None), or convert the original checkpoint to {dtype!r}")
    return stored, stored


def supported_text() -> str:
    return ("supported: " + ", ".join(sorted(ENCODER_ARCHITECTURES)) + " (model_type "
            + ", ".join(sorted(ENCODER_FAMILIES)) + ")")


def classify(config: Mapping[str, Any]) -> Tuple[str, str, str]:
    """(kind, family, name) for a config: kind is "encoder", "decoder" or "seq2seq"; name is the
    architecture (or model_type) the decision was made from. Raises ValueError for unknown ones."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ValueError(f"config.json: 'architectures' must be a list of class names, got {architectures!r}")
    model_type = config.get("model_type")
    for name in architectures:
        if name in ENCODER_ARCHITECTURES:
            return "encoder", ENCODER_ARCHITECTURES[name], name
    for name in architectures:
        if name.startswith(_SEQ2SEQ_ARCHITECTURE_PREFIXES):
            return "seq2seq", name, name
        if name.startswith(_DECODER_ARCHITECTURE_PREFIXES):
            return "decoder", name, name
    if isinstance(model_type, str):
        if model_type in ENCODER_FAMILIES and not architectures:
            return "encoder", model_type, model_type
        if model_type in DECODER_MODEL_TYPES:
            return "decoder", model_type, architectures[0] if architectures else model_type
        if model_type in SEQ2SEQ_MODEL_TYPES:
            return "seq2seq", model_type, architectures[0] if architectures else model_type
    described = ", ".join(architectures) if architectures else "none"
    raise ValueError(f"unknown architecture (architectures: {described}; model_type: {model_type!r}); "
                     + supported_text())


def wrong_model_class(kind: str, name: str) -> ValueError:
    """The error for a model class opened on another kind of model (e.g. Encoder on a GPT-2)."""
    cls = {"encoder": "Encoder", "decoder": "Generator", "seq2seq": "Seq2Seq"}[kind]
    what = {"encoder": "an encoder", "decoder": "a decoder (causal LM)", "seq2seq": "an encoder-decoder (seq2seq)"}[kind]
    return ValueError(f"{name} is {what} architecture; open it with cpuformer.{cls} or cpuformer.load")


def load(path: Union[str, os.PathLike], dtype: Optional[str] = None,
         num_threads: Optional[int] = None) -> Union["Encoder", "Generator", "Seq2Seq"]:
    """Opens the model directory ``path`` as the model class its config names.

    Returns an :class:`~cpuformer.Encoder` for BERT / RoBERTa / XLM-RoBERTa / DistilBERT
    checkpoints (base models and task-head checkpoints; the heads are ignored), a
    :class:`~cpuformer.Generator` for GPT-2 / Llama / Mistral / Qwen2 / Qwen3 causal LMs, a
    :class:`~cpuformer.Seq2Seq` for Marian / BART / mBART / T5 / mT5 encoder-decoders. Unknown
    architectures raise ValueError listing what is supported.

    dtype: weight storage of the matrix multiplications, "float32", "float16", "bfloat16" or
    "int8" (docs/precision.md); None: float32, or the dtype a converted directory stores.
    """
    from ._model_dir import ModelDir
    from .encoder import Encoder

    model_dir = ModelDir(path)
    try:
        kind, _, name = classify(model_dir.config)
        if kind == "decoder":
            from .generator import Generator

            return Generator(model_dir, dtype=dtype, num_threads=num_threads)
        if kind == "seq2seq":
            from .seq2seq import Seq2Seq

            return Seq2Seq(model_dir, dtype=dtype, num_threads=num_threads)
        if kind != "encoder":
            raise wrong_model_class(kind, name)
    except BaseException:
        model_dir.close()
        raise
    return Encoder(model_dir, dtype=dtype, num_threads=num_threads)
