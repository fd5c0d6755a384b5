"""Peer-relative accuracy of quantized weights: cpuformer's dtypes against llama.cpp's GGUF kinds.

On the same random weights and the same teacher-forced token sequence, the logits at every position
of each engine and weight format are compared with transformers float32 (the reference):
  * cpuformer: every dtype of cpuformer.weights.DTYPES (int8, float16, bfloat16, and int4 once the
    installed cpuformer has it; float32 too, as the noise floor of two float32 implementations);
  * llama.cpp (llama-cpp-python): GGUF F32 / F16 / Q8_0 / Q4_0 made by benchmarks/_llamacpp.py from
    the same weights (Q8_0 / Q4_0 by llama.cpp's own quantizer, so Q4_0 keeps its output matrix in
    Q6_K as llama-quantize does), F32 KV cache so that only the weight format differs, each in its own
    process; skipped with a message when llama_cpp or gguf does not import.
Models: GPT-2 124M (GPT2Config() defaults) and a small Llama (hidden 768, 4 layers, 12 heads, 4 KV heads,
intermediate 2048, vocab 32000), random weights from transformers' own initialisation (std 0.02, as
real checkpoints) with torch.manual_seed(--seed); a --tokens long sequence of random ids (default 64).

Metrics per engine and format, over all positions: relative RMS error ||x - ref|| / ||ref|| over all
logits, mean cosine per position, top-1 agreement with the reference, and max |x - ref| / max |ref|.
The peer-relative lines state cpuformer int8 against Q8_0 and int4 against Q4_0 (ratio of the
relative RMS errors; <= 1 means cpuformer is no further from float32 than llama.cpp). Random weights
give nearly flat next-token distributions, so top-1 agreement is a weak signal here; the relative
RMS error and the cosine are the measures to compare. Prints a table and writes
benchmarks/results/accuracy_int4_<date>.json (lscpu model name and the versions used).

    python benchmarks/accuracy_int4.py [--models gpt2,llama] [--tokens 64] [--seed 0] [--threads 2]
                                       [--no-llamacpp] [--output PATH]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer.weights import DTYPES  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _llamacpp  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SMALL_LLAMA = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=4,
                   num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                   rms_norm_eps=1e-5, tie_word_embeddings=False)
#: cpuformer dtype -> the llama.cpp kind of the same width, for the peer-relative lines.
PEER_OF = {"int8": "q8_0", "int4": "q4_0", "float16": "f16"}


def build(model: str, directory: str, seed: int) -> int:
    """Saves a randomly initialised HF model; returns its vocabulary size."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if model == "gpt2":
        config = transformers.GPT2Config()
        net = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(bos_token_id=1, eos_token_id=2, **SMALL_LLAMA)
        net = transformers.LlamaForCausalLM(config)
    net.eval().save_pretrained(directory, safe_serialization=True)
    return config.vocab_size


def reference_logits(directory: str, ids: list, threads: int) -> np.ndarray:
    import torch
    import transformers

    torch.set_num_threads(threads)
    net = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.inference_mode():
        return net(torch.tensor([ids])).logits[0].float().numpy()


def lscpu_model_name() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "unknown"
    for line in text.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def versions() -> dict:
    out = {"cpuformer": cf.__version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "llama_cpp_python", "gguf"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def evaluate(args, model: str, work: str, llamacpp: bool) -> dict:
    directory = os.path.join(work, model)
    print(f"{model}: building random weights (seed {args.seed}) ...", flush=True)
    vocab = build(model, directory, args.seed)
    ids = np.random.default_rng(args.seed).integers(10, vocab - 10, args.tokens).tolist()
    reference = reference_logits(directory, ids, args.threads)
    rows: dict = {}
    for dtype in DTYPES:
        gen = cf.Generator(directory, dtype=dtype, num_threads=args.threads)
        rows[f"cpuformer_{dtype}"] = _llamacpp.compare(reference, gen.logits([ids])[0])
        del gen
    info: dict = {}
    if llamacpp:
        try:
            prepared = _llamacpp.run_child(["prepare", directory, os.path.join(work, model + "_gguf"),
                                            "--kinds", ",".join(_llamacpp.KINDS), "--threads", str(args.threads)])
            info = {"files": {k: {"bytes": f["bytes"]} for k, f in prepared["files"].items()},
                    "kv_cache": "F32", "quantizer": "llama_model_quantize, llama.cpp's default tensor policy"}
            text = ",".join(map(str, ids))
            for kind in _llamacpp.KINDS:
                out = os.path.join(work, f"{model}_{kind}.npy")
                _llamacpp.run_child(["logits", prepared["files"][kind]["path"], "--ids", text, "--out", out,
                                     "--threads", str(args.threads), "--kv-f32"])
                rows[f"llamacpp_{kind}"] = _llamacpp.compare(reference, np.load(out))
        except RuntimeError as error:
            print(f"  llama.cpp failed on {model}: {error}", file=sys.stderr)
            info["error"] = str(error)
    f32 = rows.get("llamacpp_f32")
    if f32 and f32["max_abs_diff_rel"] > _llamacpp.SELF_CHECK_TOLERANCE:
        raise RuntimeError(f"{model}: llama.cpp F32 logits are {f32['max_abs_diff_rel']:.3g} of max |logit| away "
                           "from transformers': the GGUF conversion is wrong")

    print(f"\n{model} ({args.tokens} teacher-forced tokens, logits vs transformers float32)")
    print("| engine / format | rel. RMS error | mean cosine | top-1 agreement | max abs diff / max |ref| |")
    print("|---|---|---|---|---|")
    for name, m in rows.items():
        print(f"| {name} | {m['rel_rms']:.3e} | {m['mean_cosine']:.6f} | {m['top1_agreement']:.3f} | "
              f"{m['max_abs_diff_rel']:.3e} |")
    peer_relative = {}
    for dtype, kind in PEER_OF.items():
        ours, theirs = rows.get(f"cpuformer_{dtype}"), rows.get(f"llamacpp_{kind}")
        if ours and theirs:
            ratio = ours["rel_rms"] / theirs["rel_rms"]
            peer_relative[f"{dtype}_vs_{kind}"] = {"rel_rms_ratio": ratio, "no_further": ratio <= 1.0}
            print(f"  cpuformer {dtype} rel. RMS error is {ratio:.2f}x llama.cpp {kind.upper()}'s "
                  f"({'no further from float32' if ratio <= 1.0 else 'FURTHER from float32'})")
    return {"vocab_size": vocab, "tokens": args.tokens, "ids": ids, "reference_scale": float(np.max(np.abs(reference))),
            "rows": rows, "peer_relative": peer_relative, "llamacpp": info}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama", help="comma-separated from gpt2, llama")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp")
    parser.add_argument("--output", default=None,
                        help="JSON path (default: benchmarks/results/accuracy_int4_<date>.json)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(m not in ("gpt2", "llama") for m in models):
        parser.error("--models: choose from gpt2, llama")

    llamacpp = not args.no_llamacpp
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": lscpu_model_name(),
              "threads": args.threads, "seed": args.seed, "cpuformer_dtypes": list(DTYPES), "versions": versions(),
              "small_llama": SMALL_LLAMA, "results": {}}
    if llamacpp:
        usable, version = _llamacpp.available()
        if usable:
            record["llamacpp"] = version
        else:
            print(f"llama.cpp skipped (pip install llama-cpp-python gguf): {version}", file=sys.stderr)
            llamacpp = False
    print(f"cpuformer {cf.__version__} dtypes {', '.join(DTYPES)}; cpu {record['cpu']}")
    work = tempfile.mkdtemp(prefix="cpuformer_accuracy_int4_")
    try:
        for model in models:
            record["results"][model] = evaluate(args, model, work, llamacpp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = args.output or os.path.join(RESULTS, f"accuracy_int4_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
