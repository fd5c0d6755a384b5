"""Encoder-decoder throughput: cpuformer vs PyTorch (transformers) vs CTranslate2 float32, same weights,
one run.

Workloads (2 threads unless --threads), random weights with real shapes:
  * Marian base (opus-mt shape: d_model 512, 6 + 6 layers, 8 heads, ffn 2048, vocab 58101);
  * T5-small (d_model 512, 6 + 6 layers, 8 heads, d_kv 64, ffn 2048 ReLU, vocab 32128);
16 sources × 24 tokens → exactly 32 target tokens each (min = max length, so every engine does
the same work), greedy and beam search with 4 beams. Reported: target tokens/s (16 × 32 /
seconds, the median of --repeats runs after a warm-up). --dtypes adds cpuformer with int8 /
float16 / bfloat16 weights (rows cpuformer_<dtype>) and, with int8, CTranslate2 with
compute_type=int8 (row ctranslate2_int8). Prints a table and writes
benchmarks/results/seq2seq_<date>.json. Never asserts a time.

    python benchmarks/bench_seq2seq.py [--quick] [--threads 2] [--dtypes float32,int8] [--no-ct2] [--no-torch]
                                       [--only marian|t5-small]

CTranslate2 runs at the instruction set it picks itself (AVX2 on AMD CPUs, even with AVX-512);
--ct2-isa AVX512 forces AVX-512 (CT2_FORCE_CPU_ISA). The JSON records the setting (machine.ct2_isa).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

import cpuformer as cf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decoder import add_ct2_isa_option, apply_ct2_isa, machine_info, timed  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
SOURCES, SOURCE_LEN, TARGET_LEN = 16, 24, 32

MODELS = {
    "marian": ("MarianMTModel", "MarianConfig",
               dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                    max_position_embeddings=512, pad_token_id=58100, decoder_start_token_id=58100, eos_token_id=0,
                    activation_function="swish", scale_embedding=True)),
    "t5-small": ("T5ForConditionalGeneration", "T5Config",
                 dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, feed_forward_proj="relu")),
}


def write_tokenizer(directory: str, vocab_size: int, pad: int, eos: int) -> None:
    """WordLevel tokens "t0".."t{V-1}" for CTranslate2's converter; the pad token is named <pad>
    (its Marian loader drops a final <pad> from the vocabulary) and EOS is named </s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = {i: f"t{i}" for i in range(vocab_size)}
    names[pad], names[eos] = "<pad>", "</s>"
    tokenizer = Tokenizer(models.WordLevel({n: i for i, n in names.items()}, unk_token=names[2]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=names[2], pad_token="<pad>",
                            eos_token="</s>").save_pretrained(directory)
    return names


def build(name: str, directory: str):
    import torch
    import transformers

    model_class, config_class, config = MODELS[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    model.save_pretrained(directory)
    del model
    gc.collect()
    return write_tokenizer(directory, config["vocab_size"], config["pad_token_id"], config["eos_token_id"])


def run(name: str, args, work: str, results: dict) -> None:
    directory = os.path.join(work, name)
    names = build(name, directory)
    rng = np.random.default_rng(0)
    vocab = MODELS[name][2]["vocab_size"]
    sources = rng.integers(3, vocab - 2, size=(SOURCES, SOURCE_LEN))
    tokens = SOURCES * TARGET_LEN
    repeats = 1 if args.quick else args.repeats
    entry = results.setdefault(name, {})
    beams = (1, 4)

    src_lists = sources.tolist()
    for dtype in args.dtypes:
        s2s = cf.Seq2Seq(directory, dtype=dtype, num_threads=args.threads)
        key = "cpuformer" if dtype == "float32" else f"cpuformer_{dtype}"
        for k in beams:
            def go(k=k):
                # ruff reads the `del s2s` after this loop as an undefined name here; every call comes before it
                out = s2s.generate(  # noqa: F821
                    src_lists, max_new_tokens=TARGET_LEN, min_new_tokens=TARGET_LEN, num_beams=k)
                assert all(len(t) == TARGET_LEN for t in out)
            entry.setdefault(f"beam{k}", {})[key] = dict(rate(timed(go, repeats), tokens), dtype=dtype)
        s2s.close()
        del s2s
        gc.collect()

    if not args.no_torch:
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory, dtype=torch.float32).eval()
        ids = torch.tensor(sources)
        mask = torch.ones_like(ids)
        for k in beams:
            def go(k=k):
                with torch.inference_mode():
                    model.generate(ids, attention_mask=mask, max_new_tokens=TARGET_LEN, min_new_tokens=TARGET_LEN,
                                   num_beams=k, do_sample=False)
            entry[f"beam{k}"]["pytorch"] = rate(timed(go, repeats), tokens)
        del model
        gc.collect()

    if not args.no_ct2:
        try:
            import ctranslate2

            out = os.path.join(work, name + "_ct2")
            ctranslate2.converters.TransformersConverter(directory).convert(out, quantization="float32", force=True)
            batch = [[names[t] for t in row] + ["</s>"] for row in sources.tolist()]
            for compute_type in ["float32"] + (["int8"] if "int8" in args.dtypes else []):
                translator = ctranslate2.Translator(out, device="cpu", intra_threads=args.threads,
                                                    compute_type=compute_type)
                key = "ctranslate2" if compute_type == "float32" else f"ctranslate2_{compute_type}"
                for k in beams:
                    def go(k=k):
                        translator.translate_batch(batch, beam_size=k, max_decoding_length=TARGET_LEN,
                                                   min_decoding_length=TARGET_LEN)
                    entry[f"beam{k}"][key] = dict(rate(timed(go, repeats), tokens), dtype=compute_type)
                del translator
        except Exception as error:  # a missing/broken peer must not stop the run
            print(f"  CTranslate2 unavailable for {name}: {error}", file=sys.stderr)
    shutil.rmtree(directory, ignore_errors=True)
    gc.collect()


def rate(entry: dict, tokens: int) -> dict:
    entry["tok_per_s"] = tokens / entry["seconds"]
    return entry


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one timed run per case")
    parser.add_argument("--no-ct2", action="store_true")
    parser.add_argument("--no-torch", action="store_true")
    add_ct2_isa_option(parser)
    parser.add_argument("--only", choices=sorted(MODELS), default=None)
    parser.add_argument("--dtypes", default="float32,int8,float16,bfloat16",
                        help="cpuformer weight dtypes, comma-separated (int8 also runs CTranslate2 int8)")
    parser.add_argument("--output", default=None, help="JSON path (default: benchmarks/results/seq2seq_<date>.json)")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = sorted(set(args.dtypes) - {"float32", "int8", "float16", "bfloat16"})
    if unknown or not args.dtypes:
        parser.error(f"--dtypes takes float32, int8, float16, bfloat16; got {args.dtypes}")
    if "float32" not in args.dtypes:
        args.dtypes.insert(0, "float32")  # the ratios are taken against float32 rows
    machine = machine_info(args.threads)
    apply_ct2_isa(args.ct2_isa, machine)
    print(f"cpuformer {cf.__version__}  isa={machine['isa']}  threads={args.threads}  cpu={machine['cpu']}  "
          f"ct2_isa={machine['ct2_isa']}")
    print(f"workload: {SOURCES} sources x {SOURCE_LEN} tokens -> {TARGET_LEN} target tokens; target tokens/s")
    results: dict = {}
    work = tempfile.mkdtemp(prefix="cpuformer_bench_s2s_")
    try:
        for name in MODELS:
            if args.only and name != args.only:
                continue
            run(name, args, work, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'model':<10} {'search':<7} {'engine':<22} {'tok/s':>9} {'vs torch':>9} "
          f"{'vs ct2 fp32':>12} {'vs ct2 int8':>12}")
    for name, cases in results.items():
        for case, engines in cases.items():
            torch_rate = engines.get("pytorch", {}).get("tok_per_s")
            ct2_rate = engines.get("ctranslate2", {}).get("tok_per_s")
            ct2_int8 = engines.get("ctranslate2_int8", {}).get("tok_per_s")

            def ratio(x, y):
                return f"{x / y:.2f}x" if x and y else "-"

            for engine, e in engines.items():
                r = e["tok_per_s"]
                print(f"{name:<10} {case:<7} {engine:<22} {r:9.1f} {ratio(r, torch_rate):>9} "
                      f"{ratio(r, ct2_rate):>12} {ratio(r, ct2_int8):>12}")
    path = args.output or os.path.join(RESULTS, f"seq2seq_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine, "quick": args.quick, "unit": "target tokens/s",
                   "workload": {"sources": SOURCES, "source_len": SOURCE_LEN, "target_len": TARGET_LEN},
                   "results": results}, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
