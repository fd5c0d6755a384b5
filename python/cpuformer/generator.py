"""``cpuformer.Generator``: decoder-only causal language models and text generation.

Supported: GPT2LMHeadModel (GPT-2), LlamaForCausalLM, MistralForCausalLM (sliding window),
Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (per-head q/k RMSNorm). Loading maps a
checkpoint's tensor names onto one graph (``_core.DecoderModel``, C++), packs each layer's
projections and releases the layer's source pages right after. The embedding tables are copied
into memory the C++ model owns and the weights maps are closed when loading ends, so a loaded
model does not depend on its files.

Generation runs entirely in C++ (prefill, decode steps with an in-place KV cache, logits
processing, sampling and beam bookkeeping); Python is only called per token to stream.
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._arguments import check_integer, integer_array, token_id_range_error
from ._base import Generated, ModelBase, Prompts, TokenIds
from ._model_dir import ModelDir, config_float, config_int, config_token_ids
from ._tokenizer import load_tokenizer
from .convert import put_weight, release_weight

PathLike = Union[str, os.PathLike]

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                     "gelu_fast": "gelu_tanh"}
_ROPE_TYPES = ("default", "linear", "llama3")


def _family(model_type: Any, architecture: str) -> str:
    for prefix, family in (("GPT2", "gpt2"), ("Llama", "llama"), ("Mistral", "mistral"), ("Qwen3", "qwen3"),
                           ("Qwen2", "qwen2")):
        if architecture.startswith(prefix):
            return family
    if model_type in ("gpt2", "llama", "mistral", "qwen2", "qwen3"):
        return model_type
    raise ValueError(f"unknown decoder architecture {architecture!r}")


def rope_inv_freq(config: Dict[str, Any], head_dim: int) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2] float32 as transformers computes them, with
    ``rope_scaling`` / ``rope_parameters`` types default, linear and llama3."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"config.json: rope_scaling must be an object, got {params!r}")
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    theta = config_float({"rope_theta": theta}, "rope_theta", minimum=1e-9)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"config.json: unknown rope_scaling type {rope_type!r}; supported: {', '.join(_ROPE_TYPES)}")
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float64(theta) ** exponent.astype(np.float64))).astype(np.float32)
    if rope_type == "linear":
        factor = config_float(params, "factor", minimum=1e-9, source="config.json rope_scaling")
        inv_freq = (inv_freq / np.float32(factor)).astype(np.float32)
    elif rope_type == "llama3":
        source = "config.json rope_scaling"
        factor = config_float(params, "factor", minimum=1e-9, source=source)
        low = config_float(params, "low_freq_factor", minimum=1e-9, source=source)
        high = config_float(params, "high_freq_factor", minimum=1e-9, source=source)
        old = config_float(params, "original_max_position_embeddings", minimum=1, source=source)
        if high <= low:
            raise ValueError(f"{source}: high_freq_factor ({high}) must exceed low_freq_factor ({low})")
        low_wavelen, high_wavelen = old / low, old / high
        f = inv_freq.astype(np.float32)
        wavelen = np.float32(2 * math.pi) / f
        scaled = np.where(wavelen > low_wavelen, f / np.float32(factor), f).astype(np.float32)
        smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    return np.ascontiguousarray(inv_freq, dtype=np.float32)


def _decoder_config(family: str, config: Dict[str, Any]) -> Dict[str, Any]:
    if family == "gpt2":
        # (aliases: transformers' GPT2Config.attribute_map)
        hidden = config_int(config, "n_embd", default=768, aliases=("hidden_size",))
        act = config.get("activation_function", "gelu_new")
        if act not in _GPT2_ACTIVATIONS:
            raise ValueError(f"config.json: activation_function {act!r} is not supported; use one of "
                             f"{sorted(_GPT2_ACTIVATIONS)}")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(flag):
                raise NotImplementedError(f"config.json: {flag}=true is not supported")
        if config.get("scale_attn_weights") is False:
            raise NotImplementedError("config.json: scale_attn_weights=false is not supported")
        heads = config_int(config, "n_head", default=12, aliases=("num_attention_heads",))
        if hidden % heads:
            raise ValueError(f"config.json: n_embd {hidden} is not a multiple of n_head {heads}")
        n_inner = config.get("n_inner")
        out = dict(vocab_size=config_int(config, "vocab_size", default=50257), hidden_size=hidden,
                   num_layers=config_int(config, "n_layer", default=12, aliases=("num_hidden_layers",)),
                   num_heads=heads, num_kv_heads=heads,
                   head_dim=hidden // heads,
                   intermediate_size=4 * hidden if n_inner is None else config_int(config, "n_inner"),
                   max_positions=config_int(config, "n_positions", default=1024,
                                            aliases=("max_position_embeddings",)), rms_norm=False,
                   norm_eps=config_float(config, "layer_norm_epsilon", default=1e-5, minimum=0.0),
                   learned_positions=True, swiglu=False, activation=_GPT2_ACTIVATIONS[act], sliding_window=0,
                   qk_norm=False, tie_word_embeddings=config.get("tie_word_embeddings", True) is not False)
        return out
    hidden = config_int(config, "hidden_size")
    heads = config_int(config, "num_attention_heads")
    kv_heads = config_int(config, "num_key_value_heads", default=heads)
    head_dim = config.get("head_dim")
    head_dim = hidden // heads if head_dim is None else config_int(config, "head_dim")
    if heads % kv_heads:
        raise ValueError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv_heads}")
    if head_dim % 2:
        raise ValueError(f"config.json: RoPE needs an even head_dim, got {head_dim}")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json: hidden_act {act!r} is not supported; the Llama family uses 'silu'")
    window = 0
    if family == "mistral" and config.get("sliding_window") is not None:
        window = config_int(config, "sliding_window")
    if family in ("qwen2", "qwen3") and config.get("use_sliding_window") and config.get("sliding_window"):
        raise NotImplementedError("config.json: use_sliding_window=true (per-layer sliding windows) is not supported")
    return dict(vocab_size=config_int(config, "vocab_size"), hidden_size=hidden,
                num_layers=config_int(config, "num_hidden_layers"), num_heads=heads, num_kv_heads=kv_heads,
                head_dim=head_dim, intermediate_size=config_int(config, "intermediate_size"),
                max_positions=config_int(config, "max_position_embeddings", default=2048), rms_norm=True,
                norm_eps=config_float(config, "rms_norm_eps", default=1e-6, minimum=0.0),
                learned_positions=False, swiglu=True, activation="silu", sliding_window=window,
                qk_norm=family == "qwen3", tie_word_embeddings=bool(config.get("tie_word_embeddings", False)))


def generation_setting(md: ModelDir, key: str) -> Tuple[Dict[str, Any], str]:
    """(the file's settings, its name) that supply the generation default ``key``:
    generation_config.json when it sets the key (to a non-null value), else config.json."""
    if md.generation_config.get(key) is not None:
        return md.generation_config, "generation_config.json"
    return md.config, "config.json"


class Generator(ModelBase):
    """A decoder-only causal LM loaded from a Hugging Face model directory.

    ``Generator(path, dtype=None, num_threads=None)``. ``gen.logits(input_ids,
    attention_mask=None)`` gives float32 [B, T, V]; ``gen.generate(prompts, ...)`` generates
    (arguments named as in Hugging Face's generate()); ``gen.stream(prompt, ...)`` yields tokens as
    they are produced.
    """

    _INPUT = "prompt"  # what the error messages call one input sequence

    def __init__(self, path: Union[PathLike, ModelDir], dtype: Optional[str] = None,
                 num_threads: Optional[int] = None):
        self._tokenizer = None
        model_dir = self._open(path, dtype, num_threads, "decoder", self._build)
        self._defaults(model_dir)

    # ---- loading ---------------------------------------------------------------------------

    def _build(self, md: ModelDir, _: str) -> None:
        self.family = _family(md.config.get("model_type"), self.architecture)
        cfg = _decoder_config(self.family, md.config)
        self.config = cfg
        H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        D, heads, kv_heads = cfg["head_dim"], cfg["num_heads"], cfg["num_kv_heads"]
        graph_cfg = {k: v for k, v in cfg.items() if k != "tie_word_embeddings"}
        graph_cfg["dtype"] = self.dtype
        stored = self._stored_dtype
        if self.family == "gpt2":
            prefix = "transformer." if "transformer.wte.weight" in md else ""
            embeddings = {"word_embeddings": md.tensor(prefix + "wte.weight", shape=(V, H)),
                          "position_embeddings": md.tensor(prefix + "wpe.weight", shape=(cfg["max_positions"], H))}
            word = embeddings["word_embeddings"]
            model = _core.DecoderModel(graph_cfg, embeddings)
            for layer in range(cfg["num_layers"]):
                p = f"{prefix}h.{layer}."
                names = [p + n for n in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
                # Conv1D stores weights [in, out]: transposed once here into nn.Linear layout
                # (converted directories store them transposed already).
                fused: Dict[str, Any] = {}
                put_weight(md, stored, fused, "qkv", p + "attn.c_attn.weight", (3 * H, H), conv1d=True)
                qkv_b = md.tensor(p + "attn.c_attn.bias", shape=(3 * H,))
                t = {"q.bias": np.ascontiguousarray(qkv_b[:H]), "k.bias": np.ascontiguousarray(qkv_b[H:2 * H]),
                     "v.bias": np.ascontiguousarray(qkv_b[2 * H:]),
                     "o.bias": md.tensor(p + "attn.c_proj.bias", shape=(H,)),
                     "norm1.weight": md.tensor(p + "ln_1.weight", shape=(H,)),
                     "norm1.bias": md.tensor(p + "ln_1.bias", shape=(H,)),
                     "norm2.weight": md.tensor(p + "ln_2.weight", shape=(H,)),
                     "norm2.bias": md.tensor(p + "ln_2.bias", shape=(H,)),
                     "up.bias": md.tensor(p + "mlp.c_fc.bias", shape=(I,)),
                     "down.bias": md.tensor(p + "mlp.c_proj.bias", shape=(H,))}
                for i, key in enumerate(("q", "k", "v")):  # row blocks of the fused weight (and scales)
                    t[key + ".weight"] = fused["qkv"][i * H:(i + 1) * H]
                    if "qkv_scale" in fused:
                        t[key + ".weight_scale"] = fused["qkv_scale"][i * H:(i + 1) * H]
                put_weight(md, stored, t, "o.weight", p + "attn.c_proj.weight", (H, H), conv1d=True)
                put_weight(md, stored, t, "up.weight", p + "mlp.c_fc.weight", (I, H), conv1d=True)
                put_weight(md, stored, t, "down.weight", p + "mlp.c_proj.weight", (H, I), conv1d=True)
                model.add_layer(t)
                del t, fused
                for name in names:
                    release_weight(md, name)
            head = {"norm.weight": md.tensor(prefix + "ln_f.weight", shape=(H,)),
                    "norm.bias": md.tensor(prefix + "ln_f.bias", shape=(H,))}
            if stored is not None or ("lm_head.weight" in md and not cfg["tie_word_embeddings"]):
                # (a converted directory always stores its head: a quantized copy when tied)
                put_weight(md, stored, head, "lm_head", "lm_head.weight", (V, H))
        else:
            embeddings = {"word_embeddings": md.tensor("model.embed_tokens.weight", shape=(V, H)),
                          "rope_inv_freq": rope_inv_freq(md.config, D)}
            word = embeddings["word_embeddings"]
            model = _core.DecoderModel(graph_cfg, embeddings)
            shapes = {"q_proj": (heads * D, H), "k_proj": (kv_heads * D, H), "v_proj": (kv_heads * D, H),
                      "o_proj": (H, heads * D)}
            for layer in range(cfg["num_layers"]):
                p = f"model.layers.{layer}."
                t: Dict[str, Any] = {}
                names = []
                for key, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
                    name = p + "self_attn." + proj
                    put_weight(md, stored, t, key + ".weight", name + ".weight", shapes[proj])
                    names.append(name + ".weight")
                    if name + ".bias" in md:
                        t[key + ".bias"] = md.tensor(name + ".bias", shape=shapes[proj][:1])
                for key, proj, shape in (("gate", "gate_proj", (I, H)), ("up", "up_proj", (I, H)),
                                         ("down", "down_proj", (H, I))):
                    name = p + "mlp." + proj
                    put_weight(md, stored, t, key + ".weight", name + ".weight", shape)
                    names.append(name + ".weight")
                    if name + ".bias" in md:
                        if key == "gate":
                            raise NotImplementedError("MLP biases (mlp_bias=true) are not supported")
                        t[key + ".bias"] = md.tensor(name + ".bias", shape=shape[:1])
                t["norm1.weight"] = md.tensor(p + "input_layernorm.weight", shape=(H,))
                t["norm2.weight"] = md.tensor(p + "post_attention_layernorm.weight", shape=(H,))
                if cfg["qk_norm"]:
                    t["q_norm.weight"] = md.tensor(p + "self_attn.q_norm.weight", shape=(D,))
                    t["k_norm.weight"] = md.tensor(p + "self_attn.k_norm.weight", shape=(D,))
                model.add_layer(t)
                del t
                for name in names:
                    release_weight(md, name)
            head = {"norm.weight": md.tensor("model.norm.weight", shape=(H,))}
            if stored is not None or ("lm_head.weight" in md and not cfg["tie_word_embeddings"]):
                # (a converted directory always stores its head: a quantized copy when tied)
                put_weight(md, stored, head, "lm_head", "lm_head.weight", (V, H))
            elif not cfg["tie_word_embeddings"]:
                raise ValueError(f"{md.path}: the checkpoint has no lm_head.weight and tie_word_embeddings is false")
        model.set_head(head)
        if "lm_head" in head:
            release_weight(md, "lm_head.weight")
        del word
        self._model = model

    def _defaults(self, md: ModelDir) -> None:
        # Type and int64 range are checked here (naming file and key); eos ids against the
        # vocabulary when generate() uses them (a call can pass its own eos_token_id), and a pad
        # id outside [0, vocab_size) means no pad token, as the C++ loop treats it.
        settings, self._eos_source = generation_setting(md, "eos_token_id")
        self.eos_token_ids = config_token_ids(settings, "eos_token_id", source=self._eos_source) or []
        settings, source = generation_setting(md, "pad_token_id")
        pad_list = config_token_ids(settings, "pad_token_id", source=source) or []
        self.pad_token_id = pad_list[0] if pad_list else (self.eos_token_ids[0] if self.eos_token_ids else 0)

    @property
    def vocab_size(self) -> int:
        return self.config["vocab_size"]

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    def close(self) -> None:
        """Frees the model and drops the weight maps; the object cannot be used afterwards."""
        self._model = None
        self._model_dir.close()

    def _live(self):
        if self._model is None:
            raise ValueError("this Generator is closed")
        return self._model

    # ---- forward ---------------------------------------------------------------------------

    def logits(self, input_ids: TokenIds, attention_mask: Optional[TokenIds] = None) -> np.ndarray:
        """Next-token logits at every position, float32 [B, T, V]. Positions follow the mask like
        Hugging Face's generate() (cumsum(mask) - 1), so a left-padded row gives the logits it
        gives alone; rows at padded positions carry no meaning."""
        model = self._live()
        ids = _as_2d(input_ids, "input_ids", vocab_size=self.vocab_size)
        mask = None if attention_mask is None else _as_2d(attention_mask, "attention_mask", allow_bool=True)
        return model.logits(ids, mask, self.num_threads)

    # ---- generation ------------------------------------------------------------------------

    def _get_tokenizer(self):
        if self._tokenizer is None:
            path = self._model_dir.tokenizer_path
            if path is None:
                raise ValueError(f"the prompt is a string, but {self._model_dir.path} has no tokenizer.json; "
                                 "pass token ids instead")
            self._tokenizer = load_tokenizer(path)
        return self._tokenizer

    def _prompts(self, prompts) -> Tuple[List[List[int]], str]:
        """(token-id lists, kind): kind "str" (one string), "strs" (a list of strings) or "ids"."""
        if isinstance(prompts, str):
            return [self._encode(prompts, 0)], "str"
        if isinstance(prompts, np.ndarray):
            if prompts.dtype.kind not in "iu":
                raise TypeError(f"{self._INPUT}s must hold integer token ids, got dtype {prompts.dtype}")
            if prompts.ndim == 1:
                prompts = [prompts]
            elif prompts.ndim != 2:
                raise ValueError(f"{self._INPUT}s must be 1-D or 2-D, got shape {list(prompts.shape)}")
            return [_ids(p, i, self._INPUT, self.vocab_size) for i, p in enumerate(prompts)], "ids"
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"{self._INPUT}s must be a string, a list of strings or token-id lists, got "
                            f"{type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError(f"{self._INPUT}s is empty: give at least one {self._INPUT}")
        if all(isinstance(p, str) for p in prompts):
            return [self._encode(p, i) for i, p in enumerate(prompts)], "strs"
        if not any(isinstance(p, (list, tuple, np.ndarray, str)) for p in prompts):
            return [_ids(prompts, 0, self._INPUT, self.vocab_size)], "ids"  # one prompt (a flat list)
        return [_ids(p, i, self._INPUT, self.vocab_size) for i, p in enumerate(prompts)], "ids"

    def _encode(self, text: str, index: int) -> List[int]:
        ids = self._get_tokenizer().encode(text).ids
        if not ids:
            raise ValueError(f"{self._INPUT} {index} is empty (it encodes to no tokens)")
        return list(ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._get_tokenizer().decode(list(ids), skip_special_tokens=True)

    def _options(self, max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p, repetition_penalty,
                 num_beams, length_penalty, early_stopping, eos_token_id, seed, return_log_probs) -> Dict[str, Any]:
        def number(name, value):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or \
                    not _fits_float(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            return float(value)

        # Integers are checked against the int64 fields they feed (_arguments.py).
        max_new_tokens = check_integer("max_new_tokens", max_new_tokens, 0)
        min_new_tokens = check_integer("min_new_tokens", min_new_tokens, 0)
        temperature = number("temperature", temperature)
        top_p = number("top_p", top_p)
        repetition_penalty = number("repetition_penalty", repetition_penalty)
        length_penalty = number("length_penalty", length_penalty)
        top_k = check_integer("top_k", top_k, 0, note=" (0 disables it)")
        num_beams = check_integer("num_beams", num_beams, 1)
        if do_sample and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        if do_sample and num_beams > 1:
            raise NotImplementedError("beam sampling (do_sample=True with num_beams > 1) is not supported")
        if early_stopping not in (False, True, "never"):
            raise ValueError(f"early_stopping must be False, True or 'never', got {early_stopping!r}")
        if eos_token_id is None:
            eos = list(self.eos_token_ids)
            for v in eos:
                if not 0 <= v < self.vocab_size:
                    raise ValueError(f"the default eos_token_id {v} (from {self._eos_source}) is out of range; "
                                     f"token ids must be in [0, {self.vocab_size}) (vocab_size); pass eos_token_id=")
        else:
            values = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
            eos = []
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise TypeError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
                if not 0 <= v < self.vocab_size:
                    raise ValueError(f"eos_token_id {v} is out of range; token ids must be in "
                                     f"[0, {self.vocab_size}) (vocab_size)")
                eos.append(int(v))
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be an integer in [0, 2**64) or None, got {seed!r}")
        return dict(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=bool(do_sample),
                    temperature=temperature if do_sample else 1.0, top_k=top_k if do_sample else 0,
                    top_p=top_p if do_sample else 1.0, repetition_penalty=repetition_penalty, num_beams=num_beams,
                    length_penalty=length_penalty,
                    early_stopping={False: 0, True: 1, "never": 2}[early_stopping], eos_token_ids=eos,
                    pad_token_id=int(self.pad_token_id), seed=int(seed), return_log_probs=bool(return_log_probs))

    def generate(self, prompts: Prompts, max_new_tokens: int = 20, min_new_tokens: int = 0, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, repetition_penalty: float = 1.0,
                 num_beams: int = 1, length_penalty: float = 1.0, early_stopping: Union[bool, str] = False,
                 eos_token_id: Union[None, int, Sequence[int]] = None, seed: Optional[int] = None,
                 return_log_probs: bool = False) -> Generated:
        """New tokens for each prompt (list[list[int]]; EOS included when produced).

        prompts: a list of token ids (one prompt), a list of token-id lists (a batch; left-padded
        internally, each stops on its own EOS), a string or a list of strings (needs
        tokenizer.json; the result is then a string or a list of strings). Greedy by default;
        do_sample with temperature / top_k / top_p (reproducible for a given seed); num_beams > 1
        is beam search as in transformers. eos_token_id defaults to generation_config.json, else
        config.json. return_log_probs=True returns (tokens, log_probs), the log-probability of each
        chosen token under the processed distribution (for beams: the step's beam score increment).
        """
        model = self._live()
        ids, kind = self._prompts(prompts)
        options = self._options(max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
                                repetition_penalty, num_beams, length_penalty, early_stopping, eos_token_id, seed,
                                return_log_probs)
        tokens, log_probs = model.generate(ids, options, None, self.num_threads)
        if kind == "str":
            out: Any = self._decode(tokens[0])
        elif kind == "strs":
            out = [self._decode(t) for t in tokens]
        else:
            out = tokens
        return (out, log_probs) if return_log_probs else out

    def stream(self, prompt: Prompts, **kwargs: Any) -> Iterator[Union[int, str]]:
        """Yields the new tokens of one prompt as they are produced (greedy or sampling; beam search
        yields the best sequence at the end). Given a string (and tokenizer.json), yields text
        pieces instead, each once it is final (one token behind), joining to generate()'s text.
        Takes generate()'s keyword arguments except return_log_probs. Closing or dropping the
        iterator stops the generation."""
        model = self._live()
        if "return_log_probs" in kwargs:
            raise TypeError("stream() does not return log-probabilities; use generate(return_log_probs=True)")
        ids, kind = self._prompts(prompt)
        if len(ids) != 1:
            raise ValueError(f"stream() takes one prompt, got {len(ids)}")
        defaults = dict(max_new_tokens=20, min_new_tokens=0, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
                        repetition_penalty=1.0, num_beams=1, length_penalty=1.0, early_stopping=False,
                        eos_token_id=None, seed=None)
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise TypeError(f"stream() got unexpected keyword arguments {sorted(unknown)}")
        defaults.update(kwargs)
        options = self._options(return_log_probs=False, **defaults)
        return self._stream(model, ids, options, kind == "str")

    def _stream(self, model, ids, options, text: bool) -> Iterator[Union[int, str]]:
        worker = _StreamWorker(model, ids, options, self.num_threads)
        try:
            if not text:
                for token in worker.tokens():
                    yield token
                return
            # A piece is yielded once it is final: text the decodes of the first n-1 and the first
            # n tokens agree on (a decoder may rewrite the end of its text when a token follows),
            # without a trailing U+FFFD (a byte-level token may end inside a UTF-8 sequence that the
            # next token completes). The rest is flushed from the decode of the whole sequence, so
            # the pieces join to generate()'s text.
            produced: List[int] = []
            emitted = previous = ""
            for token in worker.tokens():
                produced.append(token)
                decoded = self._decode(produced)
                final = os.path.commonprefix([previous, decoded]).rstrip("\ufffd")
                previous = decoded
                if len(final) > len(emitted) and final.startswith(emitted):
                    yield final[len(emitted):]
                    emitted = final
            text_of_all = self._decode(produced)
            rest = text_of_all[len(os.path.commonprefix([emitted, text_of_all])):]
            if rest:
                yield rest
        finally:
            # Reached on exhaustion, on close() or garbage collection of an abandoned iterator and
            # on an exception in the consumer (KeyboardInterrupt while waiting for a token): the
            # worker stops at its next token, so no generation keeps running (and holding compute
            # slots) behind our back.
            worker.stop()

    def _shape_text(self) -> str:
        c = self.config
        return (f"layers={c['num_layers']}, hidden={c['hidden_size']}, "
                f"heads={c['num_heads']}/{c['num_kv_heads']}")


class _StreamCancelled(Exception):
    """Raised inside stream()'s token callback to stop an abandoned generation."""


class _StreamWorker:
    """The thread that runs one stream()'s generation and hands its tokens to the consumer.

    The generation runs in native code with the GIL released and calls back into Python once per
    token. A daemon thread (so a half-consumed stream does not make the interpreter wait for the
    whole generation at exit), stopped by stop(): the next token callback raises, the native loop
    unwinds and the thread ends. Live workers are also stopped by an atexit hook, which runs while
    the interpreter is still whole; left running into finalization, the thread would be killed
    inside native code when its callback asks for the GIL (std::terminate, SIGABRT).
    """

    def __init__(self, model, ids, options, num_threads) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._failure: List[BaseException] = []
        self._cancelled = threading.Event()
        self._at_exit = False

        def on_token(_index: int, token: int) -> None:
            if self._cancelled.is_set():
                raise _StreamCancelled()  # unwinds the native loop; the thread then ends
            self._queue.put(token)

        def run() -> None:
            try:
                model.generate(ids, options, on_token, num_threads)
            except _StreamCancelled:
                pass
            except BaseException as error:  # handed to the consuming thread
                self._failure.append(error)
            finally:
                self._queue.put(_STREAM_DONE)

        self._thread = threading.Thread(target=run, name="cpuformer-stream", daemon=True)
        self._current_thread = threading.current_thread
        self._is_finalizing = sys.is_finalizing
        self._live = _LIVE_STREAMS
        self._live.add(self)
        self._thread.start()

    def tokens(self) -> Iterator[int]:
        while True:
            token = self._queue.get()
            if token is _STREAM_DONE:
                break
            yield token
        if self._failure:
            raise self._failure[0]
        if self._at_exit:
            raise RuntimeError("stream() was stopped because the interpreter is exiting")

    def stop(self, at_exit: bool = False) -> None:
        self._at_exit = self._at_exit or at_exit
        self._cancelled.set()
        # While the interpreter finalizes (a stream collected at the very end, when module globals
        # may already be cleared: hence the bound functions), the thread cannot run Python any more:
        # the native side parks it at its next token (bindings/gil.h), so a join would wait forever.
        if self._thread is not self._current_thread() and not self._is_finalizing():
            self._thread.join()
        self._live.discard(self)

    def orphan_after_fork(self) -> None:
        """In a child forked while this stream ran: its worker thread exists only in the parent, so
        the child's consumer would wait for tokens forever (and the queue's lock may have been held
        by that thread at fork time). A fresh queue ends the stream with a clear error instead."""
        self._queue = queue.Queue()
        self._failure[:] = [RuntimeError("this stream() was started before os.fork(): its generation runs in the "
                                         "parent process and cannot continue in the child; start a new stream "
                                         "in the child")]
        self._queue.put(_STREAM_DONE)
        self._live.discard(self)


_STREAM_DONE = object()
_LIVE_STREAMS: "set[_StreamWorker]" = set()


@atexit.register
def _stop_live_streams() -> None:
    for worker in list(_LIVE_STREAMS):
        worker.stop(at_exit=True)


def _orphan_live_streams() -> None:
    for worker in list(_LIVE_STREAMS):
        worker.orphan_after_fork()


os.register_at_fork(after_in_child=_orphan_live_streams)


def _fits_float(value) -> bool:
    """True for a finite number that converts to a finite float (an int beyond ~1.8e308 does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _ids(value, index: int, noun: str, vocab_size: int) -> List[int]:
    """Prompt (or source) ``index`` as a list of token ids in [0, vocab_size): checked here, so that
    no id beyond int64 reaches the C++ conversion."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{noun} {index} must be a 1-D sequence of token ids, got shape {list(value.shape)}")
        if value.dtype.kind not in "iu":
            raise TypeError(f"{noun} {index} must hold integer token ids, got dtype {value.dtype}")
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{noun} {index} must be a string or a list of token ids, got {type(value).__name__}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{noun} {index} must hold integer token ids, got {type(v).__name__} {v!r}")
    if len(value) == 0:
        raise ValueError(f"{noun} {index} is empty; every {noun} needs at least one token")
    ids = [int(v) for v in value]
    for v in ids:
        if not 0 <= v < vocab_size:
            raise token_id_range_error(f"{noun} token ids", v, vocab_size)
    return ids


def _as_2d(value, name: str, allow_bool: bool = False, vocab_size: Optional[int] = None) -> np.ndarray:
    """int64 [batch, seq_len] (a 1-D sequence becomes one row); vocab_size words a value beyond
    int64 as an out-of-range token id (the range itself is checked in C++)."""
    array = integer_array(value, name, vocab_size=vocab_size, allow_bool=allow_bool)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"{name} must have 2 dimensions [batch, seq_len], got shape {list(array.shape)}")
    return array


__all__ = ["Generator", "rope_inv_freq"]
