"""The packed-weights file of a converted directory (``cpuformer_packed.<level key>.bin``): every
Linear's weights in the packed layout of one ISA level's kernels, written by ``cpuformer convert``
for the machine's level and by ``cpuformer pack DIR`` for the level of the machine it runs on, so
that loading maps them instead of allocating and packing (csrc/io/packed_file.h; the format and
the rules: docs/precision.md, "Packed weights"). It is written by building the model once with a
recording writer (models/_graph.recording): exactly the bytes a load packs.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import Optional, Union

from .. import _core
from .._model_dir import WEIGHTS_FILE, ModelDir
from ..arch import find
from ..weights import stored_dtype
from . import CLASSES
from ._graph import GRAPHS, recording


def packed_file_name() -> str:
    """The file name of the running ISA level's packed weights (CPUFORMER_ISA applies)."""
    return _core.packed_file_name()


def write_packed_file(directory: Union[str, "os.PathLike[str]"], required: bool = True) -> Optional[pathlib.Path]:
    """Writes (or replaces, atomically) ``directory``'s packed-weights file for the running ISA
    level and returns its path. ``directory``: a converted text model (encoder, decoder or
    seq2seq); ValueError for a directory that is not converted, and for an image or CLIP model
    unless ``required`` is False (then None: they have no packed-weights file)."""
    path = pathlib.Path(directory)
    md = ModelDir(path)
    try:
        arch, name = find(md.config)
        if stored_dtype(md.config) is None:
            raise ValueError(f"{path}: not a converted directory (config.json has no 'cpuformer' entry); "
                             "`cpuformer convert` it first")
    finally:
        md.close()
    if arch.kind not in GRAPHS:
        if required:
            raise ValueError(f"{path}: {name} is a {arch.kind} model; packed-weights files are written for "
                             "text models (encoder, decoder, seq2seq)")
        return None
    target = path / packed_file_name()
    partial = path / f".{target.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        writer = _core.PackedWeightsWriter(str(partial), _core.weights_fingerprint(str(path / WEIGHTS_FILE)))
        with recording(writer):  # (an encoder's task head is not a graph Linear: not built)
            model = CLASSES[arch.kind](path, **({"head": False} if arch.kind == "encoder" else {}))
        model.close()
        writer.finish()
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target


__all__ = ["packed_file_name", "write_packed_file"]
