"""The C API's overhead over the Python API (docs/c-api.md): the same converted model, the same
inputs, timed through ``libcpuformer`` (called with ctypes: one foreign call per request, the work
inside the C++ core) and through ``cpuformer.load``, each in its own process, alternating rounds.

Workloads (2 threads unless --threads): GPT-2 124M decode (random weights, real shape; a 16-token
prompt, 64 new greedy tokens, EOS disabled; reported as tokens/s) and BERT-base hidden states at
8 × 128 (sequences/s), each at every --dtypes. A row's rate is the median over --rounds rounds;
the ratio is C API / Python API (1.00 = no overhead; the target is ≥ 0.99). Prints a table and
writes benchmarks/results/capi_<date>.json with the machine (lscpu), date and settings. Never asserts
a time. The C rows run with GOMP_SPINCOUNT=1000, as the Python package sets for itself.

    python benchmarks/bench_capi.py [--lib build/capi/libcpuformer.so] [--threads 2] [--rounds 5]
                                    [--seconds 2] [--dtypes float32,int8] [--out FILE]

--lib: the library built by scripts/test-c-api.sh (or CMake with -DCPUFORMER_BUILD_CAPI=ON); built
here in build/capi when missing.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _timing import run_script  # noqa: E402

PROMPT, NEW = 16, 64
BATCH, SEQ = 8, 128


def _models(dtypes, cache):
    import cpuformer as cf
    from cpuformer import _bench

    out = {}
    for kind, workload in (("decoder", "gpt2_decode"), ("encoder", "bert_8x128")):
        source = _bench.cached_model(kind, quick=False, cache=cache)
        for dtype in dtypes:
            converted = f"{source}-{dtype}-graph"
            if not os.path.isfile(os.path.join(converted, "cpuformer_graph.json")):
                cf.convert(source, converted, dtype, progress=False)
            out[f"{workload}/{dtype}"] = converted
    return out


def _inputs(workload):
    import numpy as np

    rng = np.random.default_rng(0)
    if workload == "gpt2_decode":
        return rng.integers(10, 50000, size=PROMPT, dtype=np.int64)
    return rng.integers(10, 30000, size=(BATCH, SEQ), dtype=np.int64)


def _child(args):
    import numpy as np

    workload = args.workload
    ids = _inputs(workload)
    if args.engine == "python":
        import cpuformer as cf

        model = cf.load(args.model, num_threads=args.threads)
        if workload == "gpt2_decode":
            def run():
                model.generate([list(map(int, ids))], max_new_tokens=NEW, eos_token_id=[])
        else:
            def run():
                model(ids)
    else:
        # What the Python package sets for its own load of libgomp (cpuformer/__init__.py), so both
        # rows wait alike; a C application sets it in its environment (docs/c-api.md, "Threads").
        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", "1000")
        lib = ctypes.CDLL(args.lib)

        class Error(ctypes.Structure):
            _fields_ = [("status", ctypes.c_int), ("message", ctypes.c_char * 1024)]

        class OpenOptions(ctypes.Structure):
            _fields_ = [("dtype", ctypes.c_char_p), ("num_threads", ctypes.c_int)]

        class GenerateOptions(ctypes.Structure):
            _fields_ = [("max_new_tokens", ctypes.c_int64), ("min_new_tokens", ctypes.c_int64),
                        ("do_sample", ctypes.c_int), ("temperature", ctypes.c_double), ("top_k", ctypes.c_int64),
                        ("top_p", ctypes.c_double), ("repetition_penalty", ctypes.c_double),
                        ("no_repeat_ngram_size", ctypes.c_int64), ("num_beams", ctypes.c_int64),
                        ("length_penalty", ctypes.c_double), ("seed", ctypes.c_uint64),
                        ("eos_token_ids", ctypes.POINTER(ctypes.c_int64)), ("eos_count", ctypes.c_size_t)]

        error = Error()
        handle = ctypes.c_void_p()
        options = OpenOptions(None, args.threads)
        if lib.cf_model_open(args.model.encode(), ctypes.byref(options), ctypes.byref(handle), ctypes.byref(error)):
            raise SystemExit(error.message.decode())
        p64 = ctypes.POINTER(ctypes.c_int64)
        ids_p = ids.ctypes.data_as(p64)
        if workload == "gpt2_decode":
            gen = GenerateOptions()
            lib.cf_generate_options_init(ctypes.byref(gen))
            gen.max_new_tokens = NEW
            none = (ctypes.c_int64 * 1)()
            gen.eos_token_ids, gen.eos_count = ctypes.cast(none, p64), 0  # no EOS: always NEW tokens
            tokens = (ctypes.c_int64 * NEW)()
            count = ctypes.c_size_t()

            def run():
                if lib.cf_generate(handle, ids_p, ctypes.c_size_t(PROMPT), ctypes.byref(gen), None, None, tokens,
                                   ctypes.c_size_t(NEW), ctypes.byref(count), None, ctypes.byref(error)):
                    raise SystemExit(error.message.decode())
        else:
            out = np.empty((BATCH, SEQ, 768), dtype=np.float32)
            out_p = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

            def run():
                if lib.cf_encode(handle, ids_p, None, None, ctypes.c_size_t(BATCH), ctypes.c_size_t(SEQ), out_p,
                                 ctypes.c_size_t(out.size), ctypes.byref(error)):
                    raise SystemExit(error.message.decode())
    run()  # warm-up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds or calls < 2:
        run()
        calls += 1
    seconds = (time.perf_counter() - start) / calls
    rate = (NEW if workload == "gpt2_decode" else BATCH) / seconds
    pathlib.Path(args.result).write_text(json.dumps({"rate": rate}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", default=str(ROOT / "build" / "capi" / "libcpuformer.so"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    if not os.path.isfile(args.lib):
        build = ROOT / "build" / "capi"
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        "-DCPUFORMER_BUILD_PYTHON=OFF", "-DCPUFORMER_BUILD_CAPI=ON"], check=True)
        subprocess.run(["cmake", "--build", str(build), "-j", "2", "--target", "cpuformer"], check=True)
    models = _models(args.dtypes.split(","), args.cache)
    rates = {}
    result = str(ROOT / "build" / "bench_capi_result.json")
    for r in range(args.rounds):
        for key, model in models.items():
            engines = ("python", "c") if r % 2 == 0 else ("c", "python")
            for engine in engines:
                code, tail = run_script(__file__, ["--child", "--engine", engine, "--workload", key.split("/")[0],
                                                   "--model", model, "--lib", args.lib, "--threads",
                                                   str(args.threads), "--seconds", str(args.seconds), "--result",
                                                   result], timeout=600)
                if code != 0:
                    raise SystemExit(f"{engine} {key}: {tail}")
                rates.setdefault((key, engine), []).append(json.loads(pathlib.Path(result).read_text())["rate"])
    rows = []
    print(f"{'workload':<22}{'Python API':>14}{'C API':>14}{'C / Python':>12}")
    for key in models:
        py, c = statistics.median(rates[(key, "python")]), statistics.median(rates[(key, "c")])
        unit = "tok/s" if key.startswith("gpt2") else "seq/s"
        print(f"{key:<22}{py:>10.1f} {unit}{c:>10.1f} {unit}{c / py:>12.3f}")
        rows.append({"workload": key, "unit": unit, "python": py, "c": c, "ratio": c / py,
                     "python_rounds": rates[(key, "python")], "c_rounds": rates[(key, "c")]})
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                      "unknown")
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"capi_{today}.json")
    out.write_text(json.dumps({"date": today, "machine": {"cpu": model_name, "lscpu": lscpu}, "threads": args.threads,
                               "rounds": args.rounds, "seconds": args.seconds, "prompt": PROMPT,
                               "new_tokens": NEW, "batch": BATCH, "seq_len": SEQ, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
