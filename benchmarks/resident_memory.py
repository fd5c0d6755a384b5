"""Resident memory of a loaded 1.1B Llama (TinyLlama shape, random weights) per weight dtype.

Each dtype loads in a fresh process; the figure is the growth of VmRSS from just before
``cpuformer.Generator(path, dtype=...)`` to just after one 16-token prompt has produced 8 tokens
(the packed weights, the float32 embedding table, the KV cache of that call and the allocator's
buffers). A converted int4 / int8 directory (``cpuformer convert``) is measured too: it loads
without reading float32 weights. Writes benchmarks/results/resident_memory_<date>.json.

    python benchmarks/resident_memory.py [--dtypes float32,int8,int4] [--output PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_decoder  # noqa: E402

import cpuformer as cf  # noqa: E402

_CHILD = r"""
import sys
import cpuformer as cf

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024

before = rss()
gen = cf.Generator(sys.argv[1], dtype=None if sys.argv[2] == "None" else sys.argv[2])
gen.generate(list(range(3, 19)), max_new_tokens=8, min_new_tokens=8)
print(rss() - before)
"""


def resident(directory: str, dtype: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, directory, dtype], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"loading {directory} as {dtype} failed:\n{out.stderr[-3000:]}")
    return int(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,int8,int4")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    config = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                  num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048)
    results = {"machine": bench_decoder.machine_info(cf.get_num_threads()), "cpuformer": cf.__version__,
               "date": datetime.date.today().isoformat(), "model": "llama_1b", "config": config, "bytes": {}}
    with tempfile.TemporaryDirectory() as work:
        source = os.path.join(work, "llama_1b")
        bench_decoder.save_random_llama(source, config)
        for dtype in args.dtypes.split(","):
            results["bytes"][dtype] = resident(source, dtype)
            print(f"{dtype:>18s}: {results['bytes'][dtype] / 1e9:.3f} GB", flush=True)
            if dtype in ("int8", "int4"):
                converted = os.path.join(work, f"llama_1b_{dtype}")
                cf.convert(source, converted, dtype, progress=False)
                results["bytes"][f"{dtype} (converted)"] = resident(converted, "None")
                print(f"{dtype + ' (converted)':>18s}: {results['bytes'][dtype + ' (converted)'] / 1e9:.3f} GB",
                      flush=True)
    output = args.output or os.path.join(bench_decoder.RESULTS, f"resident_memory_{results['date']}.json")
    with open(output, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
