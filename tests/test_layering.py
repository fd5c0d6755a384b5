"""The package's import rule (docs/architecture.md):

    {_core, _model_dir, _arguments, _tokenizer, _sentencepiece, _slow_tokenizers, _tokenizer_dir, _sentence, _images,
     ops} < arch
    < weights < models < api < cpuformer < {cli, _bench, serve, ray}

A module imports only modules of its own layer or the layers below, without cycles; function-local
imports count too (none may dodge the rule). Only ``arch`` names Hugging Face architectures and
checkpoint tensors: no other module of the package holds a string that the registry declares.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil
import re
from typing import Dict, Set

import pytest

import cpuformer
from cpuformer.arch import ARCHS

PACKAGE = pathlib.Path(cpuformer.__file__).parent
LAYERS = [
    {"_core", "_model_dir", "_arguments", "_tokenizer", "_sentencepiece", "_slow_tokenizers", "_tokenizer_dir",
     "_sentence", "_images", "ops"},
    {"arch"},
    {"weights"},
    {"models"},
    {"api"},
    {""},  # the package itself (cpuformer/__init__.py)
    {"cli", "_bench", "__main__", "serve", "_logprobs", "_tools", "ray"},
]


def _modules() -> Dict[str, pathlib.Path]:
    """Every module of the package, by dotted name below the package ("" for the package, "arch.spec", ...)
    -> source file."""
    out = {"": PACKAGE / "__init__.py"}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="cpuformer."):
        name = info.name[len("cpuformer."):]
        path = PACKAGE.joinpath(*name.split("."))
        out[name] = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
    return {name: path for name, path in out.items() if path.exists() or name == "_core"}  # _core: compiled


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"cpuformer.{module} is in no layer of the import rule; add it to LAYERS (and to "
                         "docs/architecture.md)")


def _imports(module: str, path: pathlib.Path, modules: Dict[str, pathlib.Path]) -> Set[str]:
    """The package's modules that ``module`` imports (anywhere in the file)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: Set[str] = set()

    def resolve(name: str) -> None:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        if name in modules or name == "":
            found.add(name)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "cpuformer" or alias.name.startswith("cpuformer."):
                    resolve(alias.name[len("cpuformer."):] if "." in alias.name else "")
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, node.level - 1 packages up
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                base = ".".join(parts)
            elif node.module and (node.module == "cpuformer" or node.module.startswith("cpuformer.")):
                base = node.module[len("cpuformer."):] if node.module != "cpuformer" else ""
            else:
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if base else alias.name
                resolve(candidate if candidate in modules else base)
    found.discard(module)
    return found


def test_every_module_imports():
    for name in _modules():
        if name == "__main__":  # runs the command line
            continue
        importlib.import_module("cpuformer" + ("." + name if name else ""))


def test_imports_follow_the_layers_without_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) if name != "_core" else set() for name, path in modules.items()}
    wrong = [f"cpuformer.{importer or '__init__'} (layer {_layer(importer)}) "
             f"imports cpuformer.{imported or '__init__'} (layer {_layer(imported)})"
             for importer, imports in graph.items() for imported in imports if _layer(imported) > _layer(importer)]
    assert wrong == []
    # No cycles: a depth-first search over the import graph.
    state: Dict[str, int] = {}

    def visit(name: str, trail: list) -> None:
        if state.get(name) == 2:
            return
        assert state.get(name) != 1, "import cycle: " + " -> ".join(trail + [name])
        state[name] = 1
        for imported in sorted(graph[name]):
            visit(imported, trail + [name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])


def _declared_names() -> Set[str]:
    """Every architecture class, and every checkpoint tensor name the registry declares for a small
    configuration of each family (with the layer index written as N)."""
    names: Set[str] = set()
    for arch in ARCHS:
        names.update(arch.architectures)
    return names


def test_only_arch_names_architectures():
    declared = _declared_names()
    found = []
    for name, path in _modules().items():
        if name.split(".")[0] == "arch" or name == "_core":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                words = set(re.findall(r"[A-Za-z0-9]+", node.value))
                hits = sorted(words & declared)
                if hits:
                    found.append(f"cpuformer.{name or '__init__'} line {node.lineno}: {', '.join(hits)}")
    assert found == [], "architecture names outside cpuformer.arch"


@pytest.mark.parametrize("fragment", ["embed_tokens", "self_attn", "c_attn", "embeddings.word_embeddings",
                                      "EncDecAttention", "layernorm_embedding", "q_proj", "wte.", "shared.weight"])
def test_only_arch_names_checkpoint_tensors(fragment):
    found = [f"cpuformer.{name or '__init__'}" for name, path in _modules().items()
             if name.split(".")[0] not in ("arch", "_core") and fragment in path.read_text()]
    assert found == [], f"checkpoint tensor names ({fragment!r}) outside cpuformer.arch"
