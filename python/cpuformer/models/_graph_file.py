"""The graph manifest (``cpuformer_graph.json``) that ``cpuformer convert`` writes into a converted
text-model directory: the model config (hyperparameters plus the weight format), where each
canonical tensor comes from and the generation options a plain ``generate()`` call would pass. The
C++ architecture registry computes it (``_core.checkpoint_manifest``, csrc/models/arch/
checkpoint.h), the same code that tells the Python loader where each tensor comes from
(``weights.Checkpoint``), so the C API (docs/c-api.md) loads the directory exactly as
``cpuformer.load`` does.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Dict

from .. import _core
from .._model_dir import ModelDir
from ..arch import Arch, find
from ..weights import graph_format, resolve_dtype

#: The manifest's file name in a converted directory.
GRAPH_FILE = "cpuformer_graph.json"
#: Its format version (the C API refuses others).
GRAPH_FORMAT_VERSION = 1
#: Model kinds the C API runs.
GRAPH_KINDS = ("encoder", "decoder", "seq2seq")


def _manifest(md: ModelDir, arch: Arch) -> Dict[str, Any]:
    """The manifest of the opened converted directory ``md`` of family ``arch``."""
    dtype, stored, settings = resolve_dtype(None, md.config)
    return _core.checkpoint_manifest(os.fspath(md.path), md.config, md.generation_config,
                                     graph_format(dtype, settings), stored is not None)


def graph_manifest(directory: pathlib.Path) -> Dict[str, Any]:
    """The manifest of the converted directory ``directory`` (a text model: encoder, decoder or
    seq2seq), as cpuformer.load would configure it; opens the directory once and packs nothing."""
    md = ModelDir(directory)
    try:
        arch, _ = find(md.config)
        return _manifest(md, arch)
    finally:
        md.close()


def write_graph_file(directory: pathlib.Path) -> None:
    """Writes ``directory``/cpuformer_graph.json for a converted text model (encoder, decoder or
    seq2seq); image and CLIP models get none (the C API does not run them)."""
    md = ModelDir(directory)
    try:
        arch, _ = find(md.config)
        if arch.kind not in GRAPH_KINDS:
            return
        manifest = _manifest(md, arch)
    finally:
        md.close()
    with open(pathlib.Path(directory) / GRAPH_FILE, "w", encoding="utf-8") as f:
        json.dump(manifest, f, separators=(",", ":"))
        f.write("\n")


__all__ = ["GRAPH_FILE", "GRAPH_FORMAT_VERSION", "GRAPH_KINDS", "graph_manifest", "write_graph_file"]
