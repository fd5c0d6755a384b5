"""Checks cpuformer on AArch64 (run under QEMU) against cpuformer on the x86-64 host, which is itself
checked against Hugging Face transformers here and by the test suite (docs/arm.md):

    python scripts/aarch64_crosscheck.py build DIR    # host: torch + transformers + cpuformer
    python scripts/aarch64_crosscheck.py check DIR    # target: numpy + cpuformer only

`build` writes tiny random-weight models with transformers (BERT encoder, GPT-2 decoder, Marian and
T5 encoder-decoders; the decoders' final norms scaled up so that greedy choices are far from ties),
then runs them with the host's cpuformer at float32, float16, bfloat16, int8 and int4 (converted or
quantized at load) and stores
the inputs and outputs in DIR/reference.npz. At float32 the host's outputs must match transformers
(max |difference| <= 1e-4 * max |reference|, greedy tokens identical), and every greedy run must
decide each token by a top-2 score gap of at least GAP, so that a different token on ARM means a
bug, not a rounding tie.

`check` runs the same models and inputs with the cpuformer it imports (the AArch64 build, at the level
the emulated CPU and CPUFORMER_ISA select) and compares with DIR/reference.npz:
- float32: max |difference| <= 1e-4 * max |reference| (two float32 implementations; different
  blocking and fused multiply-adds give ~1e-6 in practice)
- float16 / bfloat16: the same bound. Both sides widen the 16-bit weights to float32 exactly and
  sum in float32; `build` hides the host's avx512_bf16 (CPUFORMER_DISABLE_FEATURES) so that its
  bfloat16 reference is the widening kernel too, not vdpbf16ps, which rounds activations to bfloat16.
- int8 / int4: max |difference| <= 2e-3 * max |reference|. The integer dot products are exact on
  both architectures, but the activations are quantized from float32 values that differ in the last
  bits, so an element near a rounding boundary may land one quantization step apart.
- greedy tokens: identical at every dtype.
It prints one line per output and exits 1 listing every mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List

import numpy as np

FLOAT32_TOLERANCE = 1e-4
QUANTIZED_TOLERANCE = 2e-3
GAP = 2e-3
DTYPES = ("float32", "float16", "bfloat16", "int8", "int4")
NEW_TOKENS = 16

# name -> (transformers model class, config class, config, the parameter scaled for peaky outputs)
MODELS = {
    "bert": ("BertModel", "BertConfig",
             dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  max_position_embeddings=48, type_vocab_size=2), None),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=101, n_embd=64, n_layer=2, n_head=4, n_positions=96, initializer_range=0.2,
                  bos_token_id=1, eos_token_id=2), "transformer.ln_f.weight"),
    "marian": ("MarianMTModel", "MarianConfig",
               dict(vocab_size=101, pad_token_id=100, decoder_start_token_id=100, eos_token_id=0, d_model=64,
                    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                    encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, init_std=0.1),
               "model.decoder.layers.1.final_layer_norm.weight"),
    "t5": ("T5ForConditionalGeneration", "T5Config",
           dict(vocab_size=99, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0,
                relative_attention_num_buckets=16, relative_attention_max_distance=20),
           "decoder.final_layer_norm.weight"),
}


def _inputs(name: str) -> Dict[str, np.ndarray]:
    vocab = MODELS[name][2]["vocab_size"]
    rng = np.random.default_rng(sorted(MODELS).index(name))
    ids = rng.integers(3, vocab - 2, size=(2, 13)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 9:] = 0
    return {"ids": ids, "mask": mask, "target": rng.integers(3, vocab - 2, size=(2, 7)).astype(np.int64)}


def _gap(scores: np.ndarray) -> float:
    finite = np.where(np.isfinite(scores), scores, -1e30)
    top = np.sort(finite, axis=-1)[..., -2:]
    return float((top[..., 1] - top[..., 0]).min())


def _run(directory: str, name: str, dtype: str, inputs: Dict[str, np.ndarray]):
    """(the cpuformer model, {output name: array}); greedy tokens as int64 arrays, one per prompt
    (min_new_tokens = max_new_tokens: EOS is banned, every run generates NEW_TOKENS)."""
    import cpuformer as cf

    model = cf.load(directory, dtype=dtype)
    ids, mask = inputs["ids"], inputs["mask"]
    prompts = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask)]
    out: Dict[str, np.ndarray] = {}
    if name == "bert":
        out["hidden"] = model(ids, mask)
    elif name == "gpt2":
        out["logits"] = model.logits(ids[:1])
        for i, prompt in enumerate(prompts):
            out[f"tokens{i}"] = np.asarray(model.generate([prompt], max_new_tokens=NEW_TOKENS,
                                                          min_new_tokens=NEW_TOKENS)[0], dtype=np.int64)
    else:
        # padded positions of an encoder output carry no meaning (zero where the encoder skips
        # them): compared at the unpadded ones
        out["encoder"] = model.encode(ids, mask) * mask[:, :, None].astype(np.float32)
        out["logits"] = model.logits(ids, inputs["target"], mask)
        for i, prompt in enumerate(prompts):
            out[f"tokens{i}"] = np.asarray(model.generate([prompt], max_new_tokens=NEW_TOKENS,
                                                          min_new_tokens=NEW_TOKENS)[0], dtype=np.int64)
    return model, out


def _decision_gap(model, name: str, prompt: List[int], tokens: np.ndarray) -> float:
    """The smallest top-2 gap of the scores that chose each greedy token, recomputed with logits() over
    the prompt and the tokens. min_new_tokens = max_new_tokens bans EOS at every step, so EOS is left
    out of the scores, and a step that chose EOS anyway (forced_eos_token_id at the last one) is skipped."""
    eos = MODELS[name][2].get("eos_token_id", 1)
    tokens = tokens.tolist()
    if name == "gpt2":
        scores = model.logits([prompt + tokens])[0, len(prompt) - 1:-1].copy()
    else:
        start = MODELS[name][2]["decoder_start_token_id"]
        scores = model.logits([prompt], [[start] + tokens[:-1]])[0].copy()
    scores[:, eos] = -np.inf
    return _gap(scores[np.asarray(tokens) != eos])


def _hf_reference(model, name: str, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    import torch

    ids, mask = torch.tensor(inputs["ids"]), torch.tensor(inputs["mask"])
    prompts = [row[m.astype(bool)] for row, m in zip(inputs["ids"], inputs["mask"])]
    out: Dict[str, np.ndarray] = {}
    with torch.inference_mode():
        if name == "bert":
            out["hidden"] = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
            return out
        if name == "gpt2":
            out["logits"] = model(input_ids=ids[:1]).logits.numpy()
            for i, prompt in enumerate(prompts):
                p = torch.tensor(prompt[None])
                seq = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1, pad_token_id=0)
                out[f"tokens{i}"] = seq[0, p.shape[1]:].numpy()
            return out
        out["encoder"] = (model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
                          * mask[:, :, None]).numpy()
        out["logits"] = model(input_ids=ids, attention_mask=mask,
                              decoder_input_ids=torch.tensor(inputs["target"])).logits.numpy()
        for i, prompt in enumerate(prompts):
            p = torch.tensor(prompt[None])
            seq = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1)
            out[f"tokens{i}"] = seq[0, 1:].numpy()
    return out


def _compare(ours: np.ndarray, ref: np.ndarray, tolerance: float, key: str, failures: List[str]) -> str:
    if ours.shape != ref.shape:
        failures.append(f"{key}: shape {ours.shape}, reference {ref.shape}")
        return "SHAPE MISMATCH"
    if np.issubdtype(ref.dtype, np.integer):
        if not np.array_equal(ours, ref):
            failures.append(f"{key}: tokens {ours.tolist()}, reference {ref.tolist()}")
            return "TOKENS DIFFER"
        return "tokens identical"
    scale = float(np.abs(ref).max())
    error = float(np.abs(ours.astype(np.float64) - ref).max()) / scale
    verdict = "ok" if np.isfinite(error) and error <= tolerance else "MISMATCH"
    if verdict != "ok":
        failures.append(f"{key}: max |difference| / max |reference| = {error:.3g} > {tolerance:g}")
    return f"{verdict}: max |difference| / max |reference| = {error:.2e} (bound {tolerance:g})"


def build(root: str) -> int:
    # The bfloat16 reference from the widening kernel, as on ARM (read at the first kernel call).
    features = [f for f in os.environ.get("CPUFORMER_DISABLE_FEATURES", "").split(",") if f]
    os.environ["CPUFORMER_DISABLE_FEATURES"] = ",".join(features + ["avx512_bf16"])
    import torch
    import transformers

    import cpuformer as cf

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    arrays: Dict[str, np.ndarray] = {}
    failures: List[str] = []
    print(f"cpuformer {cf.__version__} ({cf.__file__}), isa {cf.cpu_info()['isa']}")
    for seed, (name, (model_class, config_class, config, peaky)) in enumerate(MODELS.items()):
        directory = os.path.join(root, name)
        torch.manual_seed(seed)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
        if peaky:
            with torch.no_grad():
                dict(model.named_parameters())[peaky].mul_(8.0)
        model.save_pretrained(directory)
        inputs = _inputs(name)
        for key, value in inputs.items():
            arrays[f"{name}/input/{key}"] = value
        hf = _hf_reference(model, name, inputs)
        for dtype in DTYPES:
            cf_model, out = _run(directory, name, dtype, inputs)
            prompts = [row[m.astype(bool)].tolist() for row, m in zip(inputs["ids"], inputs["mask"])]
            for i, prompt in enumerate(prompts if name != "bert" else []):
                gap = _decision_gap(cf_model, name, prompt, out[f"tokens{i}"])
                if gap <= GAP:
                    failures.append(f"{name}/{dtype}/tokens{i}: top-2 score gap {gap:.3g} <= {GAP:g}: "
                                    "a tie could flip a token; change the model's seed or scale")
            for key, value in out.items():
                arrays[f"{name}/{dtype}/{key}"] = value
                if dtype == "float32":
                    verdict = _compare(value, hf[key], FLOAT32_TOLERANCE, f"{name}/{key} vs transformers", failures)
                    print(f"{name:<7} {key:<8} host float32 vs transformers: {verdict}")
    np.savez(os.path.join(root, "reference.npz"), **arrays)
    with open(os.path.join(root, "reference.json"), "w") as f:
        json.dump({"isa": cf.cpu_info()["isa"], "version": cf.__version__}, f)
    if failures:
        print("FAILED (the host reference):\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print(f"reference outputs of {len(MODELS)} models x {len(DTYPES)} dtypes in {root}/reference.npz")
    return 0


def check(root: str) -> int:
    import cpuformer as cf

    if not os.path.isfile(os.path.join(root, "reference.npz")):
        print(f"no reference outputs in {root}: run `aarch64_crosscheck.py build {root}` on the host first",
              file=sys.stderr)
        return 2
    reference = np.load(os.path.join(root, "reference.npz"))
    with open(os.path.join(root, "reference.json")) as f:
        host = json.load(f)
    info = cf.cpu_info()
    print(f"cpuformer {cf.__version__} isa {info['isa']} against the host's cpuformer {host['version']} "
          f"(isa {host['isa']})")
    failures: List[str] = []
    checked = 0
    for name in MODELS:
        inputs = {key: reference[f"{name}/input/{key}"] for key in ("ids", "mask", "target")}
        for dtype in DTYPES:
            _, out = _run(os.path.join(root, name), name, dtype, inputs)
            expected = {k[len(f"{name}/{dtype}/"):] for k in reference.files if k.startswith(f"{name}/{dtype}/")}
            if set(out) != expected:
                failures.append(f"{name}/{dtype}: outputs {sorted(out)}, reference {sorted(expected)}")
            tolerance = QUANTIZED_TOLERANCE if dtype in ("int8", "int4") else FLOAT32_TOLERANCE
            for key in sorted(expected & set(out)):
                verdict = _compare(out[key], reference[f"{name}/{dtype}/{key}"], tolerance, f"{name}/{dtype}/{key}",
                                   failures)
                checked += 1
                print(f"{name:<7} {dtype:<8} {key:<8} {verdict}")
    if failures:
        print(f"FAILED: {len(failures)} of {checked} outputs differ from the host's:\n  " + "\n  ".join(failures),
              file=sys.stderr)
        return 1
    print(f"all {checked} outputs match the host's")
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("build", "check"))
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    os.makedirs(args.directory, exist_ok=True)
    return build(args.directory) if args.mode == "build" else check(args.directory)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
