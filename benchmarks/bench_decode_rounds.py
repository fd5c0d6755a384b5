"""Batch-1 decode, cpuformer against llama.cpp, in interleaved rounds with a bandwidth probe each round.

A batch-1 decode step reads every weight once, so its speed follows the read bandwidth the machine
gives at that moment; on a shared host that moves by 1.5x within minutes, and two engines timed one
after the other (as bench_decoder.py does) can differ by that much for no reason of their own.
Here every round times each pair (a cpuformer dtype and the llama.cpp kind it is compared with)
back to back, each engine in its own fresh process, alternating which goes first, next to a read
bandwidth probe; the ratio of a pair is taken within each round and the median over rounds is
reported, with each round's fraction of the bandwidth bound (bytes of weights read per token ÷ the
probe's bytes/s).

Interference on a shared host only ever slows an engine down, so next to the median of the rounds'
ratios the summary gives each engine's best rate over the rounds, their ratio, and the best rate's
bytes/s against the best probe reading (the machine's bandwidth when it was quiet): the same
reasoning as timing a function by its fastest run.

    python benchmarks/bench_decode_rounds.py [--model llama_1b|gpt2] [--pairs int4:q4_0,int8:q8_0]
                                             [--rounds 7] [--prompt 16] [--new 64] [--repeats 3]
                                             [--threads 2] [--work DIR] [--output FILE]

--work keeps the models (HF checkpoint, cpuformer-converted directories, GGUF files) between runs.
Bytes read per token: the weights of every tensor but the token embedding (one row of it is read);
for cpuformer the converted model.safetensors' tensors, for llama.cpp the GGUF file's (Q4_0 keeps
llama.cpp's output matrix in Q6_K). The KV cache of a 16 + 64-token context is < 1 % of either.

Probe: bench_decoder.read_bandwidth (NumPy sums over 1 GiB on `threads` threads, best of 5).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _llamacpp  # noqa: E402
from _timing import timed  # noqa: E402

RESULTS = os.path.join(HERE, "results")
LLAMA_1B = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048)
#: Tensors a decode step reads only one row of.
EMBEDDINGS = ("model.embed_tokens.", "transformer.wte.", "token_embd.")


def safetensors_bytes(path: str) -> int:
    """Bytes of every tensor in a safetensors file except the token embedding."""
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
               if k != "__metadata__" and not k.startswith(EMBEDDINGS))


def gguf_bytes(path: str) -> int:
    """Bytes of every tensor in a GGUF file except the token embedding."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors if not t.name.startswith(EMBEDDINGS))


def child(args) -> int:
    """One cpuformer timing in this (fresh) process: prints {"tok_per_s": ...} as the last line."""
    import cpuformer as cf

    gen = cf.Generator(args.child, num_threads=args.threads)
    prompt = np.random.default_rng(0).integers(10, gen.vocab_size - 10, (1, args.prompt)).tolist()
    entry = timed(lambda: gen.generate(prompt, max_new_tokens=args.new, min_new_tokens=args.new, eos_token_id=[]),
                  args.repeats)
    entry["tok_per_s"] = args.new / entry["seconds"]  # prompt included, as llama.cpp's rows
    print(json.dumps(entry))
    return 0


def run_ours(directory: str, args) -> float:
    command = [sys.executable, os.path.abspath(__file__), "--child", directory, "--threads", str(args.threads),
               "--prompt", str(args.prompt), "--new", str(args.new), "--repeats", str(args.repeats)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"cpuformer child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["tok_per_s"]


def run_llamacpp(path: str, args) -> float:
    timings = _llamacpp.run_child(["bench", path, "--threads", str(args.threads), "--repeats", str(args.repeats),
                                   "--decode", f"{args.prompt},{args.new}", "--batch", "1", "--prefill", "0"])
    return timings[f"decode_b1_p{args.prompt}_n{args.new}"]["tok_per_s"]


def prepare(args, pairs) -> tuple:
    """(cpuformer directory per dtype, GGUF path per kind, self-check) under args.work, built once."""
    import bench_decoder

    import cpuformer as cf

    hf = os.path.join(args.work, args.model)
    if not os.path.exists(os.path.join(hf, "config.json")):
        print(f"building {args.model} (random weights) ...", flush=True)
        if args.model == "gpt2":
            bench_decoder.build_gpt2(hf)
            bench_decoder.write_word_level_tokenizer(hf, 50257, 50256, 50256)
        else:
            bench_decoder.save_random_llama(hf, LLAMA_1B)
            bench_decoder.write_word_level_tokenizer(hf, 32000, 1, 2)
    ours = {}
    for dtype in sorted({d for d, _ in pairs}):
        out = os.path.join(args.work, f"{args.model}-{dtype}")
        if not os.path.exists(os.path.join(out, "config.json")):
            print(f"cpuformer convert --dtype {dtype} ...", flush=True)
            cf.convert(hf, out, dtype=dtype)
        ours[dtype] = out
    kinds = sorted({k for _, k in pairs})
    gguf_dir = os.path.join(args.work, f"{args.model}-gguf")
    files = {k: os.path.join(gguf_dir, f"model-{k}.gguf") for k in kinds}
    if not all(os.path.exists(p) for p in files.values()):
        print(f"llama.cpp GGUF files ({', '.join(kinds)}) ...", flush=True)
        made = _llamacpp.run_child(["prepare", hf, gguf_dir, "--kinds", ",".join(["f32"] + kinds),
                                    "--threads", str(args.threads)])["files"]
        files = {k: made[k]["path"] for k in kinds}
    ids = np.random.default_rng(2).integers(10, 1000, 16).tolist()
    check = _llamacpp.self_check(hf, os.path.join(gguf_dir, "model-f32.gguf"), ids, args.threads, args.work) \
        if os.path.exists(os.path.join(gguf_dir, "model-f32.gguf")) else {"skipped": "no F32 file kept"}
    return ours, files, check


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("llama_1b", "gpt2"), default="llama_1b")
    parser.add_argument("--pairs", default="int4:q4_0,int8:q8_0",
                        help="cpuformer dtype:llama.cpp kind pairs (comma-separated)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine per round (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "cpuformer", "rounds"))
    parser.add_argument("--output", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",") if p]
    if any(len(p) != 2 or p[1] not in _llamacpp.KINDS for p in pairs):
        parser.error(f"--pairs: dtype:kind with kind in {', '.join(_llamacpp.KINDS)}")
    usable, version = _llamacpp.available()
    if not usable:
        print(f"llama.cpp is needed (pip install llama-cpp-python gguf): {version}", file=sys.stderr)
        return 1
    import bench_decoder

    os.makedirs(args.work, exist_ok=True)
    ours, files, check = prepare(args, pairs)
    weight_bytes = {("cpuformer", d): safetensors_bytes(os.path.join(p, "model.safetensors")) for d, p in ours.items()}
    weight_bytes.update({("llamacpp", k): gguf_bytes(p) for k, p in files.items()})
    machine = bench_decoder.machine_info(args.threads)
    print(f"{machine['cpu']}  isa={machine['isa']}  threads={args.threads}  llama-cpp-python "
          f"{version['llama_cpp_python']}")
    for (engine, name), nbytes in weight_bytes.items():
        print(f"  {engine} {name}: {nbytes / 1e6:.1f} MB of weights read per token")

    rounds = []
    for r in range(args.rounds):
        entry: dict = {"probe_gb_s": bench_decoder.read_bandwidth(args.threads) / 1e9}
        for dtype, kind in pairs:
            order = [("cpuformer", dtype), ("llamacpp", kind)]
            if r % 2:
                order.reverse()
            for engine, name in order:
                rate = run_ours(ours[name], args) if engine == "cpuformer" else run_llamacpp(files[name], args)
                entry[f"{engine}_{name}"] = rate
        entry["probe_after_gb_s"] = bench_decoder.read_bandwidth(args.threads) / 1e9
        probe = (entry["probe_gb_s"] + entry["probe_after_gb_s"]) / 2
        line = [f"round {r + 1}: probe {entry['probe_gb_s']:.1f}/{entry['probe_after_gb_s']:.1f} GB/s"]
        for dtype, kind in pairs:
            a, b = entry[f"cpuformer_{dtype}"], entry[f"llamacpp_{kind}"]
            fa = a * weight_bytes[("cpuformer", dtype)] / (probe * 1e9)
            fb = b * weight_bytes[("llamacpp", kind)] / (probe * 1e9)
            entry[f"{dtype}_vs_{kind}"] = a / b
            entry[f"fraction_cpuformer_{dtype}"], entry[f"fraction_llamacpp_{kind}"] = fa, fb
            line.append(f"{dtype} {a:.1f} ({fa:.0%}) vs {kind} {b:.1f} ({fb:.0%}) tok/s = {a / b:.2f}x")
        print("  ".join(line), flush=True)
        rounds.append(entry)

    summary = {}
    for dtype, kind in pairs:
        ratios = [e[f"{dtype}_vs_{kind}"] for e in rounds]
        fractions = [e[f"fraction_cpuformer_{dtype}"] for e in rounds]
        peer_fractions = [e[f"fraction_llamacpp_{kind}"] for e in rounds]
        best = max(e[f"cpuformer_{dtype}"] for e in rounds), max(e[f"llamacpp_{kind}"] for e in rounds)
        best_probe = max(max(e["probe_gb_s"], e["probe_after_gb_s"]) for e in rounds) * 1e9
        summary[f"{dtype}_vs_{kind}"] = {
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "fraction_median": statistics.median(fractions), "peer_fraction_median": statistics.median(peer_fractions),
            "best_tok_per_s": best[0], "peer_best_tok_per_s": best[1], "best_ratio": best[0] / best[1],
            "best_probe_gb_s": best_probe / 1e9,
            "best_fraction": best[0] * weight_bytes[("cpuformer", dtype)] / best_probe,
            "peer_best_fraction": best[1] * weight_bytes[("llamacpp", kind)] / best_probe}
        s = summary[f"{dtype}_vs_{kind}"]
        print(f"{args.model} decode b1: cpuformer {dtype} / llama.cpp {kind}: median of the rounds' ratios "
              f"{s['median']:.2f}x (min {s['min']:.2f}, max {s['max']:.2f}); best rates {best[0]:.1f} / {best[1]:.1f} "
              f"tok/s = {s['best_ratio']:.2f}x, at {s['best_fraction']:.0%} / {s['peer_best_fraction']:.0%} of the "
              f"best probe's bound ({s['best_probe_gb_s']:.1f} GB/s)")
    result = {"machine": machine, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "llamacpp": version, "model": args.model, "prompt": args.prompt, "new": args.new,
              "repeats": args.repeats, "weight_bytes_per_token": {f"{e}_{n}": b for (e, n), b in weight_bytes.items()},
              "self_check": check, "rounds": rounds, "summary": summary,
              "probe": "NumPy sum over 1 GiB on `threads` threads, best of 5, before and after each round"}
    path = args.output or os.path.join(RESULTS, f"decode_rounds_{args.model}_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
