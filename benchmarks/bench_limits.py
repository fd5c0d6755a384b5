"""How close each README row runs to the machine's limit: a roofline report.

For each workload of the README's headline table and each dtype, this prints:
- the work of one unit (a sequence, a generated token or a prompt token): the multiply-adds (MACs)
  and the bytes of weights and KV cache read;
- the limits measured in the same run: the compute peak of the dtype's matmul instruction
  (`cpuformer.ops.peak_gops`), and the read bandwidth of an independent NumPy probe run right
  before and right after each measurement (their mean; it drifts by up to 2x within minutes on a
  shared host, so each row has its own);
- the bound: the time the work would take at those limits, summed over the phases of a call.
  Every phase takes at least its MACs at the peak or its bytes at the bandwidth, whichever is
  longer. The phases are an encoder pass, a prefill, and each decode step at its context length;
- the measured rate, and the fraction of the bound's rate it reaches.

Accounting, from the model's hyperparameters (cpuformer.arch):
- Per token per layer: the projections' weights (q, k, v, o and the feed-forward's two or three
  matrices) as MACs. Attention adds 2 · heads · head_dim · (keys it sees) MACs per query (q·k and
  p·v).
- The LM head (vocab · hidden) runs once per generated token and once per prompt. An encoder-
  decoder's cross-attention keys and values run once per source token and layer.
- Bytes are the weights in their stored dtype, read once per phase: int8 adds a float32 scale per
  output row. The KV cache is read in float32 at every decode step; a decoder's model-level tables
  are not counted.
- Not counted: activations, norms, softmax and the embedding lookup. These make the bound
  optimistic, so a fraction near 100 % means there is nothing left to gain.
- Beam rows count num_beams sequences per source (their KV reordering is not counted).

Each row runs in its own process, which loads the model, warms up and then times the call (median
of --repeats). Models are random weights of the real shapes, built once into --work:
BERT-base, GPT-2 124M, Marian base, T5-small and the 1.1B Llama shape (--skip-llama drops it).

    python benchmarks/bench_limits.py [--work DIR] [--dtypes float32,int8] [--rows gpt2_decode_b1,...]
                                      [--skip-llama] [--threads 2] [--repeats 5] [--out FILE]

Writes benchmarks/results/limits_<date>.json (lscpu, peaks, per-row probes). Never asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _timing import machine, run_script, timed  # noqa: E402

# name -> (model, mode, workload); mode: "encoder", "decoder" (generate), "prefill" (one new token),
# "seq2seq" (generate from sources). The README's headline rows (its MiniLM `embed` row includes
# tokenization and is left out).
ROWS = {
    "bert_8x128": ("bert", "encoder", dict(batch=8, length=128)),
    "bert_1x16": ("bert", "encoder", dict(batch=1, length=16)),
    "gpt2_decode_b1": ("gpt2", "decoder", dict(batch=1, prompt=16, new=64)),
    "gpt2_decode_b8": ("gpt2", "decoder", dict(batch=8, prompt=16, new=64)),
    "gpt2_prefill_512": ("gpt2", "prefill", dict(batch=1, prompt=512)),
    "llama_decode_b1": ("llama", "decoder", dict(batch=1, prompt=16, new=64)),
    "llama_prefill_512": ("llama", "prefill", dict(batch=1, prompt=512)),
    "marian_greedy": ("marian", "seq2seq", dict(batch=16, length=24, new=32, beams=1)),
    "marian_beam4": ("marian", "seq2seq", dict(batch=16, length=24, new=32, beams=4)),
    "t5_greedy": ("t5", "seq2seq", dict(batch=16, length=24, new=32, beams=1)),
    "t5_beam4": ("t5", "seq2seq", dict(batch=16, length=24, new=32, beams=4)),
}
LLAMA = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
             num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048)


# ---- the work of a call ------------------------------------------------------------------------

def weight_bytes(n: int, k: int, dtype: str) -> float:
    """Bytes of an n x k weight stored in `dtype` (int8: a float32 scale per output row; int4 at the
    default settings: nibbles and a float16 scale per group of 32 input channels)."""
    if dtype == "int8":
        return n * k + 4.0 * n
    if dtype == "int4":
        groups = -(-k // 32)
        return n * groups * (16 + 2.0)
    return n * k * {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def layer_matrices(h, cross: bool = False):
    """(out, in) of one layer's projections applied to every token: attention q, k, v, o and the
    feed-forward; with `cross`, a decoder layer's cross-attention q and o too (its k and v run
    over the source: cross_kv_matrices)."""
    d, q_width, kv_width = h.hidden_size, h.num_heads * h.head_dim, (h.num_kv_heads or h.num_heads) * h.head_dim
    mats = [(q_width, d), (kv_width, d), (kv_width, d), (d, q_width)]
    if cross:
        mats += [(q_width, d), (d, q_width)]
    mats += [(h.intermediate_size, d)] * (2 if h.gated_ffn else 1) + [(d, h.intermediate_size)]
    return mats


def cross_kv_matrices(h):
    kv_width = (h.num_kv_heads or h.num_heads) * h.head_dim
    return [(kv_width, h.hidden_size), (kv_width, h.hidden_size)]


def phase(macs: float, nbytes: float) -> dict:
    return {"macs": float(macs), "bytes": float(nbytes)}


def call_phases(h, mode: str, load: dict, dtype: str) -> list:
    """The phases of one call: [{"macs", "bytes"}]."""
    L, d, V = h.num_layers, h.hidden_size, h.vocab_size
    attn_width = h.num_heads * h.head_dim
    kv_width = (h.num_kv_heads or h.num_heads) * h.head_dim
    per_token = sum(n * k for n, k in layer_matrices(h)) * L
    layer_bytes = sum(weight_bytes(n, k, dtype) for n, k in layer_matrices(h)) * L
    head_bytes = weight_bytes(V, d, "int8" if dtype == "int4" else dtype)  # int4 keeps an int8 LM head
    if mode == "encoder":
        B, T = load["batch"], load["length"]
        attention = 2 * attn_width * T * T * L * B
        return [phase(B * T * per_token + attention, layer_bytes)]
    if mode in ("decoder", "prefill"):
        B, P = load["batch"], load["prompt"]
        causal_pairs = P * (P + 1) / 2
        phases = [phase(B * (P * per_token + 2 * attn_width * causal_pairs * L + V * d), layer_bytes + head_bytes)]
        for step in range(1, load.get("new", 1)):  # the first new token comes from the prefill
            context = P + step  # keys the new token sees (the cache plus itself)
            kv_read = B * L * 2 * kv_width * (context - 1) * 4
            phases.append(phase(B * (per_token + 2 * attn_width * context * L + V * d),
                                layer_bytes + head_bytes + kv_read))
        return phases
    # seq2seq: the encoder over the sources, the cross-attention keys and values, then each step for
    # batch x beams sequences.
    B, S, N, beams = load["batch"], load["length"], load["new"], load["beams"]
    Ld = h.num_decoder_layers or L
    encoder = phase(B * S * per_token + 2 * attn_width * S * S * L * B, layer_bytes)
    cross_kv = sum(n * k for n, k in cross_kv_matrices(h)) * Ld
    cross_kv_bytes = sum(weight_bytes(n, k, dtype) for n, k in cross_kv_matrices(h)) * Ld
    phases = [encoder, phase(B * S * cross_kv, cross_kv_bytes)]
    dec_token = sum(n * k for n, k in layer_matrices(h, cross=True)) * Ld
    dec_bytes = sum(weight_bytes(n, k, dtype) for n, k in layer_matrices(h, cross=True)) * Ld
    seqs = B * beams
    for step in range(1, N + 1):
        keys = step + S  # self-attention over the steps so far, cross-attention over the source
        kv_read = seqs * Ld * 2 * kv_width * (step - 1) * 4 + B * Ld * 2 * kv_width * S * 4
        phases.append(phase(seqs * (dec_token + 2 * attn_width * keys * Ld + V * d),
                            dec_bytes + head_bytes + kv_read))
    return phases


def units(mode: str, load: dict) -> tuple:
    """(units per call, unit name) as the README counts them."""
    if mode == "encoder":
        return load["batch"], "seq/s"
    if mode == "prefill":
        return load["batch"] * load["prompt"], "tok/s"
    return load["batch"] * load["new"], "tok/s"  # generated tokens (seq2seq: per source, as the README)


def bound_seconds(phases: list, peak_ops: float, bandwidth: float) -> float:
    """The time of a call at the limits: each phase at least its MACs at the peak (2 ops each) or
    its bytes at the bandwidth."""
    return sum(max(2 * p["macs"] / peak_ops, p["bytes"] / bandwidth) for p in phases)


# ---- models and timing -------------------------------------------------------------------------

def model_dir(name: str, work: str) -> str:
    from cpuformer import _bench

    if name in ("bert", "gpt2", "marian"):
        kind = {"bert": "encoder", "gpt2": "decoder", "marian": "seq2seq"}[name]
        return _bench.cached_model(kind, quick=False, cache=work)
    directory = os.path.join(work, name)
    if os.path.isfile(os.path.join(directory, "config.json")):
        return directory
    if name == "llama":
        import bench_decoder

        print("building a 1.1B Llama (TinyLlama shape, random weights) ...", flush=True)
        bench_decoder.save_random_llama(directory, LLAMA)
    else:
        import bench_seq2seq

        bench_seq2seq.build("t5-small", directory)
    return directory


def hparams(directory: str):
    from cpuformer.arch import find

    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    arch, _ = find(config)
    return arch.hparams(config)


def child(args) -> int:
    import numpy as np

    import cpuformer as cf

    _, mode, load = ROWS[args.row]
    h = hparams(args.model)
    rng = np.random.default_rng(0)
    model = cf.load(args.model, dtype=args.dtype, num_threads=args.threads)
    if mode == "encoder":
        ids = rng.integers(104, h.vocab_size, (load["batch"], load["length"]))

        def run():
            model(ids)
    elif mode in ("decoder", "prefill"):
        prompts = rng.integers(10, h.vocab_size - 10, (load["batch"], load["prompt"])).tolist()
        new = load.get("new", 1)

        def run():
            model.generate(prompts, max_new_tokens=new, min_new_tokens=new, eos_token_id=[])
    else:
        sources = rng.integers(3, h.vocab_size - 2, (load["batch"], load["length"])).tolist()
        new, beams = load["new"], load["beams"]

        def run():
            model.generate(sources, max_new_tokens=new, min_new_tokens=new, num_beams=beams)
    seconds = timed(run, args.repeats)["seconds"]  # after its own warm-up call
    pathlib.Path(args.result).write_text(json.dumps({"seconds": seconds}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=os.path.join(os.path.expanduser("~"), ".cache", "cpuformer"))
    parser.add_argument("--dtypes", default="float32,int8")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    import bench_decoder

    from cpuformer import ops, set_num_threads

    rows = [r for r in args.rows.split(",") if not (args.skip_llama and r.startswith("llama"))]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    dtypes = args.dtypes.split(",")
    set_num_threads(args.threads)
    peaks = {dtype: ops.peak_gops(dtype) * 1e9 for dtype in dtypes}
    print("compute peaks: " + ", ".join(f"{d} {p / 1e9:.0f} GOP/s" for d, p in peaks.items()), flush=True)
    result_file = os.path.join(args.work, "bench_limits_result.json")
    os.makedirs(args.work, exist_ok=True)
    out_rows = []
    print(f"{'row':<20}{'dtype':<9}{'MACs/unit':>11}{'MB/unit':>9}{'probe GB/s':>11}{'bound':>10}{'measured':>10}"
          f"{'fraction':>9}  limited by")
    for row in rows:
        model_name, mode, load = ROWS[row]
        directory = model_dir(model_name, args.work)
        h = hparams(directory)
        count, unit = units(mode, load)
        for dtype in dtypes:
            phases = call_phases(h, mode, load, dtype)
            before = bench_decoder.read_bandwidth(args.threads)
            code, tail = run_script(__file__, ["--child", "--row", row, "--model", directory, "--dtype", dtype,
                                               "--threads", str(args.threads), "--repeats", str(args.repeats),
                                               "--result", result_file], timeout=3600)
            if code != 0:
                raise SystemExit(f"{row} {dtype}: {tail}")
            after = bench_decoder.read_bandwidth(args.threads)
            seconds = json.loads(pathlib.Path(result_file).read_text())["seconds"]
            bandwidth = (before + after) / 2
            bound = bound_seconds(phases, peaks[dtype], bandwidth)
            compute = sum(2 * p["macs"] / peaks[dtype] for p in phases)
            memory = sum(p["bytes"] / bandwidth for p in phases)
            macs = sum(p["macs"] for p in phases) / count
            nbytes = sum(p["bytes"] for p in phases) / count
            limited = "compute" if compute >= memory else "memory"
            entry = {"row": row, "dtype": dtype, "unit": unit, "workload": load, "macs_per_unit": macs,
                     "bytes_per_unit": nbytes, "probe_gb_s": [before / 1e9, after / 1e9],
                     "peak_gops": peaks[dtype] / 1e9, "measured_rate": count / seconds,
                     "bound_rate": count / bound, "fraction": bound / seconds, "limited_by": limited,
                     "compute_seconds": compute, "memory_seconds": memory, "measured_seconds": seconds}
            out_rows.append(entry)
            print(f"{row:<20}{dtype:<9}{macs / 1e6:>10.1f}M{nbytes / 1e6:>9.1f}{bandwidth / 1e9:>11.1f}"
                  f"{count / bound:>10.1f}{count / seconds:>10.1f}{bound / seconds:>9.0%}  {limited} ({unit})",
                  flush=True)
    today = datetime.date.today().isoformat()
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / f"limits_{today}.json")
    out.write_text(json.dumps({"date": today, "machine": machine(), "threads": args.threads,
                               "peaks_gops": {d: p / 1e9 for d, p in peaks.items()}, "rows": out_rows}, indent=1)
                   + "\n")
    print(f"wrote {out}")
    if out_rows:
        print(f"median fraction of the bound: {statistics.median(r['fraction'] for r in out_rows):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
