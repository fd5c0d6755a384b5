"""The benchmark behind ``cpuformer bench``: needs nothing but NumPy (peers are used when installed).

Model benchmarks build standard-shape checkpoints with seeded random weights straight from NumPy
(no download, no torch): BERT-base for encoders, GPT-2 124M for decoders, Marian base (opus-mt)
for encoder-decoders; ``quick`` uses small shapes of the same architectures. The checkpoints are
Hugging Face directories (config.json, model.safetensors, a WordLevel tokenizer.json), cached under
``$CPUFORMER_CACHE`` (default ``~/.cache/cpuformer``) in ``bench/<name>-<hash of the shape>``, so
later runs and the peers load the very same weights. PyTorch (transformers) and CTranslate2 run
the same workloads when they are installed. Timings are medians of several rounds after a warm-up.

The kernel benchmark times ``ops.Linear`` (weights packed once, as a model holds them) against
NumPy's BLAS and ``ops.attention`` against a NumPy two-GEMM softmax attention, and states each of
our rates as a fraction of the float32 compute peak (``ops.peak_gops``, measured first).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from . import cpu_info, ops
from .arch import by_family, find
from .arch.checkpoint import random_checkpoint

MODEL_KINDS = ("encoder", "decoder", "seq2seq")
PEERS = ("torch", "ctranslate2")

# The family of each kind's benchmark model (registry names, arch/).
FAMILIES = {"encoder": "bert", "decoder": "gpt2", "seq2seq": "marian"}
# Standard shapes (full) and small ones of the same architectures (quick).
SHAPES: Dict[str, Dict[str, Dict[str, Any]]] = {
    "encoder": {
        "full": dict(name="bert-base", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=512),
        "quick": dict(name="minilm-l6", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                      num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512),
    },
    "decoder": {
        "full": dict(name="gpt2-124m", vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024),
        "quick": dict(name="gpt2-tiny", vocab_size=16384, n_embd=384, n_layer=6, n_head=6, n_positions=512),
    },
    "seq2seq": {
        "full": dict(name="marian-base", vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
                     encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                     decoder_ffn_dim=2048, max_position_embeddings=512),
        "quick": dict(name="marian-small", vocab_size=16384, d_model=256, encoder_layers=3, decoder_layers=3,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024,
                      decoder_ffn_dim=1024, max_position_embeddings=512),
    },
}

# Workloads: encoder batch x length; decoder batch, prompt length, new tokens; seq2seq sources x
# source length -> target tokens (min = max new tokens, so every engine does the same work).
WORKLOADS = {"encoder": dict(batch=8, length=128), "decoder": dict(batch=1, prompt=16, new=64),
             "seq2seq": dict(batch=8, length=24, new=32)}
QUICK_WORKLOADS = {"encoder": dict(batch=8, length=64), "decoder": dict(batch=1, prompt=16, new=32),
                   "seq2seq": dict(batch=4, length=16, new=16)}


# ---- progress bars (tqdm when installed) ----------------------------------------------------

def progress(iterable: Iterable, desc: str, total: Optional[int] = None, enabled: bool = True) -> Iterable:
    """tqdm(iterable) on a terminal when tqdm is installed; the bare iterable otherwise."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, disable=None, file=sys.stderr)


# ---- timing ---------------------------------------------------------------------------------

def median_seconds(fn: Callable[[], object], repeats: int, min_time: float = 0.05) -> float:
    """Median over ``repeats`` rounds of the seconds per call (each round calls fn until
    ``min_time`` has passed), after ``min_time`` of untimed calls: the first calls after an idle
    pause run slow while the pool's workers and the virtual CPUs wake up."""
    warm_until = time.perf_counter() + min_time
    fn()
    while time.perf_counter() < warm_until:
        fn()
    samples = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            fn()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        samples.append(elapsed / count)
    return float(np.median(samples))


# ---- random-weight checkpoints --------------------------------------------------------------

def cache_root() -> str:
    return os.environ.get("CPUFORMER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cpuformer")


def special_tokens(kind: str, shape: Dict[str, Any]) -> Dict[str, int]:
    V = shape["vocab_size"]
    if kind == "encoder":
        return dict(pad=0, unk=100, cls=101, sep=102)
    if kind == "decoder":
        return dict(unk=0, eos=V - 1, bos=V - 1)
    return dict(eos=0, unk=1, pad=V - 1)  # Marian: </s> is 0, <pad> is the last id


def token_name(i: int, specials: Dict[str, int]) -> str:
    names = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "bos": "</s>"}
    for key, index in specials.items():
        if index == i:
            return names[key]
    return f"t{i}"


def write_tokenizer(directory: str, kind: str, shape: Dict[str, Any]) -> None:
    """A WordLevel tokenizer.json: tokens "t0".."t{V-1}" split on whitespace (specials named)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = special_tokens(kind, shape)
    vocab = {token_name(i, specials): i for i in range(shape["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=token_name(specials["unk"], specials)))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([token_name(i, specials) for i in sorted(set(specials.values()))])
    tokenizer.save(os.path.join(directory, "tokenizer.json"))


def _config(kind: str, shape: Dict[str, Any]) -> Dict[str, Any]:
    cfg = by_family()[FAMILIES[kind]].example_config(**{k: v for k, v in shape.items() if k != "name"})
    specials = special_tokens(kind, shape)
    if kind == "encoder":
        cfg.update(pad_token_id=specials["pad"])
    elif kind == "decoder":
        cfg.update(bos_token_id=specials["bos"], eos_token_id=specials["eos"])
    else:
        cfg.update(pad_token_id=specials["pad"], eos_token_id=specials["eos"], decoder_start_token_id=specials["pad"],
                   forced_eos_token_id=specials["eos"], bad_words_ids=[[specials["pad"]]])
    cfg["torch_dtype"] = "float32"
    return cfg


def build_model(kind: str, shape: Dict[str, Any], directory: str, seed: int = 0) -> str:
    """Writes a Hugging Face model directory with seeded random weights of ``shape`` (a SHAPES
    entry) for ``kind``: config.json, model.safetensors, tokenizer.json. Returns the directory."""
    from ._model_dir import save_safetensors

    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
    os.makedirs(directory, exist_ok=True)
    config = _config(kind, shape)
    arch, _ = find(config)
    tensors = random_checkpoint(arch, config, np.random.default_rng(seed))
    save_safetensors(os.path.join(directory, "model.safetensors"), tensors, metadata={"format": "pt"})
    del tensors
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_tokenizer(directory, kind, shape)
    return directory


def cached_model(kind: str, quick: bool, cache: Optional[str] = None) -> str:
    """The directory of the benchmark model for ``kind`` (built once, then reused)."""
    shape = SHAPES[kind]["quick" if quick else "full"]
    return cached_build(shape["name"], [kind, shape, 1], lambda staging: build_model(kind, shape, staging), cache,
                        f"{kind}, random weights")


def cached_build(name: str, key: Any, build: Callable[[str], None], cache: Optional[str] = None,
                 what: str = "random weights") -> str:
    """A model directory in the benchmark cache: ``<cache>/bench/<name>-<hash of key>``, made by
    ``build(staging_directory)`` the first time (then renamed into place atomically) and reused
    once it holds a tokenizer.json."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    root = os.path.join(cache or cache_root(), "bench")
    directory = os.path.join(root, f"{name}-{digest}")
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):
        return directory
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}-", dir=root)
    try:
        print(f"building {name} ({what}) in {directory} ...", file=sys.stderr, flush=True)
        build(staging)
        try:
            os.rename(staging, directory)  # atomic: a concurrent build of the same model may win
        except OSError:
            if not os.path.isfile(os.path.join(directory, "tokenizer.json")):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


# ---- model workloads ------------------------------------------------------------------------

def _inputs(kind: str, shape: Dict[str, Any], load: Dict[str, int]) -> np.ndarray:
    rng = np.random.default_rng(0)
    V = shape["vocab_size"]
    if kind == "encoder":
        ids = rng.integers(104, V, (load["batch"], load["length"]))
        ids[:, 0], ids[:, -1] = 101, 102
        return ids
    if kind == "decoder":
        return rng.integers(10, V - 10, (load["batch"], load["prompt"]))
    return rng.integers(3, V - 2, (load["batch"], load["length"]))


def _work(kind: str, load: Dict[str, int]) -> Dict[str, int]:
    """(sequences, tokens) one call handles: tokens are input tokens for encoders, generated ones otherwise."""
    if kind == "encoder":
        return {"sequences": load["batch"], "tokens": load["batch"] * load["length"]}
    return {"sequences": load["batch"], "tokens": load["batch"] * load["new"]}


def _cpuformer_fn(kind: str, directory: str, dtype: str, threads: Optional[int], ids: np.ndarray,
                  load: Dict[str, int]):
    from . import load as load_model

    model = load_model(directory, dtype=dtype, num_threads=threads)
    if kind == "encoder":
        return model, lambda: model(ids)
    lists, new = ids.tolist(), load["new"]
    return model, lambda: model.generate(lists, max_new_tokens=new, min_new_tokens=new, eos_token_id=[])


def _torch_fn(kind: str, directory: str, threads: Optional[int], ids: np.ndarray, load: Dict[str, int]):
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    auto = {"encoder": transformers.AutoModel, "decoder": transformers.AutoModelForCausalLM,
            "seq2seq": transformers.AutoModelForSeq2SeqLM}[kind]
    transformers.logging.set_verbosity_error()
    model = auto.from_pretrained(directory, dtype=torch.float32).eval()
    x = torch.tensor(ids)
    mask = torch.ones_like(x)
    if kind == "encoder":
        def run():
            with torch.inference_mode():
                return model(input_ids=x, attention_mask=mask).last_hidden_state
        return model, run
    new = load["new"]

    def generate():
        with torch.inference_mode():
            return model.generate(x, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                  num_beams=1, pad_token_id=0)
    return model, generate


def _ct2_fn(kind: str, directory: str, threads: Optional[int], ids: np.ndarray, load: Dict[str, int],
            shape: Dict[str, Any], dtype: str):
    import ctranslate2
    from transformers import PreTrainedTokenizerFast

    converted = directory + "-ct2"
    if not os.path.isdir(converted):
        # The converter reads the vocabulary through transformers' tokenizer files.
        specials = special_tokens(kind, shape)
        named = {key: token_name(i, specials) for key, i in specials.items()}
        extra = {f"{k}_token": v for k, v in named.items() if k in ("pad", "eos", "bos", "unk", "cls", "sep")}
        from tokenizers import Tokenizer

        fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(os.path.join(directory, "tokenizer.json")),
                                       **extra)
        staging = tempfile.mkdtemp(prefix=".hf-", dir=os.path.dirname(directory))
        try:
            for name in ("config.json", "model.safetensors"):
                os.symlink(os.path.join(directory, name), os.path.join(staging, name))
            fast.save_pretrained(staging)
            ctranslate2.converters.TransformersConverter(staging).convert(converted, quantization="float32",
                                                                          force=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    # CTranslate2 has no 4-bit CPU type: int4 runs compare against its int8.
    compute = {"float32": "float32", "int8": "int8", "int4": "int8", "bfloat16": "bfloat16",
               "float16": "float16"}[dtype]
    specials = special_tokens(kind, shape)
    tokens = [[token_name(i, specials) for i in row] for row in ids.tolist()]
    common = dict(device="cpu", intra_threads=threads or 0, compute_type=compute)
    if kind == "encoder":
        model = ctranslate2.Encoder(converted, **common)
        return model, lambda: model.forward_batch(tokens)
    new = load["new"]
    if kind == "decoder":
        model = ctranslate2.Generator(converted, **common)
        return model, lambda: model.generate_batch(tokens, max_length=new, min_length=new, sampling_topk=1,
                                                   include_prompt_in_result=False)
    model = ctranslate2.Translator(converted, **common)
    sources = [row + ["</s>"] for row in tokens]
    return model, lambda: model.translate_batch(sources, beam_size=1, max_decoding_length=new,
                                                min_decoding_length=new)


def peers_available() -> Dict[str, bool]:
    import importlib.util

    have = {name: importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "ctranslate2")}
    return {"torch": have["torch"] and have["transformers"],
            "ctranslate2": have["ctranslate2"] and have["transformers"]}


def run_model_bench(kinds: Sequence[str], quick: bool = True, dtype: str = "float32",
                    compare: Sequence[str] = (), threads: Optional[int] = None, cache: Optional[str] = None,
                    show_progress: bool = True, log: Callable[[str], None] = lambda s: None) -> List[Dict[str, Any]]:
    """One row per (model kind, engine): sequences/s and tokens/s for the kind's workload."""
    repeats, min_time = (3, 0.3) if quick else (5, 2.0)
    available = peers_available()
    rows: List[Dict[str, Any]] = []
    jobs = [(kind, engine) for kind in kinds for engine in ("cpuformer", *compare)]
    for kind, engine in progress(jobs, "bench", total=len(jobs), enabled=show_progress):
        shape = SHAPES[kind]["quick" if quick else "full"]
        load = (QUICK_WORKLOADS if quick else WORKLOADS)[kind]
        directory = cached_model(kind, quick, cache)
        ids = _inputs(kind, shape, load)
        row: Dict[str, Any] = {"kind": kind, "model": shape["name"], "engine": engine, "dtype": dtype,
                               "workload": _workload_text(kind, load)}
        if engine != "cpuformer" and not available.get(engine, False):
            row["skipped"] = "not installed"
            rows.append(row)
            continue
        try:
            if engine == "cpuformer":
                model, fn = _cpuformer_fn(kind, directory, dtype, threads, ids, load)
            elif engine == "torch":
                row["dtype"] = "float32"
                model, fn = _torch_fn(kind, directory, threads, ids, load)
            else:
                model, fn = _ct2_fn(kind, directory, threads, ids, load, shape, dtype)
        except Exception as error:  # a missing or broken peer must not stop the run
            if engine == "cpuformer" and not isinstance(error, NotImplementedError):
                raise
            # cpuformer: a dtype not supported for this model kind (yet) skips the kind, not the run
            row["skipped"] = f"failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            rows.append(row)
            continue
        try:
            seconds = median_seconds(fn, repeats, min_time)
        finally:
            close = getattr(model, "close", None)
            del fn
            if engine == "cpuformer" and close is not None:
                close()
            del model
            gc.collect()
        work = _work(kind, load)
        row.update(seconds=seconds, seq_per_s=work["sequences"] / seconds, tok_per_s=work["tokens"] / seconds)
        log(f"{kind:<8} {engine:<12} {row['tok_per_s']:10.1f} tokens/s")
        rows.append(row)
    return rows


def _workload_text(kind: str, load: Dict[str, int]) -> str:
    if kind == "encoder":
        return f"{load['batch']}x{load['length']} tokens"
    if kind == "decoder":
        return f"batch {load['batch']}, prompt {load['prompt']}, +{load['new']} tokens"
    return f"{load['batch']} sources x {load['length']} -> {load['new']} tokens"


def format_model_table(rows: List[Dict[str, Any]], threads: Optional[int] = None) -> str:
    info = cpu_info()
    lines = [f"cpuformer models — isa {info['isa']}, {threads or info['num_threads']} threads, random weights "
             "(higher is better; tokens: input tokens for encoders, generated tokens otherwise)",
             f"{'kind':<8} {'model':<13} {'engine':<12} {'dtype':<9} {'sequences/s':>12} {'tokens/s':>10} "
             f"{'vs cpuformer':>12}  workload"]
    ours = {r["kind"]: r.get("tok_per_s") for r in rows if r["engine"] == "cpuformer"}
    for r in rows:
        if "tok_per_s" not in r:
            lines.append(f"{r['kind']:<8} {r['model']:<13} {r['engine']:<12} {r['dtype']:<9} {'-':>12} {'-':>10} "
                         f"{'-':>12}  ({r.get('skipped', 'skipped')})")
            continue
        base = ours.get(r["kind"])
        ratio = "" if r["engine"] == "cpuformer" or not base else f"{base / r['tok_per_s']:.2f}x"
        lines.append(f"{r['kind']:<8} {r['model']:<13} {r['engine']:<12} {r['dtype']:<9} {r['seq_per_s']:>12.2f} "
                     f"{r['tok_per_s']:>10.1f} {ratio:>12}  {r['workload']}")
    if any(r["engine"] != "cpuformer" and "tok_per_s" in r for r in rows):
        lines.append("vs cpuformer: cpuformer's tokens/s divided by the engine's (above 1: cpuformer is faster)")
    return "\n".join(lines)


# ---- kernels --------------------------------------------------------------------------------

def _numpy_attention(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def run_kernel_bench(quick: bool = True, show_progress: bool = False) -> List[Dict[str, object]]:
    rng = np.random.default_rng(0)
    repeats = 3 if quick else 7
    rows: List[Dict[str, object]] = []
    peak = ops.peak_gops("float32", seconds=0.1 if quick else 0.3)
    linear_shapes = [(1024, 768, 768), (1024, 768, 3072), (1, 768, 3072), (4, 2048, 5632)]
    if not quick:
        linear_shapes += [(1024, 3072, 768), (512, 2048, 5632), (1, 2048, 5632), (4, 768, 2304)]
    for m, k, n in progress(linear_shapes, "linear", enabled=show_progress):
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)
        lin = ops.Linear(w)
        wt = np.ascontiguousarray(w.T)
        flops = 2.0 * m * k * n
        ours = median_seconds(lambda lin=lin, x=x: lin(x), repeats)
        peer = median_seconds(lambda x=x, wt=wt: x @ wt, repeats)
        rows.append({"op": f"linear M={m} K={k} N={n}", "cpuformer": flops / ours / 1e9,
                     "numpy": flops / peer / 1e9, "unit": "GFLOP/s", "of_peak": flops / ours / 1e9 / peak})
    for b, h, t, d in [(8, 12, 128, 64)] + ([] if quick else [(1, 12, 512, 64)]):
        q, k_, v = (rng.standard_normal((b, h, t, d), dtype=np.float32) for _ in range(3))
        flops = 4.0 * b * h * t * t * d
        ours = median_seconds(lambda q=q, k_=k_, v=v: ops.attention(q, k_, v), repeats)
        peer = median_seconds(lambda q=q, k_=k_, v=v: _numpy_attention(q, k_, v), repeats)
        rows.append({"op": f"attention B={b} H={h} T={t} D={d}", "cpuformer": flops / ours / 1e9,
                     "numpy": flops / peer / 1e9, "unit": "GFLOP/s", "of_peak": flops / ours / 1e9 / peak})
    return rows


def format_table(rows: List[Dict[str, object]]) -> str:
    info = cpu_info()
    lines = [f"cpuformer kernels — isa {info['isa']}, {info['num_threads']} threads (higher is better)",
             f"{'op':<34} {'cpuformer':>10} {'numpy':>10} {'ratio':>7} {'of peak':>8}  unit"]
    for r in rows:
        ratio = float(r["cpuformer"]) / float(r["numpy"])
        lines.append(f"{r['op']:<34} {r['cpuformer']:>10.1f} {r['numpy']:>10.1f} {ratio:>6.2f}x "
                     f"{100 * float(r['of_peak']):>7.1f}%  {r['unit']}")
    lines.append("of peak: cpuformer's rate / the float32 compute peak measured by ops.peak_gops")
    return "\n".join(lines)
