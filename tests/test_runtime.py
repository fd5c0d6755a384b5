import json
import math
import os
import subprocess
import sys

import pytest

import cpuformer as cf

LEVELS = ["scalar", "avx2", "avx512"]


def supported_levels():
    best = cf.cpu_info()["best_isa"]
    return LEVELS[: LEVELS.index(best) + 1]


def test_cpu_info_fields():
    info = cf.cpu_info()
    assert info["isa"] in LEVELS
    assert info["best_isa"] in LEVELS
    assert LEVELS.index(info["isa"]) <= LEVELS.index(info["best_isa"])
    assert isinstance(info["features"], list)
    assert info["num_threads"] >= 1
    if info["best_isa"] == "avx512":
        assert {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(info["features"])
    assert list(info["matmul"]) == ["float32", "float16", "bfloat16", "int8", "int4"]


MATMUL_CASES = [  # (CPUFORMER_ISA, CPUFORMER_DISABLE_FEATURES, features needed, expected int8 / bfloat16)
    ("scalar", "", set(), "scalar", "scalar"),
    ("avx2", "avx_vnni", {"avx2"}, "avx2 vpmaddubsw", "avx2 widen + fma"),
    ("avx2", "", {"avx2", "avx_vnni"}, "avx_vnni vpdpbusd", "avx2 widen + fma"),
    ("avx512", "avx512_vnni,avx512_bf16", {"avx512bw"}, "avx512bw vpmaddubsw", "avx512 widen + fma"),
    ("avx512", "", {"avx512_vnni", "avx512_bf16"}, "avx512_vnni vpdpbusd", "avx512_bf16 vdpbf16ps"),
]


@pytest.mark.parametrize("isa,disabled,needs,int8,bf16", MATMUL_CASES)
def test_cpu_info_names_the_matmul_kernels(isa, disabled, needs, int8, bf16):
    if isa not in supported_levels() or not needs <= set(cf.cpu_info()["features"]):
        pytest.skip(f"the CPU lacks {isa} or {sorted(needs)}")
    env = dict(os.environ, CPUFORMER_ISA=isa, CPUFORMER_DISABLE_FEATURES=disabled)
    # Also runs the peak probe of each kernel (ops.peak_gops): every probe exists and returns a rate.
    code = ("import json, cpuformer; print(json.dumps([cpuformer.cpu_info()['matmul'], "
            "{d: cpuformer.ops.peak_gops(d, 0.02) for d in cpuformer.cpu_info()['matmul']}]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    matmul, peaks = json.loads(out.stdout)
    assert (matmul["int8"], matmul["bfloat16"]) == (int8, bf16)
    assert matmul["float32"] == ("scalar" if isa == "scalar" else f"{isa} fma")
    assert matmul["int4"] == ("scalar" if isa == "scalar" else "avx2 vpmaddubsw")  # the avx512 level too
    assert all(math.isfinite(g) and g > 0 for g in peaks.values()), peaks


def test_env_forces_level():
    for level in supported_levels():
        env = dict(os.environ, CPUFORMER_ISA=level)
        out = subprocess.run([sys.executable, "-c", "import cpuformer; print(cpuformer.cpu_info()['isa'])"],
                             env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == level


@pytest.mark.parametrize("value,message", [
    ("avx9", "CPUFORMER_ISA='avx9' is not a level; use scalar, avx2 or avx512"),
])
def test_bad_isa_value_fails_import(value, message):
    env = dict(os.environ, CPUFORMER_ISA=value)
    out = subprocess.run([sys.executable, "-c", "import cpuformer"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "ImportError" in out.stderr and message in out.stderr


def test_level_above_cpu_fails_import():
    # CPUFORMER_TEST_MAX_ISA makes the detector pretend the CPU stops at avx2.
    env = dict(os.environ, CPUFORMER_ISA="avx512", CPUFORMER_TEST_MAX_ISA="avx2")
    out = subprocess.run([sys.executable, "-c", "import cpuformer"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert "CPUFORMER_ISA=avx512 asks for a level this CPU lacks; it supports up to avx2" in out.stderr


def test_set_num_threads():
    before = cf.get_num_threads()
    try:
        cf.set_num_threads(1)
        assert cf.get_num_threads() == 1
        cf.set_num_threads(0)
        assert cf.get_num_threads() >= 1
    finally:
        cf.set_num_threads(before)
    with pytest.raises(ValueError, match=r"num_threads must be an integer >= 0 \(0: the automatic default\), got -1"):
        cf.set_num_threads(-1)
    with pytest.raises(ValueError, match=r"num_threads must be an integer >= 0 and <= 1024 .*got 1099511627776"):
        cf.set_num_threads(2 ** 40)


# The kernel and model tests run in this process at the best level; here they run again in a
# child process at every lower level this CPU supports.
@pytest.mark.parametrize("level", [lv for lv in supported_levels() if lv != cf.cpu_info()["isa"]])
def test_kernels_at_level(level):
    env = dict(os.environ, CPUFORMER_ISA=level)
    here = os.path.dirname(__file__)
    dirs = [os.path.join(here, "kernels"), os.path.join(here, "models")]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *dirs],
                         env=env, capture_output=True, text=True)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    print(f"[{level}] {summary}")
    assert out.returncode == 0, (f"kernel/model tests failed at CPUFORMER_ISA={level}:\n"
                                 f"{out.stdout[-6000:]}\n{out.stderr[-3000:]}")
    assert "passed" in summary


def _environment_after_import(extra):
    code = ("import os, json; before = dict(os.environ); import cpuformer; "
            "print(json.dumps({k: os.environ.get(k) for k in ('GOMP_SPINCOUNT', 'OMP_WAIT_POLICY')}))")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(extra)
    env["OMP_DISPLAY_ENV"] = "verbose"  # libgomp prints the settings it loaded with to stderr
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = [line.split("=", 1)[1].strip().strip("'") for line in out.stderr.splitlines()
              if line.strip().startswith("GOMP_SPINCOUNT")]
    return json.loads(out.stdout), loaded


def test_import_sets_the_spin_count_only_while_loading_the_core():
    """docs/runtime.md, "Waiting threads": the short spin count is given to libgomp at load and
    never left in the environment; a user's own setting is kept as given."""
    import cpuformer as cf_module

    assert cf_module._SPIN_COUNT == 1000
    assert _environment_after_import({}) == ({"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None}, ["1000"])
    assert _environment_after_import({"GOMP_SPINCOUNT": "7"}) == ({"GOMP_SPINCOUNT": "7", "OMP_WAIT_POLICY": None},
                                                                  ["7"])
    env, loaded = _environment_after_import({"OMP_WAIT_POLICY": "active"})
    assert env == {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "active"}
    assert loaded != ["1000"]  # libgomp's own active-policy count
