"""Sizes and limits: requests whose buffers cannot be allocated, and the kernels' documented limits.

Every size made from user or config input is computed with checked arithmetic
(csrc/runtime/checked_size.h): a product that would wrap, or a buffer larger than the process can
allocate, is a ValueError naming the argument instead of a small allocation that decoding writes
past. The hostile calls run in a child process, so a crash shows up as a failed test rather than
taking pytest down. Rules: docs/reliability.md, "Limits".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cpuformer as cf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T5_SIZES = dict(vocab_size=99, d_model=40, d_kv=12, d_ff=65, num_layers=2, num_heads=4, decoder_start_token_id=0,
                eos_token_id=1, pad_token_id=0, relative_attention_num_buckets=16, relative_attention_max_distance=20)
T5_KV_BYTES_PER_POSITION = 2 * 2 * 4 * 12 * 4  # (k, v) × layers × heads × d_kv × float32, per row

# The child runs each call (a statement) and prints one JSON line per call: [name, exception type or None, message].
CHILD = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import cpuformer as cf
    from cpuformer import _core

    model = cf.load(sys.argv[1])
    for name, expression in json.loads(sys.argv[2]).items():
        try:
            exec(expression)
            outcome = [name, None, None]
        except Exception as error:
            outcome = [name, type(error).__name__, str(error)]
        print(json.dumps(outcome), flush=True)
""")


def run_child(directory, calls):
    """{name: (exception type name or None, message)} of each call, made in a child process on
    the model loaded from `directory` (available as `model`)."""
    child = subprocess.run([sys.executable, "-c", CHILD, str(directory), json.dumps(calls)], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, f"the child died (exit {child.returncode}): {child.stderr[-3000:]}"
    outcomes = {name: (kind, message) for name, kind, message in map(json.loads, child.stdout.splitlines())}
    assert set(outcomes) == set(calls), child.stderr[-3000:]
    return outcomes


def assert_value_error(outcome, *fragments):
    kind, message = outcome
    assert kind == "ValueError", outcome
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def _save_tokenizer(directory, vocab_size):
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    tokenizer = Tokenizer(tok_models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t3"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    """A tiny T5: relative positions, so no position table bounds max_new_tokens."""
    directory = tmp_path_factory.mktemp("limits_t5")
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**T5_SIZES)).eval()
    model.save_pretrained(directory)
    _save_tokenizer(directory, T5_SIZES["vocab_size"])
    return str(directory)


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    directory = tmp_path_factory.mktemp("limits_bart")
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=53, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                                     decoder_ffn_dim=24, max_position_embeddings=32)
    transformers.BartForConditionalGeneration(config).eval().save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama with a long position range (RoPE): a large max_new_tokens is allowed."""
    directory = tmp_path_factory.mktemp("limits_llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1 << 18,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    return str(directory)


# ---- generation lengths and batch sizes ---------------------------------------------------------

def test_t5_huge_max_new_tokens_is_a_value_error(t5):
    outcomes = run_child(t5, {
        "2**62": "model.generate([[5, 6, 7]], max_new_tokens=2**62)",
        "2**40": "model.generate([[5, 6, 7]], max_new_tokens=2**40)",
        "2**31": "model.generate([[5, 6, 7]], max_new_tokens=2**31)",
        "2**63-1": "model.generate([[5, 6, 7]], max_new_tokens=2**63 - 1)",
        "2**62 beams": "model.generate([[5, 6, 7]], max_new_tokens=2**62, num_beams=3)",
        "2**30 x 8 inputs": "model.generate([[5, 6, 7]] * 8, max_new_tokens=2**30)",
        "usable after": "assert model.generate([[5, 6, 7]], max_new_tokens=3) == "
                        "model.generate([[5, 6, 7]], max_new_tokens=3)",
    })
    for n in ("2**62", "2**40", "2**31"):
        assert_value_error(outcomes[n], f"max_new_tokens {eval(n)} (with num_beams 1 and 1 input of up to 3 tokens) "
                                        "is too large: the KV cache length of",
                           "exceeds the 2147483647 keys (2^31 - 1) the attention kernel supports")
    assert_value_error(outcomes["2**63-1"], f"max_new_tokens {2**63 - 1} ", "1 decoder start token + max_new_tokens",
                       "overflows a 64-bit size")
    assert_value_error(outcomes["2**62 beams"], f"max_new_tokens {2**62} (with num_beams 3", "is too large")
    # Within the attention limit but not within memory: the message gives the exact byte count.
    needed = T5_KV_BYTES_PER_POSITION * 8 * (2**30 + 1)
    assert_value_error(outcomes["2**30 x 8 inputs"], f"max_new_tokens {2**30} (with num_beams 1 and 8 inputs",
                       f"the KV cache (keys and values) [2 × 2 × 8 × 4 × {2**30 + 1} × 12] would need {needed} bytes",
                       "this process can allocate")
    assert outcomes["usable after"] == (None, None)


def test_huge_num_beams_times_batch_is_a_value_error(t5):
    outcomes = run_child(t5, {
        "2**40 x 2": "model.generate([[5, 6, 7], [8, 9]], max_new_tokens=4, num_beams=2**40)",
        "2**62 x 4": "model.generate([[5, 6, 7]] * 4, max_new_tokens=4, num_beams=2**62)",
        "2**20 x 2, long": "model.generate([[5, 6, 7], [8, 9]], max_new_tokens=2**20, num_beams=2**20)",
    })
    assert_value_error(outcomes["2**40 x 2"], f"num_beams {2**40} × 2 inputs is too large: the logits "
                                              f"[{2**41} × 99] would need", "this process can allocate")
    assert_value_error(outcomes["2**62 x 4"], f"num_beams {2**62} × 4 inputs is too large",
                       f"[4 × {2**62}] overflows a 64-bit size")
    # The KV cache is sized before the beams' own buffers (2^21 rows of logits and candidates, which
    # would fit): the refusal comes at once, before gigabytes are allocated for nothing.
    assert_value_error(outcomes["2**20 x 2, long"], f"max_new_tokens {2**20} (with num_beams {2**20} and 2 inputs",
                       "the KV cache (keys and values)", "this process can allocate")


def test_position_limited_models_refuse_max_new_tokens_near_int64(bart, tmp_path):
    """BART and GPT-2 check prompt + max_new_tokens against their position table; the sum itself
    must not wrap around."""
    outcomes = run_child(bart, {
        "2**63-1": "model.generate([[5, 6, 7]], max_new_tokens=2**63 - 1)",
        "2**62": "model.generate([[5, 6, 7]], max_new_tokens=2**62)",
    })
    for n in ("2**63-1", "2**62"):
        assert_value_error(outcomes[n], f"max_new_tokens {eval(n)} exceeds the model's maximum of 32 target tokens")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Config(vocab_size=61, n_embd=16, n_layer=1, n_head=2, n_positions=32, eos_token_id=2)
    transformers.GPT2LMHeadModel(gpt2).eval().save_pretrained(tmp_path)
    outcomes = run_child(tmp_path, {"2**63-1": "model.generate([[5, 6, 7]], max_new_tokens=2**63 - 1)"})
    assert_value_error(outcomes["2**63-1"], f"prompt length 3 + max_new_tokens {2**63 - 1} exceeds the model's "
                                            "maximum of 32 tokens")


def test_large_allowed_max_new_tokens_still_decodes(llama):
    """A budget of 2^18 - 3 new tokens sizes a (lazily mapped) KV cache for all of them; the run
    stops at EOS after one token and matches a short run."""
    model = cf.Generator(llama)
    first = model.generate([[5, 6, 7]], max_new_tokens=1)[0][0]
    assert model.generate([[5, 6, 7]], max_new_tokens=(1 << 18) - 3, eos_token_id=first) == [[first]]
    with pytest.raises(ValueError, match=r"prompt length 3 \+ max_new_tokens 262142 exceeds the model's maximum"):
        model.generate([[5, 6, 7]], max_new_tokens=(1 << 18) - 2)


def test_t5_source_too_long_for_its_attention_bias(t5):
    """T5 has no position table either: a long source's [heads, T, T] relative bias cannot be
    allocated (before: std::bad_alloc, a MemoryError)."""
    outcomes = run_child(t5, {
        "encode": "model.encode(np.full((1, 1 << 18), 5, dtype=np.int64))",
        "logits": "model.logits(np.full((1, 1 << 18), 5, dtype=np.int64), [[0]])",
        "generate": "model.generate([[5] * (1 << 18)], max_new_tokens=2)",
    })
    assert_value_error(outcomes["generate"], "1 input of up to 262144 tokens (with num_beams 1) is too large: "
                                             "a scratch buffer", "this process can allocate")
    for name in ("encode", "logits"):
        assert_value_error(outcomes[name], "input_ids of shape [1, 262144]", "is too large: a scratch buffer",
                           "this process can allocate")


def test_translate_cli_huge_max_new_tokens_is_a_user_error(t5):
    out = subprocess.run([sys.executable, "-m", "cpuformer", "translate", t5, "t5 t6 t7", "--max-new-tokens",
                          str(2**62)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith("cpuformer translate: error: ") and f"max_new_tokens {2**62}" in lines[0], lines[0]


# ---- kernel limits ------------------------------------------------------------------------------

def test_int8_linear_input_features_limit():
    """The int8 GEMM's int32 sums are exact up to K = 2^17 (the extreme case 127 · 127 · 2^17 still
    fits); one more input feature is refused rather than wrapping around."""
    k = 1 << 17
    ones = np.ones((1, k), np.float32)
    np.testing.assert_array_equal(cf.ops.Linear(ones, dtype="int8")(ones), [[float(k)]])
    np.testing.assert_array_equal(cf.ops.Linear(-ones, dtype="int8")(ones), [[-float(k)]])
    wide = np.ones((1, k + 1), np.float32)
    with pytest.raises(ValueError, match=r"w has K = 131073 input features; dtype 'int8' supports at most 131072 "
                                         r"\(2\^17"):
        cf.ops.Linear(wide, dtype="int8")
    np.testing.assert_array_equal(cf.ops.Linear(wide)(wide), [[float(k + 1)]])  # float32 has no such limit


def test_int8_model_with_too_wide_intermediate_is_refused_at_load(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=61, n_embd=4, n_layer=1, n_head=1, n_positions=8,
                                     n_inner=(1 << 17) + 1, eos_token_id=2)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"intermediate_size 131073 is too large for int8 weights: the int8 GEMM "
                                         r"sums at most 131072 \(2\^17\) products"):
        cf.load(tmp_path, dtype="int8")
    assert cf.load(tmp_path).logits([[5, 6]]).shape == (1, 2, 61)  # float32 loads


def test_attention_key_count_limit(t5):
    """2^31 keys as a zero-stride view (no memory behind it): refused before anything is copied or
    computed, by ops.attention and by the kernel's view hook (before: a segmentation fault)."""
    setup = ("q = np.zeros((1, 1, 1, 4), np.float32); "
             "keys = np.broadcast_to(np.zeros((1, 1, 1, 4), np.float32), (1, 1, 2**31, 4)); ")
    outcomes = run_child(t5, {
        "ops.attention": setup + "cf.ops.attention(q, keys, keys)",
        "views": setup + "_core._attention_views(q, keys, keys, np.zeros_like(q), False, 0, 0, None, 1.0)",
    })
    for name in outcomes:
        assert_value_error(outcomes[name],
                           "k has 2147483648 keys (Tk); attention supports at most 2147483647 (2^31 - 1)")


def test_output_too_large_names_the_argument():
    """ops.Linear's output [M, N] is sized from x and w: too large is a ValueError, not MemoryError."""
    x = np.ones((1 << 22, 1), np.float32)  # 4 M rows of one feature
    linear = cf.ops.Linear(np.ones((1 << 22, 1), np.float32))
    with pytest.raises(ValueError, match=r"x of shape \[4194304, 1\] is too large: the output \[4194304 × 4194304\] "
                                         r"would need 70368744177664 bytes \(64\.0 TiB\)"):
        linear(x)
