"""Speculative decoding against plain decoding, batch 1, on the ~1.1B Llama shape (TinyLlama:
hidden 2048, 22 layers, 32 heads, 4 KV heads, intermediate 5632, vocab 32000).

Random weights give near-flat next-token distributions whose top token flips under int8 rounding
far more often than a trained model's, so a draft would agree with its model unrealistically
rarely. The benchmark model is shaped the way trained models behave (bench_decoder.save_random_llama
with ``peak`` and ``damp``: each token favours a "next" token through the residual stream, and the
layers make small updates); the float32 / int8 / int4 top-1 agreement it reaches is measured
(teacher-forced over a random 256-token text) and reported next to every speed-up, with the
acceptance rate (accepted ÷ drafted tokens) and the tokens per model pass.

Rows:
  * float32 model, its own int8 weights as the draft (assistant_model="int8");
  * int8 model, its own int4 weights as the draft;
  each with the adaptive draft length and with a fixed draft of 3 tokens;
  * prompt lookup on a copying task, float32 and int8: a model made to copy (--copy-damp 0: the
    layers write nothing to the residual stream, so each token's successor is fixed and the
    acceptance rate is known to be 100 %) and a prompt that holds the text it goes on to write
    (its own greedy continuation of a text, then that text again).
Greedy output is checked to be identical to plain decoding in every row.

    python benchmarks/bench_speculative.py [--threads 2] [--new 64] [--output results/...json]
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
from bench_decoder import machine_info, save_random_llama  # noqa: E402

LLAMA_1B = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048)


def agreement(directory: str, dtypes, threads: int) -> dict:
    """Top-1 agreement of each pair of dtypes over a random 256-token text (teacher-forced)."""
    ids = np.random.default_rng(7).integers(3, LLAMA_1B["vocab_size"], (1, 256))
    top = {}
    for dtype in dtypes:
        model = cf.Generator(directory, dtype=dtype, num_threads=threads)
        top[dtype] = model.logits(ids)[0].argmax(-1)
        model.close()
    return {f"{a}/{b}": float((top[a] == top[b]).mean()) for a, b in zip(dtypes, dtypes[1:])}


def run_row(model, prompt, new: int, repeats: int, **speculative) -> dict:
    """Plain and speculative decoding timed alternately (`repeats` runs of each, best of each): a
    batch-1 decode follows the read bandwidth the host gives at the moment, which drifts by 1.5x
    within minutes on a shared machine, so the two are timed in the same minutes."""
    def plain_run():
        return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, eos_token_id=[])

    def spec_run():
        return model.generate(prompt, max_new_tokens=new, min_new_tokens=new, eos_token_id=[], return_stats=True,
                              **speculative)

    def once(fn):
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start, result

    plain_s = spec_s = float("inf")
    plain, (out, stats) = plain_run(), spec_run()  # warm-up
    for _ in range(repeats):
        plain_s = min(plain_s, once(plain_run)[0])
        seconds, (out, stats) = once(spec_run)
        spec_s = min(spec_s, seconds)
    if out != plain:
        raise AssertionError(f"speculative output differs from plain decoding ({speculative})")
    row = {"plain_tok_per_s": new / plain_s, "speculative_tok_per_s": new / spec_s, "speedup": plain_s / spec_s,
           "acceptance": stats["accepted_tokens"] / max(1, stats["draft_tokens"]),
           "tokens_per_pass": (new - 1) / max(1, stats["target_passes"]), **stats}
    print(f"  {model.dtype:8s} {json.dumps(speculative, default=str):48s} plain {row['plain_tok_per_s']:6.2f} tok/s  "
          f"speculative {row['speculative_tok_per_s']:6.2f} tok/s  {row['speedup']:4.2f}x  "
          f"acceptance {row['acceptance']:.2f}  tokens/pass {row['tokens_per_pass']:.2f}", flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new", type=int, default=64, help="new tokens per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--peak", type=float, default=6.0)
    parser.add_argument("--damp", type=float, default=0.04)
    parser.add_argument("--copy-damp", type=float, default=0.0, help="damp of the copying model")
    parser.add_argument("--model-dir", help="reuse (or create) the benchmark checkpoints under this directory")
    parser.add_argument("--output", help="write the results as JSON")
    args = parser.parse_args(argv)

    machine = machine_info(args.threads)
    print(json.dumps(machine))
    root = args.model_dir or tempfile.mkdtemp(prefix="cpuformer_bench_spec_")
    directory = os.path.join(root, f"llama_peak{args.peak:g}_damp{args.damp:g}")
    copier = os.path.join(root, f"llama_peak{args.peak:g}_damp{args.copy_damp:g}")
    for path, damp in ((directory, args.damp), (copier, args.copy_damp)):
        if not os.path.isfile(os.path.join(path, "model.safetensors")):
            print(f"building a 1.1B Llama (TinyLlama shape, random weights, peak {args.peak}, damp {damp}) ...",
                  flush=True)
            save_random_llama(path, LLAMA_1B, peak=args.peak, damp=damp)
    results = {"machine": machine, "model": dict(LLAMA_1B, peak=args.peak, damp=args.damp, copy_damp=args.copy_damp),
               "new_tokens": args.new,
               "agreement": agreement(directory, ["float32", "int8", "int4"], args.threads), "rows": {}}
    print("top-1 agreement:", results["agreement"], flush=True)
    rng = np.random.default_rng(3)
    prompt = [int(x) for x in rng.integers(3, LLAMA_1B["vocab_size"], 32)]
    for dtype, draft in (("float32", "int8"), ("int8", "int4")):
        model = cf.Generator(directory, dtype=dtype, num_threads=args.threads)
        results["rows"][f"{dtype}_draft_{draft}"] = run_row(model, prompt, args.new, args.repeats,
                                                            assistant_model=draft)
        # A fixed, short draft: where a verification pass costs more per extra position (int8
        # GEMMs on CPUs without VNNI are compute-bound from a few rows on).
        results["rows"][f"{dtype}_draft_{draft}_constant3"] = run_row(
            model, prompt, args.new, args.repeats, assistant_model=draft, num_assistant_tokens=3,
            num_assistant_tokens_schedule="constant")
        model.close()
    for dtype in ("float32", "int8"):
        # Copying: the model's own continuation of a text, then the text again; prompt lookup
        # finds the continuation in the prompt.
        model = cf.Generator(copier, dtype=dtype, num_threads=args.threads)
        text = prompt[:16]
        continuation = model.generate(text, max_new_tokens=args.new, min_new_tokens=args.new, eos_token_id=[])[0]
        results["rows"][f"{dtype}_prompt_lookup_copying"] = run_row(model, text + continuation + text, args.new,
                                                                    args.repeats, prompt_lookup_num_tokens=10)
        model.close()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
