"""Opening Hugging Face model directories: config validation and safetensors weights via mmap.

A model directory holds ``config.json``, the weights as ``model.safetensors`` or as shards listed
by ``model.safetensors.index.json`` (``{"weight_map": {tensor name: shard file name}}``), and
optionally ``generation_config.json`` and ``tokenizer.json``.

The safetensors format
----------------------
::

    [8 bytes]  N, unsigned 64-bit little-endian: the header's length in bytes
    [N bytes]  UTF-8 JSON object (writers pad it with spaces so the data starts 8-byte aligned):
               {"name": {"dtype": "F32", "shape": [768, 768], "data_offsets": [begin, end]},
                ..., "__metadata__": {"str": "str"}}
    [rest]     the data region; ``data_offsets`` are relative to its first byte, little-endian

Parsing is strict about anything that could make a read go wrong: the header length must fit in
the file (and under 100 MB, so a hostile length cannot make us allocate), every range must lie in
the data region, ``end - begin`` must equal ``prod(shape) * itemsize``, dtypes must be known,
shapes must be lists of non-negative integers whose byte size is possible. As in the reference
reader (the ``safetensors`` library), the ranges sorted by offset must tile the data region
exactly: no two tensors share a byte (an empty tensor inside another's range counts), and no byte
belongs to no tensor (no gap, nothing after the last tensor); the C API's reader
(csrc/io/safetensors.cc) applies the same rule with the same messages. Duplicate JSON keys are
rejected (the reference reader keeps the last) rather than silently resolved. The header is read
once (at most its length, which is at most the file's size) and parsed into Python objects. Every
failure is a ValueError naming the file and what is wrong; a missing file is a FileNotFoundError
naming the path. Files are opened with O_NONBLOCK and must be regular files, so a FIFO or device
cannot hang the loader.

mmap and zero copy
------------------
Each weights file is mapped read-only (``MAP_SHARED``) once. ``tensor()`` returns NumPy arrays
whose buffer *is* the mapping, so an F32 tensor read as float32 costs no copy and no memory beyond
the page cache, which the kernel shares between processes loading the same model. The arrays are
read-only because the mapping is. F16, BF16 and F64 tensors read as float32 are converted into new
(read-only) arrays; a tensor whose offset is not a multiple of its item size (possible after an odd
number of 1- or 2-byte elements) is copied into an aligned array so kernels never see misaligned
pointers. ``release(name)`` tells the kernel that the process no longer needs a tensor's pages
(``madvise(MADV_DONTNEED)``) once a model has packed its own copy: resident memory drops, the view
stays valid and faults the pages back in from the file if read again.

``close()`` drops the mappings. A mapping still referenced by an array that was handed out cannot
be unmapped (Python refuses to close an mmap with live buffer exports); it is then unmapped when
the last such array is freed, so a stale array can never point at unmapped memory. Like every
mmap-based reader, a ModelDir assumes nobody truncates or rewrites the files while they are
mapped (reading a page beyond the new end of a file raises SIGBUS; a MAP_SHARED page shows what
is written to the file). The models therefore copy or pack every tensor they use and close their
ModelDir when loading ends; ``tensor_info``, ``names`` and the configs stay available after
``close()`` (they were read at open).
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import pathlib
import reprlib
import stat
import struct
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__all__ = ["ModelDir", "config_int", "config_float", "save_safetensors"]

PathLike = Union[str, "os.PathLike[str]"]

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"

#: Largest safetensors header accepted (the reference implementation uses the same limit).
MAX_HEADER_BYTES = 100 * 1000 * 1000
#: Largest JSON side file (config, generation config, index) accepted; real ones are kilobytes.
MAX_JSON_FILE_BYTES = 64 * 1000 * 1000
#: NumPy's lowest supported maximum rank (32 before NumPy 2).
MAX_RANK = 32
#: Bound on prod(non-zero dims) * itemsize: NumPy refuses larger arrays even when a dim is 0.
_MAX_SHAPE_BYTES = 1 << 62

# safetensors dtype -> NumPy storage dtype (little-endian). BF16 and the F8 formats have no NumPy
# type; they are stored as raw unsigned bits, readable zero-copy as uint16 / uint8. The sub-byte
# formats (F4, F6_*) are not supported.
_STORAGE_DTYPES: Dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E4M3FNUZ": np.dtype("u1"),
    "F8_E5M2": np.dtype("u1"),
    "F8_E5M2FNUZ": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
}
_SUPPORTED_DTYPES = ", ".join(sorted(_STORAGE_DTYPES))
# Stored dtypes that tensor(..., dtype=np.float32) converts (everything else must match exactly).
_CONVERTIBLE_TO_F32 = ("F16", "BF16", "F64")

# NumPy dtype -> safetensors dtype, for the writer.
_NUMPY_TO_SAFETENSORS: Dict[np.dtype, str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.int32): "I32",
    np.dtype(np.float32): "F32",
    np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64",
    np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
}

# Bounded repr for values taken from untrusted files: never huge, never deeply recursive.
_short_repr = reprlib.Repr()
_short_repr.maxstring = 200
_short_repr.maxother = 200
_short_repr.maxlong = 60
_short_repr.maxlist = _short_repr.maxtuple = 8
_short_repr.maxdict = 4
_short_repr.maxlevel = 3


def _describe(value: Any) -> str:
    """repr(value), shortened so an error message stays readable whatever the file contains."""
    try:
        return _short_repr.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


def _is_int(value: Any) -> bool:
    """A JSON integer (bool is an int subclass in Python, but not an integer in JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------

def _open_regular_file(path: pathlib.Path) -> int:
    """Opens ``path`` read-only and returns the descriptor; FileNotFoundError if it is missing,
    ValueError if it is not a regular file. O_NONBLOCK: opening a FIFO must not wait for a writer."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    except OSError as error:  # names a file can never have; permission errors stay OSErrors
        if error.errno in (errno.ENAMETOOLONG, errno.ELOOP, errno.ENXIO, errno.ENODEV):
            raise ValueError(f"{path}: cannot be opened ({os.strerror(error.errno)})") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parse_json(data: bytes, path: pathlib.Path, *, reject_duplicate_keys: bool) -> Any:
    """Parses UTF-8 JSON; any defect becomes a ValueError naming ``path``."""

    def no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
        result: Dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {_describe(key)}")
            result[key] = value
        return result

    try:
        text = data.decode("utf-8")
        if reject_duplicate_keys:
            return json.loads(text, object_pairs_hook=no_duplicates)
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: invalid JSON (nested too deeply)") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, int digit limit, duplicates
        raise ValueError(f"{path}: invalid JSON ({error})") from None


def _read_json(path: pathlib.Path, *, reject_duplicate_keys: bool = False) -> Any:
    """Reads any JSON value from a regular file of at most MAX_JSON_FILE_BYTES; ValueError naming
    the file for every defect."""
    fd = _open_regular_file(path)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_JSON_FILE_BYTES:
            raise ValueError(f"{path}: {size} bytes is larger than the {MAX_JSON_FILE_BYTES} byte limit "
                             "for a JSON file")
        chunks = []
        remaining = size
        while remaining > 0:  # read at most the size fstat reported, even if the file grows
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    return _parse_json(b"".join(chunks), path, reject_duplicate_keys=reject_duplicate_keys)


def _read_json_object(path: pathlib.Path, *, reject_duplicate_keys: bool = False) -> Dict[str, Any]:
    """Reads a JSON file whose top level must be an object."""
    value = _read_json(path, reject_duplicate_keys=reject_duplicate_keys)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must contain a JSON object, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------------------------
# One safetensors file
# --------------------------------------------------------------------------------------------

class _TensorEntry:
    """Where one tensor lives: its file, dtype, shape and absolute byte range in the file."""

    __slots__ = ("file", "dtype", "shape", "start", "stop")

    def __init__(self, file: "_SafetensorsFile", dtype: str, shape: Tuple[int, ...], start: int, stop: int):
        self.file = file
        self.dtype = dtype
        self.shape = shape
        self.start = start  # absolute offsets in the file, i.e. header length + 8 + data_offsets
        self.stop = stop


def _element_count(shape: Sequence[int], itemsize: int) -> Optional[int]:
    """prod(shape), or None when the non-zero dims alone describe an impossible byte size."""
    count = 1
    nonzero_bytes = itemsize
    for dim in shape:
        if dim == 0:
            count = 0
        else:
            nonzero_bytes *= dim
            if nonzero_bytes > _MAX_SHAPE_BYTES:
                return None
            count *= dim
    return count


class _SafetensorsFile:
    """A mapped, validated safetensors file."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.tensors: Dict[str, _TensorEntry] = {}
        self.metadata: Dict[str, str] = {}
        fd = _open_regular_file(path)
        try:
            size = os.fstat(fd).st_size
            if size < 8:
                raise ValueError(f"{path}: file is {size} bytes, too short for the 8-byte header length "
                                 "(truncated or not a safetensors file)")
            header_length = struct.unpack("<Q", os.pread(fd, 8, 0))[0]
            if header_length > size - 8:
                raise ValueError(f"{path}: header length {header_length} is beyond the end of the file "
                                 f"({size} bytes; truncated or not a safetensors file)")
            if header_length > MAX_HEADER_BYTES:
                raise ValueError(f"{path}: header length {header_length} exceeds the limit of "
                                 f"{MAX_HEADER_BYTES} bytes")
            # Map exactly the size fstat saw: mmap raises ValueError if the file shrank since.
            try:
                self.map: Optional[mmap.mmap] = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            except (ValueError, OSError) as error:
                raise ValueError(f"{path}: cannot map the file ({error})") from None
        finally:
            os.close(fd)
        try:
            self._parse_header(self.map[8:8 + header_length], data_start=8 + header_length, size=size)
        except BaseException:
            self.close()
            raise

    def _parse_header(self, header_bytes: bytes, *, data_start: int, size: int) -> None:
        path = self.path
        header = _parse_json(header_bytes, path, reject_duplicate_keys=True)
        if not isinstance(header, dict):
            raise ValueError(f"{path}: header must be a JSON object, got {type(header).__name__}")
        data_length = size - data_start
        ranges: List[Tuple[int, int, int, str]] = []  # (begin, end, header position, name)
        for name, info in header.items():
            if name == "__metadata__":
                self.metadata = self._parse_metadata(info)
                continue
            where = f"{path}: tensor {_describe(name)}"
            if not isinstance(info, dict):
                raise ValueError(f"{where}: entry must be a JSON object, got {type(info).__name__}")
            for key in ("dtype", "shape", "data_offsets"):
                if key not in info:
                    raise ValueError(f"{where}: missing {key!r}")
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            if not isinstance(dtype, str) or dtype not in _STORAGE_DTYPES:
                raise ValueError(f"{where}: unknown or unsupported dtype {_describe(dtype)} "
                                 f"(supported: {_SUPPORTED_DTYPES})")
            if not isinstance(shape, list) or not all(_is_int(dim) for dim in shape):
                raise ValueError(f"{where}: shape must be a list of integers, got {_describe(shape)}")
            if len(shape) > MAX_RANK:
                raise ValueError(f"{where}: shape has {len(shape)} dimensions, more than {MAX_RANK}")
            if any(dim < 0 for dim in shape):
                raise ValueError(f"{where}: shape {_describe(shape)} has a negative dimension")
            itemsize = _STORAGE_DTYPES[dtype].itemsize
            count = _element_count(shape, itemsize)
            if count is None:
                raise ValueError(f"{where}: shape {_describe(shape)} is absurdly large")
            if (not isinstance(offsets, list) or len(offsets) != 2
                    or not all(_is_int(offset) for offset in offsets)):
                raise ValueError(f"{where}: data_offsets must be a list of two integers, got "
                                 f"{_describe(offsets)}")
            begin, end = offsets
            if not 0 <= begin <= end:
                raise ValueError(f"{where}: data_offsets {_describe(offsets)} must satisfy 0 <= begin <= end")
            if end > data_length:
                raise ValueError(f"{where}: data_offsets {_describe(offsets)} are out of range: the data "
                                 f"region is {data_length} bytes (file truncated or offsets wrong)")
            if end - begin != count * itemsize:
                raise ValueError(f"{where}: data_offsets {_describe(offsets)} span {end - begin} bytes, but "
                                 f"shape {list(shape)} of {dtype} needs {count * itemsize}")
            self.tensors[name] = _TensorEntry(self, dtype, tuple(shape), data_start + begin, data_start + end)
            ranges.append((begin, end, len(ranges), name))
        self._check_layout(ranges, data_length)

    def _check_layout(self, ranges: List[Tuple[int, int, int, str]], data_length: int) -> None:
        """The reference reader's layout rule: sorted by offsets (ties in header order), each range
        begins where the previous one ends, and the last ends at the end of the data region."""
        reach, reached_by = 0, ""  # where the ranges so far end, and the tensor that ends there
        for begin, end, _, name in sorted(ranges):
            if begin < reach:
                raise ValueError(f"{self.path}: tensors {_describe(reached_by)} and {_describe(name)} overlap: "
                                 f"{_describe(name)} begins at byte {begin}, before {_describe(reached_by)} "
                                 f"ends at byte {reach}")
            if begin > reach:
                raise ValueError(f"{self.path}: bytes [{reach}, {begin}) of the data section belong to no tensor "
                                 f"(a gap before tensor {_describe(name)}); the tensors must cover the data "
                                 "section exactly")
            reach, reached_by = end, name
        if reach != data_length:
            raise ValueError(f"{self.path}: bytes [{reach}, {data_length}) of the data section belong to no tensor "
                             "(after the last one); the tensors must cover the data section exactly")

    def _parse_metadata(self, info: Any) -> Dict[str, str]:
        if info is None:
            return {}
        if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
            raise ValueError(f"{self.path}: __metadata__ must be an object of strings, got {_describe(info)}")
        return info

    def close(self) -> None:
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass  # arrays still view the map: it is unmapped when the last of them is freed
            self.map = None


# --------------------------------------------------------------------------------------------
# The model directory
# --------------------------------------------------------------------------------------------

def _absent(path: pathlib.Path) -> str:
    """Why a path that exists() denies is missing: a symbolic link to nothing (dangling, or a loop)
    is named as such rather than as a file that is not there."""
    if path.is_symlink():
        return "is a symbolic link that leads nowhere (its target is missing, or the links form a loop)"
    return "does not exist"


class ModelDir:
    """An opened Hugging Face model directory.

    ``ModelDir(path)`` reads and validates ``config.json``, ``generation_config.json`` (if any) and
    every safetensors header, and maps the weights files; tensors are read lazily by ``tensor()``.
    Raises FileNotFoundError when the directory, ``config.json`` or a weights file is missing and
    ValueError when a file is corrupt; both messages name the file.
    """

    path: pathlib.Path
    config: Dict[str, Any]
    generation_config: Dict[str, Any]
    tokenizer_path: Optional[pathlib.Path]

    def __init__(self, path: PathLike):
        self.path = pathlib.Path(os.fspath(path))
        self._files: List[_SafetensorsFile] = []
        self._tensors: Dict[str, _TensorEntry] = {}
        self._closed = False
        self._weights_source = self.path / WEIGHTS_FILE  # or the index: named by "has no tensor" errors
        if not self.path.exists():
            raise FileNotFoundError(f"model directory {self.path} {_absent(self.path)}")
        if not self.path.is_dir():
            raise FileNotFoundError(f"model directory {self.path} is not a directory")
        config_path = self.path / CONFIG_FILE
        if not config_path.exists():
            raise FileNotFoundError(f"{config_path} {_absent(config_path)}: a model directory needs {CONFIG_FILE}")
        self.config = _read_json_object(config_path)
        generation_path = self.path / GENERATION_CONFIG_FILE
        self.generation_config = _read_json_object(generation_path) if generation_path.exists() else {}
        tokenizer_path = self.path / TOKENIZER_FILE
        self.tokenizer_path = tokenizer_path if tokenizer_path.is_file() else None
        try:
            self._open_weights()
        except BaseException:
            self.close()
            raise

    def _open_weights(self) -> None:
        single = self.path / WEIGHTS_FILE
        index = self.path / WEIGHTS_INDEX_FILE
        if single.exists():
            self._add_file(_SafetensorsFile(single))
            return
        if not index.exists():
            hint = ""
            if (self.path / "pytorch_model.bin").exists():
                hint = (" (pytorch_model.bin is not read: save the model with "
                        "save_pretrained(..., safe_serialization=True))")
            raise FileNotFoundError(f"no weights in {self.path}: expected {WEIGHTS_FILE} or "
                                    f"{WEIGHTS_INDEX_FILE}{hint}")
        self._weights_source = index
        weight_map = self._read_index(index)
        shards: Dict[str, _SafetensorsFile] = {}
        for shard_name in dict.fromkeys(weight_map.values()):  # first-appearance order
            shard_path = self.path / shard_name
            try:
                shards[shard_name] = shard = _SafetensorsFile(shard_path)
            except FileNotFoundError:
                raise FileNotFoundError(f"{shard_path} does not exist: {WEIGHTS_INDEX_FILE} names it "
                                        "as a shard") from None
            self._add_file(shard)
        for name, shard_name in weight_map.items():
            if name not in shards[shard_name].tensors:
                raise ValueError(f"{index}: maps tensor {_describe(name)} to {shard_name}, which has no such tensor")

    def _read_index(self, index: pathlib.Path) -> Dict[str, str]:
        content = _read_json_object(index, reject_duplicate_keys=True)
        weight_map = content.get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: 'weight_map' must be an object of tensor name -> shard file, "
                             f"got {_describe(weight_map)}")
        if not weight_map:
            raise ValueError(f"{index}: 'weight_map' names no tensors")
        for name, shard_name in weight_map.items():
            if not isinstance(shard_name, str):
                raise ValueError(f"{index}: shard for tensor {_describe(name)} must be a file name, "
                                 f"got {_describe(shard_name)}")
            if (shard_name in ("", ".", "..") or "/" in shard_name or "\\" in shard_name
                    or "\0" in shard_name):
                raise ValueError(f"{index}: shard {_describe(shard_name)} for tensor {_describe(name)} must "
                                 "be a plain file name in the model directory")
        return weight_map

    def _add_file(self, file: _SafetensorsFile) -> None:
        self._files.append(file)
        for name, entry in file.tensors.items():
            other = self._tensors.get(name)
            if other is not None:
                raise ValueError(f"tensor {_describe(name)} is in both {other.file.path} and {file.path}")
            self._tensors[name] = entry

    # ---- queries ---------------------------------------------------------------------------

    def names(self) -> List[str]:
        """All tensor names, file by file, each file in header order."""
        return list(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def _entry(self, name: str) -> _TensorEntry:
        entry = self._tensors.get(name)
        if entry is None:
            raise ValueError(f"{self._weights_source} has no tensor {_describe(name)}")
        return entry

    def tensor_info(self, name: str) -> Tuple[str, Tuple[int, ...]]:
        """(safetensors dtype such as "F32", shape) without reading the data."""
        entry = self._entry(name)
        return entry.dtype, entry.shape

    def tensor(self, name: str, shape: Optional[Sequence[int]] = None,
               dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The tensor as a read-only C-contiguous array.

        ``shape``: if given, the stored shape must equal it (ValueError otherwise).
        ``dtype``: the stored dtype's NumPy type gives a zero-copy view of the mapping (raw bits as
        uint16 for BF16, uint8 for F8 formats); float32 from F16 / BF16 / F64 converts (a copy);
        anything else is a ValueError.
        """
        entry = self._entry(name)
        if shape is not None:
            expected = tuple(int(dim) for dim in shape)
            if expected != entry.shape:
                raise ValueError(f"tensor {_describe(name)} has shape {list(entry.shape)}, "
                                 f"expected {list(expected)}")
        wanted = np.dtype(dtype)
        storage = _STORAGE_DTYPES[entry.dtype]
        convert = wanted == np.float32 and entry.dtype in _CONVERTIBLE_TO_F32
        if not convert and wanted != storage:
            readable = f"{storage} or float32" if entry.dtype in _CONVERTIBLE_TO_F32 else f"{storage} only"
            raise ValueError(f"tensor {_describe(name)} is stored as {entry.dtype}, which reads as {readable}, "
                             f"not as {wanted}")
        stored = self._view(entry, storage)
        if convert:
            if entry.dtype == "BF16":  # bfloat16 is the top half of a float32
                widened = stored.astype(np.uint32)
                widened <<= 16  # in place: an operator would turn a 0-d array into a NumPy scalar
                result = widened.view(np.float32)
            else:
                # IEEE conversion: F64 beyond float32's range becomes ±inf, a signalling NaN a quiet one
                with np.errstate(over="ignore", invalid="ignore"):
                    result = stored.astype(np.float32)
            result.flags.writeable = False
            return result
        return stored

    def _view(self, entry: _TensorEntry, storage: np.dtype) -> np.ndarray:
        """The stored bytes as an array of ``storage`` (a view of the map when aligned)."""
        mapping = entry.file.map
        if self._closed or mapping is None:
            raise ValueError(f"{self.path}: the model directory is closed")
        count = (entry.stop - entry.start) // storage.itemsize
        if count == 0:
            array = np.empty(entry.shape, dtype=storage)
            array.flags.writeable = False
            return array
        array = np.frombuffer(mapping, dtype=storage, count=count, offset=entry.start).reshape(entry.shape)
        if entry.start % storage.itemsize != 0:
            array = array.copy()  # misaligned in the file: kernels get an aligned copy
            array.flags.writeable = False
        return array

    def release(self, name: str) -> None:
        """Drops the tensor's pages from resident memory (madvise MADV_DONTNEED on the whole pages
        inside its byte range). Arrays viewing it stay valid: pages fault back in from the file if
        read again. A no-op where madvise is unavailable."""
        entry = self._entry(name)
        mapping = entry.file.map
        if self._closed or mapping is None:
            raise ValueError(f"{self.path}: the model directory is closed")
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None or not hasattr(mapping, "madvise"):
            return
        page = mmap.PAGESIZE
        first = -(-entry.start // page) * page  # round up: never drop a neighbour's page
        last = entry.stop // page * page
        if last > first:
            mapping.madvise(advice, first, last - first)

    # ---- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the maps. Arrays handed out must not be used afterwards (while any is alive its
        map stays mapped, so such use reads the file rather than crashing)."""
        self._closed = True
        for file in self._files:
            file.close()

    def __enter__(self) -> "ModelDir":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._tensors)} tensors"
        return f"ModelDir({str(self.path)!r}, {state})"


# --------------------------------------------------------------------------------------------
# Config values
# --------------------------------------------------------------------------------------------

class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


def _range_text(minimum: Optional[float], maximum: Optional[float]) -> str:
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    return (" " + " and ".join(parts)) if parts else ""


def _lookup(config: Mapping[str, Any], key: str, default: Any, source: str,
            aliases: Sequence[str] = ()) -> Tuple[bool, Any, str]:
    """(found, value, the key it was found under); a null value counts as absent, as in Hugging
    Face configs. ``aliases``: other names of the same setting (transformers' attribute_map, such
    as DistilBERT's hidden_size for dim); a config that gives several of them with different
    values is refused, because which one transformers uses depends on the order of the keys."""
    if not isinstance(config, Mapping):
        raise ValueError(f"{source}: must be a JSON object, got {type(config).__name__}")
    found_key, value = key, config.get(key)
    for alias in aliases:
        other = config.get(alias)
        if other is None:
            continue
        if value is None:
            found_key, value = alias, other
        elif other != value or isinstance(other, bool) != isinstance(value, bool):
            raise ValueError(f"{source}: {found_key!r} ({_describe(value)}) and {alias!r} ({_describe(other)}) "
                             "name the same setting but differ; keep one of them")
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{source}: {key!r} is missing")
        return False, default, key
    return True, value, found_key


def config_int(config: Mapping[str, Any], key: str, *, default: Any = _REQUIRED, minimum: Optional[int] = 1,
               maximum: Optional[int] = 1 << 31, source: str = "config.json", aliases: Sequence[str] = (),
               note: str = "") -> int:
    """``config[key]`` (or one of its ``aliases``) as an int in [minimum, maximum] (either bound
    may be None).

    A missing or null key returns ``default`` (unchecked), or raises ValueError
    "config.json: 'hidden_size' is missing" when there is none. Integral floats such as 768.0 are
    accepted; other values raise e.g. "config.json: 'hidden_size' must be an integer >= 1, got -3"
    (``note`` is appended to the range: why the bound is what it is).
    """
    found, value, key = _lookup(config, key, default, source, aliases)
    if not found:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{source}: {key!r} must be an integer{_range_text(minimum, None)}{note}, "
                         f"got {_describe(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{source}: {key!r} must be an integer{_range_text(minimum, maximum)}{note}, "
                         f"got {_describe(value)}")
    return value


def config_float(config: Mapping[str, Any], key: str, *, default: Any = _REQUIRED,
                 minimum: Optional[float] = None, maximum: Optional[float] = None,
                 source: str = "config.json", aliases: Sequence[str] = ()) -> float:
    """``config[key]`` (or one of its ``aliases``) as a finite float in [minimum, maximum] (None =
    unbounded); integers are accepted. Missing or null: ``default`` or ValueError "... is
    missing"; otherwise e.g. "config.json: 'layer_norm_eps' must be a finite number >= 0, got -1"."""
    found, value, key = _lookup(config, key, default, source, aliases)
    if not found:
        return value
    valid = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
             and (minimum is None or value >= minimum) and (maximum is None or value <= maximum))
    if not valid:
        raise ValueError(f"{source}: {key!r} must be a finite number{_range_text(minimum, maximum)}, "
                         f"got {_describe(value)}")
    return float(value)


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def config_token_ids(config: Mapping[str, Any], key: str, *, vocab_size: Optional[int] = None,
                     source: str = "config.json", single: bool = False) -> Optional[List[int]]:
    """``config[key]``, a token id or a list of token ids (as transformers allows for
    eos_token_id), as a list; None when the key is missing or null. ``single``: only one id (a list
    is refused).

    Every id must be a JSON integer — not a float such as 2.0 (transformers refuses those too), a
    bool, a string, a nested list or an object — in [0, vocab_size) when ``vocab_size`` is given,
    else within int64 (the C++ field; such ids are range-checked where they are used). Otherwise
    ValueError naming the file and the key, e.g. "generation_config.json: 'eos_token_id' must be a
    token id or a list of token ids (integers in [0, 99)), got 'abc'".
    """
    found, value, _ = _lookup(config, key, None, source)
    if not found:
        return None
    values = value if isinstance(value, list) and not single else [value]
    valid = all(_is_int(v) and (0 <= v < vocab_size if vocab_size is not None else _INT64_MIN <= v <= _INT64_MAX)
                for v in values)
    if not valid:
        what = "a token id" if single else "a token id or a list of token ids"
        where = f"in [0, {vocab_size})" if vocab_size is not None else "within int64"
        raise ValueError(f"{source}: {key!r} must be {what} ({'an integer' if single else 'integers'} {where}), "
                         f"got {_describe(value)}")
    return list(values)


def config_token_id(config: Mapping[str, Any], key: str, *, vocab_size: Optional[int] = None,
                    source: str = "config.json") -> Optional[int]:
    """``config[key]`` as one token id (see config_token_ids), or None when missing or null."""
    ids = config_token_ids(config, key, vocab_size=vocab_size, source=source, single=True)
    return None if ids is None else ids[0]


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------

def save_safetensors(path: PathLike, tensors: Mapping[str, np.ndarray], metadata: Optional[Mapping[str, str]] = None,
                     *, dtypes: Optional[Mapping[str, str]] = None) -> None:
    """Writes ``tensors`` to a safetensors file, in the given order, contiguously.

    dtypes follow the arrays (bool, uint8/16/32/64, int8/16/32/64, float16/32/64, complex64).
    ``dtypes`` overrides the stored dtype per tensor for types NumPy lacks: {"name": "BF16"} with
    the bfloat16 bits as a uint16 array, {"name": "F8_E4M3"} (or another F8 format) with uint8 bits.
    ``metadata`` becomes "__metadata__" (str -> str). The header is padded with spaces so the data
    starts 8-byte aligned.
    """
    dtypes = dict(dtypes or {})
    unknown = set(dtypes) - set(tensors)
    if unknown:
        raise ValueError(f"dtypes names tensors that are not being saved: {sorted(unknown)}")
    header: Dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    arrays: List[np.ndarray] = []
    offset = 0
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"invalid tensor name {_describe(name)}")
        array = np.asarray(value)
        natural = _NUMPY_TO_SAFETENSORS.get(array.dtype.newbyteorder("="))
        if natural is None:
            raise TypeError(f"tensor {name!r}: cannot store NumPy dtype {array.dtype} in safetensors")
        stored = dtypes.get(name, natural)
        storage = _STORAGE_DTYPES.get(stored)
        if storage is None or storage.kind + str(storage.itemsize) != array.dtype.kind + str(array.dtype.itemsize):
            raise ValueError(f"tensor {name!r}: dtype override {stored!r} needs an array of "
                             f"{storage if storage is not None else 'a supported dtype'}, got {array.dtype}")
        array = np.asarray(array, dtype=storage, order="C")  # little-endian, C order, keeps 0-d
        header[name] = {"dtype": stored, "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(os.fspath(path), "wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for array in arrays:
            if array.nbytes:
                out.write(array.reshape(-1).view(np.uint8).data)
