"""A/B of GPT-2 124M decode (batch 1, 64 new tokens) and prefill (512 tokens) in the cpuformer this
process imports: run it alternately with PYTHONPATH pointing at each build.

    PYTHONPATH=<build>/python python ab_decode.py float32|int8
"""

import json
import sys
import time

import numpy as np

import cpuformer as cf
from cpuformer import _bench


def best_rate(fn, count, rounds=3):
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        rates.append(count / (time.perf_counter() - start))
    return max(rates)


def main(dtype):
    model = cf.load(_bench.cached_model("decoder", quick=False), dtype=dtype, num_threads=2)
    prompt = list(range(5, 21))
    model.generate(prompt, max_new_tokens=8, min_new_tokens=8)  # warm-up
    decode = best_rate(lambda: model.generate(prompt, max_new_tokens=64, min_new_tokens=64), 64)
    long_prompt = np.arange(5, 517).tolist()
    prefill = best_rate(lambda: model.generate(long_prompt, max_new_tokens=1, min_new_tokens=1), 512)
    print(json.dumps({"decode": decode, "prefill": prefill}))


if __name__ == "__main__":
    main(sys.argv[1])
