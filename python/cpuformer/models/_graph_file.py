"""The graph manifest (``cpuformer_graph.json``) that ``cpuformer convert`` writes into a converted
text-model directory: what the Python layer hands the C++ graph when it loads that directory — the
model config (``arch.Hparams`` plus the weight format), where each canonical tensor comes from
(``weights.graph_tensors``) and the generation options a plain ``generate()`` call would pass — so
that the C API (docs/c-api.md), which has no Python and no architecture registry, loads the model
exactly as ``cpuformer.load`` does. The registry stays the one source of truth: the manifest is its
output, written once at conversion.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Dict

from .._model_dir import ModelDir
from ..arch import Arch, find
from ..weights import Checkpoint, graph_format, graph_tensors
from . import CLASSES
from .generator import Generator, sequence_options
from .seq2seq import Seq2Seq

#: The manifest's file name in a converted directory.
GRAPH_FILE = "cpuformer_graph.json"
#: Its format version (the C API refuses others).
GRAPH_FORMAT_VERSION = 1
#: Model kinds the C API runs.
GRAPH_KINDS = ("encoder", "decoder", "seq2seq")


def _generation_defaults(model: Any) -> Dict[str, Any]:
    """The options dict a plain ``generate(ids)`` passes to the C++ model (greedy, 20 new tokens,
    the model's eos / pad / start tokens, forced tokens and banned words); seed 0. The default EOS
    tokens are recorded as the config names them: like generate(), the C API refuses them at
    generation time when they are outside the vocabulary. ``model`` may be unbuilt
    (ModelBase._unbuilt): these come from the config files, not from the C++ model."""
    common = dict(max_new_tokens=20, min_new_tokens=0, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
                  repetition_penalty=1.0, num_beams=1, length_penalty=1.0, early_stopping=False, eos_token_id=[],
                  seed=0, return_log_probs=False)
    if isinstance(model, Seq2Seq):
        options = model._options(1, 0, None, **common)
        options["kv_cache_dtype"] = 0
    else:
        assert isinstance(model, Generator)
        options = model._options(*common.values())
        sequence_options(options, 1, 0)
        model._add_options(options, None, None)
    options["eos_token_ids"] = [int(v) for v in model.eos_token_ids]
    return options


def _manifest(md: ModelDir, arch: Arch) -> Dict[str, Any]:
    """The manifest of the opened converted directory ``md`` of family ``arch``: the settings and
    generation defaults the model class takes from its config files (without building the model)
    and the tensor entries of the one loader."""
    kind = arch.kind
    model = CLASSES[kind]._unbuilt(md, kind)
    form = graph_format(model.dtype, model.quantization)
    manifest: Dict[str, Any] = {"format_version": GRAPH_FORMAT_VERSION, "kind": kind,
                                "architecture": model.architecture, "config": dict(model.config, **form)}
    if kind != "encoder":
        manifest["generation"] = _generation_defaults(model)
    checkpoint = Checkpoint(md, arch, model.hparams, form["dtype"], None, model.quantization)
    manifest["tensors"] = graph_tensors(checkpoint)
    return manifest


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
