import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import ops

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
    # The control group's CPU limit: None without one, else a positive count that caps the default
    # (num_threads is at most its ceiling unless OMP_NUM_THREADS says otherwise).
    assert info["cpu_limit"] is None or info["cpu_limit"] > 0
    if info["cpu_limit"] is not None and "OMP_NUM_THREADS" not in os.environ:
        assert info["num_threads"] <= math.ceil(info["cpu_limit"])
    if info["best_isa"] == "avx512":
        assert {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(info["features"])
    assert list(info["matmul"]) == ["float32", "float16", "bfloat16", "int8", "int4"]


MATMUL_CASES = [  # (CPUFORMER_ISA, CPUFORMER_DISABLE_FEATURES, features needed, expected int8 / bfloat16)
    ("scalar", "", set(), "scalar", "scalar"),
    ("avx2", "avx_vnni", {"avx2"}, "avx2 vpmaddubsw", "avx2 widen + fma"),
    ("avx2", "", {"avx2", "avx_vnni"}, "avx_vnni vpdpbusd", "avx2 widen + fma"),
    ("avx512", "avx512_vnni,avx512_bf16", {"avx512bw"}, "avx512bw vpmaddubsw", "avx512 widen + fma"),
    ("avx512", "amx_int8,amx_bf16", {"avx512_vnni", "avx512_bf16"}, "avx512_vnni vpdpbusd", "avx512_bf16 vdpbf16ps"),
    ("avx512", "", {"amx_int8", "amx_bf16"}, "amx_int8 tdpbusd", "amx_bf16 tdpbf16ps"),
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
    # int4: vpdpbusd as int8 (no AMX kernel); without AVX512-VNNI the AVX2 kernel serves the avx512 level.
    assert matmul["int4"] == int8.replace("avx512bw", "avx2").replace("amx_int8 tdpbusd", "avx512_vnni vpdpbusd")
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


def test_spin_setting_is_checked_at_import():
    """docs/runtime.md, "Waiting threads": CPUFORMER_SPIN_US is a whole number of microseconds in
    [0, 1000000]; another value warns at import (the core then uses its default) and nothing of
    libgomp's is set in the environment."""
    code = ("import os, warnings; warnings.simplefilter('always'); import cpuformer, numpy as np; "
            "print(os.environ.get('GOMP_SPINCOUNT')); "
            "print(cpuformer.ops.Linear(np.eye(64, dtype=np.float32))(np.ones((3, 64), np.float32)).sum())")
    for value, warned in (("", False), ("0", False), ("50", False), ("1000000", False), ("-1", True),
                          ("1000001", True), ("fast", True), ("2.5", True), ("+5", True), (" 5", True),
                          ("\u00b2", True)):
        env = dict(os.environ, CPUFORMER_SPIN_US=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["None", "192.0"], (value, out.stdout)
        message = f"CPUFORMER_SPIN_US={value!r} is not a whole number of microseconds in [0, 1000000]"
        assert (message in out.stderr) == warned, (value, out.stderr)


_DEFAULT_THREADS = r"""
import os, sys
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU in the mask, whatever the machine has
import cpuformer
from cpuformer import _core
print(cpuformer.get_num_threads(), cpuformer.cpu_info()["num_threads"], _core._compute_slots()["capacity"])
"""


def default_threads(value):
    """get_num_threads(), cpu_info()'s num_threads and the compute slots' capacity of a fresh process
    whose affinity mask holds one CPU, with OMP_NUM_THREADS=value (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if value is not None:
        env["OMP_NUM_THREADS"] = value
    run = subprocess.run([sys.executable, "-c", _DEFAULT_THREADS], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return [int(word) for word in run.stdout.split()]


# docs/runtime.md, "Threads": OMP_NUM_THREADS read as GNU libgomp reads it (a comma-separated list of
# positive integers, white space around each allowed; the first is the count), at most 1024 threads.
@pytest.mark.parametrize("value, expected", [("3", 3), ("2,1", 2), (" 4 ", 4), ("+5", 5), ("7, 2 ,1", 7),
                                             ("5000", 1024), ("3000000000", 1024)])
def test_omp_num_threads_sets_the_default(value, expected):
    # The compute slots' capacity stays the CPUs of the affinity mask.
    assert default_threads(value) == [expected, expected, 1]


# A value libgomp would ignore: the CPUs of the affinity mask (1 here, while the machine may have more).
@pytest.mark.parametrize("value", [None, "", "abc", "0", "-2", "2.5", "3 4", "2,x", "0,2", "2,", ",",
                                   "99999999999999999999"])
def test_unusable_omp_num_threads_gives_the_affinity_count(value):
    assert default_threads(value) == [1, 1, 1]


# docs/runtime.md, "Threads": the default count is capped by the control group's CPU limit (a
# container's --cpus), read from cgroup v2's cpu.max or v1's cpu.cfs_quota_us / cpu.cfs_period_us of
# the process's cgroup and every ancestor up to the hierarchy's mount. The trees below stand in for
# /proc/self and /sys/fs/cgroup (every path is read under the root given).
def cgroup_tree(tmp_path, cgroup, mountinfo, files):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    return cf._core._cgroup_cpu_limit(str(tmp_path))


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")


@pytest.mark.parametrize("cgroup, files, expected", [
    # a container with its own cgroup namespace: its cgroup is the mount's root
    ("0::/\n", {"sys/fs/cgroup/cpu.max": "200000 100000\n"}, 2.0),
    ("0::/\n", {"sys/fs/cgroup/cpu.max": "150000 100000\n"}, 1.5),
    ("0::/\n", {"sys/fs/cgroup/cpu.max": "max 100000\n"}, 0.0),
    ("0::/\n", {}, 0.0),  # the root cgroup has no cpu.max
    # a service's cgroup below a slice: the tighter of the two levels counts
    ("0::/app.slice/model.service\n", {"sys/fs/cgroup/app.slice/cpu.max": "300000 100000",
                                       "sys/fs/cgroup/app.slice/model.service/cpu.max": "max 100000"}, 3.0),
    ("0::/app.slice/model.service\n", {"sys/fs/cgroup/app.slice/cpu.max": "400000 100000",
                                       "sys/fs/cgroup/app.slice/model.service/cpu.max": "50000 100000"}, 0.5),
    # unreadable or nonsensical values are no limit
    ("0::/\n", {"sys/fs/cgroup/cpu.max": "lots 100000"}, 0.0),
    ("0::/\n", {"sys/fs/cgroup/cpu.max": "100000 0"}, 0.0),
    ("0::/\n", {"sys/fs/cgroup/cpu.max": ""}, 0.0),
    ("", {"sys/fs/cgroup/cpu.max": "100000 100000"}, 0.0),  # no cgroup line
])
def test_cgroup_v2_cpu_limit(tmp_path, cgroup, files, expected):
    assert cgroup_tree(tmp_path, cgroup, V2_MOUNT, files) == pytest.approx(expected)


@pytest.mark.parametrize("mount_root, path, files, expected", [
    ("/", "/", {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "400000\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 4.0),
    ("/", "/", {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 0.0),
    # Docker without a cgroup namespace: /proc/self/cgroup names /docker/<id>, mounted at the hierarchy's top
    ("/docker/abc", "/docker/abc", {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000",
                                    "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0.5),
    # the whole hierarchy mounted: the process's directory and its parents
    ("/", "/kubepods/pod1/c1", {"sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "250000",
                                "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us": "100000",
                                "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_quota_us": "-1",
                                "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_period_us": "100000"}, 2.5),
    # a mount of another part of the hierarchy does not describe this process
    ("/other", "/docker/abc", {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000",
                               "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0.0),
])
def test_cgroup_v1_cpu_limit(tmp_path, mount_root, path, files, expected):
    cgroup = f"12:memory:{path}\n4:cpu,cpuacct:{path}\n1:name=systemd:{path}\n0::/\n"
    assert cgroup_tree(tmp_path, cgroup, V1_MOUNTS.format(root=mount_root), files) == pytest.approx(expected)


def test_cgroup_mount_point_escapes(tmp_path):
    # mountinfo writes a space in a path as \040
    mount = "30 23 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup_tree(tmp_path, "0::/\n", mount, {"sys/fs/my cgroup/cpu.max": "300000 100000"}) == 3.0


def test_missing_cgroup_files_are_no_limit(tmp_path):
    assert cf._core._cgroup_cpu_limit(str(tmp_path)) == 0.0


@pytest.mark.parametrize("cpus, limit, expected", [(64, 2.0, 2), (64, 1.5, 2), (64, 0.5, 1), (64, 0.01, 1),
                                                   (2, 8.0, 2), (8, 0.0, 8), (1, 3.0, 1)])
def test_default_threads_within_the_cpu_limit(cpus, limit, expected):
    assert cf._core._cpus_within_limit(cpus, limit) == expected


_OP_THREADS = r"""
import sys
import numpy as np
from cpuformer import ops

def threads():
    return int([line for line in open("/proc/self/status") if line.startswith("Threads:")][0].split()[1])

x = np.random.rand(4096, 256).astype(np.float32)
w = np.random.rand(256, 256).astype(np.float32)
q = np.random.rand(2, 4, 128, 64).astype(np.float32)
lin = ops.Linear(w)
call = {"linear": lambda n: lin(x, num_threads=n), "attention": lambda n: ops.attention(q, q, q, num_threads=n),
        "layer_norm": lambda n: ops.layer_norm(x, w[0], num_threads=n)}[sys.argv[1]]
counts = [threads()]
for n in (1, 3):
    call(n)
    counts.append(threads())
print(counts)
"""


@pytest.mark.parametrize("op", ["linear", "attention", "layer_norm"])
def test_op_num_threads_is_honored(op):
    """ops.Linear, attention and layer_norm run on their num_threads argument, not the process's
    count: in a fresh process with OMP_NUM_THREADS=1, num_threads=1 starts no pool worker and
    num_threads=3 starts two (/proc/self/status counts the process's threads)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", _OP_THREADS, op], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    base, one, three = json.loads(run.stdout)
    assert one == base and three == base + 2, (base, one, three)


def test_op_num_threads_results_and_errors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 48), dtype=np.float32)
    w = rng.standard_normal((32, 48), dtype=np.float32)
    q = rng.standard_normal((1, 2, 16, 8), dtype=np.float32)
    lin = ops.Linear(w, dtype="int8")
    for n in (1, 2, 3):
        np.testing.assert_array_equal(lin(x, num_threads=n), lin(x))
        np.testing.assert_array_equal(ops.attention(q, q, q, num_threads=n), ops.attention(q, q, q))
        np.testing.assert_array_equal(ops.layer_norm(x, x[0], num_threads=n), ops.layer_norm(x, x[0]))
    calls = [lambda n: lin(x, num_threads=n), lambda n: ops.attention(q, q, q, num_threads=n),
             lambda n: ops.layer_norm(x, x[0], num_threads=n)]
    # Each bad value named in the error (not pybind11's dump of the signature and the arrays).
    for value, message in [(-1, r"^num_threads must be an integer >= 0 \(0: the calling thread's count\), got -1$"),
                           (1.5, r"^num_threads must be an integer >= 0 \(0: the calling thread's count\), got 1\.5$"),
                           (True, r"^num_threads must be an integer >= 0 \(0: the calling thread's count\), got True$"),
                           ("2", r"^num_threads must be an integer >= 0 \(0: the calling thread's count\), got '2'$"),
                           (2 ** 31, r"^num_threads must be an integer >= 0 and <= 1024 \(0: the calling thread's "
                                     r"count\), got 2147483648$")]:
        for call in calls:
            with pytest.raises(ValueError, match=message):
                call(value)
    np.testing.assert_array_equal(lin(x, num_threads=np.int64(2)), lin(x))


@pytest.mark.parametrize("value,expected", [("high", "high"), ("highest", "highest"), ("", "highest")])
def test_float32_matmul_precision_from_the_environment(value, expected):
    env = dict(os.environ, CPUFORMER_FLOAT32_MATMUL_PRECISION=value)
    out = subprocess.run([sys.executable, "-c", "import cpuformer; print(cpuformer.get_float32_matmul_precision())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected


def test_bad_float32_matmul_precision_fails_import():
    env = dict(os.environ, CPUFORMER_FLOAT32_MATMUL_PRECISION="medium")
    out = subprocess.run([sys.executable, "-c", "import cpuformer"], env=env, capture_output=True, text=True)
    assert out.returncode != 0
    assert ("ImportError: cpuformer: CPUFORMER_FLOAT32_MATMUL_PRECISION: float32 matmul precision must be "
            "'highest' or 'high', got 'medium'" in out.stderr)
