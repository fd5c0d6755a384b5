"""Decoder throughput: cpuformer vs PyTorch (transformers) vs CTranslate2 vs llama.cpp, same weights, one run.

Workloads (2 threads unless --threads), random weights with real shapes:
  * GPT-2 124M: decode tokens/s at batch 1 (16-token prompt, 128 new tokens) and batch 8
    (8 × 16-token prompts, 128 new tokens each), prefill tokens/s for a 512-token prompt (the
    prompt plus one generated token), and cpuformer's per-token decode time over 1000 steps
    (flatness: only the attention term may grow), and the decode time per token against the
    context length for every engine (prompts of 16 .. 896 tokens; per-token time = (time to
    generate n tokens - time to generate 1) / (n - 1), so the prefill is excluded; skip with
    --no-decode-vs-length);
  * a ~1.1B Llama (TinyLlama shape: hidden 2048, 22 layers, 32 heads, 4 KV heads, intermediate
    5632, vocab 32000): decode at batch 1 and prefill 512, with the read-bandwidth bound
    (weight bytes per token ÷ measured bandwidth) and cpuformer's fraction of it.
Greedy decoding with min = max new tokens, so every engine produces exactly the same count.
Read bandwidth: NumPy sums over a 1 GiB array split across --threads threads (NumPy releases the
GIL in reductions). Prints a table and writes benchmarks/results/decoder_<date>.json. Never
asserts a time.

    python benchmarks/bench_decoder.py [--quick] [--skip-llama] [--threads 2] [--no-ct2] [--no-torch]
                                       [--no-llamacpp] [--llamacpp-kinds f32,f16,q8_0,q4_0] [--llamacpp-flash-attn]
                                       [--no-decode-vs-length] [--dtypes float32,int8,float16,bfloat16]
                                       [--speculative] [--kv-cache]

--speculative and --kv-cache also run benchmarks/bench_speculative.py (speculative decoding on and
off: acceptance rate, tokens per model pass) and benchmarks/bench_kv_cache.py (decode time per token
against context length up to ~4k for each kv_cache_dtype), each in its own process, writing
<output>_speculative.json and <output>_kv_cache.json.

--dtypes (default: every dtype of cpuformer.weights.DTYPES) also runs cpuformer with the other weight
dtypes (rows cpuformer_<dtype>) and, with int8, CTranslate2 with compute_type=int8 (row
ctranslate2_int8).

llama.cpp (llama-cpp-python, rows llamacpp_<kind>) decodes and prefills GGUF files made from the same
weights by benchmarks/_llamacpp.py: F32, F16, Q8_0 and Q4_0 (made by llama.cpp's own quantizer), each
kind in its own process, at llama.cpp's default settings (F16 KV cache). Before timing, the F32 file's
logits are checked against transformers' on the same weights (a 16-token sequence, F32 KV cache): when
max |diff| exceeds 1e-3 of max |logit|, that model gets no llama.cpp rows and the run ends with exit
status 1 (after writing the JSON). The JSON records the number
(results.<model>.llamacpp.self_check) and llama.cpp's version (results.llamacpp). Each llama.cpp row
carries the cpuformer dtype it is compared with ("dtype": F16 -> float16, Q8_0 -> int8, Q4_0 -> int4).
Skipped with a message when llama_cpp or gguf does not import (pip install llama-cpp-python gguf).
CTranslate2 runs at the instruction set it picks itself (AVX2 on AMD CPUs, even with AVX-512);
--ct2-isa AVX512 forces AVX-512 (CT2_FORCE_CPU_ISA). The JSON records the setting (machine.ct2_isa).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

import cpuformer as cf  # noqa: E402
from cpuformer.weights import DTYPES  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _llamacpp  # noqa: E402
from _timing import cpuformer_build, timed  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: The cpuformer dtype each peer row is compared with; a peer row not listed here is float32.
LIKE_FOR_LIKE = {"ctranslate2_int8": "cpuformer_int8", "llamacpp_f16": "cpuformer_float16",
                 "llamacpp_q8_0": "cpuformer_int8", "llamacpp_q4_0": "cpuformer_int4"}
LLAMACPP_DTYPE = {"f32": "float32", "f16": "float16", "q8_0": "int8", "q4_0": "int4"}


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
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
            **cpuformer_build()}


CT2_ISAS = ("default", "AVX2", "AVX512")


def add_ct2_isa_option(parser) -> None:
    parser.add_argument("--ct2-isa", choices=CT2_ISAS, default="default",
                        help="instruction set of CTranslate2: its own choice (default; it picks AVX2 on AMD CPUs "
                             "even with AVX-512) or forced with CT2_FORCE_CPU_ISA")


def apply_ct2_isa(isa: str, machine: dict) -> None:
    """Forces CTranslate2's instruction set (CT2_FORCE_CPU_ISA, read once when ctranslate2 starts,
    so before its import) and records the setting in the machine description."""
    if isa != "default":
        if "ctranslate2" in sys.modules:
            raise RuntimeError("--ct2-isa must be applied before ctranslate2 is imported")
        os.environ["CT2_FORCE_CPU_ISA"] = isa
    machine["ct2_isa"] = os.environ.get("CT2_FORCE_CPU_ISA") or "default"


def ratio_note(engine: str, entry: dict, key: str) -> str:
    """The comparison printed after a result row, like against like: a float32 peer against
    cpuformer float32, CTranslate2 int8 and llama.cpp Q8_0 against cpuformer int8, llama.cpp Q4_0
    against cpuformer int4 (LIKE_FOR_LIKE); a cpuformer dtype row states its speed-up over cpuformer
    float32. key: the rate's name in the entries ("tok_per_s", ...)."""
    rate = entry[engine][key]
    if engine == "cpuformer" or not rate:
        return ""
    if engine.startswith("cpuformer_"):
        return f"   {rate / entry['cpuformer'][key]:5.2f}x cpuformer float32" if "cpuformer" in entry else ""
    ours = LIKE_FOR_LIKE.get(engine, "cpuformer")
    return f"   {ours} is {entry[ours][key] / rate:5.2f}x" if ours in entry else ""


def int8_vs_ct2_int8(entry: dict, key: str) -> str:
    """cpuformer int8 over CTranslate2 int8 for the quantized tables, "-" when either is missing."""
    pair = [entry.get(k, {}).get(key) for k in ("cpuformer_int8", "ctranslate2_int8")]
    return f"{pair[0] / pair[1]:.2f}x" if all(pair) else "-"


def rate(entry: dict, tokens: int) -> dict:
    entry["tok_per_s"] = tokens / entry["seconds"]
    return entry


def read_bandwidth(threads: int, gib: float = 1.0) -> float:
    """Bytes/s of summing a `gib` GiB float32 array with `threads` threads (best of 5)."""
    data = np.ones(int(gib * (1 << 30)) // 4, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    for _ in range(5):
        sums = [0.0] * threads

        def work(i):
            sums[i] = float(parts[i].sum(dtype=np.float32))  # noqa: F821 (`del parts` runs after the last call)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    nbytes = data.nbytes
    del data, parts
    return nbytes / best


def write_word_level_tokenizer(directory: str, vocab_size: int, bos: int, eos: int) -> None:
    """A WordLevel tokenizer with tokens "t0".."t{V-1}": CTranslate2's converter needs a vocabulary
    (and named BOS / EOS tokens)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token=f"t{bos}",
                            eos_token=f"t{eos}").save_pretrained(directory)


def save_random_llama(directory: str, config: dict, seed: int = 0, peak: float = 0.0, damp: float = 1.0) -> None:
    """A LlamaForCausalLM checkpoint with random weights written straight from NumPy (torch's
    initialisation of 1.1B parameters takes minutes on 2 cores). peak > 0 adds peak × (the token
    embeddings in a random order) to the LM head: random weights give near-flat next-token
    distributions whose top token flips under int8 rounding far more often than a trained model's;
    the added term makes each token favour a "next" token through the residual stream, as trained
    models' peaked distributions do (the speculative-decoding rows tune it to a stated float32 /
    int8 top-1 agreement). damp scales the layers' output projections (o_proj, down_proj): random
    layers each rewrite the residual stream as much as the embedding put in, so rounding
    differences grow layer by layer; trained layers make smaller updates."""
    from cpuformer._model_dir import save_safetensors

    rng = np.random.default_rng(seed)
    H, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    D = H // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * D

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    embeddings = w(V, H)
    head = w(V, H)
    if peak:
        head += np.float32(peak) * embeddings[rng.permutation(V)]
    tensors = {"model.embed_tokens.weight": embeddings, "model.norm.weight": np.ones(H, np.float32),
               "lm_head.weight": head}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({p + "self_attn.q_proj.weight": w(H, H), p + "self_attn.k_proj.weight": w(kv, H),
                        p + "self_attn.v_proj.weight": w(kv, H),
                        p + "self_attn.o_proj.weight": w(H, H) * np.float32(damp),
                        p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
                        p + "mlp.down_proj.weight": w(H, I) * np.float32(damp),
                        p + "input_layernorm.weight": np.ones(H, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(H, np.float32)})
    os.makedirs(directory, exist_ok=True)
    save_safetensors(os.path.join(directory, "model.safetensors"), tensors, metadata={"format": "pt"})
    full = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
                rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                torch_dtype="float32", **config)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(full, f)


def build_gpt2(directory: str) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    model.save_pretrained(directory)


class Engines:
    """The three engines over one checkpoint directory; each is loaded lazily and freed after use."""

    def __init__(self, args, directory: str, work: str, name: str):
        self.args, self.directory, self.work, self.name = args, directory, work, name

    def cpuformer(self, dtype: str = "float32"):
        return cf.Generator(self.directory, dtype=dtype, num_threads=self.args.threads)

    def torch(self):
        import torch
        import transformers

        torch.set_num_threads(self.args.threads)
        return transformers.AutoModelForCausalLM.from_pretrained(self.directory, dtype=torch.float32).eval()

    def ct2(self, compute_type: str = "default"):
        import ctranslate2

        out = os.path.join(self.work, self.name + "_ct2")
        if not os.path.isdir(out):
            ctranslate2.converters.TransformersConverter(self.directory).convert(out, quantization="float32",
                                                                                 force=True)
        return ctranslate2.Generator(out, device="cpu", intra_threads=self.args.threads, compute_type=compute_type)


def run_engine(label: str, make, fn, results: dict, key: str) -> None:
    try:
        engine = make()
    except Exception as error:  # a missing/broken peer must not stop the run
        print(f"  {label} unavailable: {error}", file=sys.stderr)
        return
    try:
        results[key] = fn(engine)
    finally:
        del engine
        gc.collect()


def decode_workloads(args, engines: Engines, vocab: int, cases: list, skip: set) -> dict:
    """cases: (name, batch, prompt_len, new_tokens). Returns {name: {engine: entry}}."""
    rng = np.random.default_rng(0)
    prompts = {name: rng.integers(10, vocab - 10, (batch, plen)).tolist() for name, batch, plen, _ in cases}
    repeats = 1 if args.quick else 3
    out: dict = {name: {} for name, *_ in cases}

    def ours(gen):
        entries = {}
        for name, batch, plen, new in cases:
            def go():
                return gen.generate(prompts[name], max_new_tokens=new, min_new_tokens=new, eos_token_id=[])
            entries[name] = rate(timed(go, repeats), batch * (new if new > 1 else plen))
        return entries

    def pytorch(model):
        import torch

        entries = {}
        for name, batch, plen, new in cases:
            ids = torch.tensor(prompts[name])

            def go():
                with torch.inference_mode():
                    if new == 1:  # prefill: last-position logits only
                        return model(ids, logits_to_keep=1).logits
                    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                          min_new_tokens=new, do_sample=False, pad_token_id=0)
            entries[name] = rate(timed(go, repeats), batch * (new if new > 1 else plen))
        return entries

    def ct2(gen):
        entries = {}
        for name, batch, plen, new in cases:
            tokens = [[f"t{i}" for i in row] for row in prompts[name]]

            def go():
                return gen.generate_batch(tokens, max_length=new, min_length=new, sampling_topk=1,
                                          include_prompt_in_result=False)
            entries[name] = rate(timed(go, repeats), batch * (new if new > 1 else plen))
        return entries

    per_engine: dict = {}
    run_engine("cpuformer", engines.cpuformer, ours, per_engine, "cpuformer")
    if "torch" not in skip:
        run_engine("PyTorch", engines.torch, pytorch, per_engine, "pytorch")
    if "ct2" not in skip:
        run_engine("CTranslate2", engines.ct2, ct2, per_engine, "ctranslate2_fp32")
    for dtype in getattr(args, "dtypes", ["float32"]):
        if dtype != "float32":
            run_engine(f"cpuformer {dtype}", lambda d=dtype: engines.cpuformer(d), ours, per_engine,
                       f"cpuformer_{dtype}")
    if "ct2" not in skip and "int8" in getattr(args, "dtypes", []):
        run_engine("CTranslate2 int8", lambda: engines.ct2("int8"), ct2, per_engine, "ctranslate2_int8")
    for engine, entries in per_engine.items():
        for name, entry in entries.items():
            out[name][engine] = entry
    for name in out:
        _print_entry(name, out[name])
    return out


def llamacpp_workloads(args, directory: str, work: str, name: str, vocab: int, cases: list, out: dict) -> dict:
    """llama.cpp's rows for decode_workloads' cases (name, batch, prompt_len, new_tokens): GGUF files
    of every kind in args.llamacpp_kinds, the F32 self-check against transformers, then each kind
    timed in its own process. Adds the rows llamacpp_<kind> to out[case] and returns what the JSON
    records about the run (files, self-check, settings); {"error": ...} when the self-check fails."""
    gguf_dir = os.path.join(work, name + "_gguf")
    print(f"  llama.cpp: GGUF files ({', '.join(args.llamacpp_kinds)}) of {name} ...", flush=True)
    ids = np.random.default_rng(2).integers(10, vocab - 10, 16).tolist()
    info: dict = {"settings": "llama-cpp-python's defaults (F16 KV cache); n_batch = n_ubatch = 512 (prefill: the "
                              "prompt length); greedy = argmax of llama_get_logits_ith",
                  "flash_attn": args.llamacpp_flash_attn}
    try:
        files = _llamacpp.run_child(["prepare", directory, gguf_dir, "--kinds", ",".join(args.llamacpp_kinds),
                                     "--threads", str(args.threads)])["files"]
        info["files"] = {kind: {"bytes": f["bytes"]} for kind, f in files.items()}
        info["self_check"] = _llamacpp.self_check(directory, files["f32"]["path"], ids, args.threads, work)
    except RuntimeError as error:
        print(f"  ERROR llama.cpp: no rows for {name}: {error}", file=sys.stderr, flush=True)
        info["error"] = str(error)
        return info
    check = info["self_check"]
    print(f"  llama.cpp self-check ({len(ids)} tokens, F32 GGUF vs transformers float32): max |diff| "
          f"{check['max_abs_diff']:.2e} = {check['max_abs_diff_rel']:.2e} of max |logit| {check['logit_scale']:.3g}",
          flush=True)
    decode_groups: dict = {}  # (prompt_len, new) -> batch sizes
    for _, batch, plen, new in cases:
        if new > 1:
            decode_groups.setdefault((plen, new), []).append(batch)
    prefills = [plen for _, _, plen, new in cases if new == 1]
    repeats = str(1 if args.quick else 3)
    for kind in args.llamacpp_kinds:
        calls = [["--decode", f"{plen},{new}", "--batch", ",".join(map(str, batches)), "--prefill", "0"]
                 for (plen, new), batches in decode_groups.items()]
        calls += [["--decode", "", "--prefill", str(plen)] for plen in prefills]
        for call in calls:
            try:
                timings = _llamacpp.run_child(["bench", files[kind]["path"], "--threads", str(args.threads),
                                               "--repeats", repeats] + call
                                              + (["--flash-attn"] if args.llamacpp_flash_attn else []))
            except RuntimeError as error:
                print(f"  llama.cpp {kind} {' '.join(call)} failed: {error}", file=sys.stderr, flush=True)
                continue
            for case, entry in timings.items():
                if case in out:
                    out[case][f"llamacpp_{kind}"] = {**entry, "dtype": LLAMACPP_DTYPE[kind], "format": kind.upper()}
    for case, entry in out.items():
        if isinstance(entry, dict):
            _print_entry(case, entry, only="llamacpp_")
    return info


def flatness(args, directory: str, steps: int) -> dict:
    """Per-token decode time of cpuformer over `steps` steps (GPT-2, batch 1), from stream() timestamps."""
    gen = cf.Generator(directory, num_threads=args.threads)
    stamps = []
    start = time.perf_counter()
    for _ in gen.stream(list(range(100, 116)), max_new_tokens=steps, min_new_tokens=steps, eos_token_id=[]):
        stamps.append(time.perf_counter())
    gaps = np.diff(np.array([start] + stamps))[1:]  # drop the prefill
    window = max(1, min(100, len(gaps) // 4))
    first, last = float(np.median(gaps[:window])), float(np.median(gaps[-window:]))
    print(f"  per-token decode time: first {window} steps {first * 1e3:.2f} ms, last {window} steps "
          f"{last * 1e3:.2f} ms (x{last / first:.2f})", flush=True)
    return {"steps": steps, "window": window, "first_ms": first * 1e3, "last_ms": last * 1e3, "ratio": last / first}


def decode_vs_length(args, engines: Engines, vocab: int, lengths: list, new: int, skip: set) -> dict:
    """Decode milliseconds per token at batch 1 after prompts of each length, for every engine:
    (seconds for `new` tokens - seconds for 1 token) / (new - 1), medians of a few runs. Returns
    {"lengths": [...], "new_tokens": new, "ms_per_token": {engine: [ms per length]}}."""
    rng = np.random.default_rng(1)
    prompts = {n: rng.integers(10, vocab - 10, (1, n)).tolist() for n in lengths}
    repeats = 1 if args.quick else 3

    def per_token(run) -> list:
        out = []
        for n in lengths:
            one = timed(lambda: run(prompts[n], 1), repeats)["seconds"]
            many = timed(lambda: run(prompts[n], new), repeats)["seconds"]
            out.append(max(many - one, 0.0) / (new - 1) * 1e3)
        return out

    def ours(gen):
        return per_token(lambda p, k: gen.generate(p, max_new_tokens=k, min_new_tokens=k, eos_token_id=[]))

    def pytorch(model):
        import torch

        def run(p, k):
            ids = torch.tensor(p)
            with torch.inference_mode():
                return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k,
                                      do_sample=False, pad_token_id=0)
        return per_token(run)

    def ct2(gen):
        def run(p, k):
            return gen.generate_batch([[f"t{i}" for i in row] for row in p], max_length=k, min_length=k,
                                      sampling_topk=1, include_prompt_in_result=False)
        return per_token(run)

    results: dict = {}
    run_engine("cpuformer", engines.cpuformer, ours, results, "cpuformer")
    if "torch" not in skip:
        run_engine("PyTorch", engines.torch, pytorch, results, "pytorch")
    if "ct2" not in skip:
        run_engine("CTranslate2", engines.ct2, ct2, results, "ctranslate2_fp32")
    for engine, values in results.items():
        print(f"  decode ms/token by context {engine:<18} " + "  ".join(
            f"{n}: {v:.2f}" for n, v in zip(lengths, values)), flush=True)
    return {"lengths": lengths, "new_tokens": new, "ms_per_token": results}


def _print_entry(name: str, entry: dict, only: str = "") -> None:
    """One line per engine of a workload's entry (only: the engines whose name starts with it)."""
    for engine, e in entry.items():
        if not isinstance(e, dict) or "tok_per_s" not in e or not engine.startswith(only):
            continue
        print(f"  {name:<24} {engine:<18} {e['tok_per_s']:9.2f} tok/s{ratio_note(engine, entry, 'tok_per_s')}",
              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one timed run per workload, shorter flatness run")
    parser.add_argument("--skip-llama", action="store_true", help="skip the 1.1B Llama workloads")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default=",".join(DTYPES),
                        help="cpuformer weight dtypes (comma-separated; default: all of cpuformer.weights.DTYPES); "
                             "int8 adds CTranslate2 int8")
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp")
    parser.add_argument("--llamacpp-kinds", default=",".join(_llamacpp.KINDS),
                        help="llama.cpp GGUF kinds to time (comma-separated from f32,f16,q8_0,q4_0)")
    parser.add_argument("--llamacpp-flash-attn", action="store_true",
                        help="llama.cpp with flash attention (llama-cpp-python's default: off)")
    add_ct2_isa_option(parser)
    parser.add_argument("--no-decode-vs-length", action="store_true",
                        help="skip the decode time per token against context length")
    parser.add_argument("--speculative", action="store_true",
                        help="also run bench_speculative.py (drafting on and off, acceptance, tokens per pass)")
    parser.add_argument("--kv-cache", action="store_true",
                        help="also run bench_kv_cache.py (decode time per token against context length per KV dtype)")
    parser.add_argument("--output", default=None, help="JSON path (default: benchmarks/results/decoder_<date>.json)")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in args.dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes {','.join(unknown)}: this cpuformer has {', '.join(DTYPES)}")
    args.llamacpp_kinds = [k.strip() for k in args.llamacpp_kinds.split(",") if k.strip()]
    if any(k not in _llamacpp.KINDS for k in args.llamacpp_kinds):
        parser.error(f"--llamacpp-kinds: choose from {', '.join(_llamacpp.KINDS)}")
    skip = ({"ct2"} if args.no_ct2 else set()) | ({"torch"} if args.no_torch else set())
    skip |= {"llamacpp"} if args.no_llamacpp else set()
    llamacpp_failed = False
    if "llamacpp" not in skip:
        usable, version = _llamacpp.available()
        if usable:
            print(f"llama.cpp: llama-cpp-python {version['llama_cpp_python']}")
        else:
            print(f"llama.cpp skipped (pip install llama-cpp-python gguf): {version}", file=sys.stderr)
            skip.add("llamacpp")
    machine = machine_info(args.threads)
    apply_ct2_isa(args.ct2_isa, machine)
    print(f"cpuformer {cf.__version__}  isa={machine['isa']}  threads={args.threads}  cpu={machine['cpu']}  "
          f"ct2_isa={machine['ct2_isa']}")
    results: dict = {}
    if "llamacpp" not in skip:
        results["llamacpp"] = version
    work = tempfile.mkdtemp(prefix="cpuformer_bench_dec_")
    try:
        bandwidth = read_bandwidth(args.threads)
        results["read_bandwidth_gb_s"] = bandwidth / 1e9
        print(f"read bandwidth ({args.threads} threads, NumPy sum over 1 GiB): {bandwidth / 1e9:.1f} GB/s")

        gpt2 = os.path.join(work, "gpt2")
        print("building GPT-2 124M (random weights) ...", flush=True)
        build_gpt2(gpt2)
        write_word_level_tokenizer(gpt2, 50257, 50256, 50256)
        cases = [("decode_b1_p16_n128", 1, 16, 128), ("decode_b8_p16_n128", 8, 16, 128), ("prefill_512", 1, 512, 1)]
        results["gpt2"] = decode_workloads(args, Engines(args, gpt2, work, "gpt2"), 50257, cases, skip)
        if "llamacpp" not in skip:
            results["gpt2"]["llamacpp"] = llamacpp_workloads(args, gpt2, work, "gpt2", 50257, cases, results["gpt2"])
            llamacpp_failed |= "error" in results["gpt2"]["llamacpp"]
        results["gpt2"]["flatness"] = flatness(args, gpt2, 200 if args.quick else 1000)
        if not args.no_decode_vs_length:
            lengths = [16, 256, 512] if args.quick else [16, 128, 256, 512, 896]
            results["gpt2"]["decode_vs_length"] = decode_vs_length(args, Engines(args, gpt2, work, "gpt2"), 50257,
                                                                   lengths, 16 if args.quick else 32, skip)

        if not args.skip_llama:
            llama = os.path.join(work, "llama_1b")
            config = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                          num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048)
            print("building a 1.1B Llama (TinyLlama shape, random weights) ...", flush=True)
            save_random_llama(llama, config)
            write_word_level_tokenizer(llama, 32000, 1, 2)
            cases = [("decode_b1_p16_n32" if args.quick else "decode_b1_p16_n64", 1, 16, 32 if args.quick else 64),
                     ("prefill_512", 1, 512, 1)]
            entry = decode_workloads(args, Engines(args, llama, work, "llama_1b"), 32000, cases, skip)
            if "llamacpp" not in skip:
                entry["llamacpp"] = llamacpp_workloads(args, llama, work, "llama_1b", 32000, cases, entry)
                llamacpp_failed |= "error" in entry["llamacpp"]
            H, I, L, V = 2048, 5632, 22, 32000
            kv = 4 * (H // 32)
            weight_bytes = 4 * (L * (H * H * 2 + 2 * H * kv + 3 * H * I) + V * H)  # per token: every matrix once
            bound = bandwidth / weight_bytes
            decode = next(k for k in entry if k.startswith("decode"))
            ours = entry[decode].get("cpuformer", {}).get("tok_per_s")
            entry["bandwidth_bound"] = {"weight_bytes_per_token": weight_bytes, "bound_tok_per_s": bound,
                                        "cpuformer_fraction": ours / bound if ours else None}
            print(f"  bandwidth bound {bound:.2f} tok/s ({weight_bytes / 1e9:.2f} GB per token); cpuformer at "
                  f"{(ours or 0) / bound:.0%} of it", flush=True)
            results["llama_1b"] = entry
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("\n| workload | cpuformer | PyTorch | CTranslate2 fp32 | vs PyTorch | vs CT2 |")
    print("|---|---|---|---|---|---|")
    for model in ("gpt2", "llama_1b"):
        for name, entry in results.get(model, {}).items():
            if not isinstance(entry, dict) or "cpuformer" not in entry:
                continue

            def tps(key):
                return entry[key]["tok_per_s"] if key in entry else None

            ours, pt, ct = tps("cpuformer"), tps("pytorch"), tps("ctranslate2_fp32")
            fmt = lambda v: f"{v:.2f}" if v else "-"  # noqa: E731
            print(f"| {model} {name} | {fmt(ours)} | {fmt(pt)} | {fmt(ct)} | "
                  f"{f'{ours / pt:.2f}x' if pt else '-'} | {f'{ours / ct:.2f}x' if ct else '-'} |")

    extra = [f"cpuformer_{d}" for d in args.dtypes if d != "float32"]
    extra += ["ctranslate2_int8"] if "int8" in args.dtypes else []
    if extra:
        both = "ctranslate2_int8" in extra  # listed exactly when int8 runs
        columns = extra + (["int8 vs CT2 int8"] if both else [])
        print("\nquantized weights, tokens/s\n| workload | " + " | ".join(columns) + " |\n|---|"
              + "---|" * len(columns))
        for model in ("gpt2", "llama_1b"):
            for name, entry in results.get(model, {}).items():
                if isinstance(entry, dict) and "cpuformer" in entry:
                    cells = [f"{entry[k]['tok_per_s']:.2f}" if k in entry else "-" for k in extra]
                    ratio = [int8_vs_ct2_int8(entry, "tok_per_s")] if both else []
                    print(f"| {model} {name} | " + " | ".join(cells + ratio) + " |")

    peers = [f"llamacpp_{k}" for k in args.llamacpp_kinds]
    if any(k in entry for model in ("gpt2", "llama_1b") for entry in results.get(model, {}).values()
           if isinstance(entry, dict) for k in peers):
        pairs = [(f"cpuformer {LLAMACPP_DTYPE[k[9:]]} vs {k[9:].upper()}", LIKE_FOR_LIKE.get(k, "cpuformer"), k)
                 for k in peers]
        print("\nllama.cpp (GGUF of the same weights), tokens/s\n| workload | " + " | ".join(peers) + " | "
              + " | ".join(p[0] for p in pairs) + " |\n|---|" + "---|" * (2 * len(peers)))
        for model in ("gpt2", "llama_1b"):
            for name, entry in results.get(model, {}).items():
                if isinstance(entry, dict) and any(k in entry for k in peers):
                    cells = [f"{entry[k]['tok_per_s']:.2f}" if k in entry else "-" for k in peers]
                    cells += [f"{entry[ours]['tok_per_s'] / entry[k]['tok_per_s']:.2f}x"
                              if ours in entry and k in entry else "-" for _, ours, k in pairs]
                    print(f"| {model} {name} | " + " | ".join(cells) + " |")

    path = args.output or os.path.join(RESULTS, f"decoder_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine, "quick": args.quick, "unit": "tokens/s", "results": results}, f, indent=2)
    print(f"\nwrote {path}")
    # Speculative decoding and the KV cache dtype: their own scripts, each in its own process.
    here = os.path.dirname(os.path.abspath(__file__))
    for flag, script in ((args.speculative, "bench_speculative.py"), (args.kv_cache, "bench_kv_cache.py")):
        if flag:
            out = path[:-len(".json")] + "_" + script[len("bench_"):-len(".py")] + ".json"
            subprocess.run([sys.executable, os.path.join(here, script), "--threads", str(args.threads),
                            "--output", out], check=True)
    if llamacpp_failed:
        print("ERROR: llama.cpp rows are missing (see above: conversion or self-check)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
