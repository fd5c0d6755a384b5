import json
import subprocess
import sys

import cpuformer as cf


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "cpuformer", *args], capture_output=True, text=True, timeout=600)


def test_info_text():
    out = run_cli("info")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cpuformer ")
    assert f"isa:         {cf.cpu_info()['isa']}" in out.stdout


def test_info_json():
    out = run_cli("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["isa"] == cf.cpu_info()["isa"] and info["num_threads"] >= 1 and "version" in info


def test_bench_quick_writes_table_and_json(tmp_path):
    path = tmp_path / "bench.json"
    out = run_cli("bench", "--quick", "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "linear M=1024 K=768 N=768" in out.stdout and "attention B=8" in out.stdout
    rows = json.loads(path.read_text())
    assert all(r["cpuformer"] > 0 and r["numpy"] > 0 for r in rows)


def test_unknown_command_exits_nonzero():
    out = run_cli("frobnicate")
    assert out.returncode == 2
    assert "invalid choice: 'frobnicate'" in out.stderr


def test_help_lists_commands():
    out = run_cli("--help")
    assert out.returncode == 0 and "info" in out.stdout and "bench" in out.stdout
