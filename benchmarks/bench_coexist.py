"""cpuformer and PyTorch in one process: does either slow the other down?

    python benchmarks/bench_coexist.py [--calls 300] [--rounds 3] [--threads 2] [--json PATH]

cpuformer runs on its own thread pools and links no OpenMP runtime (earlier builds linked libgomp,
a wheel under a private name in cpuformer.libs/); torch brings its own. Each case runs in its own
process: cpuformer alone, torch alone, torch imported first, cpuformer imported first, and the two
orders again with an environment setting. In the mixed cases the two engines' calls alternate (one cpuformer call, one
torch call, ...), the pattern of a pipeline that runs a cpuformer model next to a torch one.
Decode-sized calls, where waking the other runtime's threads shows most: attention of 1 query over
256 keys (12 heads of 64), and a 1 × 768 · 768 × 3072 linear layer, 2 threads each. The table
shows each call's median in microseconds (over --rounds × --calls samples) and which OpenMP
runtimes the process had mapped. Never asserts a time; see docs/runtime.md ("Next to PyTorch").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

CASES = [
    ("cpuformer alone", ["cpuformer"], {}),
    ("torch alone", ["torch"], {}),
    ("torch, then cpuformer", ["torch", "cpuformer"], {}),
    ("cpuformer, then torch", ["cpuformer", "torch"], {}),
    ("torch, then cpuformer; OMP_WAIT_POLICY=passive", ["torch", "cpuformer"], {"OMP_WAIT_POLICY": "passive"}),
    ("cpuformer, then torch; OMP_WAIT_POLICY=passive", ["cpuformer", "torch"], {"OMP_WAIT_POLICY": "passive"}),
]
CALLS = ["cpuformer attention", "cpuformer linear", "torch attention", "torch linear"]


def openmp_runtimes() -> List[str]:
    """The OpenMP runtime files this process has mapped (/proc/self/maps)."""
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            base = os.path.basename(path)
            if base.startswith(("libgomp", "libiomp", "libomp")):
                names.add(path)
    return sorted(names)


# (keys, linear in, linear out) per size. "small": each engine's data ~1.6 MB, so both fit the
# last-level cache together and only the threads differ; "decode": GPT-2 decode sizes (~11 MB
# per engine), where alternating engines also evict each other's data from the cache.
SIZES = {"small": (128, 512, 512), "decode": (256, 768, 3072)}


def child(order: List[str], calls: int, rounds: int, threads: int, size: str) -> Dict[str, object]:
    import numpy as np

    modules = {}
    for name in order:
        modules[name] = __import__(name)
    keys, features_in, features_out = SIZES[size]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 12, 1, 64), dtype=np.float32)
    k = rng.standard_normal((1, 12, keys, 64), dtype=np.float32)
    v = rng.standard_normal((1, 12, keys, 64), dtype=np.float32)
    x = rng.standard_normal((1, features_in), dtype=np.float32)
    w = rng.standard_normal((features_out, features_in), dtype=np.float32) * 0.02
    fns = {}
    if "cpuformer" in modules:
        cf = modules["cpuformer"]
        cf.set_num_threads(threads)
        linear = cf.ops.Linear(w)
        fns["cpuformer attention"] = lambda: cf.ops.attention(q, k, v)
        fns["cpuformer linear"] = lambda: linear(x)
    if "torch" in modules:
        torch = modules["torch"]
        torch.set_num_threads(threads)
        tq, tk, tv, tx, tw = (torch.from_numpy(a) for a in (q, k, v, x, w))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def torch_attention():
            with torch.inference_mode():
                return sdpa(tq, tk, tv)

        def torch_linear():
            with torch.inference_mode():
                return torch.nn.functional.linear(tx, tw)

        fns["torch attention"] = torch_attention
        fns["torch linear"] = torch_linear
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for _ in range(20):  # wake both runtimes' threads
            for fn in fns.values():
                fn()
        time.sleep(0.05)
        for _ in range(calls):
            for name, fn in fns.items():  # alternate: each engine's call follows the other's
                start = time.perf_counter_ns()
                fn()
                samples[name].append((time.perf_counter_ns() - start) / 1000.0)
    return {"runtimes": openmp_runtimes(),
            "median_us": {name: statistics.median(values) for name, values in samples.items()}}


def run_case(order: List[str], env: Dict[str, str], args: argparse.Namespace) -> Dict[str, object]:
    environment = dict(os.environ, **env)
    command = [sys.executable, os.path.abspath(__file__), "--child", ",".join(order), "--calls", str(args.calls),
               "--rounds", str(args.rounds), "--threads", str(args.threads), "--size", args.size]
    out = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"case {order} {env} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="alternating calls per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", choices=sorted(SIZES), default="small",
                        help="small: both engines' data fit the cache together (default); decode: GPT-2 decode sizes")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child.split(","), args.calls, args.rounds, args.threads, args.size)))
        return 0

    import cpuformer

    print(f"cpuformer {cpuformer.__version__} from {os.path.dirname(cpuformer.__file__)}; {platform.processor() or ''}"
          f" {cpuformer.cpu_info()['isa']}, {args.threads} threads, size {args.size} (keys, linear in, out: "
          f"{SIZES[args.size]}); medians in microseconds")
    results = []
    header = f"{'case':50s}" + "".join(f"{name:>22s}" for name in CALLS) + "  OpenMP runtimes mapped"
    print(header)
    alone: Dict[str, float] = {}
    for label, order, env in CASES:
        result = run_case(order, env, args)
        result["case"] = label
        results.append(result)
        medians = result["median_us"]
        if len(order) == 1:
            alone.update(medians)
        cells = []
        for name in CALLS:
            if name not in medians:
                cells.append(f"{'-':>22s}")
                continue
            ratio = f" ({medians[name] / alone[name]:.2f}x)" if len(order) > 1 and name in alone else ""
            cells.append(f"{medians[name]:>12.1f}{ratio:>10s}")
        runtimes = ", ".join(os.path.basename(path) for path in result["runtimes"])
        print(f"{label:50s}" + "".join(cells) + f"  {runtimes}")
    print("(x: time relative to the engine alone; above 1 means the other engine slowed it down)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpuformer": cpuformer.__version__, "threads": args.threads, "size": args.size,
                       "sizes": SIZES[args.size], "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
