"""``cpuformer.convert``: store a model directory's matmul weights in float16, bfloat16 or int8.

A converted directory holds exactly what quantize-at-load computes, so loading it gives the same
outputs bit for bit while reading a quarter (int8) or half (16-bit) of the weight bytes and doing
no conversion work:

- every projection weight the model classes multiply with (see docs/precision.md, "Which tensors
  are quantized"), in nn.Linear layout [out_features, in_features] — GPT-2's Conv1D weights, stored
  [in, out] by transformers, are written transposed — as
  int8: I8 ``<name>`` + F32 ``<name>_scale`` [out_features] (W ≈ q · scale per row), or
  float16 / bfloat16: an F16 / BF16 ``<name>``;
- the LM head of decoders and encoder-decoders as ``lm_head.weight``, also when it is tied to the
  embeddings (the embedding table itself stays float32);
- every other floating-point tensor as F32 (embeddings, norms, biases, T5's relative-position
  bias); other tensors as they are.

config.json gains ``"cpuformer": {"dtype": ..., "format_version": 1}``; the tokenizer and
generation files are copied. Loading a converted directory with ``dtype=None`` uses its dtype.
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
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._load import DTYPES, check_dtype, classify, stored_dtype
from ._model_dir import CONFIG_FILE, WEIGHTS_FILE, ModelDir, save_safetensors

FORMAT_VERSION = 1
_SAFETENSORS_NAME = {"int8": "I8", "float16": "F16", "bfloat16": "BF16"}
# Files copied verbatim (those present): tokenizers, generation settings, sentence-transformers.
_COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model", "source.spm",
           "target.spm", "added_tokens.json", "sentence_bert_config.json", "modules.json",
           "config_sentence_transformers.json")
_COPIED_DIRS = ("1_Pooling", "2_Normalize")
# Two-dimensional ".weight" tensors that are not matmul weights: lookups (embeddings, position
# tables) and T5's relative-position bias.
_NOT_MATMUL = ("embed", "shared.", "wte.", "wpe.", "relative_attention_bias")
_GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

PathLike = Union[str, os.PathLike]


def is_matmul_weight(name: str, shape: Sequence[int]) -> bool:
    """Whether a checkpoint tensor is a projection weight (quantized by convert)."""
    return len(shape) == 2 and name.endswith(".weight") and not any(part in name for part in _NOT_MATMUL)


def _is_conv1d(model_type: Any, name: str) -> bool:
    return model_type == "gpt2" and name.endswith(_GPT2_CONV1D)


# ---- loading converted directories ---------------------------------------------------------------

def put_weight(md: ModelDir, stored: Optional[str], tensors: Dict[str, Any], key: str, name: str,
               shape: Tuple[int, int], conv1d: bool = False) -> None:
    """tensors[key] = the matmul weight ``name`` of nn.Linear shape ``shape`` for the C++ model:
    float32 from a plain checkpoint (``conv1d``: stored transposed, as GPT-2 does), or the
    converted int8 (+ tensors[key + "_scale"]) / 16-bit words of a converted directory, as
    zero-copy views of the mapping. ValueError naming the tensor when a converted one is corrupt."""
    if stored is None:
        if conv1d:
            tensors[key] = np.ascontiguousarray(md.tensor(name, shape=shape[::-1]).T)
        else:
            tensors[key] = md.tensor(name, shape=shape)
        return
    where = f"{md.path} (converted to {stored})"
    if name not in md:
        raise ValueError(f"{where}: has no tensor {name!r}")
    expected = _SAFETENSORS_NAME.get(stored, "F32")
    dtype, have = md.tensor_info(name)
    if dtype != expected:
        raise ValueError(f"{where}: tensor {name!r} is stored as {dtype}; a {stored} directory stores it as "
                         f"{expected}")
    if tuple(have) != tuple(shape):
        raise ValueError(f"{where}: tensor {name!r} has shape {list(have)}, expected {list(shape)}")
    if stored == "float32":
        tensors[key] = md.tensor(name, shape=shape)
    elif stored == "int8":
        scale = name + "_scale"
        if scale not in md:
            raise ValueError(f"{where}: int8 tensor {name!r} has no scale tensor {scale!r}")
        scale_dtype, scale_shape = md.tensor_info(scale)
        if scale_dtype != "F32" or tuple(scale_shape) != (shape[0],):
            raise ValueError(f"{where}: scale tensor {scale!r} must be F32 of shape [{shape[0]}] (one per output "
                             f"row), got {scale_dtype} of shape {list(scale_shape)}")
        tensors[key] = md.tensor(name, shape=shape, dtype=np.int8)
        tensors[key + "_scale"] = md.tensor(scale, shape=(shape[0],))
    elif stored == "float16":
        tensors[key] = md.tensor(name, shape=shape, dtype=np.float16).view(np.uint16)
    else:
        tensors[key] = md.tensor(name, shape=shape, dtype=np.uint16)


def release_weight(md: ModelDir, name: str) -> None:
    md.release(name)
    if name + "_scale" in md:
        md.release(name + "_scale")


# ---- convert -----------------------------------------------------------------------------------

def _head_source(kind: str, architecture: str, md: ModelDir) -> Optional[str]:
    """The embedding table the loader uses as a tied LM head (written as a quantized lm_head.weight),
    or None when the checkpoint's own lm_head.weight is used (or the model has no head)."""
    config = md.config
    if kind == "decoder":
        from .generator import _decoder_config, _family

        fam = _family(config.get("model_type"), architecture)
        tied = _decoder_config(fam, config)["tie_word_embeddings"]
        if "lm_head.weight" in md and not tied:
            return None
        if fam == "gpt2":
            return "transformer.wte.weight" if "transformer.wte.weight" in md else "wte.weight"
        return "model.embed_tokens.weight"
    if kind == "seq2seq":
        if "lm_head.weight" in md:
            return None
        from .seq2seq import _family as seq2seq_family

        prefix = "" if seq2seq_family(config.get("model_type"), architecture) in ("t5", "mt5") else "model."
        return prefix + "shared.weight" if prefix + "shared.weight" in md else prefix + "encoder.embed_tokens.weight"
    return None


def _progress(items: List[str], enabled: bool, description: str) -> Iterable[str]:
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(items, desc=description, unit="tensor")
    return items


def _converted(w: np.ndarray, dtype: str) -> Tuple[List[Tuple[str, np.ndarray]], Dict[str, str]]:
    if dtype == "int8":
        q, scales = _core.quantize_int8(w)
        return [("", q), ("_scale", scales)], {}
    if dtype == "float16":
        return [("", _core.float32_to_float16_bits(w).view(np.float16))], {}
    if dtype == "bfloat16":
        return [("", _core.float32_to_bfloat16_bits(w))], {"": "BF16"}
    return [("", np.ascontiguousarray(w, dtype=np.float32))], {}


def convert(src: PathLike, dst: PathLike, dtype: str, progress: bool = True) -> None:
    """Writes a copy of the model directory ``src`` to ``dst`` with its matmul weights stored in
    ``dtype`` ("int8", "float16", "bfloat16" or "float32"), ready to load zero-copy.

    ``dst`` must not exist or be an empty directory (FileExistsError otherwise); a symbolic link is
    followed (the conversion goes where it points). ``dst`` appears only once complete (written as
    a hidden sibling ``.<name>.partial-<pid>-<random>``, then renamed); the sibling is removed on any
    error, KeyboardInterrupt or SIGTERM, and one left by a killed process is removed by the next
    conversion into the same directory. ``progress`` shows a progress bar (tqdm, when installed).
    See docs/precision.md.
    """
    if dtype is None:
        raise ValueError(f"dtype must be one of {', '.join(repr(d) for d in DTYPES)}, got None")
    check_dtype(dtype)
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
        kind, _, architecture = classify(md.config)
        already = stored_dtype(md.config)
        if already is not None:
            raise ValueError(f"{md.path} is already converted (dtype {already!r}); convert the original checkpoint")
        head = _head_source(kind, architecture, md)
        model_type = md.config.get("model_type")
        names = [n for n in md.names() if not (head is not None and n == "lm_head.weight")]
        out: Dict[str, np.ndarray] = {}
        overrides: Dict[str, str] = {}

        def store(name: str, w: np.ndarray) -> None:
            try:
                pieces, kinds = _converted(w, dtype)
            except ValueError as error:  # a non-finite weight that int8 cannot hold: name the tensor
                raise ValueError(f"{md.path}: tensor {name}: {error}") from None
            for suffix, array in pieces:
                out[name + suffix] = array
                if suffix in kinds:
                    overrides[name + suffix] = kinds[suffix]

        for name in _progress(names, progress, f"converting to {dtype}"):
            stored, shape = md.tensor_info(name)
            if stored in ("F32", "F16", "BF16", "F64") and is_matmul_weight(name, shape):
                w = md.tensor(name)
                if _is_conv1d(model_type, name):
                    w = np.ascontiguousarray(w.T)
                store(name, w)
                md.release(name)
            elif stored in ("F32", "F16", "BF16", "F64"):
                out[name] = md.tensor(name)
            else:
                out[name] = md.tensor(name, dtype=_native(stored))
        if head is not None:
            store("lm_head.weight", md.tensor(head))
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
                with open(work / CONFIG_FILE, "w", encoding="utf-8") as f:
                    json.dump(config, f, indent=2)
                    f.write("\n")
                for file in _COPIED:
                    if (md.path / file).is_file():
                        shutil.copyfile(md.path / file, work / file)
                for sub in _COPIED_DIRS:
                    if (md.path / sub).is_dir():
                        shutil.copytree(md.path / sub, work / sub)
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


def _native(stored: str) -> Any:
    from ._model_dir import _STORAGE_DTYPES

    return _STORAGE_DTYPES[stored]


__all__ = ["convert"]
