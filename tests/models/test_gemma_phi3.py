"""What the Gemma and Phi-3 specs promise beyond their parity rows (tests/models/test_registry.py)
and their dtype rows (tests/models/test_quantized.py): Gemma's load-time edits are transformers'
arithmetic bit for bit, a converted Phi-3 keeps its fused tensors whole, and the configurations
cpuformer cannot run are refused with a message naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer._model_dir import ModelDir, save_safetensors
from cpuformer.arch import by_family
from cpuformer.weights import Checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _save(directory, model_class, config_class, seed, **config):
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model


def test_gemma_edits_match_transformers_bit_for_bit(tmp_path):
    # hidden_size 40: √40 is not a float32, so the embedding scale is a rounded value.
    hf = _save(tmp_path, "GemmaForCausalLM", "GemmaConfig", 0, vocab_size=61, hidden_size=40, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=24)
    with torch.no_grad():
        for parameter in hf.parameters():
            if parameter.dim() == 1:  # norms are initialised to zero: give 1 + w values that round
                parameter.normal_(0.0, 0.3)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = cf.load(tmp_path)
    scale = hf.model.embed_tokens.embed_scale
    assert scale.dtype == torch.float32 and model.hparams.embed_scale == scale.item() != 40 ** 0.5
    arch = by_family()["gemma"]
    with ModelDir(tmp_path) as md:
        checkpoint = Checkpoint(md, arch, arch.hparams(md.config), None)
        layer, _ = checkpoint.read(checkpoint.layer_sources("decoder", 0))
        stack, _ = checkpoint.read(checkpoint.stack_sources("decoder"))
        block = hf.model.layers[0]
        norms = {"attn_norm": block.input_layernorm, "ffn_norm": block.post_attention_layernorm}
        for name, module in norms.items():
            # GemmaRMSNorm: normalized(x) * (1.0 + weight.float()), in float32.
            np.testing.assert_array_equal(layer[name], (1.0 + module.weight.detach().float()).numpy())
        np.testing.assert_array_equal(stack["final_norm"], (1.0 + hf.model.norm.weight.detach().float()).numpy())


def test_phi3_converted_directory_keeps_fused_tensors(tmp_path):
    H, heads, kv_heads, inner = 32, 4, 2, 24
    _save(tmp_path / "src", "Phi3ForCausalLM", "Phi3Config", 1, vocab_size=53, hidden_size=H, num_hidden_layers=1,
          num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inner, pad_token_id=0,
          eos_token_id=2)
    cf.convert(tmp_path / "src", tmp_path / "int8", "int8", progress=False)
    D = H // heads
    with ModelDir(tmp_path / "int8") as md:
        # Per-row scales: the row blocks of the quantized fused tensor are the quantized blocks.
        qkv = "model.layers.0.self_attn.qkv_proj.weight"
        assert md.tensor_info(qkv) == ("I8", ((heads + 2 * kv_heads) * D, H))
        assert md.tensor_info(qkv + "_scale") == ("F32", ((heads + 2 * kv_heads) * D,))
        assert md.tensor_info("model.layers.0.mlp.gate_up_proj.weight") == ("I8", (2 * inner, H))
    ids = np.arange(3, 19).reshape(2, 8)
    np.testing.assert_array_equal(cf.load(tmp_path / "int8").logits(ids),
                                  cf.load(tmp_path / "src", dtype="int8").logits(ids))


_GEMMA = dict(architectures=["GemmaForCausalLM"], model_type="gemma", vocab_size=50, hidden_size=32,
              num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=8, intermediate_size=16,
              hidden_act="gelu_pytorch_tanh")
_PHI3 = dict(architectures=["Phi3ForCausalLM"], model_type="phi3", vocab_size=50, hidden_size=32,
             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=16,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0})
_LONG = {"short_factor": [1.0] * 4, "long_factor": [1.0] * 4, "original_max_position_embeddings": 4096}


@pytest.mark.parametrize("base, change, error, message", [
    (_GEMMA, dict(hidden_act="relu"), ValueError,
     r"config.json: hidden_act 'relu' is not supported by Gemma; use one of "
     r"\['gelu', 'gelu_new', 'gelu_pytorch_tanh'\]"),
    (_GEMMA, dict(hidden_act="gelu", hidden_activation="gelu"), ValueError,
     r"config.json: hidden_activation 'gelu' is not supported by Gemma; use one of "
     r"\['gelu_new', 'gelu_pytorch_tanh'\]"),
    (_GEMMA, dict(use_bidirectional_attention=True), NotImplementedError,
     "config.json: use_bidirectional_attention=true .* is not supported"),
    (_GEMMA, dict(head_dim=7), ValueError, "config.json: RoPE needs an even head_dim, got 7"),
    (_GEMMA, dict(num_key_value_heads=3), ValueError,
     "config.json: num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    (_PHI3, dict(rope_parameters=None, rope_scaling=dict(type="su", **_LONG)), NotImplementedError,
     r"config.json: rope_scaling type 'su' \(Phi-3's long-context RoPE .*\) is not supported"),
    (_PHI3, dict(rope_parameters=dict(rope_type="longrope", rope_theta=1e4, **_LONG)), NotImplementedError,
     "config.json: rope_parameters type 'longrope' .* is not supported"),
    (_PHI3, dict(rope_parameters=None, rope_scaling=dict(rope_type="yarn", factor=2.0)), NotImplementedError,
     "config.json: rope_scaling type 'yarn'"),
    (_PHI3, dict(rope_parameters=dict(rope_type="linear", factor=2.0)), ValueError,
     "config.json: rope_parameters type 'linear' is not a Phi-3 RoPE type; use 'default'"),
    (_PHI3, dict(rope_parameters=dict(rope_type="default", partial_rotary_factor=0.75)), NotImplementedError,
     r"config.json: partial_rotary_factor 0.75 \(RoPE on part of each head\) is not supported"),
    (_PHI3, dict(partial_rotary_factor=0.5, rope_parameters=None), NotImplementedError,
     "config.json: partial_rotary_factor 0.5"),
    (_PHI3, dict(hidden_act="gelu"), ValueError, "config.json: hidden_act 'gelu' is not supported"),
])
def test_unsupported_configs_are_refused(tmp_path, base, change, error, message):
    config = {k: v for k, v in dict(base, **change).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": np.zeros((50, 32), np.float32)})
    with pytest.raises(error, match=message):
        cf.load(tmp_path)


@pytest.mark.parametrize("base, change", [
    (_GEMMA, dict(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh")),  # the official releases' keys
    (_GEMMA, dict(hidden_act=None, head_dim=None)),  # GemmaConfig's defaults: tanh GELU, head_dim 256
    (_PHI3, dict(rope_parameters=None, rope_scaling=None, sliding_window=2047)),  # Phi-3-mini-4k
])
def test_supported_config_variants(base, change):
    config = {k: v for k, v in dict(base, **change).items() if v is not None}
    arch = by_family()[base["model_type"]]
    hp = arch.hparams(config)
    if arch.family == "gemma":
        assert hp.activation == "gelu_tanh" and hp.head_dim == (256 if "head_dim" not in config else 8)
    else:
        assert hp.sliding_window == 2047 and hp.head_dim == 8 and not hp.tie_word_embeddings
