"""benchmarks/_timing.py's record of the cpuformer a benchmark measures."""

import importlib.util
import os
import subprocess

import cpuformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timing():
    spec = importlib.util.spec_from_file_location("_timing", os.path.join(ROOT, "benchmarks", "_timing.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_the_imported_package():
    build = _timing().cpuformer_build()
    package = os.path.dirname(os.path.abspath(cpuformer.__file__))
    assert build["cpuformer_module"] == package
    assert build["cpuformer_from_checkout"] == (package == os.path.join(ROOT, "python", "cpuformer"))
    assert build["cpuformer_core_built"][:2] == "20"  # an ISO date


def test_warns_when_an_installed_package_is_older_than_the_checkout(monkeypatch, tmp_path, capsys):
    timing = _timing()
    monkeypatch.setattr(cpuformer, "__file__", str(tmp_path / "site-packages" / "cpuformer" / "__init__.py"))
    monkeypatch.setattr(os.path, "getmtime", lambda path: 1_000_000_000.0)  # built in 2001
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "1700000000\n", ""))
    build = timing.cpuformer_build()
    assert build["cpuformer_from_checkout"] is False
    assert "built before this checkout's last commit" in capsys.readouterr().err
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "900000000\n", ""))
    timing.cpuformer_build()  # the last commit is older than the build: nothing to say
    assert capsys.readouterr().err == ""
