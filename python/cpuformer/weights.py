"""Weights: the dtype policy, the one loader that turns a checkpoint into canonical arrays, and the
converted-directory format (read here, written by ``convert``).

Loading reads what an architecture declares (``arch``): every canonical weight from its checkpoint
tensor, with the declared edits applied once (transpose, row block of a fused tensor, ``1 + w``).
Which tensor and which edits is decided by the C++ core (csrc/models/arch/checkpoint.h), as for
the C API: see ``Checkpoint``. A checkpoint tensor that is neither declared nor knowingly ignored
is an error naming it, raised before any weight is read. ``load_layers`` hands the model one
layer at a time and releases that layer's pages right after, so loading peaks near one copy of
the weights.

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
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import _core
from ._model_dir import _STORAGE_DTYPES, CONFIG_FILE, WEIGHTS_FILE, ModelDir, save_safetensors
from ._sentence import module_directories
from .arch import MATMUL, Arch, Hparams, Source, Tensor, find
from .arch.heads import Head
from .arch.native import NativeArch

DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
FORMAT_VERSION = 1
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
    dtype, int4 group size and zero points). ``head``: a task head (or an image model's tensors)
    to read and account for besides the body.

    The procedure that applies the declarations to the checkpoint is the C++ core's, the one the
    C API loads with (csrc/models/arch/checkpoint.h): it picks the body's tensor prefix, decides
    the LM head (tied, untied, or a converted directory's stored copy), names the checkpoint tensor
    and edits behind each canonical weight, and checks every tensor (missing, stray, shape, dtype,
    a converted weight's scales, tied copies) before anything is read. For the families of the
    C++ registry (``arch.native.NativeArch``: every text family) it also holds the declarations
    (``_core.checkpoint_tensors``); the image and CLIP families, declared in Python, hand theirs
    over (``_core.declared_tensors``). Its answer, graph-manifest tensor entries (docs/c-api.md),
    is ``entries``; the arrays are read from it.
    """

    def __init__(self, md: ModelDir, arch: Arch, hp: Hparams, stored: Optional[str], head: Optional[Head] = None,
                 settings: Optional[Mapping[str, Any]] = None):
        self.md, self.arch, self.hp, self.stored, self.head = md, arch, hp, stored, head
        self.settings = dict(settings) if settings is not None else check_quantization(None, stored or "float32")
        self.config = md.config
        self.top = dict(arch.model_tensors(self.config, hp))
        self._format = None if stored is None else graph_format(stored, self.settings)
        self._head_entries: Optional[Dict[str, Any]] = None
        if isinstance(arch, NativeArch):
            plan = _core.checkpoint_tensors(os.fspath(md.path), self.config, self._format)
            #: {"model": {canonical: entry} (each stack's under "<stack>."), "<stack>": [{canonical:
            #: entry} per layer]}: where each canonical weight comes from.
            self.entries: Dict[str, Any] = plan["tensors"]
        else:
            stacks = self.arch.stacks(hp)
            groups = [self.top] + ([dict(head.tensors)] if head is not None else [])
            for stack, count in stacks:
                groups.append(self.stack_sources(stack))
                groups += [self.layer_sources(stack, layer) for layer in range(count)]
            plan = self._declared(groups, arch.prefixes, dict(head.shapes) if head is not None else {}, True)
            read = iter(plan["groups"])
            model = dict(next(read))
            if head is not None:
                self._head_entries = next(read)
            self.entries = {"model": model}
            for stack, count in stacks:
                model.update({f"{stack}.{key}": entry for key, entry in next(read).items()})
                self.entries[stack] = [next(read) for _ in range(count)]
        #: The body's tensor prefix in this checkpoint ("" or one of arch.prefixes).
        self.prefix: str = plan["prefix"]
        #: The stored lm_head.weight that a tied head leaves unread, else None.
        self.head_ignored: Optional[str] = plan["head_ignored"] or None

    def _declared(self, groups: List[Mapping[str, Source]], prefixes: Iterable[str],
                  shapes: Mapping[str, Tuple[int, ...]], account: bool) -> Dict[str, Any]:
        spec = {"title": self.arch.title, "prefixes": list(prefixes), "ignored": list(self.arch.ignored),
                "tied_copies": [list(pair) for pair in self.arch.tied_copies], "hparams": self.hp.as_dict(),
                "shapes": {name: list(shape) for name, shape in shapes.items()}, "groups": [dict(g) for g in groups],
                "account": account}
        return _core.declared_tensors(os.fspath(self.md.path), spec, self._format)

    # ---- names -----------------------------------------------------------------------------

    def checkpoint_name(self, tensor: Tensor) -> Optional[str]:
        """The name ``tensor`` has in this checkpoint (its first present fallback), or None when it
        is absent."""
        for name in (tensor.name,) + tensor.fallbacks:
            full = name if tensor.root else self.prefix + name
            if full in self.md:
                return full
        return None

    def stack_sources(self, stack: str) -> Dict[str, Source]:
        return dict(self.arch.stack_tensors(self.config, self.hp, stack))

    def layer_sources(self, stack: str, layer: int) -> Dict[str, Source]:
        return dict(self.arch.layer_tensors(self.hp, stack, layer))

    # ---- arrays ----------------------------------------------------------------------------

    def model_arrays(self) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """The model-level arrays (each stack's under ``"<stack>."``) and the checkpoint names read."""
        return self._read_entries(self.entries["model"])

    def layer_arrays(self, stack: str, layer: int) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """One layer's arrays and the checkpoint names read."""
        return self._read_entries(self.entries[stack][layer])

    def read(self, sources: Mapping[str, Source],
             shapes: Optional[Mapping[str, Tuple[int, ...]]] = None) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """(canonical name -> array, the checkpoint names read) for more declarations under this
        checkpoint's prefix (an image model's extra tensors). Matrix weights of a converted
        directory come as stored (int8 with ``<canonical>_scale``, int4 nibble pairs with
        ``<canonical>_scale`` and maybe ``<canonical>_zero``, or 16-bit words); everything else is
        float32. shapes: the canonical shapes of names ``canonical_shape`` does not know."""
        plan = self._declared([sources], (self.prefix,), shapes or {}, False)
        return self._read_entries(plan["groups"][0])

    def read_head(self) -> Dict[str, np.ndarray]:
        """The task head's weights (float32 copies: they outlive the weight maps)."""
        assert self.head is not None
        if self._head_entries is not None:
            arrays, _ = self._read_entries(self._head_entries)
        else:
            arrays, _ = self.read(self.head.tensors, self.head.shapes)
        return {name: np.array(array, dtype=np.float32) for name, array in arrays.items()}

    def matrices(self) -> Dict[str, Tuple[str, bool]]:
        """checkpoint name -> (canonical name, stored transposed), for every matrix weight the model
        multiplies with (what ``convert`` quantizes)."""
        out: Dict[str, Tuple[str, bool]] = {}
        layers = [entries for stack, _ in self.arch.stacks(self.hp) for entries in self.entries[stack]]
        for entries in [self.entries["model"]] + layers:
            for key, entry in entries.items():
                stack, _, rest = key.partition(".")
                canonical = rest if stack in self.entries and stack != "model" else key
                if canonical in MATMUL and "name" in entry:
                    out.setdefault(entry["name"], (canonical, bool(entry.get("transpose"))))
        return out

    def _read_entries(self, entries: Mapping[str, Any]) -> Tuple[Dict[str, np.ndarray], List[str]]:
        """The arrays of graph-manifest tensor entries, with the edits the C API's loader applies
        (csrc/models/graph_loader.cc): float32 (widened from F16 / BF16 / F64) transposed over the
        first axis, a block of rows, 1 + w; a converted weight's parts as stored (zero-copy views;
        16-bit words as uint16)."""
        out: Dict[str, np.ndarray] = {}
        read: Dict[Tuple[str, bool], np.ndarray] = {}  # a fused tensor is read (and widened) once
        for key, entry in entries.items():
            if "values" in entry:  # computed from the config
                out[key] = entry["values"]
                continue
            name, transpose = entry["name"], bool(entry.get("transpose"))
            array = read.get((name, transpose))
            if array is None:
                if entry["dtype"] == "float32":
                    array = self.md.tensor(name)
                else:  # int8, uint8, float16; float16 / bfloat16 words as uint16
                    array = self.md.tensor(name, dtype=_STORAGE_DTYPES[self.md.tensor_info(name)[0]])
                    array = array.view(entry["dtype"])
                if transpose:
                    array = np.ascontiguousarray(array.reshape(array.shape[0], -1).T)
                read[(name, transpose)] = array
            rows = entry.get("rows")
            if rows is not None:
                array = array[rows[0]:rows[1]]
            if entry.get("plus_one"):
                array = (array + np.float32(1)).astype(np.float32)
            out[key] = array.reshape(entry["shape"])
        return out, list(dict.fromkeys(name for name, _ in read))

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
            arrays, names = checkpoint.layer_arrays(stack, layer)
            add_layer(stack, arrays)
            del arrays
            checkpoint.release(names)


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
        checkpoint = checkpoints[0]
        matrices: Dict[str, Tuple[str, bool]] = {}
        for each in checkpoints:
            matrices.update(each.matrices())
        # A tied head is written as a quantized lm_head.weight made from the embedding table.
        model = checkpoint.entries["model"]
        head_source = None
        if "lm_head" in checkpoint.top and "lm_head" not in model:
            head_source = model["embed.tokens"]["name"]
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
                canonical, transpose = matrices[name]
                w = md.tensor(name)
                if w.ndim > 2:  # head axes split: [out or in, rest]
                    w = w.reshape(w.shape[0], -1)
                if transpose:
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
