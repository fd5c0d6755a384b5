"""The timing loop every benchmark script shares (no heavy imports: the llama.cpp child process
imports it without cpuformer)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def timed(fn: Callable[[], object], repeats: int) -> dict:
    """Median / min / max seconds of fn() over `repeats` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def run_script(script: str, argv: list, timeout: float) -> tuple:
    """(exit code, stderr tail) of `python <script> <argv>` in a fresh process (each engine runs in
    its own: two OpenMP runtimes in one process steal each other's cores)."""
    import os
    import subprocess
    import sys

    command = [sys.executable, os.path.abspath(script)] + argv
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    return done.returncode, "\n".join(done.stderr.strip().splitlines()[-5:])


def engine_round(script: str, argv: list, timeout: float, work: str, name: str, key: str, state: dict,
                 keep_outputs: bool, unit: str, digits: int) -> None:
    """One timed round of one engine in a child process (`script --child run ... --result FILE
    [--outputs FILE.npz]`). ``state`` holds the run's "info" ((name, key) -> version /
    not_supported / error), "rates" ((name, key) -> {label: [rate per round]}) and "outputs"
    (name -> key -> {label: array}, with ``keep_outputs``); printed as `<name> <key>: label rate
    <unit>`."""
    import json
    import os
    import sys
    import tempfile

    import numpy as np

    info, rates, outputs = state["info"], state["rates"], state["outputs"]
    handle, result_path = tempfile.mkstemp(suffix=".json", dir=work)
    os.close(handle)
    argv = argv + ["--result", result_path]
    outputs_path = None
    if keep_outputs:
        outputs_path = result_path[:-5] + ".npz"
        argv += ["--outputs", outputs_path]
    code, err = run_script(script, argv, timeout)
    try:
        if code != 0:
            info[(name, key)] = {"error": err}
            print(f"  {name} {key}: failed\n{err}", file=sys.stderr)
            return
        with open(result_path) as f:
            child = json.load(f)
        if "not_supported" in child:
            info[(name, key)] = {"not_supported": child["not_supported"]}
            print(f"  {name} {key}: not supported ({child['not_supported'].splitlines()[0][:150]})")
            return
        info[(name, key)] = {"version": child["version"]}
        for label, rate in child["rates"].items():
            rates.setdefault((name, key), {}).setdefault(label, []).append(rate)
        print(f"  {name} {key}: " + ", ".join(f"{label} {rate:.{digits}f} {unit}"
                                              for label, rate in child["rates"].items()), flush=True)
        if outputs_path:
            with np.load(outputs_path) as data:
                outputs.setdefault(name, {})[key] = {k: data[k] for k in data.files}
    finally:
        for path in (result_path, outputs_path):
            if path and os.path.exists(path):
                os.remove(path)


def peer_step(log: dict, name: str, step: Callable[[], object]) -> None:
    """Runs one peer's build step; a missing or failing peer is recorded in ``log``, not fatal."""
    import sys

    try:
        step()
        log[name] = "ok"
    except Exception as error:  # noqa: BLE001 - any failure of a peer's tooling is reported in the results
        log[name] = f"unavailable: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        print(f"{name} unavailable: {error}", file=sys.stderr)


def max_relative_error(out: Any, reference: Any) -> float:
    """max |out - reference| / max |reference|: the error relative to the output's scale."""
    import numpy as np

    out, reference = np.asarray(out, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if out.shape != reference.shape:
        raise ValueError(f"output shape {out.shape} differs from the reference's {reference.shape}")
    return float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-30))


def ort_session(path: str, threads: int) -> Any:
    """An ONNX Runtime CPU session as every benchmark runs it: ``threads`` intra-op threads, one
    inter-op thread, ORT_ENABLE_ALL."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def machine() -> dict:
    """{"cpu": lscpu's model name, "lscpu": its whole output, and cpuformer_build()'s keys}: what a
    results file records of the host and of the code measured."""
    import subprocess

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                "unknown")
    return {"cpu": name, "lscpu": lscpu, **cpuformer_build()}


def cpuformer_build() -> dict:
    """Which cpuformer the benchmark imported: {"cpuformer_module": its package directory,
    "cpuformer_from_checkout": whether that is this checkout's python/cpuformer (an editable or
    in-place build), "cpuformer_core_built": the native module's modification time}. Python imports
    an installed cpuformer unless PYTHONPATH names the checkout, so a results file's commit alone
    does not say which code ran; when the imported package is not the checkout's and its native
    module is older than the checkout's last commit, a warning on stderr says so."""
    import datetime
    import os
    import subprocess
    import sys

    import cpuformer
    from cpuformer import _core

    package = os.path.dirname(os.path.abspath(cpuformer.__file__))
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from_checkout = package == os.path.join(checkout, "python", "cpuformer")
    built = os.path.getmtime(_core.__file__)
    if not from_checkout:
        head = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=checkout, capture_output=True,
                              text=True).stdout.strip()
        if head.isdigit() and int(head) > built:
            print(f"warning: measuring the cpuformer installed at {package}, built before this checkout's last "
                  f"commit; set PYTHONPATH={os.path.join(checkout, 'python')} (with an in-place build) or "
                  "reinstall to measure this checkout", file=sys.stderr)
    return {"cpuformer_module": package, "cpuformer_from_checkout": from_checkout,
            "cpuformer_core_built": datetime.datetime.fromtimestamp(built).isoformat(timespec="seconds")}
