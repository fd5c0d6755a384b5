"""Weights: the dtype policy, the one loader that turns a checkpoint into canonical arrays, and the
converted-directory format (read here, written by ``convert``).

Loading reads what an architecture declares (``arch``): every canonical weight from its checkpoint
tensor, with the declared edits applied once (transpose, row block of a fused tensor, ``1 + w``).
A checkpoint tensor that is neither declared nor knowingly ignored is an error naming it, raised
before any weight is read. ``load_layers`` hands the model one layer at a time and releases that
layer's pages right after, so loading peaks near one copy of the weights.

A converted directory (``cpuformer convert``) holds exactly what quantize-at-load computes, so
loading it gives the same outputs bit for bit while reading a quarter (int8), about a seventh (int4) or half (16-bit) of
the weight bytes and doing no conversion work:

- every matrix weight (``arch.MATMUL``: the projections, the LM head, BERT's pooler) under its
  checkpoint name, in nn.Linear layout [out_features, in_features] (GPT-2's Conv1D weights,
  stored [in, out] by transformers, are written transposed) as
  int8: I8 ``<name>`` + F32 ``<name>_scale`` [out_features] (W ≈ q · scale per row),
  int4: U8 ``<name>`` [out_features, Kp / 2] of nibble pairs + F16 ``<name>_scale`` [out_features,
  groups] (+ U8 ``<name>_zero`` [out_features, groups] with zero points; ops.quantize_int4), or
  float16 / bfloat16: an F16 / BF16 ``<name>``;
- the LM head as ``lm_head.weight``, also when it is tied to the embeddings (the embedding table
  itself stays float32);
- every other floating-point tensor as F32 (embeddings, norms, biases, T5's relative-position
  bias, tensors the architecture ignores such as task heads); other tensors as they are.

config.json gains ``"cpuformer": {"dtype": ..., "format_version": 1}`` (int4 adds "group_size",
"zero_point" and "lm_head", the head's dtype: int8 by default); the tokenizer and generation files
are copied. Loading a converted directory with ``dtype=None`` uses its dtype and settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import threading
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Union

import numpy as np

from . import _core
from ._model_dir import _STORAGE_DTYPES, CONFIG_FILE, WEIGHTS_FILE, ModelDir, save_safetensors
from ._sentence import module_directories
from .arch import MATMUL, Arch, Hparams, Source, Tensor, canonical_shape, find
from .arch.heads import Head
from .arch.spec import bias_of

DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
FORMAT_VERSION = 1
_SAFETENSORS_NAME = {"int8": "I8", "int4": "U8", "float16": "F16", "bfloat16": "BF16"}
_FLOATS = ("F32", "F16", "BF16", "F64")
#: The suffix of an int8 weight's per-row scales (an int4 weight's per-group scales), in converted
#: directories and in loaded dicts.
SCALE = "_scale"
#: The suffix of an int4 weight's per-group zero points (asymmetric int4 only).
ZERO = "_zero"
#: The group sizes of int4 weights (input channels per scale).
GROUP_SIZES = (32, 64, 128)
#: The keys of the ``quantization`` argument of the models, ``load`` and ``convert``.
QUANTIZATION_KEYS = ("group_size", "zero_point", "lm_head", "embeddings")
#: The storage of the token-embedding table.
EMBEDDING_DTYPES = ("float32", "int8")

PathLike = Union[str, os.PathLike]


# ---- dtype policy ----------------------------------------------------------------------------------

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
    if (not isinstance(entry, dict) or entry.get("dtype") not in DTYPES or entry.get("format_version") != 1
            or set(entry) - {"dtype", "format_version", *QUANTIZATION_KEYS}):
        raise ValueError("config.json: the 'cpuformer' entry must be {\"dtype\": one of "
                         f"{', '.join(DTYPES)}, \"format_version\": 1}} plus the quantization of an int4 "
                         f"directory ({', '.join(QUANTIZATION_KEYS)}), got {entry!r}")
    return entry["dtype"]


def check_quantization(quantization: Optional[Mapping[str, Any]], dtype: str) -> Dict[str, Any]:
    """The quantization settings of a model in ``dtype``: {"group_size", "zero_point", "lm_head",
    "embeddings"}.

    Defaults: int4 groups of 32 input channels, symmetric, the LM head in int8 and the token
    embedding table in int8 rows (the policy of docs/precision.md, "Which tensors are quantized");
    for the other dtypes the LM head in the model's dtype and the table in float32. ``quantization``
    overrides them: group_size (32, 64 or 128) and zero_point (bool) for int4 weights only, lm_head
    (a dtype) and embeddings ("float32" or "int8") for any. TypeError / ValueError naming the key
    otherwise."""
    if quantization is None:
        quantization = {}
    if not isinstance(quantization, Mapping):
        raise TypeError(f"quantization must be None or a dict, got {type(quantization).__name__}")
    unknown = [key for key in quantization if key not in QUANTIZATION_KEYS]
    if unknown:
        raise ValueError(f"quantization: unknown key {unknown[0]!r}; the keys are "
                         f"{', '.join(repr(k) for k in QUANTIZATION_KEYS)}")
    # The defaults are the C++ core's (the C API opens plain directories with them).
    defaults = _core.default_quantization(dtype)
    lm_head = quantization.get("lm_head", defaults["lm_head"])
    if lm_head not in DTYPES:
        raise ValueError(f"quantization: lm_head must be one of {', '.join(repr(d) for d in DTYPES)}, got {lm_head!r}")
    embeddings = quantization.get("embeddings", defaults["embeddings"])
    if embeddings not in EMBEDDING_DTYPES:
        raise ValueError(f"quantization: embeddings must be 'float32' or 'int8', got {embeddings!r}")
    int4 = "int4" in (dtype, lm_head)
    for key in ("group_size", "zero_point"):
        if key in quantization and not int4:
            raise ValueError(f"quantization: {key!r} applies to int4 weights only (dtype is {dtype!r})")
    group_size = quantization.get("group_size", defaults["group_size"])
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in GROUP_SIZES:
        raise ValueError(f"quantization: group_size must be one of {', '.join(map(str, GROUP_SIZES))}, "
                         f"got {group_size!r}")
    zero_point = quantization.get("zero_point", defaults["zero_point"])
    if not isinstance(zero_point, bool):
        raise TypeError(f"quantization: zero_point must be True or False, got {zero_point!r}")
    return {"group_size": group_size, "zero_point": zero_point, "lm_head": lm_head, "embeddings": embeddings}


def resolve_dtype(dtype: Optional[str], config: Mapping[str, Any],
                  quantization: Optional[Mapping[str, Any]] = None) -> Tuple[str, Optional[str], Dict[str, Any]]:
    """(dtype to run in, dtype stored in the directory or None, quantization settings). dtype=None
    means the stored dtype, or float32 for a plain checkpoint; a converted directory runs only in the
    dtype and quantization it stores (``quantization`` may repeat them)."""
    dtype = check_dtype(dtype)
    stored = stored_dtype(config)
    if stored is None:
        dtype = dtype or "float32"
        return dtype, None, check_quantization(quantization, dtype)
    if dtype is not None and dtype != stored:
        raise ValueError(f"this directory was converted to dtype {stored!r}; load it with dtype={stored!r} "
                         f"(or dtype=None), or convert the original checkpoint to {dtype!r}")
    entry = config["cpuformer"]
    settings = check_quantization({key: entry[key] for key in QUANTIZATION_KEYS if key in entry}, stored)
    if quantization is not None:
        asked = check_quantization(quantization, stored)
        for key in QUANTIZATION_KEYS:
            if key in quantization and asked[key] != settings[key]:
                raise ValueError(f"this directory was converted with {key}={settings[key]!r}; load it without "
                                 f"quantization[{key!r}], or convert the original checkpoint with {key}="
                                 f"{asked[key]!r}")
    return stored, stored, settings


def graph_format(dtype: str, settings: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The weight-format fields of the C++ model config (TransformerConfig: dtype, head_dtype,
    group_size, zero_point, embedding_dtype); settings: check_quantization's (its defaults when
    None)."""
    if settings is None:
        settings = check_quantization(None, dtype)
    return {"dtype": dtype, "head_dtype": settings["lm_head"], "group_size": settings["group_size"],
            "zero_point": settings["zero_point"], "embedding_dtype": settings["embeddings"]}


# ---- reading a checkpoint --------------------------------------------------------------------------

class Checkpoint:
    """The canonical weights of one model in an opened directory, as ``arch`` declares them.

    ``stored``: the dtype of a converted directory (its matrix weights are read as stored), or
    None for a plain checkpoint (float32 arrays; the C++ model packs them into its dtype).
    ``settings``: the quantization of a converted directory (check_quantization: its LM head's
    dtype, int4 group size and zero points).
    """

    def __init__(self, md: ModelDir, arch: Arch, hp: Hparams, stored: Optional[str], head: Optional[Head] = None,
                 settings: Optional[Mapping[str, Any]] = None):
        self.md, self.arch, self.hp, self.stored, self.head = md, arch, hp, stored, head
        self.settings = dict(settings) if settings is not None else check_quantization(None, stored or "float32")
        self.config = md.config
        self.top = dict(arch.model_tensors(self.config, hp))
        embed = self.top["embed.tokens"]
        assert isinstance(embed, Tensor)
        self.prefix = "" if "" in arch.prefixes else arch.prefixes[0]  # (for the missing-tensor error)
        for prefix in arch.prefixes:
            if any(prefix + name in md for name in (embed.name,) + embed.fallbacks):
                self.prefix = prefix
                break
        self._ignored = re.compile("|".join(f"(?:{pattern})" for pattern in arch.ignored)) if arch.ignored else None
        self.head_ignored: Optional[str] = None
        self._decide_head()

    def _decide_head(self) -> None:
        """A converted directory always stores its head (a quantized copy when tied); a plain
        checkpoint's lm_head.weight is the head unless the config ties it to the embeddings (a tied
        checkpoint that saved it holds the same values)."""
        head = self.top.get("lm_head")
        if not isinstance(head, Tensor):
            return
        name = self.checkpoint_name(head)
        if self.stored is not None:
            self.top["lm_head"] = Tensor(head.name, root=head.root)
        elif self.hp.tie_word_embeddings:
            del self.top["lm_head"]
            self.head_ignored = name
        elif name is None:
            raise ValueError(f"{self.md.path}: the checkpoint has no lm_head.weight and tie_word_embeddings is false")

    # ---- names -----------------------------------------------------------------------------

    def _full(self, tensor: Tensor, name: str) -> str:
        return name if tensor.root else self.prefix + name

    def checkpoint_name(self, tensor: Tensor) -> Optional[str]:
        """The name ``tensor`` has in this checkpoint (its first present fallback), or None when it
        is absent; for a required tensor absent from the checkpoint, its name (reading it fails)."""
        for name in (tensor.name,) + tensor.fallbacks:
            full = self._full(tensor, name)
            if full in self.md:
                return full
        return None

    def stack_sources(self, stack: str) -> Dict[str, Source]:
        return dict(self.arch.stack_tensors(self.config, self.hp, stack))

    def layer_sources(self, stack: str, layer: int) -> Dict[str, Source]:
        return dict(self.arch.layer_tensors(self.hp, stack, layer))

    def all_sources(self) -> Iterator[Dict[str, Source]]:
        yield self.top
        if self.head is not None:
            yield dict(self.head.tensors)
        for stack, count in self.arch.stacks(self.hp):
            yield self.stack_sources(stack)
            for layer in range(count):
                yield self.layer_sources(stack, layer)

    def _plan(self, sources: Mapping[str, Source]) -> Dict[str, List[Tuple[str, Tensor]]]:
        """checkpoint name -> [(canonical, Tensor)] for the sources present (fused tensors feed
        several canonical weights). Absent optional tensors are left out, and so is the bias of a
        weight that is absent."""
        plan: Dict[str, List[Tuple[str, Tensor]]] = {}
        absent: Set[str] = set()
        for canonical in sorted(sources, key=lambda c: c.endswith(".bias")):  # weights before biases
            source = sources[canonical]
            if not isinstance(source, Tensor):
                continue
            if canonical.endswith(".bias") and bias_of(canonical) in absent:
                continue
            name = self.checkpoint_name(source)
            if name is None:
                if source.optional:
                    absent.add(canonical)
                    continue
                name = self._full(source, ((source.name,) + source.fallbacks)[-1])  # reading it names it missing
            plan.setdefault(name, []).append((canonical, source))
        return plan

    def check_accounted(self) -> None:
        """ValueError naming the checkpoint tensors that no declared weight reads and that the
        architecture does not knowingly ignore (a naming drift, or a head cpuformer would drop)."""
        used: Dict[str, None] = {}  # in declaration order: the first missing tensor is the one named
        for sources in self.all_sources():
            used.update(dict.fromkeys(self._plan(sources)))
        for name in used:
            if name not in self.md:
                self.md.tensor_info(name)  # the directory's own "has no tensor" error, before any read
        stray = []
        for name in self.md.names():
            if name in used or name == self.head_ignored or any(
                    name.endswith(suffix) and name[:-len(suffix)] in used for suffix in (SCALE, ZERO)):
                continue
            if self._ignored is not None and self._ignored.fullmatch(name):
                continue
            stray.append(name)
        self._check_tied_copies()
        if stray:
            shown = ", ".join(stray[:5]) + (f" and {len(stray) - 5} more" if len(stray) > 5 else "")
            raise ValueError(f"{self.md.path}: the checkpoint has tensors that {self.arch.title} models do not "
                             f"use: {shown}; config.json names the {self.arch.title} architecture, so either it does "
                             "not match the weights, or this is a variant (a task head, a checkpoint format) that "
                             "cpuformer does not support yet")

    def _check_tied_copies(self) -> None:
        """With tie_word_embeddings false, a stored copy of a table (Arch.tied_copies) must hold the
        table's values: transformers 5 then uses the copy itself (e.g. separate encoder and decoder
        embeddings), which cpuformer's one table cannot represent (NotImplementedError)."""
        if self.stored is not None or self.hp.tie_word_embeddings:
            return
        for copy, table in self.arch.tied_copies:
            copy_name, table_name = self.prefix + copy, self.prefix + table
            if copy_name not in self.md or table_name not in self.md:
                continue
            a, b = self.md.tensor(copy_name), self.md.tensor(table_name)
            same = a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
            self.md.release(copy_name)
            if not same:
                raise NotImplementedError(
                    f"{self.md.path}: {copy_name} differs from {table_name} and config.json has "
                    "tie_word_embeddings=false, so transformers uses separate tables there; cpuformer reads one "
                    f"table ({table_name}) and does not support separate ones")

    # ---- arrays ----------------------------------------------------------------------------

    def read(self, sources: Mapping[str, Source],
             shapes: Optional[Mapping[str, Tuple[int, ...]]] = None) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """(canonical name -> array, the checkpoint names read). Matrix weights of a converted
        directory come as stored (int8 with ``<canonical>_scale``, int4 nibble pairs with
        ``<canonical>_scale`` and maybe ``<canonical>_zero``, or 16-bit words); everything else is
        float32. shapes: the canonical shapes of names ``canonical_shape`` does not know
        (a task head's)."""
        out: Dict[str, np.ndarray] = {}
        for canonical, source in sources.items():
            if isinstance(source, np.ndarray):
                out[canonical] = source
        plan = self._plan(sources)
        for name, members in plan.items():
            self._read_group(name, members, out, shapes or {})
        return out, list(plan)

    def read_head(self) -> Dict[str, np.ndarray]:
        """The task head's weights (float32 copies: they outlive the weight maps)."""
        assert self.head is not None
        arrays, _ = self.read(self.head.tensors, self.head.shapes)
        return {name: np.array(array, dtype=np.float32) for name, array in arrays.items()}

    def _read_group(self, name: str, members: List[Tuple[str, Tensor]], out: Dict[str, np.ndarray],
                    shapes: Mapping[str, Tuple[int, ...]]) -> None:
        first_canonical, first = members[0]
        shape = shapes[first_canonical] if first_canonical in shapes else canonical_shape(first_canonical, self.hp)
        if first.rows is not None:  # a fused tensor: its rows are the blocks declared from it
            shape = (max(tensor.rows[1] for _, tensor in members if tensor.rows),) + shape[1:]
        matmul = first_canonical in MATMUL
        extras: Dict[str, np.ndarray] = {}
        if matmul and self.stored is not None:
            dtype = self.settings["lm_head"] if first_canonical == "lm_head" else self.stored
            array, extras = self._converted(name, shape, dtype)
        else:
            array = self._float(name, first, shape)
        for canonical, tensor in members:
            part, part_extras = array, extras
            if tensor.rows is not None:
                start, stop = tensor.rows
                part = array[start:stop] if matmul else np.ascontiguousarray(array[start:stop])
                part_extras = {suffix: extra[start:stop] for suffix, extra in extras.items()}
            if tensor.plus_one:
                part = (part + np.float32(1)).astype(np.float32)
            out[canonical] = part
            for suffix, extra in part_extras.items():
                out[canonical + suffix] = extra

    def _float(self, name: str, tensor: Tensor, shape: Tuple[int, ...]) -> np.ndarray:
        md = self.md
        if tensor.rows_key and name in md:
            have = list(md.tensor_info(name)[1])
            if have[:1] != [shape[0]] or have[1:] != list(shape[1:]):
                expected = f"[{tensor.rows_key}]" if len(shape) == 1 else f"{tensor.rows_key} × {list(shape[1:])}"
                raise ValueError(f"config.json: {tensor.rows_key!r} gives {shape[0]} rows, but the checkpoint's {name} "
                                 f"has shape {have} (expected {expected})")
        if tensor.as_row:
            return np.ascontiguousarray(md.tensor(name, shape=(1,) + shape).reshape(shape), dtype=np.float32)
        if tensor.stored_shape is not None:
            array = md.tensor(name, shape=tensor.stored_shape).reshape(shape[::-1] if tensor.transpose else shape)
            return np.ascontiguousarray(array.T) if tensor.transpose else array
        if tensor.transpose:
            return np.ascontiguousarray(md.tensor(name, shape=shape[::-1]).T)
        return md.tensor(name, shape=shape)

    def _converted(self, name: str, shape: Tuple[int, ...], stored: str) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """A matrix weight of a converted directory, stored as ``stored``, as zero-copy views of the
        mapping: int8 and its per-row scales, int4 nibble pairs with their group scales (and zero
        points), or 16-bit words. ValueError naming the tensor when it is corrupt."""
        md = self.md
        where = f"{md.path} (converted to {self.stored})"
        if name not in md:
            raise ValueError(f"{where}: has no tensor {name!r}")
        expected = _SAFETENSORS_NAME.get(stored, "F32")
        if stored == "int4":
            group_size = self.settings["group_size"]
            groups = -(-shape[1] // group_size)
            stored_shape: Tuple[int, ...] = (shape[0], groups * group_size // 2)
        else:
            stored_shape = shape
        dtype, have = md.tensor_info(name)
        if dtype != expected:
            raise ValueError(f"{where}: tensor {name!r} is stored as {dtype}; a {stored} weight is stored as "
                             f"{expected}")
        if tuple(have) != tuple(stored_shape):
            raise ValueError(f"{where}: tensor {name!r} has shape {list(have)}, expected {list(stored_shape)}")

        def part(suffix: str, part_dtype: str, part_shape: Tuple[int, ...], what: str, numpy_dtype: Any) -> np.ndarray:
            key = name + suffix
            if key not in md:
                raise ValueError(f"{where}: {stored} tensor {name!r} has no {what} tensor {key!r}")
            have_dtype, have_shape = md.tensor_info(key)
            if have_dtype != part_dtype or tuple(have_shape) != part_shape:
                raise ValueError(f"{where}: {what} tensor {key!r} must be {part_dtype} of shape "
                                 f"{list(part_shape)}, got {have_dtype} of shape {list(have_shape)}")
            return md.tensor(key, shape=part_shape, dtype=numpy_dtype)

        if stored == "float32":
            return md.tensor(name, shape=shape), {}
        if stored == "int8":
            scale = part(SCALE, "F32", (shape[0],), "scale", np.float32)
            return md.tensor(name, shape=shape, dtype=np.int8), {SCALE: scale}
        if stored == "int4":
            extras = {SCALE: part(SCALE, "F16", (shape[0], groups), "scale", np.float16)}
            if self.settings["zero_point"]:
                extras[ZERO] = part(ZERO, "U8", (shape[0], groups), "zero-point", np.uint8)
            return md.tensor(name, shape=stored_shape, dtype=np.uint8), extras
        if stored == "float16":
            return md.tensor(name, shape=shape, dtype=np.float16).view(np.uint16), {}
        return md.tensor(name, shape=shape, dtype=np.uint16), {}

    def release(self, names: Iterable[str]) -> None:
        """Drops the pages of tensors already packed or copied by the model."""
        for name in names:
            self.md.release(name)
            for suffix in (SCALE, ZERO):
                if name + suffix in self.md:
                    self.md.release(name + suffix)


def load_layers(checkpoint: Checkpoint, add_layer) -> None:
    """Reads every layer of every stack in order and hands it to ``add_layer(stack, arrays)``;
    each layer's checkpoint pages are released once the model has packed it."""
    for stack, count in checkpoint.arch.stacks(checkpoint.hp):
        for layer in range(count):
            arrays, names = checkpoint.read(checkpoint.layer_sources(stack, layer))
            add_layer(stack, arrays)
            del arrays
            checkpoint.release(names)


def graph_tensors(checkpoint: Checkpoint) -> Dict[str, Any]:
    """What ``models._graph.build`` hands the C++ graph, as the tensor part of a graph manifest
    (docs/c-api.md): {"model": {canonical: entry}, "<stack>": [{canonical: entry} per layer]}.
    An entry names the checkpoint tensor and the edits the loader applies ({"name", "rows": [start,
    stop), "transpose", "plus_one"}, the result's "shape" and NumPy "dtype"), or holds the values of
    an array computed from the config ("values", flattened). The C API's loader
    (csrc/models/graph_loader.h) follows it, so both languages read the same tensors the same way."""
    def entries(sources: Mapping[str, Source], prefix: str = "") -> Dict[str, Any]:
        arrays, names = checkpoint.read(sources)
        where: Dict[str, Tuple[str, Tensor]] = {}
        for name, members in checkpoint._plan(sources).items():
            for canonical, tensor in members:
                where[canonical] = (name, tensor)
        out: Dict[str, Any] = {}
        for key, array in arrays.items():
            base, suffix = key, ""
            for extra in (SCALE, ZERO):
                if key.endswith(extra) and key[:-len(extra)] in where:
                    base, suffix = key[:-len(extra)], extra
            entry: Dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
            if base in where:
                name, tensor = where[base]
                entry["name"] = name + suffix
                if tensor.rows is not None:
                    entry["rows"] = list(tensor.rows)
                converted_matrix = base in MATMUL and checkpoint.stored is not None
                if tensor.transpose and not converted_matrix:
                    entry["transpose"] = True
                if tensor.plus_one:
                    entry["plus_one"] = True
            else:
                entry["values"] = [float(v) for v in np.asarray(array, dtype=np.float32).ravel()]
            out[prefix + key] = entry
        del arrays
        checkpoint.release(names)
        return out

    out: Dict[str, Any] = {"model": entries(checkpoint.top)}
    for stack, count in checkpoint.arch.stacks(checkpoint.hp):
        out["model"].update(entries(checkpoint.stack_sources(stack), f"{stack}."))
        out[stack] = [entries(checkpoint.layer_sources(stack, layer)) for layer in range(count)]
    return out


# ---- convert ---------------------------------------------------------------------------------------

def convert_checkpoints(md: ModelDir, arch: Arch, name: str, stored: Optional[str] = None,
                        settings: Optional[Mapping[str, Any]] = None) -> List[Checkpoint]:
    """The checkpoints ``convert`` writes from one directory, every tensor declared: one for a text
    model; for an image model (kind "vision") one whose head declares the patch embedding, tokens,
    positions and classifiers (``arch.vision``: stored float32, packed at load like task heads); for
    a model of several towers (CLIP: ``arch.towers``) one per tower. NotImplementedError for a
    family whose model class cannot read a converted directory (image and CLIP families say so with
    ``convertible = True``; the text kinds all can)."""
    if not getattr(arch, "convertible", arch.kind not in ("vision", "clip")):
        raise NotImplementedError(f"{md.path}: cpuformer convert does not convert {arch.title} checkpoints ({name}) "
                                  "yet; load the original directory with dtype=...")
    towers = getattr(arch, "towers", None)
    if towers is not None:
        return [Checkpoint(md, tower, hp, stored, None, settings) for tower, hp in towers(md.config)]
    hp = arch.hparams(md.config)
    head = None
    if arch.kind == "vision":
        vision = arch.vision(md.config, hp, name)  # type: ignore[attr-defined]
        head = Head("image_classification", (), dict(vision.tensors), dict(vision.shapes), vision.labels)
    return [Checkpoint(md, arch, hp, stored, head, settings)]


# Files copied verbatim (those present): tokenizers, generation settings, sentence-transformers, image
# preprocessing.
_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model", "source.spm",
           "target.spm", "added_tokens.json", "sentence_bert_config.json", "modules.json",
           "config_sentence_transformers.json", "preprocessor_config.json")
# ... and the sentence-transformers module directories modules.json names (2_Dense holds weights).
_COPIED_DIRS = ("1_Pooling", "2_Normalize")


def _progress(items: List[str], enabled: bool, description: str) -> Iterable[str]:
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(items, desc=description, unit="tensor")
    return items


def _converted(w: np.ndarray, dtype: str,
               settings: Mapping[str, Any]) -> Tuple[List[Tuple[str, np.ndarray]], Dict[str, str]]:
    if dtype == "int4":
        u, scales, zeros = _core.quantize_int4(w, settings["group_size"], settings["zero_point"])
        return [("", u), (SCALE, scales)] + ([(ZERO, zeros)] if zeros is not None else []), {}
    if dtype == "int8":
        q, scales = _core.quantize_int8(w)
        return [("", q), (SCALE, scales)], {}
    if dtype == "float16":
        return [("", _core.float32_to_float16_bits(w).view(np.float16))], {}
    if dtype == "bfloat16":
        return [("", _core.float32_to_bfloat16_bits(w))], {"": "BF16"}
    return [("", np.ascontiguousarray(w, dtype=np.float32))], {}


def _matrix_sources(checkpoint: Checkpoint) -> Dict[str, Tuple[str, Tensor]]:
    """checkpoint name -> (canonical name, Tensor declaration), for every matrix weight the model
    multiplies with."""
    out: Dict[str, Tuple[str, Tensor]] = {}
    for sources in checkpoint.all_sources():
        for name, members in checkpoint._plan(sources).items():
            canonical, tensor = members[0]
            if canonical in MATMUL:
                out[name] = (canonical, tensor)
    return out


def convert(src: PathLike, dst: PathLike, dtype: str, progress: bool = True,
            quantization: Optional[Mapping[str, Any]] = None,
            finish: Optional[Callable[[pathlib.Path], None]] = None) -> None:
    """Writes a copy of the model directory ``src`` to ``dst`` with its matmul weights stored in
    ``dtype`` ("int8", "int4", "float16", "bfloat16" or "float32"), ready to load zero-copy.
    ``quantization``: as for the models (check_quantization): the int4 group size and zero
    points, and the LM head's dtype; config.json records them.

    ``dst`` must not exist or be an empty directory (FileExistsError otherwise); a symbolic link is
    followed (the conversion goes where it points). ``dst`` appears only once complete (written as
    a hidden sibling ``.<name>.partial-<pid>-<random>``, then renamed); the sibling is removed on any
    error, KeyboardInterrupt or SIGTERM, and one left by a killed process is removed by the next
    conversion into the same directory. ``progress`` shows a progress bar (tqdm, when installed).
    ``finish(directory)`` runs on the complete conversion before it is renamed to ``dst`` (it may
    add files; an error in it fails the conversion). See docs/precision.md.
    """
    if dtype is None:
        raise ValueError(f"dtype must be one of {', '.join(repr(d) for d in DTYPES)}, got None")
    check_dtype(dtype)
    settings = check_quantization(quantization, dtype)
    # Resolved before any work: the final rename must replace the directory a link points to (a
    # rename onto the link itself fails), and the hidden sibling must be on that directory's
    # file system.
    dst_path = pathlib.Path(os.path.realpath(os.fspath(dst)))
    if dst_path.exists() and (not dst_path.is_dir() or any(dst_path.iterdir())):
        raise FileExistsError(f"{dst} already exists and is not an empty directory")
    if pathlib.Path(os.path.realpath(os.fspath(src))) == dst_path:
        raise ValueError(f"the destination {dst} is the source directory")
    md = ModelDir(src)
    try:
        arch, name = find(md.config)
        already = stored_dtype(md.config)
        if already is not None:
            raise ValueError(f"{md.path} is already converted (dtype {already!r}); convert the original checkpoint")
        checkpoints = convert_checkpoints(md, arch, name)
        for checkpoint in checkpoints:
            checkpoint.check_accounted()
        checkpoint = checkpoints[0]
        matrices: Dict[str, Tuple[str, Tensor]] = {}
        for each in checkpoints:
            matrices.update(_matrix_sources(each))
        # A tied head is written as a quantized lm_head.weight made from the embedding table.
        head_source = None
        if "lm_head" in arch.model_tensors(md.config, checkpoint.hp) and "lm_head" not in checkpoint.top:
            head_source = checkpoint.checkpoint_name(checkpoint.top["embed.tokens"])  # type: ignore[arg-type]
        names = [n for n in md.names() if not (head_source is not None and n == checkpoint.head_ignored)]
        out: Dict[str, np.ndarray] = {}
        overrides: Dict[str, str] = {}

        def store(name: str, w: np.ndarray, canonical: str) -> None:
            try:
                pieces, kinds = _converted(w, settings["lm_head"] if canonical == "lm_head" else dtype, settings)
            except ValueError as error:  # a weight int8 / int4 cannot hold: name the tensor
                raise ValueError(f"{md.path}: tensor {name}: {error}") from None
            for suffix, array in pieces:
                out[name + suffix] = array
                if suffix in kinds:
                    overrides[name + suffix] = kinds[suffix]

        for name in _progress(names, progress, f"converting to {dtype}"):
            stored, shape = md.tensor_info(name)
            if stored in _FLOATS and name in matrices:
                canonical, tensor = matrices[name]
                w = md.tensor(name)
                if tensor.stored_shape is not None:  # head axes split: [out or in, rest]
                    w = w.reshape(w.shape[0], -1)
                if tensor.transpose:
                    w = np.ascontiguousarray(w.T)
                store(name, w, canonical)
                md.release(name)
            elif stored in _FLOATS:
                out[name] = md.tensor(name)
            else:
                out[name] = md.tensor(name, dtype=_STORAGE_DTYPES[stored])
        if head_source is not None:
            store("lm_head.weight", md.tensor(head_source), "lm_head")
        # Everything is written into a hidden sibling directory that is renamed to dst at the end,
        # so dst either does not appear or holds a complete conversion, even if the process dies.
        dst_path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(dst_path.parent)
        work = dst_path.parent / f".{dst_path.name}{_PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with _sigterm_raises():
            work.mkdir()  # with the usual permissions (the umask's), unlike tempfile.mkdtemp
            try:
                save_safetensors(work / WEIGHTS_FILE, out, metadata={"format": "pt"}, dtypes=overrides)
                config = dict(md.config)
                config["cpuformer"] = {"dtype": dtype, "format_version": FORMAT_VERSION}
                if "int4" in (dtype, settings["lm_head"]):
                    config["cpuformer"].update(group_size=settings["group_size"], zero_point=settings["zero_point"])
                if settings["lm_head"] != dtype or dtype == "int4":
                    config["cpuformer"]["lm_head"] = settings["lm_head"]
                if settings["embeddings"] != "float32" or dtype == "int4":
                    config["cpuformer"]["embeddings"] = settings["embeddings"]
                with open(work / CONFIG_FILE, "w", encoding="utf-8") as f:
                    json.dump(config, f, indent=2)
                    f.write("\n")
                for file in _COPIED:
                    if (md.path / file).is_file():
                        shutil.copyfile(md.path / file, work / file)
                for sub in dict.fromkeys(_COPIED_DIRS + tuple(module_directories(md.path))):
                    if (md.path / sub).is_dir():
                        shutil.copytree(md.path / sub, work / sub)
                if finish is not None:
                    finish(work)
                if dst_path.is_dir():
                    dst_path.rmdir()  # empty (checked above); fails if something was put there since
                os.replace(work, dst_path)
            except BaseException:  # errors, KeyboardInterrupt, SIGTERM (see _sigterm_raises)
                shutil.rmtree(work, ignore_errors=True)
                raise
    finally:
        md.close()


# The hidden directory a conversion writes into: .<dst name>.partial-<pid>-<8 hex digits>.
_PARTIAL = ".partial-"
_PARTIAL_NAME = re.compile(r"^\..*\.partial-(\d+)-[0-9a-f]{8}$")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # not a pid at all
        return False
    return True


def remove_stale_partials(parent: pathlib.Path) -> List[pathlib.Path]:
    """Removes the hidden ``.<name>.partial-<pid>-<random>`` directories in ``parent`` whose
    process is no longer alive on this machine: what a conversion killed during its write (SIGKILL,
    power loss) leaves behind. Directories of live processes (a conversion running now) are left
    alone. Returns the removed paths."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = _PARTIAL_NAME.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and not _process_alive(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(pathlib.Path(entry.path))
    return removed


class _SigtermRaised(SystemExit):
    """SIGTERM turned into an exception, so that cleanup code runs before the process exits."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the block runs on the main thread, SIGTERM raises SystemExit(143) (the exit status of a
    process killed by SIGTERM) instead of ending the process at once, so the block's cleanup runs.
    Only replaces the default action: a handler the program installed (or SIG_IGN) stays in charge.
    The previous handler is restored afterwards. Elsewhere (other threads, no SIGTERM) a no-op."""
    if (threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM")
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise _SigtermRaised(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except (ValueError, OSError):  # e.g. an embedded interpreter without signal support
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["DTYPES", "EMBEDDING_DTYPES", "GROUP_SIZES", "QUANTIZATION_KEYS", "Checkpoint", "check_dtype",
           "check_quantization", "convert", "convert_checkpoints", "graph_format", "load_layers", "resolve_dtype",
           "stored_dtype"]
