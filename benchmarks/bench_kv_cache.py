"""Decode time per token against context length for each KV cache dtype (kv_cache_dtype=),
batch 1, on GPT-2 124M's shape with a 4,096-position table (random weights).

At long contexts a decode step reads the KV cache as well as the weights: GPT-2's float32 cache
holds 12 layers × 2 × 768 floats per position, 288 MiB at 4,096 positions, more than half of its
float32 weights. A float16 / bfloat16 cache halves that, int8 (one float32 scale per 64-value row)
reads 0.27× of it. The time per decode token is the time from the first to the last streamed
token over the tokens in between (the prefill excluded), best of --repeats. The cache's size at
each length is reported next to it.

    python benchmarks/bench_kv_cache.py [--threads 2] [--lengths 512 1024 2048 4096] [--output results/...json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import cpuformer as cf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decoder import machine_info  # noqa: E402

KV_DTYPES = ("float32", "float16", "bfloat16", "int8")
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}


def build_gpt2(directory: str, positions: int) -> dict:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=positions)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(directory)
    return config.to_dict()


def cache_bytes(config: dict, length: int, dtype: str) -> int:
    """Bytes of the KV cache of one sequence of `length` positions."""
    layers, hidden, heads = config["n_layer"], config["n_embd"], config["n_head"]
    rows = 2 * layers * heads * length  # key and value rows of head_dim values
    return rows * (hidden // heads) * BYTES[dtype] + (rows * 4 if dtype == "int8" else 0)


def per_token(model, prompt, new: int, repeats: int, kv: str) -> float:
    """Seconds per decode token: the time between the first and the last streamed token over the
    tokens in between (the prefill is not in it), best of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        stamps = [time.perf_counter() for _ in model.stream(prompt, max_new_tokens=1 + new, min_new_tokens=1 + new,
                                                          eos_token_id=[], kv_cache_dtype=kv)]
        best = min(best, (stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4032])
    parser.add_argument("--new", type=int, default=48, help="decode tokens timed per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "int8"], help="weight dtypes")
    parser.add_argument("--output", help="write the results as JSON")
    args = parser.parse_args(argv)

    machine = machine_info(args.threads)
    print(json.dumps(machine))
    directory = os.path.join(tempfile.mkdtemp(prefix="cpuformer_bench_kv_"), "gpt2")
    positions = max(args.lengths) + args.new + 1
    config = build_gpt2(directory, positions)
    results = {"machine": machine, "model": "GPT-2 124M shape, n_positions=%d" % positions, "new_tokens": args.new,
               "rows": {}}
    rng = np.random.default_rng(0)
    for dtype in args.dtypes:
        model = cf.Generator(directory, dtype=dtype, num_threads=args.threads)
        for length in args.lengths:
            prompt = [int(x) for x in rng.integers(0, config["vocab_size"], length)]
            row = {}
            for kv in KV_DTYPES:
                seconds = per_token(model, prompt, args.new, args.repeats, kv)
                row[kv] = {"ms_per_token": seconds * 1e3, "tok_per_s": 1 / seconds,
                           "cache_mib": cache_bytes(config, length + args.new + 1, kv) / 2 ** 20}
            for kv in KV_DTYPES:
                row[kv]["speedup_vs_float32_cache"] = row["float32"]["ms_per_token"] / row[kv]["ms_per_token"]
                row[kv]["memory_vs_float32_cache"] = row[kv]["cache_mib"] / row["float32"]["cache_mib"]
            results["rows"][f"{dtype}_{length}"] = row
            print(f"  weights {dtype:8s} context {length:5d}: " + "  ".join(
                f"{kv} {row[kv]['ms_per_token']:6.2f} ms ({row[kv]['speedup_vs_float32_cache']:4.2f}x, "
                f"{row[kv]['cache_mib']:6.1f} MiB)" for kv in KV_DTYPES), flush=True)
        model.close()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
