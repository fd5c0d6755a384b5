"""Records the outputs of every supported architecture at every dtype, to prove a change bit-exact.

Uses only cpuformer's public API (cpuformer.load / convert and the model methods), so the same
script runs against the package before and after a rewrite of its internals:

    python scripts/bitwise_outputs.py build DIR          # tiny random checkpoints (+ converted copies)
    python scripts/bitwise_outputs.py run DIR OUT.npz    # every output, at the ISA CPUFORMER_ISA selects
    python scripts/bitwise_outputs.py compare A.npz B.npz  # exit 0 iff every array is bitwise equal

`build` needs torch and transformers; `run` and `compare` need only numpy (and cpuformer for run).
Each checkpoint in DIR/<name> is a Hugging Face model saved with save_pretrained (fixed seed), with
DIR/<name>-int8, -float16, -bfloat16 written by the cpuformer that ran `build`. `run` loads every
checkpoint at float32, float16, bfloat16 and int8 (quantized at load), loads the directories `build`
converted, and converts afresh with the cpuformer under test (so both reading old converted files
and writing new ones are covered). Keys are "<model>/<variant>/<output>", e.g. "gpt2/int8-load/logits".

Outputs depend on the thread count (how work is split), so `run` passes num_threads explicitly
(--num-threads, default 2) and records it; compare only runs made with the same count and ISA.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONVERTED_DTYPES = ("int8", "float16", "bfloat16")
LOAD_DTYPES = ("float32", "float16", "bfloat16", "int8")

# ---- the checkpoints ------------------------------------------------------------------------------
# name -> (kind, model class, config class, config kwargs). The configurations follow
# tests/models/test_{encoder,decoder,seq2seq}.py, scaled up to hidden sizes of 64-128 and three
# layers; head dims (16, 11, 9, 16, 16, 24, 16, 12, 20, 16, 24, ...) and odd intermediate sizes
# exercise the kernels' vector tails. GQA in every Llama-family model.
_BART = dict(d_model=96, encoder_layers=2, decoder_layers=3, encoder_attention_heads=6, decoder_attention_heads=6,
             encoder_ffn_dim=131, decoder_ffn_dim=131, max_position_embeddings=64, init_std=0.1)
MODELS: Dict[str, Tuple[str, str, str, Dict[str, Any]]] = {
    # encoders
    "bert": ("encoder", "BertModel", "BertConfig",
             dict(vocab_size=101, hidden_size=96, num_hidden_layers=3, num_attention_heads=6, intermediate_size=129,
                  max_position_embeddings=40, type_vocab_size=3)),
    "bert_sequence_classification": ("encoder", "BertForSequenceClassification", "BertConfig",
                                     dict(vocab_size=97, hidden_size=88, num_hidden_layers=3, num_attention_heads=8,
                                          intermediate_size=67, max_position_embeddings=36, hidden_act="gelu_new")),
    "roberta": ("encoder", "RobertaModel", "RobertaConfig",
                dict(vocab_size=103, hidden_size=72, num_hidden_layers=3, num_attention_heads=8, intermediate_size=37,
                     max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, hidden_act="relu")),
    "xlm_roberta": ("encoder", "XLMRobertaModel", "XLMRobertaConfig",
                    dict(vocab_size=89, hidden_size=80, num_hidden_layers=3, num_attention_heads=5,
                         intermediate_size=65, max_position_embeddings=38, type_vocab_size=1, pad_token_id=1)),
    "distilbert": ("encoder", "DistilBertModel", "DistilBertConfig",
                   dict(vocab_size=91, dim=64, n_layers=3, n_heads=4, hidden_dim=127, max_position_embeddings=40)),
    # decoders
    "gpt2": ("decoder", "GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=101, n_embd=96, n_layer=3, n_head=4, n_positions=128, initializer_range=0.2,
                  bos_token_id=1, eos_token_id=2)),
    "llama": ("decoder", "LlamaForCausalLM", "LlamaConfig",
              dict(vocab_size=103, hidden_size=128, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                   intermediate_size=171, max_position_embeddings=128, initializer_range=0.2)),
    "llama3_tied": ("decoder", "LlamaForCausalLM", "LlamaConfig",
                    dict(vocab_size=89, hidden_size=72, num_hidden_layers=3, num_attention_heads=6,
                         num_key_value_heads=3, intermediate_size=65, max_position_embeddings=128,
                         initializer_range=0.2, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                       "rope_theta": 500000.0})),
    "mistral": ("decoder", "MistralForCausalLM", "MistralConfig",
                dict(vocab_size=91, hidden_size=80, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                     intermediate_size=33, max_position_embeddings=128, sliding_window=8, initializer_range=0.2)),
    "qwen2": ("decoder", "Qwen2ForCausalLM", "Qwen2Config",
              dict(vocab_size=107, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=45, max_position_embeddings=128, initializer_range=0.2)),
    "qwen3": ("decoder", "Qwen3ForCausalLM", "Qwen3Config",
              dict(vocab_size=97, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=24, intermediate_size=29, max_position_embeddings=128, initializer_range=0.2)),
    # encoder-decoders
    "marian": ("seq2seq", "MarianMTModel", "MarianConfig",
               dict(vocab_size=101, pad_token_id=100, decoder_start_token_id=100, eos_token_id=0, **_BART)),
    "bart": ("seq2seq", "BartForConditionalGeneration", "BartConfig", dict(vocab_size=97, **_BART)),
    "mbart": ("seq2seq", "MBartForConditionalGeneration", "MBartConfig",
              dict(vocab_size=103, scale_embedding=True, **_BART)),
    "t5": ("seq2seq", "T5ForConditionalGeneration", "T5Config",
           dict(vocab_size=99, d_model=64, d_kv=12, d_ff=65, num_layers=3, num_decoder_layers=2, num_heads=4,
                decoder_start_token_id=0, relative_attention_num_buckets=16, relative_attention_max_distance=20)),
    "t5_gated": ("seq2seq", "T5ForConditionalGeneration", "T5Config",
                 dict(vocab_size=95, d_model=64, d_kv=8, d_ff=47, num_layers=2, num_heads=3, decoder_start_token_id=0,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                      relative_attention_num_buckets=16, relative_attention_max_distance=20)),
    "mt5": ("seq2seq", "MT5ForConditionalGeneration", "MT5Config",
            dict(vocab_size=93, d_model=64, d_kv=16, d_ff=33, num_layers=2, num_heads=2, decoder_start_token_id=0,
                 relative_attention_num_buckets=16, relative_attention_max_distance=20)),
}
# generation_config.json settings (transformers 5 keeps generation parameters out of config.json)
GENERATION = {"mbart": dict(forced_bos_token_id=7)}
# The parameter scaled up to make next-token distributions peaky (as the tests do), so greedy and
# beam choices are far from ties; sampling still has a few candidates within top_p.
PEAKY = {"gpt2": "transformer.ln_f.weight", "marian": "model.decoder.layers.2.final_layer_norm.weight",
         "bart": "model.decoder.layers.2.final_layer_norm.weight", "mbart": "model.decoder.layer_norm.weight",
         "t5": "decoder.final_layer_norm.weight", "t5_gated": "decoder.final_layer_norm.weight",
         "mt5": "decoder.final_layer_norm.weight"}
# Written with their own untied LM head (see _untie_head).
UNTIED = ("t5_gated",)
for _name in ("llama", "llama3_tied", "mistral", "qwen2", "qwen3"):
    PEAKY[_name] = "model.norm.weight"


def _build_one(directory: pathlib.Path, index: int, name: str) -> None:
    import torch
    import transformers

    _, model_class, config_class, config = MODELS[name]
    torch.manual_seed(1000 + index)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    for key, value in GENERATION.get(name, {}).items():
        setattr(model.generation_config, key, value)
    with torch.no_grad():
        for _name, parameter in model.named_parameters():
            # Constant-initialised tensors (norm weights = 1, biases = 0, Qwen2's qkv biases, Qwen3's
            # q/k norms) get noise: a tensor read from the wrong place, or not read, then changes outputs.
            if parameter.dim() == 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.randn_like(parameter) * 0.1)
        if name in PEAKY:
            dict(model.named_parameters())[PEAKY[name]].mul_(4.0)
        buffers = dict(model.named_buffers())
        if "final_logits_bias" in buffers:
            buffers["final_logits_bias"].normal_(0.0, 1.0)
    model.save_pretrained(directory, safe_serialization=True)
    if name in UNTIED:
        _untie_head(directory, seed=2000 + index)


def _untie_head(directory: pathlib.Path, seed: int) -> None:
    """Rewrites a T5 checkpoint as transformers 4 saved T5 v1.1 / flan-T5: its own lm_head.weight and
    "tie_word_embeddings": false. transformers 5 always ties T5's head (it records v1.1's missing
    output scaling as scale_decoder_outputs instead), so save_pretrained cannot write this layout,
    which every published flan-T5 checkpoint has."""
    import torch
    from safetensors.torch import load_file, save_file

    weights_path = directory / "model.safetensors"
    tensors = load_file(weights_path)
    generator = torch.Generator().manual_seed(seed)
    tensors["lm_head.weight"] = torch.randn(tensors["shared.weight"].shape, generator=generator)
    save_file(tensors, weights_path, metadata={"format": "pt"})
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["tie_word_embeddings"] = False
    config.pop("scale_decoder_outputs", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build(root: pathlib.Path) -> None:
    import torch

    import cpuformer as cf

    torch.set_num_threads(1)
    root.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(MODELS):
        directory = root / name
        if directory.exists():
            raise SystemExit(f"{directory} exists: build into an empty directory")
        _build_one(directory, index, name)
        for dtype in CONVERTED_DTYPES:
            cf.convert(directory, root / f"{name}-{dtype}", dtype, progress=False)
        print(f"built {name}", flush=True)
    (root / "MANIFEST.json").write_text(json.dumps(sorted(MODELS), indent=1) + "\n")


# ---- the fixed inputs -----------------------------------------------------------------------------

def _ragged(tokens: Sequence[Sequence[int]]) -> Tuple[np.ndarray, np.ndarray]:
    """(concatenated int64 tokens, int64 lengths) of a list of token lists."""
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    flat = np.array([int(x) for t in tokens for x in t], dtype=np.int64)
    return flat, lengths


def _record_generated(out: Dict[str, np.ndarray], key: str, result: Any) -> None:
    if isinstance(result, tuple):
        tokens, log_probs = result
        out[f"{key}/log_probs"] = np.concatenate([np.asarray(p, dtype=np.float32).reshape(-1) for p in log_probs])
        out[f"{key}/log_prob_lengths"] = np.array([len(p) for p in log_probs], dtype=np.int64)
    else:
        tokens = result
    out[f"{key}/tokens"], out[f"{key}/lengths"] = _ragged(tokens)


def _right_padded(rng: np.random.Generator, vocab: int, pad: int, lengths: Sequence[int]):
    T = max(lengths)
    ids = rng.integers(3, vocab, (len(lengths), T))
    ids[ids == pad] = (pad + 2) % vocab  # real tokens are never the pad id (RoBERTa positions)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = pad
    return ids, mask


def _pad_id(config: Dict[str, Any], default: int) -> int:
    value = config.get("pad_token_id")
    return default if value is None else int(value)


def record_encoder(model: Any, name: str, out: Dict[str, np.ndarray]) -> None:
    config = MODELS[name][3]
    vocab = config["vocab_size"]
    pad = _pad_id(config, 0)
    rng = np.random.default_rng(1)
    ids, mask = _right_padded(rng, vocab, pad, [17, 5, 30, 1])
    types = None
    if config.get("type_vocab_size", 2) > 1 and name != "distilbert":
        types = rng.integers(0, config.get("type_vocab_size", 2), ids.shape) * mask
    out["hidden"] = model(ids, mask, types)
    out["hidden_no_mask"] = model(ids[:2, :9])
    try:
        pooled = model.pooler_output(ids, mask, types)
        out["has_pooler"] = np.array(True)
        out["pooler"] = pooled
    except ValueError:
        out["has_pooler"] = np.array(False)
    texts = [[int(t) for t in rng.integers(3, vocab, n) if t != pad] for n in (9, 3, 21, 14, 1)]
    out["embed_mean"] = model.embed(texts, pooling="mean", batch_size=2)
    out["embed_cls"] = model.embed(texts, pooling="cls")
    out["embed_mean_raw"] = model.embed(texts, pooling="mean", normalize=False)


def record_decoder(model: Any, name: str, out: Dict[str, np.ndarray]) -> None:
    vocab = MODELS[name][3]["vocab_size"]
    rng = np.random.default_rng(2)
    lengths = [7, 1, 17, 12]
    T = max(lengths)
    ids = np.zeros((len(lengths), T), dtype=np.int64)
    mask = np.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, T - n:] = rng.integers(3, vocab, n)
        mask[b, T - n:] = 1
    out["logits"] = model.logits(ids, mask)
    out["logits_long"] = model.logits(rng.integers(0, vocab, (2, 40)))  # beyond Mistral's window of 8
    prompts = [[int(t) for t in rng.integers(3, vocab, n)] for n in (5, 1, 13)]
    _record_generated(out, "greedy", model.generate(prompts, max_new_tokens=24, return_log_probs=True))
    _record_generated(out, "greedy_no_eos", model.generate(prompts[2], max_new_tokens=48, eos_token_id=[]))
    _record_generated(out, "beam", model.generate(prompts, max_new_tokens=16, num_beams=3, length_penalty=0.8,
                                                  return_log_probs=True))
    _record_generated(out, "sample", model.generate(prompts, max_new_tokens=24, do_sample=True, seed=7, top_k=20,
                                                    top_p=0.9, temperature=1.3, repetition_penalty=1.2,
                                                    return_log_probs=True))
    _record_generated(out, "sample_min", model.generate(prompts[0], max_new_tokens=12, min_new_tokens=10,
                                                        do_sample=True, seed=11))
    out["stream_greedy"] = np.array(list(model.stream(prompts[2], max_new_tokens=20)), dtype=np.int64)
    out["stream_sample"] = np.array(list(model.stream(prompts[0], max_new_tokens=20, do_sample=True, seed=5,
                                                      top_k=10)), dtype=np.int64)


def record_seq2seq(model: Any, name: str, out: Dict[str, np.ndarray]) -> None:
    config = MODELS[name][3]
    vocab = config["vocab_size"]
    pad = _pad_id(config, 1 if "d_kv" not in config else 0)
    rng = np.random.default_rng(3)
    ids, mask = _right_padded(rng, vocab - 2, pad, [17, 5, 11])
    tgt = rng.integers(3, vocab, (3, 7))
    out["encode"] = model.encode(ids, mask)
    out["logits"] = model.logits(ids, tgt, mask)
    long_source = rng.integers(3, vocab, (2, 60))  # beyond T5's max_distance of 20
    long_target = rng.integers(3, vocab, (2, 33))
    out["encode_long"] = model.encode(long_source)
    out["logits_long"] = model.logits(long_source.tolist(), long_target.tolist())
    sources = [[int(t) for t in rng.integers(3, vocab - 2, n)] for n in (13, 4, 9)]
    _record_generated(out, "greedy", model.generate(sources, max_new_tokens=24, return_log_probs=True))
    _record_generated(out, "greedy_min", model.generate(sources[0], max_new_tokens=40, min_new_tokens=34))
    _record_generated(out, "beam", model.generate(sources, max_new_tokens=16, num_beams=3, length_penalty=0.8,
                                                  return_log_probs=True))
    _record_generated(out, "beam_multi", model.generate(sources[:2], max_new_tokens=12, num_beams=3,
                                                        num_return_sequences=2, no_repeat_ngram_size=3))
    _record_generated(out, "sample", model.generate(sources, max_new_tokens=24, do_sample=True, seed=7, top_k=20,
                                                    top_p=0.9, temperature=1.3, repetition_penalty=1.2,
                                                    return_log_probs=True))


RECORDERS: Dict[str, Callable[[Any, str, Dict[str, np.ndarray]], None]] = {
    "encoder": record_encoder, "decoder": record_decoder, "seq2seq": record_seq2seq}


def _variants(root: pathlib.Path, name: str, scratch: pathlib.Path) -> List[Tuple[str, pathlib.Path, Any]]:
    """(variant, directory, dtype argument): each dtype at load, the converted directories of
    `build`, and directories converted now by the cpuformer under test."""
    import cpuformer as cf

    source = root / name
    variants = [(f"{dtype}-load", source, dtype) for dtype in LOAD_DTYPES]
    variants += [(f"{dtype}-converted", root / f"{name}-{dtype}", None) for dtype in CONVERTED_DTYPES]
    for dtype in CONVERTED_DTYPES:
        destination = scratch / f"{name}-{dtype}"
        cf.convert(source, destination, dtype, progress=False)
        variants.append((f"{dtype}-converted-now", destination, None))
    return variants


def run(root: pathlib.Path, output: pathlib.Path, num_threads: int, only: Sequence[str]) -> None:
    import cpuformer as cf

    names = list(only) or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    isa = cf.cpu_info()["isa"]
    wanted = os.environ.get("CPUFORMER_ISA")
    if wanted and wanted != isa:
        raise SystemExit(f"CPUFORMER_ISA={wanted} but cpuformer runs at {isa}")
    results: Dict[str, np.ndarray] = {"meta/isa": np.array(isa), "meta/num_threads": np.array(num_threads)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bitwise-") as scratch:
        for name in names:
            kind = MODELS[name][0]
            model_started = time.perf_counter()
            for variant, directory, dtype in _variants(root, name, pathlib.Path(scratch)):
                model = cf.load(directory, dtype=dtype, num_threads=num_threads)
                expected = {"encoder": cf.Encoder, "decoder": cf.Generator, "seq2seq": cf.Seq2Seq}[kind]
                if not isinstance(model, expected):
                    raise SystemExit(f"{directory}: cf.load returned {type(model).__name__}, "
                                     f"expected {expected.__name__}")
                out: Dict[str, np.ndarray] = {"num_parameters": np.array(model.num_parameters, dtype=np.int64)}
                RECORDERS[kind](model, name, out)
                for key, value in out.items():
                    results[f"{name}/{variant}/{key}"] = np.asarray(value)
                del model
            print(f"{name}: {time.perf_counter() - model_started:.1f} s", flush=True)
    np.savez_compressed(output, **results)
    print(f"{len(results)} arrays from {len(names)} models at isa={isa}, num_threads={num_threads} in "
          f"{time.perf_counter() - started:.1f} s -> {output}")


# ---- comparing two runs ---------------------------------------------------------------------------

def _describe_difference(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape:
        return f"shapes {list(a.shape)} vs {list(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtypes {a.dtype} vs {b.dtype}"
    if a.dtype.kind not in "fiub":
        return f"{a!r} vs {b!r}"
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    # Per element, by bits: a NaN with another payload, or -0.0 against 0.0, counts as different.
    differ = (flat_a.view(np.uint8).reshape(flat_a.size, -1) != flat_b.view(np.uint8).reshape(flat_b.size, -1)).any(1)
    wide_a, wide_b = flat_a.astype(np.float64), flat_b.astype(np.float64)
    difference = np.abs(wide_a - wide_b)[differ]
    finite = difference[np.isfinite(difference)]
    largest = f"max abs diff {finite.max():.3g}" if finite.size else "no finite difference (NaN or inf)"
    text = f"{largest}, {int(differ.sum())} of {flat_a.size} elements differ"
    nan_in_one = int((np.isnan(wide_a) != np.isnan(wide_b)).sum())
    return text + (f", {nan_in_one} NaN in one only" if nan_in_one else "")


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fiucb":
        # Compare the bytes: NaNs (any payload) are equal only if their bits are, and -0.0 != 0.0.
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    return bool(np.array_equal(a, b))


def compare(first: pathlib.Path, second: pathlib.Path) -> int:
    with np.load(first) as a_file, np.load(second) as b_file:
        a = {key: a_file[key] for key in a_file.files}
        b = {key: b_file[key] for key in b_file.files}
    problems = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            problems.append(f"{key}: only in {first}")
        elif key not in a:
            problems.append(f"{key}: only in {second}")
        elif not _bitwise_equal(a[key], b[key]):
            problems.append(f"{key}: {_describe_difference(a[key], b[key])}")
    for line in problems:
        print(line)
    compared = len(set(a) & set(b))
    if problems:
        print(f"{len(problems)} differences ({compared} keys in both)")
        return 1
    print(f"bitwise identical: {compared} arrays")
    return 0


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="write the random checkpoints and their converted copies")
    build_parser.add_argument("directory", type=pathlib.Path)
    run_parser = commands.add_parser("run", help="record every output into one .npz")
    run_parser.add_argument("directory", type=pathlib.Path)
    run_parser.add_argument("output", type=pathlib.Path)
    run_parser.add_argument("--num-threads", type=int, default=2)
    run_parser.add_argument("--only", nargs="*", default=[], help="model names (default: all)")
    compare_parser = commands.add_parser("compare", help="exit 0 iff both files hold bitwise-equal arrays")
    compare_parser.add_argument("first", type=pathlib.Path)
    compare_parser.add_argument("second", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.directory)
        return 0
    if args.command == "run":
        run(args.directory, args.output, args.num_threads, args.only)
        return 0
    return compare(args.first, args.second)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
