"""Every registered architecture family against transformers, driven by the registry.

``PARITY`` holds one tiny random checkpoint per family (``cpuformer.arch.ARCHS``); registering a
family without a row here fails ``test_every_family_has_a_parity_row``. Each row is built with
transformers, saved as a Hugging Face directory, loaded with ``cpuformer.load`` (which also
checks that every checkpoint tensor is accounted for) and compared: float32 outputs within 1e-4
of transformers' (relative to the output's scale), greedy and beam tokens identical; and each
family also loads in int8 and int4, with int4's error the size 4-bit weights give.
"""

from __future__ import annotations

import numpy as np
import pytest

import cpuformer as cf
from cpuformer.arch import ARCHS, by_family

from ._hf import assert_close, cosine_rows, save_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_BART = dict(d_model=48, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=67, decoder_ffn_dim=67, max_position_embeddings=64, init_std=0.1)
_T5 = dict(d_model=48, d_kv=12, d_ff=53, num_layers=2, num_heads=4, decoder_start_token_id=0,
           relative_attention_num_buckets=16, relative_attention_max_distance=20)
_LLAMA = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=45, max_position_embeddings=64, initializer_range=0.2)

_VISION = dict(hidden_size=40, num_hidden_layers=2, num_attention_heads=4, intermediate_size=51, image_size=32,
               patch_size=8, initializer_range=0.2)

#: family -> (transformers model class, config class, config keyword arguments)
PARITY = {
    "bert": ("BertModel", "BertConfig", dict(vocab_size=99, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=61, max_position_embeddings=40, type_vocab_size=3)),
    "roberta": ("RobertaModel", "RobertaConfig",
                dict(vocab_size=89, hidden_size=40, num_hidden_layers=2, num_attention_heads=5, intermediate_size=37,
                     max_position_embeddings=42, type_vocab_size=1, pad_token_id=1)),
    "xlm-roberta": ("XLMRobertaForSequenceClassification", "XLMRobertaConfig",
                    dict(vocab_size=83, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=41, max_position_embeddings=38, type_vocab_size=1, pad_token_id=1)),
    "distilbert": ("DistilBertModel", "DistilBertConfig",
                   dict(vocab_size=91, dim=48, n_layers=2, n_heads=4, hidden_dim=67, max_position_embeddings=40)),
    # Three heads of 15: neither the hidden size nor the head size is a multiple of 16.
    "mpnet": ("MPNetModel", "MPNetConfig",
              dict(vocab_size=87, hidden_size=45, num_hidden_layers=2, num_attention_heads=3, intermediate_size=53,
                   max_position_embeddings=44, initializer_range=0.2)),
    # Four layers sharing two groups' weights (0, 0, 1, 1), tables of 20 projected to 36.
    "albert": ("AlbertModel", "AlbertConfig",
               dict(vocab_size=91, embedding_size=20, hidden_size=36, num_hidden_layers=4, num_hidden_groups=2,
                    num_attention_heads=3, intermediate_size=41, max_position_embeddings=40, type_vocab_size=2,
                    initializer_range=0.2)),
    # Embedding tables narrower than the hidden size: embeddings_project maps 24 -> 40.
    "electra": ("ElectraModel", "ElectraConfig",
                dict(vocab_size=95, embedding_size=24, hidden_size=40, num_hidden_layers=2, num_attention_heads=5,
                     intermediate_size=37, max_position_embeddings=40, type_vocab_size=3)),
    # Global, local, global layers (global_attn_every_n_layers=2) with a window of |i - j| <= 2,
    # shorter than the sequences, and RoPE thetas small enough to matter over 9 positions.
    "modernbert": ("ModernBertModel", "ModernBertConfig",
                   dict(vocab_size=97, hidden_size=60, num_hidden_layers=3, num_attention_heads=5,
                        intermediate_size=37, max_position_embeddings=64, global_attn_every_n_layers=2,
                        local_attention=4, global_rope_theta=1000.0, local_rope_theta=50.0, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, initializer_range=0.2)),
    # Disentangled attention with 8 log buckets (relative positions up to 4 exact, then bucketed up
    # to max_relative_positions 20): the 9-token inputs reach the bucketed distances.
    "deberta-v2": ("DebertaV2ForSequenceClassification", "DebertaV2Config",
                   dict(vocab_size=93, hidden_size=45, num_hidden_layers=2, num_attention_heads=5, intermediate_size=39,
                        max_position_embeddings=48, relative_attention=True, position_buckets=8,
                        max_relative_positions=20, pos_att_type="p2c|c2p", share_att_key=True,
                        norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
                        initializer_range=0.3)),
    # Transformer-XL relative attention: three heads of 12 (hidden 36), distances clamped to ±5,
    # shorter than the 9-token inputs.
    "xlnet": ("XLNetModel", "XLNetConfig",
              dict(vocab_size=91, d_model=36, n_layer=2, n_head=3, d_inner=41, clamp_len=5, initializer_range=0.3)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=101, n_embd=48, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2,
                  bos_token_id=1, eos_token_id=2)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", _LLAMA),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(_LLAMA, sliding_window=6)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", _LLAMA),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(_LLAMA, head_dim=24)),
    # Multi-query attention and a head_dim that is not hidden_size / num_attention_heads (64 / 4).
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(_LLAMA, num_key_value_heads=1, head_dim=20)),
    # GQA: the query block of the fused qkv_proj is twice the key and value blocks.
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(_LLAMA, sliding_window=6, pad_token_id=0, eos_token_id=2)),
    "marian": ("MarianMTModel", "MarianConfig",
               dict(vocab_size=101, pad_token_id=100, decoder_start_token_id=100, eos_token_id=0, **_BART)),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(vocab_size=97, **_BART)),
    "mbart": ("MBartForConditionalGeneration", "MBartConfig", dict(vocab_size=103, scale_embedding=True, **_BART)),
    # NLLB's shape scaled down (pre-norm, relu, scaled embeddings, fairseq positions from row pad + 1)
    # with a pad id of 5, so rows read from the wrong offset change every output.
    "m2m100": ("M2M100ForConditionalGeneration", "M2M100Config",
               dict(vocab_size=107, pad_token_id=5, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                    **dict(_BART, init_std=0.2))),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=99, **_T5)),
    "mt5": ("MT5ForConditionalGeneration", "MT5Config", dict(vocab_size=93, feed_forward_proj="gated-gelu", **_T5)),
    # Image models (kind "vision", tests/models/test_vit.py has the rest): patch 8 on 40x24 images.
    "vit": ("ViTModel", "ViTConfig", dict(_VISION, image_size=[40, 24])),
    "deit": ("DeiTForImageClassificationWithTeacher", "DeiTConfig", dict(_VISION, num_labels=3)),
    # Swin (tests/test_swin.py has the rest): 40x24 images, patch 4, window 3 (shifted in the first
    # stage, 10x6; the second, 5x3, is one window).
    "swin": ("SwinForImageClassification", "SwinConfig",
             dict(image_size=[40, 24], patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=3,
                  num_labels=3, initializer_range=0.2)),
}

NEW_TOKENS = 6


def test_every_family_has_a_parity_row():
    # (CLIP, two towers and no logits of this shape, has its own parity tests: tests/models/test_clip.py)
    registered = {arch.family for arch in ARCHS if arch.kind != "clip"}
    assert sorted(registered - set(PARITY)) == [], "registered families without a parity row"
    assert sorted(set(PARITY) - registered) == [], "parity rows for families that are not registered"
    for family, (model_class, _, _) in PARITY.items():
        assert by_family()[family].claims(model_class), f"{family} does not claim {model_class}"


#: Each family's random seed: its position here. A new family is appended, so that adding one
#: does not change the weights (and the near-ties other tests check for) of the others.
SEED_ORDER = ("albert", "bart", "bert", "deberta-v2", "distilbert", "electra", "gemma", "gpt2", "llama", "marian",
              "mbart", "mistral", "modernbert", "mpnet", "mt5", "phi3", "qwen2", "qwen3", "roberta", "t5",
              "xlm-roberta", "xlnet", "m2m100", "vit", "deit", "swin")


def _build(family, directory):
    model_class, config_class, kwargs = PARITY[family]
    assert family in SEED_ORDER, f"append {family!r} to SEED_ORDER"
    return save_random_model(directory, getattr(transformers, model_class),
                             getattr(transformers, config_class)(**kwargs), SEED_ORDER.index(family),
                             prepare=_noise_final_logits_bias)


def _noise_final_logits_bias(model):
    buffers = dict(model.named_buffers())  # a buffer, not a parameter: zeros unless set here
    if "final_logits_bias" in buffers:
        buffers["final_logits_bias"].normal_(0.0, 1.0)


def _forward(model, ids, mask, target):
    """Hidden states (encoders) or logits of the first row, the same inputs for every dtype."""
    if model.hparams.kind == "encoder":
        return model(ids, mask)[0]
    if model.hparams.kind == "decoder":
        return model.logits(ids[:1])[0]
    return model.logits(ids, target, mask)[0]


#: int4's distance to float32 (1 − the lowest per-position cosine) against int8's on the same
#: checkpoint. These tiny random checkpoints (init std up to 0.2) amplify any weight error layer by
#: layer, so both distances vary by family; 4-bit steps are ~17× int8's, and the ratio measured
#: 16-155× across the families. A family whose int4 path were wrong (a scale, a padded group, a
#: projection packed in the wrong format) would be near cosine 0, far outside.
INT4_OVER_INT8 = 400


def _vision_parity(hf, model, directory):
    """Image models: hidden states on random pixel values (and the logits of a classifier)."""
    height, width = model.image_size
    pixels = np.random.default_rng(0).standard_normal((2, 3, height, width)).astype(np.float32)
    ref = model(pixels)
    distance = {dtype: 1.0 - cosine_rows(cf.load(directory, dtype=dtype)(pixels), ref).min()
                for dtype in ("int8", "int4")}
    assert distance["int4"] <= max(INT4_OVER_INT8 * distance["int8"], 0.01), distance
    assert distance["int4"] > distance["int8"], distance
    with torch.no_grad():
        out = hf(pixel_values=torch.tensor(pixels))
    base = getattr(hf, hf.base_model_prefix, hf)
    with torch.no_grad():
        assert_close(ref, base(pixel_values=torch.tensor(pixels)).last_hidden_state.numpy())
    if isinstance(model, cf.ImageClassifier):
        assert_close(model.logits(pixels), out.logits.numpy())


@pytest.mark.parametrize("family", sorted(PARITY))
def test_parity_with_transformers(family, tmp_path):
    hf = _build(family, tmp_path)
    model = cf.load(tmp_path)
    assert model.family == family
    if by_family()[family].kind == "vision":
        return _vision_parity(hf, model, tmp_path)
    rng = np.random.default_rng(0)
    vocab = model.config["vocab_size"]
    ids = rng.integers(3, vocab - 2, size=(2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0  # the second row is shorter (right-padded)
    # Every family runs in int4; its error is the size 4-bit weights give (docs/precision.md has
    # the bounds on realistic shapes).
    target = rng.integers(3, vocab - 2, size=(2, 5))
    ref = _forward(model, ids, mask, target)
    distance = {dtype: 1.0 - cosine_rows(_forward(cf.load(tmp_path, dtype=dtype), ids, mask, target), ref).min()
                for dtype in ("int8", "int4")}
    assert distance["int4"] <= max(INT4_OVER_INT8 * distance["int8"], 0.01), distance
    assert distance["int4"] > distance["int8"], distance  # really 4 bits
    rng = np.random.default_rng(0)  # the parity inputs below as before
    ids = rng.integers(3, vocab - 2, size=(2, 9))
    with torch.no_grad():
        if model.hparams.kind == "encoder":
            base = getattr(hf, hf.base_model_prefix, hf)
            ref = base(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
            ours = model(ids, mask)
            assert_close(ours[0], ref[0])
            assert_close(ours[1, :6], ref[1, :6])
            return
        if model.hparams.kind == "decoder":
            assert_close(model.logits(ids[:1]), hf(input_ids=torch.tensor(ids[:1])).logits.numpy())
            prompt = torch.tensor(ids[:1])
            for beams in (1, 3):
                ref = hf.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                  num_beams=beams, pad_token_id=0)[0, ids.shape[1]:].tolist()
                ours = model.generate(ids[0].tolist(), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                      num_beams=beams)[0]
                assert ours == ref, f"num_beams={beams}"
            return
        target = rng.integers(3, vocab - 2, size=(2, 5))
        ref = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 decoder_input_ids=torch.tensor(target)).logits.numpy()
        assert_close(model.logits(ids, target, mask), ref)
        source = torch.tensor(ids[:1])
        for beams in (1, 3):
            ref = hf.generate(source, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                              num_beams=beams)[0, 1:].tolist()
            ours = model.generate(ids[0].tolist(), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  num_beams=beams)[0]
            assert ours == ref, f"num_beams={beams}"


def _generation_defaults(model):
    """The options dict a plain ``generate(ids)`` passes to the C++ model (greedy, 20 new tokens,
    the model's eos / pad / start tokens, forced tokens and banned words); seed 0."""
    from cpuformer.models.generator import Generator, penalty_options, sequence_options
    from cpuformer.models.seq2seq import Seq2Seq

    common = dict(max_new_tokens=20, min_new_tokens=0, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
                  repetition_penalty=1.0, num_beams=1, length_penalty=1.0, early_stopping=False, eos_token_id=[],
                  seed=0, return_log_probs=False)
    if isinstance(model, Seq2Seq):
        options = model._options(1, 0, None, **common)
        options["kv_cache_dtype"] = 0
    else:
        assert isinstance(model, Generator)
        options = model._options(*common.values())
        sequence_options(options, 1, 0)
        penalty_options(options, model.vocab_size, 0.0, 0.0, None)
        model._add_options(options, None, None)
    options["eos_token_ids"] = [int(v) for v in model.eos_token_ids]
    return options


def _python_settings(directory, dtype):
    """What the Python model classes take from a plain directory's config files (the model config
    with the dtype's default weight format, the generation defaults a plain generate() passes): the
    C++ registry's manifest must state the same."""
    from cpuformer._model_dir import ModelDir
    from cpuformer.arch import find
    from cpuformer.models import CLASSES
    from cpuformer.weights import check_quantization, graph_format

    md = ModelDir(directory)
    try:
        arch, _ = find(md.config)
        model = CLASSES[arch.kind]._unbuilt(md, arch.kind)
        settings = check_quantization(None, dtype)
        manifest = {"format_version": 1, "kind": arch.kind, "architecture": model.architecture,
                    "config": dict(model.config, **graph_format(dtype, settings))}
        if arch.kind != "encoder":
            manifest["generation"] = _generation_defaults(model)
        return manifest
    finally:
        md.close()


#: The families the C++ registry declares: the C API opens their plain directories
#: (csrc/models/arch/checkpoint.h) and must read them exactly as the Python loader does.
NATIVE_FAMILIES = sorted(arch.family for arch in ARCHS if type(arch).__name__ == "NativeArch")


@pytest.mark.parametrize("family", NATIVE_FAMILIES)
def test_cpp_reads_a_plain_directory_as_python_does(family, tmp_path):
    from cpuformer import _core

    _build(family, tmp_path)
    for dtype in ("float32", "int4"):
        manifest = _core.graph_manifest(str(tmp_path), dtype)
        tensors = manifest.pop("tensors")
        assert manifest == _python_settings(tmp_path, dtype), (family, dtype)
    assert _core.graph_manifest(str(tmp_path))["config"] == _python_settings(tmp_path, "float32")["config"]
    # The Python loader reads the tensors the C API's manifest names: one plan, _core.checkpoint_tensors.
    from cpuformer._model_dir import ModelDir
    from cpuformer.arch import find
    from cpuformer.weights import Checkpoint

    def plain(entries):
        if isinstance(entries, list):
            return [plain(e) for e in entries]
        if "shape" not in entries:
            return {key: plain(e) for key, e in entries.items()}
        return dict(entries, values=np.asarray(entries["values"], np.float32).ravel().tolist()) \
            if "values" in entries else entries

    md = ModelDir(tmp_path)
    try:
        arch, _ = find(md.config)
        checkpoint = Checkpoint(md, arch, arch.hparams(md.config), None)
        assert plain(checkpoint.entries) == plain(tensors)
    finally:
        md.close()
