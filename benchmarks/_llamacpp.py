"""llama.cpp as a peer: HF -> GGUF conversion, quantization, logits and timings, one process per call.

llama.cpp reads GGUF files only and llama-cpp-python does not ship llama.cpp's HF converter, so this
module writes GGUF itself with the `gguf` package for the two architectures the decoder benchmarks
use: LlamaForCausalLM (arch "llama") and GPT2LMHeadModel (arch "gpt2"), from an HF directory of
float32 (or float16) safetensors. Q8_0 / Q4_0 / F16 come from the F32 file through
`llama_cpp.llama_model_quantize`, as a user would make them with llama-quantize (so Q4_0 keeps
llama.cpp's own policy: the output matrix in Q6_K, norms in F32).

The vocabulary written is a SentencePiece-style ("llama") token list "t0".."t{V-1}" with zero scores:
enough for llama.cpp to load the model; callers feed token ids, never text. With vocabulary="chars"
token i is instead the single character chr(CHARS_BASE + i) (no space prefix, no BOS): a text of
such characters tokenizes to exactly those ids, for a client that can only send text (llama-cpp-python's
server takes no token-id prompts; benchmarks/bench_serve.py). `id_text` makes that text.

llama.cpp and torch each bring an OpenMP runtime (cpuformer its own thread pools), so everything
that loads llama.cpp (or torch, for the reference logits) runs in its own process through this
file's command line; every command prints one JSON object as its last stdout line. The importing side (bench_decoder.py,
accuracy_int4.py) uses `run_child` and the helpers below, which import neither llama_cpp nor torch.

    python benchmarks/_llamacpp.py version
    python benchmarks/_llamacpp.py prepare HF_DIR OUT_DIR [--kinds f32,f16,q8_0,q4_0] [--threads 2]
                                           [--vocabulary ids|chars]
    python benchmarks/_llamacpp.py logits GGUF --ids 1,2,3 --out LOGITS.npy [--threads 2] [--kv-f32]
    python benchmarks/_llamacpp.py reference HF_DIR --ids 1,2,3 --out LOGITS.npy [--threads 2]
    python benchmarks/_llamacpp.py bench GGUF [--threads 2] [--decode 16,128] [--batch 1,8] [--prefill 512]
                                              [--repeats 3] [--flash-attn]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
from typing import Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import timed  # noqa: E402

KINDS = ("f32", "f16", "q8_0", "q4_0")
#: llama_ftype of each kind (llama.h's LLAMA_FTYPE_*).
FTYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}
#: The self-check bound: max |llama.cpp F32 logit - transformers logit| / max |transformers logit|.
SELF_CHECK_TOLERANCE = 1e-3
#: The vocabularies convert() writes: "t0".."t{V-1}" (ids), or one character per id (chars).
VOCABULARIES = ("ids", "chars")
#: Token i of the "chars" vocabulary is chr(CHARS_BASE + i): planes 2-3 and up hold no character that
#: a tokenizer splits, normalizes or treats as whitespace, and every code point there is valid UTF-8.
CHARS_BASE = 0x20000
CHARS_LIMIT = 0xE0000 - CHARS_BASE  # below the tag and private-use planes
HERE = os.path.abspath(__file__)


# ---- reading an HF checkpoint (no torch, no copies) --------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16}


def _safetensors_files(directory: str) -> List[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(directory, n) for n in names]
    single = os.path.join(directory, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"{directory}: no model.safetensors (or index)")
    return [single]


def read_checkpoint(directory: str) -> Dict[str, np.ndarray]:
    """Every tensor of the directory's safetensors as a read-only memory map (a 1.1B checkpoint is
    written to GGUF without being read into memory first)."""
    tensors: Dict[str, np.ndarray] = {}
    for path in _safetensors_files(directory):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for name, info in header.items():
            if info["dtype"] not in _ST_DTYPES:
                raise ValueError(f"{path}: tensor {name} is {info['dtype']}; float32 or float16 expected")
            start, end = info["data_offsets"]
            dtype = np.dtype(_ST_DTYPES[info["dtype"]])
            shape = tuple(info["shape"])
            if end - start != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
                raise ValueError(f"{path}: tensor {name} has {end - start} bytes for shape {shape}")
            tensors[name] = np.memmap(path, dtype=dtype, mode="r", offset=8 + length + start, shape=shape)
    return tensors


# ---- HF -> GGUF ----------------------------------------------------------------------------------

def permute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """HF's Llama q/k rows (each head's rotary pairs split into halves) in llama.cpp's order (pairs
    interleaved), as llama.cpp's convert_hf_to_gguf.py does: heads = attention heads for q, KV heads for k."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _llama_tensors(config: dict, ckpt: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    embed = ckpt["model.embed_tokens.weight"]
    out = {"token_embd.weight": embed, "output_norm.weight": ckpt["model.norm.weight"],
           "output.weight": ckpt.get("lm_head.weight", embed)}  # tied: the LM head is the embedding
    names = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for layer in range(config["num_hidden_layers"]):
        hf, gg = f"model.layers.{layer}.", f"blk.{layer}."
        out[gg + "attn_q.weight"] = permute_rope(ckpt[hf + "self_attn.q_proj.weight"], heads)
        out[gg + "attn_k.weight"] = permute_rope(ckpt[hf + "self_attn.k_proj.weight"], kv_heads)
        for hf_name, gg_name in names.items():
            out[gg + gg_name + ".weight"] = ckpt[hf + hf_name + ".weight"]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if hf + f"self_attn.{proj}.bias" in ckpt:
                raise ValueError("Llama attention biases are not converted")
    return out


def _gpt2_tensors(config: dict, ckpt: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    # transformers saves GPT2LMHeadModel's body under "transformer."; the bare GPT2Model has no prefix
    prefix = "transformer." if "transformer.wte.weight" in ckpt else ""
    embed = ckpt[prefix + "wte.weight"]
    out = {"token_embd.weight": embed, "position_embd.weight": ckpt[prefix + "wpe.weight"],
           "output_norm.weight": ckpt[prefix + "ln_f.weight"], "output_norm.bias": ckpt[prefix + "ln_f.bias"],
           "output.weight": ckpt.get("lm_head.weight", embed)}
    # (HF module, llama.cpp name, Conv1D weight stored [in, out] that GGUF wants as [out, in])
    parts = [("ln_1", "attn_norm", False), ("attn.c_attn", "attn_qkv", True), ("attn.c_proj", "attn_output", True),
             ("ln_2", "ffn_norm", False), ("mlp.c_fc", "ffn_up", True), ("mlp.c_proj", "ffn_down", True)]
    for layer in range(config["n_layer"]):
        hf, gg = f"{prefix}h.{layer}.", f"blk.{layer}."
        for hf_name, gg_name, conv1d in parts:
            weight = ckpt[hf + hf_name + ".weight"]
            out[gg + gg_name + ".weight"] = np.ascontiguousarray(weight.T) if conv1d else weight
            out[gg + gg_name + ".bias"] = ckpt[hf + hf_name + ".bias"]
    return out


def id_text(ids: List[int]) -> str:
    """The text that the "chars" vocabulary tokenizes to exactly `ids`."""
    for i in ids:
        if not 0 <= i < CHARS_LIMIT:
            raise ValueError(f"token id {i} has no character in the chars vocabulary (0 .. {CHARS_LIMIT - 1})")
    return "".join(chr(CHARS_BASE + i) for i in ids)


def _vocabulary(writer, vocab_size: int, bos: Optional[int], eos: Optional[int], vocabulary: str = "ids") -> None:
    from gguf import TokenType

    # an id outside the vocabulary (a shrunken test config keeping GPT-2's 50256) names no token
    bos, eos = (t if t is not None and 0 <= t < vocab_size else None for t in (bos, eos))
    special = {t for t in (bos, eos) if t is not None}
    writer.add_tokenizer_model("llama")
    if vocabulary == "chars":
        writer.add_token_list(list(id_text(list(range(vocab_size)))))
        writer.add_add_space_prefix(False)  # else SentencePiece puts a "▁" (no token here) before the text
    else:
        writer.add_token_list([f"t{i}" for i in range(vocab_size)])
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types([int(TokenType.CONTROL if i in special else TokenType.NORMAL) for i in range(vocab_size)])
    if bos is not None:
        writer.add_bos_token_id(bos)
    if eos is not None:
        writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)  # ids are fed as given


def _first_id(value) -> Optional[int]:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


def convert(hf_dir: str, out_path: str, outtype: str = "f32", vocabulary: str = "ids") -> dict:
    """Writes hf_dir (LlamaForCausalLM or GPT2LMHeadModel, float safetensors) as a GGUF file:
    outtype "f32", or "f16" (matrices in F16, 1-D tensors in F32 as llama.cpp's converter keeps them);
    vocabulary "ids" or "chars" (module docstring)."""
    from gguf import GGUFWriter, LlamaFileType

    if outtype not in ("f32", "f16"):
        raise ValueError(f"outtype {outtype!r}: f32 or f16 (quantize() makes the others)")
    if vocabulary not in VOCABULARIES:
        raise ValueError(f"vocabulary {vocabulary!r}: {' or '.join(VOCABULARIES)}")
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    arch = (config.get("architectures") or [""])[0]
    ckpt = read_checkpoint(hf_dir)
    if arch == "LlamaForCausalLM":
        writer = GGUFWriter(out_path, "llama")
        H, heads = config["hidden_size"], config["num_attention_heads"]
        writer.add_context_length(config.get("max_position_embeddings", 2048))
        writer.add_embedding_length(H)
        writer.add_block_count(config["num_hidden_layers"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(heads)
        writer.add_head_count_kv(config.get("num_key_value_heads", heads))
        writer.add_rope_dimension_count(config.get("head_dim") or H // heads)
        writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
        writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
        if config.get("rope_scaling"):
            raise ValueError("rope_scaling is not converted")
        tensors = _llama_tensors(config, ckpt)
    elif arch == "GPT2LMHeadModel":
        writer = GGUFWriter(out_path, "gpt2")
        writer.add_context_length(config.get("n_positions", 1024))
        writer.add_embedding_length(config["n_embd"])
        writer.add_block_count(config["n_layer"])
        writer.add_feed_forward_length(config.get("n_inner") or 4 * config["n_embd"])
        writer.add_head_count(config["n_head"])
        writer.add_layer_norm_eps(float(config.get("layer_norm_epsilon", 1e-5)))
        if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"activation {config['activation_function']}: llama.cpp's gpt2 uses the tanh GELU")
        tensors = _gpt2_tensors(config, ckpt)
    else:
        raise ValueError(f"{hf_dir}: architecture {arch!r} not converted (LlamaForCausalLM, GPT2LMHeadModel)")
    vocab_size = tensors["token_embd.weight"].shape[0]
    if vocabulary == "chars" and vocab_size > CHARS_LIMIT:
        raise ValueError(f"{hf_dir}: {vocab_size} tokens do not fit the chars vocabulary ({CHARS_LIMIT})")
    writer.add_name(os.path.basename(os.path.normpath(hf_dir)))
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(LlamaFileType.ALL_F32 if outtype == "f32" else LlamaFileType.MOSTLY_F16)
    _vocabulary(writer, vocab_size, _first_id(config.get("bos_token_id")), _first_id(config.get("eos_token_id")),
                vocabulary)
    for name, array in tensors.items():
        half = outtype == "f16" and array.ndim == 2
        writer.add_tensor(name, np.asarray(array, dtype=np.float16 if half else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"path": out_path, "bytes": os.path.getsize(out_path), "tensors": len(tensors)}


# ---- in a child process: everything that loads llama.cpp ------------------------------------------

def llama_cpp_version() -> dict:
    import llama_cpp

    info = {"llama_cpp_python": llama_cpp.__version__}
    try:
        info["system_info"] = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:  # an older binding without it: the package version is enough
        pass
    return info


def quantize(src: str, dst: str, kind: str, threads: int) -> dict:
    """src (an F32 GGUF) as `kind` through llama.cpp's own quantizer, its default tensor policy."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if status != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {kind}) returned {status}")
    return {"path": dst, "bytes": os.path.getsize(dst)}


def prepare(hf_dir: str, out_dir: str, kinds: List[str], threads: int, vocabulary: str = "ids") -> dict:
    """GGUF files of hf_dir for each kind in out_dir: the F32 conversion, the rest quantized from it.
    Reuses files already there (the benchmark prepares once and times in several children), so one
    out_dir holds one vocabulary."""
    os.makedirs(out_dir, exist_ok=True)
    f32 = os.path.join(out_dir, "model-f32.gguf")
    if not os.path.exists(f32):
        convert(hf_dir, f32 + ".part", "f32", vocabulary)
        os.replace(f32 + ".part", f32)
    files = {"f32": {"path": f32, "bytes": os.path.getsize(f32)}}
    for kind in kinds:
        if kind == "f32":
            continue
        path = os.path.join(out_dir, f"model-{kind}.gguf")
        if not os.path.exists(path):
            quantize(f32, path + ".part", kind, threads)
            os.replace(path + ".part", path)
        files[kind] = {"path": path, "bytes": os.path.getsize(path)}
    return {"files": files, **llama_cpp_version()}


def _load(path: str, threads: int, n_ctx: int, n_batch: int, logits_all: bool = False, kv_f32: bool = False,
          flash_attn: bool = False):
    import llama_cpp

    extra = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if kv_f32 else {}
    return llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                           n_threads_batch=threads, logits_all=logits_all, flash_attn=flash_attn, verbose=False,
                           **extra)


def logits(path: str, ids: List[int], threads: int, kv_f32: bool) -> np.ndarray:
    """llama.cpp's next-token logits at every position of ids (teacher forcing), float32 [T, V]."""
    n = len(ids)
    llm = _load(path, threads, n_ctx=max(n, 32), n_batch=max(n, 32), logits_all=True, kv_f32=kv_f32)
    llm.eval(ids)
    return np.array(llm.scores[:n], dtype=np.float32)


def reference_logits(hf_dir: str, ids: List[int], threads: int) -> np.ndarray:
    """transformers float32 logits at every position of ids, [T, V]."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().numpy()




def _decode_batch(ctx, vocab: int, prompts: List[List[int]], new: int) -> List[List[int]]:
    """Greedy decoding of several sequences in one llama_batch per step (one KV-cache sequence id each),
    with llama.cpp's low-level API; ctx must hold n_seq_max >= len(prompts) sequences."""
    import llama_cpp

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    batch = llama_cpp.llama_batch_init(max(sum(len(p) for p in prompts), len(prompts)), 0, len(prompts))
    try:
        def submit(entries):  # entries: (token, position, sequence, wants logits)
            for i, (token, pos, seq, want) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, want
            batch.n_tokens = len(entries)
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")

        entries, rows = [], []
        for seq, prompt in enumerate(prompts):
            for pos, token in enumerate(prompt):
                entries.append((token, pos, seq, pos == len(prompt) - 1))
            rows.append(len(entries) - 1)
        submit(entries)
        out: List[List[int]] = [[] for _ in prompts]
        for step in range(new):
            for seq, row in enumerate(rows):
                scores = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row), shape=(vocab,))
                out[seq].append(int(np.argmax(scores)))
            if step + 1 < new:  # the last token needs no forward pass
                submit([(out[seq][-1], len(prompts[seq]) + step, seq, True) for seq in range(len(prompts))])
                rows = list(range(len(prompts)))
        return out
    finally:
        llama_cpp.llama_batch_free(batch)


def _decode_one(llm, prompt: List[int], new: int) -> List[int]:
    """Greedy decoding of one sequence: Llama.eval per token, argmax of the last position's logits."""
    import llama_cpp

    vocab = llm.n_vocab()
    llm.reset()
    llm.eval(prompt)
    out: List[int] = []
    for step in range(new):
        scores = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(vocab,))
        out.append(int(np.argmax(scores)))
        if step + 1 < new:  # the last token needs no forward pass
            llm.eval([out[-1]])
    return out


def bench(path: str, threads: int, prompt_len: int, new: int, batches: List[int], prefill: int,
          repeats: int, flash_attn: bool = False) -> dict:
    """tokens/s of decoding (greedy, `new` tokens after `prompt_len`-token prompts, for each batch size)
    and of a `prefill`-token prompt evaluated in one batch (n_batch = n_ubatch = prefill), measured
    like bench_decoder.py's engines: rate = batch * new / seconds, prompt included."""
    import llama_cpp

    rng = np.random.default_rng(0)
    results: dict = {}
    llm = _load(path, threads, n_ctx=max(prefill, max(batches or [1]) * (prompt_len + new), 64),
                n_batch=max(prefill, 64), flash_attn=flash_attn)
    vocab = llm.n_vocab()
    try:
        for batch in batches:
            prompts = rng.integers(10, vocab - 10, (batch, prompt_len)).tolist()
            if batch == 1:
                entry = timed(lambda: _decode_one(llm, prompts[0], new), repeats)
            else:
                # The Llama class makes single-sequence contexts: a second context on the same weights
                # holds `batch` sequences in one unified KV cache.
                params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
                params.n_seq_max, params.kv_unified = batch, True
                params.n_ctx = batch * (prompt_len + new)
                params.n_batch = params.n_ubatch = max(512, batch * prompt_len)
                ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
                if not ctx:
                    raise RuntimeError(f"llama.cpp could not make a context of {batch} sequences")
                try:
                    entry = timed(lambda: _decode_batch(ctx, vocab, prompts, new), repeats)
                finally:
                    llama_cpp.llama_free(ctx)
            entry["tok_per_s"] = batch * new / entry["seconds"]
            results[f"decode_b{batch}_p{prompt_len}_n{new}"] = entry
        if prefill:
            prompt = rng.integers(10, vocab - 10, prefill).tolist()

            def fill():
                llm.reset()
                llm.eval(prompt)
            entry = timed(fill, repeats)
            entry["tok_per_s"] = prefill / entry["seconds"]
            results[f"prefill_{prefill}"] = entry
    finally:
        llm.close()
    return results


# ---- the importing side (no llama_cpp, no torch) --------------------------------------------------

def run_child(argv: List[str], timeout: float = 3600) -> dict:
    """The JSON printed by `python _llamacpp.py <argv>` in a fresh process; RuntimeError with the
    child's stderr tail when it fails."""
    try:
        done = subprocess.run([sys.executable, HERE] + argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"llama.cpp child {argv[0]} timed out after {timeout:.0f} s") from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise RuntimeError(f"llama.cpp child {argv[0]} exited with {done.returncode}: {tail}")
    return json.loads(lines[-1])


def available() -> tuple:
    """(True, version dict) when llama_cpp and gguf import in a fresh process, else (False, reason)."""
    try:
        return True, run_child(["version"], timeout=120)
    except RuntimeError as error:
        return False, str(error).strip().splitlines()[-1]  # the exception line, not the traceback


def compare(reference: np.ndarray, other: np.ndarray) -> dict:
    """How far `other` logits [T, V] are from `reference`: max |diff| against max |reference|,
    relative RMS error over all logits, mean cosine per position and top-1 agreement."""
    reference, other = np.asarray(reference, np.float64), np.asarray(other, np.float64)
    if reference.shape != other.shape:
        raise ValueError(f"logits of shape {other.shape} against {reference.shape}")
    cos = np.sum(reference * other, axis=-1) / (np.linalg.norm(reference, axis=-1) * np.linalg.norm(other, axis=-1))
    scale = float(np.max(np.abs(reference)))
    return {"max_abs_diff": float(np.max(np.abs(other - reference))), "logit_scale": scale,
            "max_abs_diff_rel": float(np.max(np.abs(other - reference))) / scale,
            "rel_rms": float(np.linalg.norm(other - reference) / np.linalg.norm(reference)),
            "mean_cosine": float(np.mean(cos)),
            "top1_agreement": float(np.mean(np.argmax(other, -1) == np.argmax(reference, -1)))}


def self_check(hf_dir: str, gguf_f32: str, ids: List[int], threads: int, work: str) -> dict:
    """llama.cpp's logits from the F32 GGUF (F32 KV cache) against transformers' on the same weights,
    each in its own process. Raises when max |diff| / max |logit| exceeds SELF_CHECK_TOLERANCE: a
    converter bug must not turn into a benchmark row."""
    ref_path, ours_path = os.path.join(work, "selfcheck_ref.npy"), os.path.join(work, "selfcheck_llamacpp.npy")
    text = ",".join(map(str, ids))
    run_child(["reference", hf_dir, "--ids", text, "--out", ref_path, "--threads", str(threads)])
    run_child(["logits", gguf_f32, "--ids", text, "--out", ours_path, "--threads", str(threads), "--kv-f32"])
    result = compare(np.load(ref_path), np.load(ours_path))
    result.update(tokens=len(ids), tolerance=SELF_CHECK_TOLERANCE)
    if not result["max_abs_diff_rel"] <= SELF_CHECK_TOLERANCE:
        raise RuntimeError(f"llama.cpp F32 logits differ from transformers': max |diff| {result['max_abs_diff']:.3g}"
                           f" = {result['max_abs_diff_rel']:.3g} of max |logit| (> {SELF_CHECK_TOLERANCE}); "
                           f"the GGUF conversion of {hf_dir} is wrong")
    return result


# ---- command line (the child's side) --------------------------------------------------------------

def _ids(text: str) -> List[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version")
    p = sub.add_parser("convert")
    p.add_argument("hf_dir")
    p.add_argument("out")
    p.add_argument("--outtype", choices=("f32", "f16"), default="f32")
    p.add_argument("--vocabulary", choices=VOCABULARIES, default="ids")
    p = sub.add_parser("prepare")
    p.add_argument("hf_dir")
    p.add_argument("out_dir")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocabulary", choices=VOCABULARIES, default="ids")
    for name in ("logits", "reference"):
        p = sub.add_parser(name)
        p.add_argument("model")
        p.add_argument("--ids", required=True, help="comma-separated token ids")
        p.add_argument("--out", required=True, help=".npy path of the [T, V] float32 logits")
        p.add_argument("--threads", type=int, default=2)
        if name == "logits":
            p.add_argument("--kv-f32", action="store_true", help="F32 KV cache (llama.cpp's default is F16)")
    p = sub.add_parser("bench")
    p.add_argument("gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode", default="16,128", help="PROMPT,NEW tokens of the decode runs ('' for none)")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes of the decode runs")
    p.add_argument("--prefill", type=int, default=512, help="prompt length of the prefill run (0: none)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--flash-attn", action="store_true", help="flash attention (llama-cpp-python's default: off)")
    args = parser.parse_args(argv)

    if args.command == "version":
        import gguf  # noqa: F401 (the converter needs it too)
        out = llama_cpp_version()
    elif args.command == "convert":
        out = convert(args.hf_dir, args.out, args.outtype, args.vocabulary)
    elif args.command == "prepare":
        out = prepare(args.hf_dir, args.out_dir, [k for k in args.kinds.split(",") if k], args.threads,
                      args.vocabulary)
    elif args.command in ("logits", "reference"):
        ids = _ids(args.ids)
        values = (logits(args.model, ids, args.threads, args.kv_f32) if args.command == "logits"
                  else reference_logits(args.model, ids, args.threads))
        np.save(args.out, values)
        out = {"path": args.out, "shape": list(values.shape)}
    else:
        prompt_new = _ids(args.decode)
        batches = _ids(args.batch) if prompt_new else []
        prompt_len, new = prompt_new if prompt_new else (0, 0)
        out = bench(args.gguf, args.threads, prompt_len, new, batches, args.prefill, args.repeats, args.flash_attn)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
