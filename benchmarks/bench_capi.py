"""The C API's overhead over the Python API (docs/c-api.md): the same converted model, the same
inputs, timed through ``libcpuformer`` (called with ctypes: one foreign call per request, the work
inside the C++ core) and through ``cpuformer.load``, each in its own process, alternating rounds.

Workloads (2 threads unless --threads): GPT-2 124M decode (random weights, real shape; a 16-token
prompt, 64 new greedy tokens, EOS disabled; reported as tokens/s) and BERT-base hidden states at
8 × 128 (sequences/s), each at every --dtypes. A row's rate is the median over --rounds rounds;
the ratio is C API / Python API (1.00 = no overhead; the target is ≥ 0.99). Prints a table and
writes benchmarks/results/capi_<date>.json with the machine (lscpu), date and settings. Never asserts
a time. Both run their kernels on cpuformer's own thread pools (docs/runtime.md).

Single rounds move by ±15 % on a shared host, so the full-size ratios cannot resolve 1 %. The two
APIs differ only in what wraps the one C++ call a request makes, so each workload also has a
*wrapper twin*: the same request (the same prompt and new tokens; the same batch × length) on a
one-layer model of width 32, where the model's own work is tens of microseconds and the wrappers'
cost is most of the time. The twin's C − Python time per request is the C API's extra cost in
absolute terms; divided by the full workload's Python time per request it bounds the C API's
overhead there (negative: the C API's wrapper is the cheaper one). A wrapper cost that grows with the
model's width is the output copy of the encoder, and there the C API writes into the caller's
reused buffer while the Python API allocates a new array, so the twin does not favour the C API.

    python benchmarks/bench_capi.py [--lib build/capi/libcpuformer.so] [--threads 2] [--rounds 5]
                                    [--seconds 2] [--dtypes float32,int8] [--no-twins] [--out FILE]

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
from _timing import machine, run_script  # noqa: E402

PROMPT, NEW = 16, 64
BATCH, SEQ = 8, 128
# The wrapper twins: each workload's request on a one-layer model of width 32.
TWINS = {
    "gpt2_decode": ("decoder", dict(name="gpt2-wrapper-twin", vocab_size=512, n_embd=32, n_layer=1, n_head=2,
                                    n_positions=128)),
    "bert_8x128": ("encoder", dict(name="bert-wrapper-twin", vocab_size=512, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)),
}


def _converted(source, dtype):
    import cpuformer as cf

    converted = f"{source}-{dtype}-graph"
    if not os.path.isfile(os.path.join(converted, "cpuformer_graph.json")):
        cf.convert(source, converted, dtype, progress=False)
    return converted


def _models(dtypes, cache, twins):
    """{row key: converted directory}: "<workload>/<dtype>" and, with twins, "<workload>-twin/<dtype>"."""
    from cpuformer import _bench

    out = {}
    for kind, workload in (("decoder", "gpt2_decode"), ("encoder", "bert_8x128")):
        source = _bench.cached_model(kind, quick=False, cache=cache)
        for dtype in dtypes:
            out[f"{workload}/{dtype}"] = _converted(source, dtype)
        if twins:
            twin_kind, shape = TWINS[workload]
            twin = _bench.cached_build(shape["name"], [twin_kind, shape, 1],
                                       lambda staging, k=twin_kind, s=shape: _bench.build_model(k, s, staging),
                                       cache, f"{twin_kind}, random weights")
            for dtype in dtypes:
                out[f"{workload}-twin/{dtype}"] = _converted(twin, dtype)
    return out


def _inputs(workload, vocab_size):
    import numpy as np

    rng = np.random.default_rng(0)
    if workload == "gpt2_decode":
        return rng.integers(10, vocab_size, size=PROMPT, dtype=np.int64)
    return rng.integers(10, vocab_size, size=(BATCH, SEQ), dtype=np.int64)


def _child(args):
    import numpy as np

    workload = args.workload
    config = json.loads(pathlib.Path(args.model, "config.json").read_text())
    ids = _inputs(workload, config["vocab_size"])
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
            out = np.empty((BATCH, SEQ, config["hidden_size"]), dtype=np.float32)
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
    pathlib.Path(args.result).write_text(json.dumps({"rate": rate, "request_seconds": seconds}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", default=str(ROOT / "build" / "capi" / "libcpuformer.so"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--no-twins", action="store_true", help="skip the wrapper twins (see the module's doc)")
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
    models = _models(args.dtypes.split(","), args.cache, not args.no_twins)
    rates, request_seconds = {}, {}
    result = str(ROOT / "build" / "bench_capi_result.json")
    for r in range(args.rounds):
        for key, model in models.items():
            engines = ("python", "c") if r % 2 == 0 else ("c", "python")
            for engine in engines:
                code, tail = run_script(__file__, ["--child", "--engine", engine, "--workload",
                                                   key.split("/")[0].removesuffix("-twin"),
                                                   "--model", model, "--lib", args.lib, "--threads",
                                                   str(args.threads), "--seconds", str(args.seconds), "--result",
                                                   result], timeout=600)
                if code != 0:
                    raise SystemExit(f"{engine} {key}: {tail}")
                measured = json.loads(pathlib.Path(result).read_text())
                rates.setdefault((key, engine), []).append(measured["rate"])
                request_seconds.setdefault((key, engine), []).append(measured["request_seconds"])
    rows = []
    print(f"{'workload':<22}{'Python API':>14}{'C API':>14}{'C / Python':>12}")
    for key in models:
        if "-twin/" in key:
            continue
        py, c = statistics.median(rates[(key, "python")]), statistics.median(rates[(key, "c")])
        unit = "tok/s" if key.startswith("gpt2") else "seq/s"
        print(f"{key:<22}{py:>10.1f} {unit}{c:>10.1f} {unit}{c / py:>12.3f}")
        rows.append({"workload": key, "unit": unit, "python": py, "c": c, "ratio": c / py,
                     "python_rounds": rates[(key, "python")], "c_rounds": rates[(key, "c")]})
    twin_rows = _twin_rows(models, request_seconds)
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"capi_{today}.json")
    out.write_text(json.dumps({"date": today, "machine": machine(), "threads": args.threads,
                               "rounds": args.rounds, "seconds": args.seconds, "prompt": PROMPT,
                               "new_tokens": NEW, "batch": BATCH, "seq_len": SEQ, "rows": rows,
                               "twins": {k: v[1] for k, v in TWINS.items()}, "twin_rows": twin_rows},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def _twin_rows(models, request_seconds):
    """The wrapper twins' rows: per request, the median Python and C API times, their difference,
    and the difference as a fraction of the full workload's Python time per request (the bound on
    the C API's overhead there). Prints them as a table."""
    rows = []
    twins = [key for key in models if "-twin/" in key]
    if twins:
        print(f"\n{'wrapper twin':<27}{'Python API':>12}{'C API':>12}{'C - Python':>12}{'of full request':>17}")
    for key in twins:
        full = key.replace("-twin/", "/")
        py = statistics.median(request_seconds[(key, "python")])
        c = statistics.median(request_seconds[(key, "c")])
        full_py = statistics.median(request_seconds[(full, "python")])
        rows.append({"workload": key, "full_workload": full, "python_request_us": py * 1e6, "c_request_us": c * 1e6,
                     "c_minus_python_us": (c - py) * 1e6, "full_python_request_us": full_py * 1e6,
                     "overhead_bound": (c - py) / full_py,
                     "python_rounds_us": [t * 1e6 for t in request_seconds[(key, "python")]],
                     "c_rounds_us": [t * 1e6 for t in request_seconds[(key, "c")]]})
        print(f"{key:<27}{py * 1e6:>9.0f} us{c * 1e6:>9.0f} us{(c - py) * 1e6:>9.0f} us{(c - py) / full_py:>16.3%}")
    return rows


if __name__ == "__main__":
    sys.exit(main())
