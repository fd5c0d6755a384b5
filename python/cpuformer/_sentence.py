"""A sentence-transformers model directory's embedding pipeline, read and applied with NumPy.

``SentenceTransformer(path).encode(texts)`` runs the modules listed in ``modules.json`` in order:
the Transformer (the encoder cpuformer loads from the same directory; its tokenizer settings are
in ``sentence_bert_config.json``), a Pooling module (``1_Pooling/config.json``), optional Dense
projections (``2_Dense/config.json`` + ``2_Dense/model.safetensors``) and an optional Normalize.
``read_sentence_pipeline`` reads all of it once; ``SentencePipeline.apply`` turns the encoder's
last hidden states into the embeddings ``encode`` returns. torch is never imported: Dense weights
are read from safetensors only.

The directory names in modules.json come from the file and are checked to be plain relative
paths inside the model directory, as sentence-transformers itself requires.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ._model_dir import _describe, _read_json, _read_json_object, _SafetensorsFile

PathLike = Union[str, "os.PathLike[str]"]

MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG_FILE = "sentence_bert_config.json"
PROMPTS_FILE = "config_sentence_transformers.json"

#: Pooling modes as sentence-transformers names them (Pooling.POOLING_MODES), in the order its
#: legacy boolean keys are concatenated.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}

#: Dense activations sentence-transformers saves as a class path -> the NumPy function.
_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": ("Tanh", np.tanh),
    "torch.nn.modules.linear.Identity": ("Identity", None),
}
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default when the config names none

_MODULE_TYPES = ("Transformer", "Pooling", "Dense", "Normalize")
_EMBEDDING = "sentence_embedding"  # the feature Dense and Normalize must read and write


# ---- reading -------------------------------------------------------------------------------------

def _module_directory(root: pathlib.Path, relative: Any, source: pathlib.Path, index: int) -> pathlib.Path:
    if not isinstance(relative, str):
        raise ValueError(f"{source}: module {index} 'path' must be a string, got {_describe(relative)}")
    parts = pathlib.PurePosixPath(relative.replace("\\", "/")).parts
    if relative.startswith(("/", "\\")) or ".." in parts or "\0" in relative:
        raise ValueError(f"{source}: module {index} 'path' {_describe(relative)} must be a relative path "
                         "inside the model directory")
    return root.joinpath(*parts)


def _flag(settings: Dict[str, Any], key: str, default: bool, source: pathlib.Path) -> bool:
    value = settings.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key!r} must be true or false, got {_describe(value)}")
    return value


def _dimension(settings: Dict[str, Any], key: str, source: pathlib.Path) -> int:
    value = settings.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{source}: {key!r} must be an integer >= 1, got {_describe(value)}")
    return value


def _feature_names(settings: Dict[str, Any], source: pathlib.Path, module: str) -> None:
    """Dense and Normalize may be pointed at token embeddings (multi-vector models); embed()
    produces one vector per sentence, so only the sentence embedding is accepted."""
    for key in ("module_input_name", "module_output_name"):
        value = settings.get(key)
        if value is not None and value != _EMBEDDING:
            raise ValueError(f"{source}: {module} {key!r} is {_describe(value)}; embed() applies {module} "
                             f"modules to {_EMBEDDING!r} only")


def module_directories(directory: PathLike) -> List[str]:
    """The module subdirectories modules.json names (such as 1_Pooling, 2_Dense), for copying a
    directory: those that exist and are plain relative paths. Lenient by design: a malformed
    modules.json gives [] here and is reported by embed()."""
    root = pathlib.Path(os.fspath(directory))
    try:
        entries = _read_json(root / MODULES_FILE)
    except (OSError, ValueError):
        return []
    found = []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        try:
            path = _module_directory(root, entry.get("path") if isinstance(entry, dict) else None, root, index)
        except ValueError:
            continue
        if path != root and path.is_dir():
            found.append(path.relative_to(root).as_posix())
    return found


def read_do_lower_case(directory: PathLike) -> bool:
    """sentence_bert_config.json's do_lower_case (False when the file or the key is absent)."""
    path = pathlib.Path(os.fspath(directory)) / TRANSFORMER_CONFIG_FILE
    if not path.is_file():
        return False
    return _flag(_read_json_object(path), "do_lower_case", False, path)


@dataclass(frozen=True)
class DenseLayer:
    """``activation(x @ weight.T + bias)`` (+ ``x`` or ``x @ residual.T`` when the module has a residual)."""

    weight: np.ndarray  # float32 [out_features, in_features]
    bias: Optional[np.ndarray]  # float32 [out_features]
    activation: str  # "Tanh" or "Identity"
    residual: Optional[np.ndarray] = None  # float32 [out, in] when in != out; see residual_identity
    residual_identity: bool = False  # use_residual with in == out: the input itself is added

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = x @ self.weight.T
        if self.bias is not None:
            out += self.bias
        function = _ACTIVATIONS_BY_NAME[self.activation]
        if function is not None:
            out = function(out)
        if self.residual_identity:
            out = out + x
        elif self.residual is not None:
            out = out + x @ self.residual.T
        return out.astype(np.float32, copy=False)

    def describe(self) -> Dict[str, Any]:
        return {"type": "Dense", "in_features": int(self.weight.shape[1]), "out_features": int(self.weight.shape[0]),
                "bias": self.bias is not None, "activation": self.activation,
                "residual": self.residual_identity or self.residual is not None}


_ACTIVATIONS_BY_NAME = {name: function for name, function in _ACTIVATIONS.values()}


def _read_dense_tensors(directory: pathlib.Path, config_path: pathlib.Path) -> Dict[str, np.ndarray]:
    weights_path = directory / "model.safetensors"
    if not weights_path.is_file():
        if (directory / "pytorch_model.bin").exists():
            raise ValueError(f"{directory}: the Dense module's weights are only in pytorch_model.bin, which "
                             "cpuformer cannot read (torch is not a dependency); save them as model.safetensors "
                             "(SentenceTransformer.save(..., safe_serialization=True))")
        raise FileNotFoundError(f"{weights_path} does not exist: the Dense module of {config_path} needs its weights")
    file = _SafetensorsFile(weights_path)
    try:
        tensors = {}
        for name, entry in file.tensors.items():
            if entry.dtype not in ("F32", "F16", "BF16", "F64"):
                raise ValueError(f"{weights_path}: tensor {_describe(name)} is {entry.dtype}; Dense weights must be "
                                 "F32, F16, BF16 or F64")
            count = int(np.prod(entry.shape, dtype=np.int64))
            storage = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}[entry.dtype]
            stored = np.frombuffer(file.map, dtype=storage, count=count, offset=entry.start).reshape(entry.shape)
            if entry.dtype == "BF16":  # bfloat16 is the top half of a float32
                tensors[name] = (stored.astype(np.uint32) << 16).view(np.float32)
            else:
                tensors[name] = stored.astype(np.float32)  # a copy: the map is closed below
            del stored
        return tensors
    finally:
        file.close()


def _read_dense(directory: pathlib.Path, width: int) -> DenseLayer:
    config_path = directory / "config.json"
    settings = _read_json_object(config_path)
    _feature_names(settings, config_path, "Dense")
    in_features = _dimension(settings, "in_features", config_path)
    out_features = _dimension(settings, "out_features", config_path)
    if in_features != width:
        raise ValueError(f"{config_path}: 'in_features' is {in_features}, but the embedding reaching this Dense "
                         f"module has {width} dimensions")
    has_bias = _flag(settings, "bias", True, config_path)
    use_residual = _flag(settings, "use_residual", False, config_path)
    activation_path = settings.get("activation_function")
    if activation_path is None:
        activation_path = _DEFAULT_ACTIVATION
    if activation_path not in _ACTIVATIONS:
        raise NotImplementedError(f"{config_path}: Dense activation_function {_describe(activation_path)} is not "
                                  f"supported (supported: {', '.join(_ACTIVATIONS)})")
    activation = _ACTIVATIONS[activation_path][0]
    tensors = _read_dense_tensors(directory, config_path)
    weights_path = directory / "model.safetensors"

    def tensor(name: str, shape: Tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{weights_path} has no tensor {name!r}")
        value = tensors[name]
        if value.shape != shape:
            raise ValueError(f"{weights_path}: tensor {name!r} has shape {list(value.shape)}, expected {list(shape)} "
                             f"(from {config_path})")
        return value

    weight = tensor("linear.weight", (out_features, in_features))
    bias = tensor("linear.bias", (out_features,)) if has_bias else None
    residual = None
    if use_residual and in_features != out_features:
        residual = tensor("residual.weight", (out_features, in_features))
    return DenseLayer(weight, bias, activation, residual, use_residual and in_features == out_features)


def _read_pooling(directory: pathlib.Path, hidden_size: int) -> Tuple[Tuple[str, ...], bool]:
    config_path = directory / "config.json"
    settings = _read_json_object(config_path)
    for key in ("embedding_dimension", "word_embedding_dimension"):
        if settings.get(key) is not None:
            dimension = _dimension(settings, key, config_path)
            if dimension != hidden_size:
                raise ValueError(f"{config_path}: {key!r} is {dimension}, but the encoder's hidden size is "
                                 f"{hidden_size}")
    mode = settings.get("pooling_mode")
    if mode is None:  # written before sentence-transformers 5.x: one boolean per mode; none set means mean
        modes = tuple(m for key, m in _LEGACY_POOLING_KEYS.items() if _flag(settings, key, False, config_path))
        modes = modes or ("mean",)
    elif isinstance(mode, str):
        modes = (mode,)
    elif isinstance(mode, list) and mode and all(isinstance(m, str) for m in mode):
        modes = tuple(mode)
    else:
        raise ValueError(f"{config_path}: 'pooling_mode' must be a mode name or a list of them, got {_describe(mode)}")
    for m in modes:
        if m not in POOLING_MODES:
            raise NotImplementedError(f"{config_path}: pooling mode {m!r} is not supported (supported: "
                                      f"{', '.join(POOLING_MODES)})")
    return modes, _flag(settings, "include_prompt", True, config_path)


def _read_default_prompt(root: pathlib.Path) -> Optional[str]:
    """The prompt encode() prepends when the model names a default one (default_prompt_name)."""
    path = root / PROMPTS_FILE
    if not path.is_file():
        return None
    settings = _read_json_object(path)
    name = settings.get("default_prompt_name")
    if name is None:
        return None
    prompts = settings.get("prompts")
    if not isinstance(prompts, dict) or not isinstance(prompts.get(name), str):
        raise ValueError(f"{path}: 'default_prompt_name' {_describe(name)} names no prompt in 'prompts'")
    return prompts[name] or None


@dataclass(frozen=True)
class SentencePipeline:
    """What follows the encoder in a sentence-transformers directory: pooling, then the Dense and
    Normalize modules in the order modules.json lists them."""

    source: str  # the modules.json path
    pooling: Tuple[str, ...]  # sentence-transformers mode names; several are concatenated in order
    include_prompt: bool
    after_pooling: Tuple[Union[DenseLayer, str], ...] = field(default=())  # DenseLayer or "Normalize"
    prompt: Optional[str] = None  # config_sentence_transformers.json's default prompt, prepended to texts

    def describe(self) -> Dict[str, Any]:
        return {"source": self.source, "pooling": list(self.pooling), "include_prompt": self.include_prompt,
                "after_pooling": [step.describe() if isinstance(step, DenseLayer) else {"type": step}
                                  for step in self.after_pooling],
                "default_prompt": self.prompt}

    def apply(self, hidden: np.ndarray, mask: np.ndarray, prompt_length: int = 0,
              normalize_modules: bool = True) -> np.ndarray:
        """hidden float32 [B, T, H], mask 0/1 [B, T] (right-padded) -> [B, D]. ``prompt_length``:
        tokens of the default prompt at the start of every sequence, left out of the pooling when
        include_prompt is false. ``normalize_modules=False`` skips the Normalize modules (the caller
        decides normalisation itself); Dense modules always apply."""
        pooling_mask = mask
        if prompt_length and not self.include_prompt:
            pooling_mask = mask.copy()
            pooling_mask[:, :prompt_length] = 0
        parts = [pool(hidden, pooling_mask, mode) for mode in self.pooling]
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        for step in self.after_pooling:
            if isinstance(step, DenseLayer):
                out = step(out)
            elif normalize_modules:
                out = l2_normalize(out)
        return np.ascontiguousarray(out, dtype=np.float32)


def read_sentence_pipeline(directory: PathLike, hidden_size: int) -> Optional[SentencePipeline]:
    """The pipeline of a sentence-transformers directory, or None when it has no modules.json.

    Raises ValueError naming the file for malformed JSON or values, NotImplementedError naming
    the module type, pooling mode or activation that embed() cannot compute, and ValueError for
    Dense weights stored only as pytorch_model.bin.
    """
    root = pathlib.Path(os.fspath(directory))
    source = root / MODULES_FILE
    if not source.is_file():
        return None
    entries = _read_json(source)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: must contain a non-empty JSON list of modules, got {_describe(entries)}")
    pooling: Optional[Tuple[str, ...]] = None
    include_prompt = True
    width = hidden_size
    after: List[Union[DenseLayer, str]] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{source}: module {index} must be a JSON object, got {_describe(entry)}")
        module_type = entry.get("type")
        if not isinstance(module_type, str):
            raise ValueError(f"{source}: module {index} 'type' must be a string, got {_describe(module_type)}")
        name = module_type.rsplit(".", 1)[-1]
        if not module_type.startswith("sentence_transformers.") or name not in _MODULE_TYPES:
            raise NotImplementedError(f"{source}: module type {module_type!r} is not supported by embed() "
                                      f"(supported: sentence-transformers' {', '.join(_MODULE_TYPES)}); pass "
                                      "pooling= to embed() to pool the encoder's output without the module list")
        directory_path = _module_directory(root, entry.get("path", ""), source, index)
        if name == "Transformer":
            if index != 0 or directory_path != root:
                raise NotImplementedError(f"{source}: the Transformer module must come first with path \"\" (the "
                                          f"model directory cpuformer loads), got module {index} with path "
                                          f"{_describe(entry.get('path'))}")
        elif index == 0:
            raise NotImplementedError(f"{source}: the first module must be the Transformer, got {module_type!r}")
        elif name == "Pooling":
            if pooling is not None:
                raise NotImplementedError(f"{source}: more than one Pooling module")
            pooling, include_prompt = _read_pooling(directory_path, hidden_size)
            width = hidden_size * len(pooling)
        elif pooling is None:
            raise NotImplementedError(f"{source}: the {name} module at index {index} comes before any Pooling "
                                      "module; embed() needs the token embeddings pooled first")
        elif name == "Dense":
            layer = _read_dense(directory_path, width)
            after.append(layer)
            width = layer.weight.shape[0]
        else:  # Normalize; its config.json is optional (older versions wrote none)
            config_path = directory_path / "config.json"
            if config_path.is_file():
                _feature_names(_read_json_object(config_path), config_path, "Normalize")
            after.append("Normalize")
    if pooling is None:
        raise NotImplementedError(f"{source}: lists no Pooling module; pass pooling= to embed()")
    return SentencePipeline(str(source), pooling, include_prompt, tuple(after), _read_default_prompt(root))


# ---- computing -----------------------------------------------------------------------------------

def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by max(norm, 1e-12), as torch.nn.functional.normalize does."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, np.float32(1e-12))


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """One sentence-transformers pooling mode. hidden float32 [B, T, H]; mask 0/1 [B, T], padding on
    the right. Padded rows are selected out rather than multiplied by 0, so a NaN there stays out."""
    B, T, H = hidden.shape
    keep = mask > 0  # [B, T]
    if mode == "cls":  # the first kept token (the first token unless a prompt is left out)
        return hidden[np.arange(B), keep.argmax(axis=1)]
    if mode == "lasttoken":  # the last kept token; position T-1 when none is kept, as sentence-transformers
        last = T - 1 - keep[:, ::-1].argmax(axis=1)
        last = np.where(keep.any(axis=1), last, T - 1)
        rows = hidden[np.arange(B), last]
        return np.where(keep[np.arange(B), last][:, None], rows, np.float32(0.0))
    if mode == "max":
        return np.where(keep[:, :, None], hidden, np.float32(-np.inf)).max(axis=1)
    if mode == "weightedmean":  # token t (from 1) weighs t
        weights = np.where(keep, np.arange(1, T + 1, dtype=np.float32)[None, :], np.float32(0.0))
    else:
        weights = keep.astype(np.float32)
    total = np.where(keep[:, :, None], hidden * weights[:, :, None], np.float32(0.0)).sum(axis=1)
    count = np.maximum(weights.sum(axis=1, keepdims=True), np.float32(1e-9))
    if mode in ("mean", "weightedmean"):
        return total / count
    if mode == "mean_sqrt_len_tokens":
        return total / np.sqrt(count)
    raise ValueError(f"unknown pooling mode {mode!r}")


def lowercase_tokenizer(tokenizer: Any) -> None:
    """sentence_bert_config.json's do_lower_case: put a Lowercase normalizer first in the tokenizer
    unless it already lowercases, as sentence-transformers does to its fast tokenizer."""
    from tokenizers import normalizers

    current = tokenizer.normalizer
    if isinstance(current, normalizers.Lowercase):
        return
    if isinstance(current, normalizers.Sequence):
        if any(isinstance(step, normalizers.Lowercase) for step in current):
            return
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *current])
    elif current is None:
        tokenizer.normalizer = normalizers.Lowercase()
    else:
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), current])


def prompt_token_count(tokenizer: Any, prompt: str) -> int:
    """Tokens the prompt occupies at the start of an encoded text: its encoding with special tokens,
    less a trailing special token (as sentence-transformers' _get_prompt_length counts)."""
    encoding = tokenizer.encode(prompt)
    count = len(encoding.ids)
    if count and encoding.special_tokens_mask[-1]:
        count -= 1
    return count


__all__ = ["DenseLayer", "SentencePipeline", "POOLING_MODES", "l2_normalize", "lowercase_tokenizer",
           "module_directories", "pool", "prompt_token_count", "read_do_lower_case", "read_sentence_pipeline"]
