"""Damaged int4 directories (hypothesis): every mutation of an int4 weight's tensors either loads
and runs, or is refused with ValueError / TypeError — never a crash or silently wrong numbers.

An independent judge decides from the mutated tensors alone which outcome is right: the weight
loads exactly when its nibble, scale and zero-point tensors are all present with the dtype and
shape of the format (docs/precision.md) and no zero point exceeds 15 and no scale is infinite. A
loaded model must then give the outputs of the stored codes: finite logits unless a NaN scale was
written (the channel's outputs are NaN then), and unchanged logits when the mutation wrote the
values that were there.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cpuformer as cf
from cpuformer._model_dir import ModelDir, save_safetensors

from ._support import property_settings

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, I, V = 32, 48, 61
WEIGHT = "model.layers.0.mlp.down_proj.weight"  # [H, I]: I = 48 with groups of 32 is padded to 64
GROUPS, HALF = 2, 32
STORAGE = {"U8": np.uint8, "I8": np.int8, "F16": np.float16, "F32": np.float32, "BF16": np.uint16,
           "I64": np.int64}


@pytest.fixture(scope="module")
def int4_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4_files")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=I, max_position_embeddings=32)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(root / "src")
    cf.convert(root / "src", root / "int4", "int4", progress=False, quantization={"zero_point": True})
    with ModelDir(root / "int4") as md:
        tensors = {n: np.array(md.tensor(n, dtype=STORAGE[md.tensor_info(n)[0]])) for n in md.names()}
    return root, tensors


def mutations():
    """(tensor suffix, what to do, argument) — the damage a file can carry."""
    suffix = st.sampled_from(["", "_scale", "_zero"])
    return st.one_of(
        st.tuples(suffix, st.just("drop"), st.none()),
        st.tuples(suffix, st.just("rows"), st.integers(0, 2 * H)),
        st.tuples(suffix, st.just("columns"), st.integers(0, 2 * HALF)),
        st.tuples(suffix, st.just("dtype"), st.sampled_from(["U8", "I8", "F16", "F32", "I64"])),
        st.tuples(st.just("_zero"), st.just("value"), st.integers(0, 255)),
        st.tuples(st.just("_scale"), st.just("value"), st.sampled_from([np.inf, -np.inf, np.nan, 0.0, 1e-8, 6e4])),
        st.tuples(st.just(""), st.just("value"), st.integers(0, 255)),
        st.tuples(suffix, st.just("same"), st.none()),
    )


def mutate(tensors, suffix, action, argument, index):
    """The tensors after the damage, and the judge's verdict (True: must load)."""
    out = dict(tensors)
    key = WEIGHT + suffix
    array = out[key]
    if action == "drop":
        del out[key]
    elif action == "rows":
        out[key] = np.resize(array, (argument,) + array.shape[1:]) if argument else array[:0].copy()
    elif action == "columns":
        out[key] = np.resize(array, (array.shape[0], argument)) if argument else array[:, :0].copy()
    elif action == "dtype":
        out[key] = array.astype(STORAGE[argument])
    elif action == "value":
        changed = array.copy().reshape(-1)
        changed[index % changed.size] = argument
        out[key] = changed.reshape(array.shape)
    expected = {"": ((H, HALF), np.uint8), "_scale": ((H, GROUPS), np.float16), "_zero": ((H, GROUPS), np.uint8)}
    valid = True
    for part, (shape, dtype) in expected.items():
        have = out.get(WEIGHT + part)
        valid &= have is not None and have.shape == shape and have.dtype == dtype
    if valid:
        valid &= bool(np.all(out[WEIGHT + "_zero"] <= 15)) and not bool(np.isinf(out[WEIGHT + "_scale"]).any())
    return out, valid


@property_settings(60)
@given(damage=mutations(), index=st.integers(0, 10_000))
def test_damaged_int4_weight(int4_dir, tmp_path_factory, damage, index):
    root, tensors = int4_dir
    changed, valid = mutate(tensors, *damage, index)
    broken = tmp_path_factory.mktemp("broken")
    for name in ("config.json", "generation_config.json"):
        if (root / "int4" / name).is_file():
            shutil.copyfile(root / "int4" / name, broken / name)
    save_safetensors(broken / "model.safetensors", changed)
    assert json.loads((broken / "config.json").read_text())["cpuformer"]["dtype"] == "int4"
    ids = np.arange(3, 11, dtype=np.int64)[None]
    try:
        model = cf.Generator(broken)
    except (ValueError, TypeError) as error:
        assert not valid, f"refused a valid weight: {error}"
        assert "down" in str(error) or WEIGHT in str(error), error  # the message names the tensor
        return
    assert valid, f"loaded a damaged weight: {damage}"
    logits = model.logits(ids)
    if np.isnan(changed[WEIGHT + "_scale"]).any():
        assert np.isnan(logits).any()
    else:
        assert np.isfinite(logits).all()
    if all(np.array_equal(changed[k], tensors[k]) for k in tensors):
        np.testing.assert_array_equal(logits, cf.Generator(root / "int4").logits(ids))
