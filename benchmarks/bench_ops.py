"""Kernel benchmark: cpuformer.ops against PyTorch (MKL / oneDNN) and NumPy (OpenBLAS) in one run.

    PYTHONPATH=python python benchmarks/bench_ops.py [--quick] [--threads 2] [--out PATH]

Linear: GFLOP/s of ``ops.Linear`` (weights packed once, outside the timed loop, as a model holds
them) against ``torch.matmul(x, w.t())`` and NumPy ``x @ w.T`` on transformer shapes: large M
(prefill / encoder) and M = 1, 4 (decode), plus the fraction of the compute peak.
Linear by weight dtype: GOP/s of ``ops.Linear(w, dtype=...)`` for float32, int8, float16 and
bfloat16 weights on BERT-base shapes (M = 1024), the 1.1B Llama shape's prefill (M = 512) and decode
GEMV shapes (M = 1), with each dtype's speed relative to float32 (an int8 multiply-add counts as 2
operations, like a float one) and relative to that dtype's compute peak.
Compute peak: ``ops.peak_gops(dtype)``, measured at the start of the run on the same threads: the
rate of the instruction the matmul kernel multiplies with (FMA, vpdpbusd, vdpbf16ps, ...) with its
operands in registers, which no GEMM can exceed. It replaces a peak computed from a clock and a
vector width, which cpuinfo's nominal clock and CPUs that run 512-bit instructions on 256-bit
units (Zen 4) make wrong.
Attention: milliseconds of ``ops.attention`` against ``torch.nn.functional.scaled_dot_product_attention``.
Decode attention: microseconds and GB/s of KV read of ``ops.attention`` for one query position over a
float32 KV cache (a decode step's attention), multi-head (GPT-2) and grouped-query (Llama) shapes,
with the cache hot (one layer's call repeated) and cold (calls rotating over layers whose caches fill
400 MB, so each reads its keys and values from memory, as a decode step does after its weights).

Every implementation runs in the same process on the same inputs. The samples of the
implementations alternate in a few passes (so that load from other processes hits all of them
alike), with a short pause before each block so that one library's idle spinning threads do not
slow the next, then 0.05 s of untimed calls (after an idle pause the first tens of milliseconds
run slow: waking the OpenMP workers and the virtual CPUs; a single warm-up call left --quick's M = 1
rows ~4x low); each sample repeats the call for at least 0.1 s (0.02 s with --quick); the table
shows medians. Runs without PyTorch (its column is then skipped). Writes
benchmarks/results/ops_<date>.json with the machine description. Never asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from typing import Callable, Dict, List, Optional

_THREADS_DEFAULT = 2


def _threads_from_argv() -> int:
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return int(sys.argv[i + 1])
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
    return _THREADS_DEFAULT


# BLAS thread pools size themselves when the library loads: set them before NumPy / torch import.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, str(_threads_from_argv()))

import numpy as np  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import cpuformer_build  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the torch column is skipped
    torch = None

try:
    from threadpoolctl import threadpool_limits
except ImportError:
    threadpool_limits = None

LINEAR_LARGE = [(1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768), (512, 2048, 5632)]
LINEAR_DECODE_KN = [(768, 2304), (768, 3072), (2048, 5632)]
# (M, K, N): BERT-base 8 x 128 (fused QKV, output, feed-forward up and down), the 1.1B Llama shape's
# prefill of 512 tokens (fused QKV with 4 KV heads, fused gate/up, down), then decode GEMVs.
LINEAR_DTYPE_SHAPES = [(1024, 768, 2304), (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768),
                       (512, 2048, 2560), (512, 2048, 11264), (512, 5632, 2048),
                       (1, 768, 2304), (1, 768, 3072), (1, 2048, 5632)]
WEIGHT_DTYPES = ["float32", "int8", "float16", "bfloat16"]
SHORT = {"float32": "f32", "int8": "i8", "float16": "f16", "bfloat16": "bf16"}


# ---- machine ----------------------------------------------------------------------------------

def cpu_model_and_mhz() -> tuple:
    """(model name, MHz) of the first CPU in /proc/cpuinfo; MHz is None when not reported."""
    model, mhz = None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "cpu MHz" and mhz is None:
                    mhz = float(value)
    except OSError:
        pass
    return model or platform.processor() or "unknown", mhz


def machine_info(threads: int) -> Dict[str, object]:
    model, mhz = cpu_model_and_mhz()
    info = cf.cpu_info()
    peaks = {dt: ops.peak_gops(dt, seconds=0.6) for dt in WEIGHT_DTYPES}
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu_model": model,
        "cpu_mhz": mhz,
        "logical_cpus": os.cpu_count(),
        "threads": threads,
        "isa": info["isa"],
        "best_isa": info["best_isa"],
        "features": info["features"],
        "matmul": info["matmul"],
        "peak_gops": peaks,
        "peak_source": "ops.peak_gops: the matmul instruction with operands in registers, measured",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "cpuformer": cf.__version__,
        **cpuformer_build(),
    }


# ---- timing -----------------------------------------------------------------------------------

def measure(fns: Dict[str, Callable[[], object]], rounds: int, min_time: float, passes: int = 3,
            settle: float = 0.15, warm: float = 0.05) -> Dict[str, float]:
    """Median seconds per call of each function.

    The samples are taken in `passes` passes over the implementations (rounds/passes samples each
    per pass), so that slow phases of the machine hit every implementation. Before each block the
    process sleeps `settle` seconds: an idle BLAS pool keeps spinning on the cores for a while after
    its last call (OpenBLAS ~0.1 s) and would otherwise steal them from the next implementation.
    After the pause the function runs untimed for `warm` seconds: the first calls after an idle
    pause are slow (sleeping OpenMP workers and virtual CPUs wake up)."""
    calls = {}
    for name, fn in fns.items():  # warm-up, and calls per sample so one sample lasts >= min_time
        fn()
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-7)
        calls[name] = max(1, int(min_time / once))
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    passes = max(1, min(passes, rounds))
    for p in range(passes):
        per_pass = rounds // passes + (1 if p < rounds % passes else 0)
        for name, fn in fns.items():
            time.sleep(settle)
            warm_until = time.perf_counter() + warm
            while time.perf_counter() < warm_until:
                fn()
            for _ in range(per_pass):
                start = time.perf_counter()
                for _ in range(calls[name]):
                    fn()
                samples[name].append((time.perf_counter() - start) / calls[name])
    return {name: float(np.median(s)) for name, s in samples.items()}


# ---- linear -----------------------------------------------------------------------------------

def bench_linear(shapes, rounds: int, min_time: float, peak: float) -> List[Dict[str, object]]:
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in shapes:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        lin = ops.Linear(w)  # packed once, outside the timed loop
        wt = w.T
        fns: Dict[str, Callable[[], object]] = {"cpuformer": lambda: lin(x), "numpy": lambda: x @ wt}
        if torch is not None:
            xt, wtt = torch.from_numpy(x), torch.from_numpy(w).t()
            fns["torch"] = lambda: torch.matmul(xt, wtt)
        seconds = measure(fns, rounds, min_time)
        flops = 2.0 * m * k * n
        row: Dict[str, object] = {"M": m, "K": k, "N": n, "seconds": seconds,
                                  "gflops": {name: flops / s / 1e9 for name, s in seconds.items()}}
        gf = row["gflops"]
        best_peer = max(v for name, v in gf.items() if name != "cpuformer")
        row["ratio_vs_best_peer"] = gf["cpuformer"] / best_peer
        row["fraction_of_peak"] = gf["cpuformer"] / peak
        row["weight_gbytes_per_s"] = 4.0 * n * k / seconds["cpuformer"] / 1e9
        rows.append(row)
        print(format_linear_row(row), flush=True)
    return rows


def linear_header() -> str:
    torch_col = f"{'torch':>8}" if torch is not None else ""
    return (f"{'M':>5} {'K':>5} {'N':>5} {'cpuformer':>10} {torch_col} {'numpy':>8} "
            f"{'vs best':>8} {'of peak':>8} {'W GB/s':>7}")


def format_linear_row(r: Dict[str, object]) -> str:
    gf = r["gflops"]
    torch_col = f"{gf['torch']:>8.1f}" if "torch" in gf else ""
    return (f"{r['M']:>5} {r['K']:>5} {r['N']:>5} {gf['cpuformer']:>10.1f} {torch_col} {gf['numpy']:>8.1f} "
            f"{r['ratio_vs_best_peer']:>7.2f}x {100 * r['fraction_of_peak']:>7.1f}% {r['weight_gbytes_per_s']:>7.1f}")


def bench_linear_dtypes(shapes, rounds: int, min_time: float, peaks: Dict[str, float]) -> List[Dict[str, object]]:
    rng = np.random.default_rng(2)
    rows = []
    for m, k, n in shapes:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        b = rng.standard_normal(n, dtype=np.float32)
        lins = {dt: ops.Linear(w, b, dtype=dt) for dt in WEIGHT_DTYPES}  # packed outside the timed loop
        fns: Dict[str, Callable[[], object]] = {dt: (lambda lin=lin: lin(x)) for dt, lin in lins.items()}
        seconds = measure(fns, rounds, min_time)
        ops_count = 2.0 * m * k * n
        gops = {dt: ops_count / s / 1e9 for dt, s in seconds.items()}
        row: Dict[str, object] = {"M": m, "K": k, "N": n, "seconds": seconds, "gops": gops,
                                  "ratio_vs_float32": {dt: gops[dt] / gops["float32"] for dt in WEIGHT_DTYPES},
                                  "fraction_of_peak": {dt: gops[dt] / peaks[dt] for dt in WEIGHT_DTYPES}}
        rows.append(row)
        print(format_dtype_row(row), flush=True)
    return rows


def dtype_header() -> str:
    cols = " ".join(f"{dt:>9}" for dt in WEIGHT_DTYPES)
    ratios = " ".join(f"{dt + '/f32':>13}" for dt in WEIGHT_DTYPES[1:])
    of_peak = " ".join(f"{SHORT[dt] + ' peak':>9}" for dt in WEIGHT_DTYPES)
    return f"{'M':>5} {'K':>5} {'N':>5} {cols} {ratios} {of_peak}"


def format_dtype_row(r: Dict[str, object]) -> str:
    cols = " ".join(f"{r['gops'][dt]:>9.1f}" for dt in WEIGHT_DTYPES)
    ratios = " ".join(f"{r['ratio_vs_float32'][dt]:>12.2f}x" for dt in WEIGHT_DTYPES[1:])
    of_peak = " ".join(f"{100 * r['fraction_of_peak'][dt]:>8.1f}%" for dt in WEIGHT_DTYPES)
    return f"{r['M']:>5} {r['K']:>5} {r['N']:>5} {cols} {ratios} {of_peak}"


# ---- attention --------------------------------------------------------------------------------

def attention_cases() -> List[Dict[str, object]]:
    return [
        {"name": "encoder B=8 H=12 T=128 D=64", "B": 8, "H": 12, "Hkv": 12, "Tq": 128, "Tk": 128, "D": 64,
         "causal": False, "mask": None},
        {"name": "encoder + key padding mask", "B": 8, "H": 12, "Hkv": 12, "Tq": 128, "Tk": 128, "D": 64,
         "causal": False, "mask": "padding"},
        {"name": "causal B=1 H=12 T=512 D=64", "B": 1, "H": 12, "Hkv": 12, "Tq": 512, "Tk": 512, "D": 64,
         "causal": True, "mask": None},
        {"name": "decode B=1 H=32 Hkv=4 Tk=2048", "B": 1, "H": 32, "Hkv": 4, "Tq": 1, "Tk": 2048, "D": 64,
         "causal": False, "mask": None},
    ]


def bench_attention(rounds: int, min_time: float) -> List[Dict[str, object]]:
    rng = np.random.default_rng(1)
    rows = []
    for case in attention_cases():
        b, h, hkv, tq, tk, d = (case[key] for key in ("B", "H", "Hkv", "Tq", "Tk", "D"))
        q = rng.standard_normal((b, h, tq, d), dtype=np.float32)
        k = rng.standard_normal((b, hkv, tk, d), dtype=np.float32)
        v = rng.standard_normal((b, hkv, tk, d), dtype=np.float32)
        mask: Optional[np.ndarray] = None
        if case["mask"] == "padding":  # [B, 1, 1, Tk], True = attend; row i pads its last 3·(i % 4) keys
            mask = np.ones((b, 1, 1, tk), dtype=bool)
            for i in range(b):
                pad = 3 * (i % 4)
                if pad:
                    mask[i, :, :, tk - pad:] = False
        causal = bool(case["causal"])
        fns: Dict[str, Callable[[], object]] = {"cpuformer": lambda: ops.attention(q, k, v, causal=causal, mask=mask)}
        if torch is not None:
            qt, kt, vt = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v)
            mt = torch.from_numpy(mask) if mask is not None else None
            if hkv != h:
                kt, vt = kt.repeat_interleave(h // hkv, dim=1), vt.repeat_interleave(h // hkv, dim=1)
            fns["torch"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mt, is_causal=causal)
        seconds = measure(fns, rounds, min_time)
        row = {"case": case["name"], "shape": {key: case[key] for key in ("B", "H", "Hkv", "Tq", "Tk", "D")},
               "causal": causal, "mask": case["mask"], "ms": {name: 1e3 * s for name, s in seconds.items()}}
        if "torch" in seconds:
            row["speedup_vs_torch"] = seconds["torch"] / seconds["cpuformer"]
        rows.append(row)
        print(format_attention_row(row), flush=True)
    return rows


def attention_header() -> str:
    torch_col = f"{'torch ms':>10} {'speedup':>8}" if torch is not None else ""
    return f"{'case':<32} {'cpuformer ms':>13} {torch_col}"


def format_attention_row(r: Dict[str, object]) -> str:
    torch_col = f"{r['ms']['torch']:>10.3f} {r['speedup_vs_torch']:>7.2f}x" if "torch" in r["ms"] else ""
    return f"{r['case']:<32} {r['ms']['cpuformer']:>13.3f} {torch_col}"


# ---- decode attention over a hot and a cold KV cache -------------------------------------------

DECODE_ATTENTION_HEADS = [("MHA 12/12", 12, 12), ("GQA 32/4", 32, 4)]  # (name, H, Hkv); D = 64
DECODE_ATTENTION_KEYS = (512, 2048)
DECODE_ATTENTION_COLD_BYTES = 400e6


def bench_decode_attention(rounds: int, min_time: float) -> List[Dict[str, object]]:
    rng = np.random.default_rng(2)
    rows = []
    d = 64
    for name, h, hkv in DECODE_ATTENTION_HEADS:
        for tk in DECODE_ATTENTION_KEYS:
            kv_bytes = 2 * hkv * tk * d * 4
            layers = max(2, int(DECODE_ATTENTION_COLD_BYTES / kv_bytes))
            q = rng.standard_normal((1, h, 1, d), dtype=np.float32)
            caches = [(np.full((1, hkv, tk, d), 0.5, np.float32), np.full((1, hkv, tk, d), 0.5, np.float32))
                      for _ in range(layers)]
            turn = [0]

            def cold() -> object:
                k, v = caches[turn[0]]
                turn[0] = (turn[0] + 1) % layers
                return ops.attention(q, k, v, causal=True)

            hot_k, hot_v = caches[0]
            seconds = measure({"hot": lambda: ops.attention(q, hot_k, hot_v, causal=True), "cold": cold},
                              rounds, min_time)
            caches.clear()  # before the next case allocates its own
            row = {"case": f"{name} Tk={tk}", "shape": {"B": 1, "H": h, "Hkv": hkv, "Tq": 1, "Tk": tk, "D": d},
                   "kv_bytes": kv_bytes, "us": {mode: 1e6 * t for mode, t in seconds.items()},
                   "gb_per_s": {mode: kv_bytes / t / 1e9 for mode, t in seconds.items()}}
            rows.append(row)
            print(format_decode_attention_row(row), flush=True)
    return rows


def decode_attention_header() -> str:
    return f"{'case':<20} {'KV MB':>7} {'hot us':>9} {'hot GB/s':>9} {'cold us':>9} {'cold GB/s':>10}"


def format_decode_attention_row(r: Dict[str, object]) -> str:
    return (f"{r['case']:<20} {r['kv_bytes'] / 1e6:>7.2f} {r['us']['hot']:>9.1f} {r['gb_per_s']['hot']:>9.1f} "
            f"{r['us']['cold']:>9.1f} {r['gb_per_s']['cold']:>10.1f}")


# ---- main -------------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter samples")
    parser.add_argument("--threads", type=int, default=_THREADS_DEFAULT, help="threads for every library")
    parser.add_argument("--rounds", type=int, default=None, help="samples per implementation (median)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/ops_<date>.json)")
    parser.add_argument("--skip-attention", action="store_true")
    parser.add_argument("--skip-decode-attention", action="store_true",
                        help="skip one-position attention over a hot and a cold KV cache")
    parser.add_argument("--skip-linear", action="store_true", help="skip the float32 Linear against the peers")
    parser.add_argument("--skip-dtypes", action="store_true", help="skip Linear by weight dtype")
    args = parser.parse_args(argv)

    rounds = args.rounds or (3 if args.quick else 9)
    min_time = 0.02 if args.quick else 0.1
    cf.set_num_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
    limits = threadpool_limits(limits=args.threads, user_api="blas") if threadpool_limits else None

    info = machine_info(args.threads)
    print(f"cpuformer {info['cpuformer']} isa={info['isa']} threads={args.threads} | {info['cpu_model']} | "
          f"numpy {info['numpy']} | torch {info['torch'] or 'absent'}")
    print("compute peak (ops.peak_gops, measured), GOP/s: " + ", ".join(
        f"{dt} {info['peak_gops'][dt]:.0f} ({info['matmul'][dt]})" for dt in WEIGHT_DTYPES))
    print(f"medians of {rounds} samples in alternating passes, each >= {min_time * 1e3:.0f} ms of calls\n")

    linear_rows: List[Dict[str, object]] = []
    if not args.skip_linear:
        print("Linear, GFLOP/s (higher is better); 'vs best' = cpuformer / faster peer")
        print(linear_header())
        shapes = list(LINEAR_LARGE) + [(m, k, n) for m in (1, 4) for k, n in LINEAR_DECODE_KN]
        linear_rows = bench_linear(shapes, rounds, min_time, info["peak_gops"]["float32"])

    dtype_rows: List[Dict[str, object]] = []
    if not args.skip_dtypes:
        print("\nLinear by weight dtype (cpuformer, with bias), GOP/s (higher is better); ratios to float32; "
              "fraction of each dtype's compute peak")
        print(dtype_header())
        dtype_rows = bench_linear_dtypes(LINEAR_DTYPE_SHAPES, rounds, min_time, info["peak_gops"])

    attention_rows: List[Dict[str, object]] = []
    if not args.skip_attention:
        print("\nAttention, milliseconds (lower is better); speedup = torch ms / cpuformer ms")
        print(attention_header())
        attention_rows = bench_attention(rounds, min_time)
    decode_attention_rows: List[Dict[str, object]] = []
    if not args.skip_decode_attention:
        print("\nDecode attention (one query position, float32 KV cache), microseconds and GB/s of KV read; "
              "hot = one layer's call repeated, cold = calls rotating over 400 MB of caches")
        print(decode_attention_header())
        decode_attention_rows = bench_decode_attention(rounds, min_time)
    if limits is not None:
        limits.unregister()

    result = {"machine": info, "rounds": rounds, "min_sample_seconds": min_time, "quick": args.quick,
              "linear": linear_rows, "linear_dtypes": dtype_rows,
              "attention": attention_rows, "decode_attention": decode_attention_rows}
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"ops_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
