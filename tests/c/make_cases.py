"""Writes the C API test fixtures into DIR (scripts/test-c-api.sh runs it): tiny random-weight
checkpoints of each model kind (transformers + torch), converted with ``cpuformer convert`` to
several dtypes, the Python API's outputs on fixed inputs, and DIR/cases.txt listing what
tests/c/capi_tests.c must reproduce from C — bit for bit (hidden states, generated tokens) or
within a stated tolerance (pooled embeddings: NumPy sums in another order) — plus damaged copies
for the error paths.

    python tests/c/make_cases.py DIR

Raw arrays are little-endian int64 (ids) or float32 files; cases.txt has one case per line:

    encode  MODEL B T IDS MASK REF
    embed   MODEL B T POOLING NORMALIZE IDS MASK REF TOLERANCE
    generate MODEL PROMPT MAX_NEW NUM_BEAMS DO_SAMPLE SEED REF
"""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import sys
from typing import List

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file
from safetensors.torch import save_file as save_torch_file

import cpuformer as cf
from cpuformer.models._packed import packed_file_name

POOLINGS = {"mean": 0, "cls": 1, "max": 2, "last": 3}


def read_packed_index(path: pathlib.Path) -> dict:
    """The JSON index of a packed-weights file (csrc/io/packed_file.h)."""
    data = path.read_bytes()
    offset, size = struct.unpack_from("<QQ", data, 8)
    return json.loads(data[offset:offset + size])


def rewrite_packed_index(path: pathlib.Path, edit) -> None:
    """Applies edit(index) to a packed-weights file's index (written anew after the data)."""
    data = bytearray(path.read_bytes())
    offset, _ = struct.unpack_from("<QQ", data, 8)
    index = read_packed_index(path)
    edit(index)
    text = json.dumps(index).encode()
    data = data[:offset] + text
    struct.pack_into("<QQ", data, 8, offset, len(text))
    path.write_bytes(bytes(data))


def swap_keys(a: str, b: str):
    """An index edit swapping the keys of two matrices."""
    def edit(index: dict) -> None:
        for m in index["matrices"]:
            if m["key"] in (a, b):
                m["key"] = b if m["key"] == a else a
    return edit


def save(path: pathlib.Path, array: np.ndarray) -> str:
    np.ascontiguousarray(array).tofile(path)
    return path.name


def checkpoints(root: pathlib.Path) -> dict:
    torch.manual_seed(0)
    models = {
        "bert": transformers.BertModel(transformers.BertConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)),
        "deberta": transformers.DebertaV2Model(transformers.DebertaV2Config(
            vocab_size=95, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, relative_attention=True, position_buckets=8, pos_att_type="p2c|c2p",
            norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False, type_vocab_size=0)),
        "modernbert": transformers.ModernBertModel(transformers.ModernBertConfig(
            vocab_size=93, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0)),
        "xlnet": transformers.XLNetModel(transformers.XLNetConfig(
            vocab_size=91, d_model=32, n_layer=2, n_head=4, d_inner=64)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)),
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)),
        "t5": transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
            eos_token_id=1, pad_token_id=0)),
        "bart": transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=90, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            bos_token_id=0, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2, forced_eos_token_id=2)),
    }
    out = {}
    for name, model in models.items():
        path = root / "hf" / name
        model.eval().save_pretrained(path)
        out[name] = path
    return out


def main(argv: List[str]) -> int:
    root = pathlib.Path(argv[1]).resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    data = root / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    cases: List[str] = []
    sources = checkpoints(root)
    dtypes = {"bert": ["float32", "int8", "int4"], "gpt2": ["float32", "int8", "bfloat16", "int4"],
              "llama": ["float32", "int8", "float16"], "t5": ["float32", "int8"], "bart": ["float32"],
              "deberta": [], "modernbert": [], "xlnet": []}
    # Converted directories, and plain ones opened in a dtype ("hf/bert@int8": MODEL@DTYPE; the C++
    # registry declares every family here, so the C API opens them without conversion too).
    runs = [(name, dtype, root / f"{name}-{dtype}", f"{name}-{dtype}") for name in sources for dtype in dtypes[name]]
    runs += [(name, dtype, sources[name], f"hf-{name}-{dtype}") for name in ("bert", "deberta", "modernbert", "xlnet")
             for dtype in ("float32", "int8")]
    for name, dtype, model_dir, tag in runs:
        src = sources[name]
        plain = model_dir == src
        if not plain:
            cf.convert(src, model_dir, dtype, progress=False)
        model = cf.load(model_dir, dtype=dtype if plain else None, num_threads=2)
        opened = f"hf/{name}@{dtype}" if plain else model_dir.name
        V = model.vocab_size if hasattr(model, "vocab_size") else model.config["vocab_size"]
        if name in ("bert", "deberta", "modernbert", "xlnet"):  # encoders
            B, T = 3, 7
            ids = rng.integers(3, V, size=(B, T), dtype=np.int64)
            mask = np.ones((B, T), dtype=np.int64)
            mask[1, 5:] = 0
            mask[2, 2:] = 0
            hidden = model(ids, attention_mask=mask)
            i, m = save(data / f"{tag}.ids", ids), save(data / f"{tag}.mask", mask)
            cases.append(f"encode {opened} {B} {T} {i} {m} {save(data / f'{tag}.hidden', hidden)}")
            for pooling in POOLINGS:
                for normalize in (0, 1):
                    rows = [list(ids[b][mask[b] > 0]) for b in range(B)]
                    emb = model.embed(rows, pooling=pooling, normalize=bool(normalize))
                    ref = save(data / f"{tag}.{pooling}{normalize}", emb.astype(np.float32))
                    cases.append(f"embed {opened} {B} {T} {POOLINGS[pooling]} {normalize} {i} {m} "
                                 f"{ref} 2e-6")
            continue
        for p, (length, max_new, beams, sample, seed) in enumerate(
                [(5, 12, 1, 0, 0), (9, 8, 3, 0, 0), (4, 10, 1, 1, 7)]):
            prompt = rng.integers(3, V, size=length, dtype=np.int64)
            kwargs = dict(max_new_tokens=max_new, num_beams=beams, do_sample=bool(sample), seed=seed)
            tokens = model.generate([list(map(int, prompt))], **kwargs)[0]
            ref = save(data / f"{tag}.{p}.tokens", np.array(tokens, dtype=np.int64))
            cases.append(f"generate {opened} {save(data / f'{tag}.{p}.prompt', prompt)} {max_new} "
                         f"{beams} {sample} {seed} {ref}")
        model.close()
    # Plain Hugging Face directories of the families the C++ registry declares (decoders and
    # encoder-decoders): the C API opens them in any dtype ("hf/gpt2@int8": MODEL@DTYPE) and must
    # give the Python API's outputs bit for bit.
    # hf/llama-bf16 stores its weights in bfloat16 (widened to float32 at load on both sides).
    bf16 = root / "hf" / "llama-bf16"
    shutil.copytree(sources["llama"], bf16)
    weights = load_file(bf16 / "model.safetensors")
    save_torch_file({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in weights.items()},
                    bf16 / "model.safetensors")
    # hf/gpt2-sharded holds GPT-2's tensors in two shards named by model.safetensors.index.json.
    sharded = root / "hf" / "gpt2-sharded"
    shutil.copytree(sources["gpt2"], sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = load_file(sources["gpt2"] / "model.safetensors")
    names = list(weights)
    shard_of = {name: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, name in enumerate(names)}
    for shard in sorted(set(shard_of.values())):
        save_file({n: weights[n] for n in names if shard_of[n] == shard}, sharded / shard)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shard_of}))
    for tag, src, dtype in (("gpt2", sources["gpt2"], "float32"), ("gpt2", sources["gpt2"], "int8"),
                            ("gpt2-sharded", sharded, "int8"),
                            ("llama", sources["llama"], "float32"), ("llama", sources["llama"], "int4"),
                            ("llama-bf16", bf16, "float32"), ("llama-bf16", bf16, "int8"),
                            ("t5", sources["t5"], "float32"), ("t5", sources["t5"], "int8"),
                            ("bart", sources["bart"], "float32")):
        model = cf.load(src, dtype=dtype, num_threads=2)
        V = model.config["vocab_size"]
        for p, (length, max_new, beams, sample, seed) in enumerate([(5, 12, 1, 0, 0), (9, 8, 3, 0, 0)]):
            prompt = rng.integers(3, V, size=length, dtype=np.int64)
            tokens = model.generate([list(map(int, prompt))], max_new_tokens=max_new, num_beams=beams,
                                    do_sample=bool(sample), seed=seed)[0]
            name = f"plain-{tag}-{dtype}.{p}"
            ref = save(data / f"{name}.tokens", np.array(tokens, dtype=np.int64))
            cases.append(f"generate hf/{tag}@{dtype} {save(data / f'{name}.prompt', prompt)} {max_new} {beams} "
                         f"{sample} {seed} {ref}")
        model.close()
    # Every directory above has its packed-weights file (cpuformer convert writes it for this
    # machine's level), so the C API maps them; these copies without one pack at load, and must
    # give the same bits (the same reference files).
    packed = packed_file_name()
    for tag in ("gpt2-int8", "gpt2-int4", "llama-float16", "bert-int8", "t5-int8"):
        assert (root / tag / packed).is_file(), tag
        shutil.copytree(root / tag, root / f"{tag}-nopack", ignore=shutil.ignore_patterns(packed))
        cases += [line.replace(f" {tag} ", f" {tag}-nopack ") for line in cases if f" {tag} " in line]
    # Damaged copies for the error paths (tests/c/capi_tests.c opens each and expects
    # CF_ERROR_INVALID_MODEL).
    damaged = root / "damaged"
    damaged.mkdir()
    good = root / "gpt2-int8"
    edits = {  # what -> an edit of the manifest (tests/c/capi_tests.c names the message each gives)
        "wrong_shape": lambda t: t["decoder"][1]["attn.o"].update(shape=[16, 32]),
        "bad_dtype": lambda t: t["decoder"][0]["attn.q"].update(dtype="int3"),
        "bad_rows": lambda t: t["decoder"][0]["attn.q"].update(rows=[0, 9999]),
        "stored_dtype": lambda t: t["decoder"][0]["attn_norm"].update(dtype="int8"),
        "missing_tensor": lambda t: t["decoder"][0]["attn_norm"].update(name="nonexistent.weight"),
        "layer_count": lambda t: t["decoder"].pop(),
    }
    for what in ("manifest_truncated", "weights_truncated", "bad_version", "no_manifest", "unknown_field",
                 "unknown_option", "packed_truncated", "packed_bad_magic", "packed_shape", *edits):
        copy = damaged / what
        shutil.copytree(good, copy)
        manifest = copy / "cpuformer_graph.json"
        if what == "packed_truncated":
            (copy / packed).write_bytes((copy / packed).read_bytes()[:200])
        elif what == "packed_bad_magic":
            data = bytearray((copy / packed).read_bytes())
            data[:8] = b"NOTPACKD"
            (copy / packed).write_bytes(bytes(data))
        elif what == "packed_shape":  # two matrices' keys swapped: each is self-consistent, not the model's
            rewrite_packed_index(copy / packed, swap_keys("decoder.layers.0.qkv", "decoder.layers.0.up"))
        elif what == "manifest_truncated":
            manifest.write_bytes(manifest.read_bytes()[:100])
        elif what == "weights_truncated":
            weights = copy / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:-1000])
        elif what == "bad_version":
            doc = json.loads(manifest.read_text())
            doc["format_version"] = 99
            manifest.write_text(json.dumps(doc))
        elif what == "no_manifest":
            manifest.unlink()
        else:
            doc = json.loads(manifest.read_text())
            if what == "unknown_field":
                doc["config"]["bogus"] = 1
            elif what == "unknown_option":
                doc["generation"]["bogus"] = 1
            else:
                edits[what](doc["tensors"])
            manifest.write_text(json.dumps(doc))
    # Plain directories the C API refuses (CF_ERROR_INVALID_MODEL, tests/c/capi_tests.c).
    plain = sources["gpt2"]
    stray = damaged / "plain_stray"
    shutil.copytree(plain, stray)
    weights = load_file(stray / "model.safetensors")
    weights["extra.weight"] = np.ones(3, dtype=np.float32)
    save_file(weights, stray / "model.safetensors")
    missing_shard = damaged / "plain_missing_shard"
    shutil.copytree(root / "hf" / "gpt2-sharded", missing_shard)
    (missing_shard / "model-00002-of-00002.safetensors").unlink()
    no_head = damaged / "plain_no_head"  # llama's head is untied
    shutil.copytree(sources["llama"], no_head)
    weights = load_file(no_head / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, no_head / "model.safetensors")
    undeclared = damaged / "plain_undeclared"  # an image model: the C API runs text models only
    shutil.copytree(sources["bert"], undeclared)
    config = json.loads((undeclared / "config.json").read_text())
    config.update(architectures=["ViTModel"], model_type="vit")
    (undeclared / "config.json").write_text(json.dumps(config))
    bad_config = damaged / "plain_bad_config"
    shutil.copytree(sources["llama"], bad_config)
    config = json.loads((bad_config / "config.json").read_text())
    config["hidden_act"] = "relu"
    (bad_config / "config.json").write_text(json.dumps(config))
    (root / "cases.txt").write_text("\n".join(cases) + "\n")
    print(f"wrote {len(cases)} cases into {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
