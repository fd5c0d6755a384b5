"""Packed-weights files (cpuformer_packed.<level>.bin, csrc/io/packed_file.h; docs/precision.md,
"Packed weights"): ``cpuformer convert`` writes the running level's, loading maps it instead of
packing, and the outputs are bit-identical with and without it at every ISA level, for every
stored dtype, a decoder, an encoder and an encoder-decoder (each level in its own process:
CPUFORMER_ISA). A damaged
file is a ValueError naming it; a stale one a warning, and the weights are packed as without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _core
from cpuformer.models._packed import packed_file_name, write_packed_file

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DTYPES = ["int8", "int4", "float16", "bfloat16", "float32"]
LEVELS = {"x86_64": ["scalar", "avx2", "avx512"], "aarch64": ["scalar", "neon", "dotprod", "i8mm"]}


def _make_cases():
    """tests/c/make_cases.py (its packed-index helpers)."""
    spec = importlib.util.spec_from_file_location("make_cases", ROOT / "tests" / "c" / "make_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def supported_levels():
    levels = LEVELS[platform.machine()]
    return levels[: levels.index(cf.cpu_info()["best_isa"]) + 1]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed_sources")
    torch.manual_seed(3)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=71, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=80, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)).eval()
    llama.save_pretrained(root / "llama")
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=73, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=100,
        max_position_embeddings=64)).eval()
    bert.save_pretrained(root / "bert")
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=60, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, decoder_start_token_id=0,
        eos_token_id=1, pad_token_id=0)).eval()
    t5.save_pretrained(root / "t5")
    return root


CHILD = textwrap.dedent(r"""
    import json, os, shutil, sys
    import numpy as np
    import cpuformer as cf
    from cpuformer.models._packed import packed_file_name

    sources, out = sys.argv[1], sys.argv[2]
    report = {"file": packed_file_name(), "models": {}}
    ids = [[5, 6, 7, 8, 9, 10, 11]]
    for name in ("llama", "bert", "t5"):
        for dtype in sys.argv[3].split(","):
            target = os.path.join(out, f"{name}-{dtype}")
            cf.convert(os.path.join(sources, name), target, dtype, progress=False)
            packed = os.path.join(target, packed_file_name())
            results = []
            for present in (True, False):
                model = cf.load(target)
                store = model._model.packed_weights
                if name == "llama":
                    outputs = [model.logits(ids), np.array(model.generate([[5, 6, 7]], max_new_tokens=6))]
                elif name == "t5":
                    outputs = [model.logits(ids, [[0, 5, 6]]), np.array(model.generate(ids, max_new_tokens=6))]
                else:
                    outputs = [model(ids)]
                results.append((outputs, None if store is None else [store.matrices, store.used]))
                model.close()
                if present:
                    os.rename(packed, packed + ".away")
            os.rename(packed + ".away", packed)
            (with_file, counts), (without, none) = results
            report["models"][f"{name}-{dtype}"] = {
                "counts": counts, "without": none,
                "identical": all(a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
                                 for a, b in zip(with_file, without))}
    print(json.dumps(report))
""")


@pytest.mark.parametrize("level", supported_levels())
def test_outputs_identical_with_and_without_the_file_at_every_level(sources, tmp_path, level):
    env = dict(os.environ, CPUFORMER_ISA=level)
    done = subprocess.run([sys.executable, "-c", CHILD, str(sources), str(tmp_path), ",".join(DTYPES)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["file"].startswith(f"cpuformer_packed.{platform.machine()}-{level}")
    # 2 layers × (qkv, o, up, down) + the LM head; BERT: 2 layers × 4 + the pooler; T5: 2 encoder
    # layers × 4, 2 decoder layers × (qkv, o, cross_q, cross_kv, cross_o, up, down), the LM head
    expected = {"llama": 9, "bert": 9, "t5": 23}
    for name, row in report["models"].items():
        assert row["counts"] == [expected[name.split("-")[0]]] * 2, name  # every matrix mapped
        assert row["without"] is None, name
        assert row["identical"], name


def _converted(sources, tmp_path, dtype="int8", name="llama"):
    target = tmp_path / f"{name}-{dtype}"
    cf.convert(sources / name, target, dtype, progress=False)
    return target


def test_convert_writes_the_file_and_load_maps_it(sources, tmp_path):
    target = _converted(sources, tmp_path)
    assert (target / packed_file_name()).is_file()
    model = cf.load(target)
    store = model._model.packed_weights
    assert isinstance(store, _core.PackedWeightsFile)
    assert store.path == str(target / packed_file_name())
    assert store.matrices == store.used == 9


def test_no_pack_then_pack_command(sources, tmp_path):
    target = tmp_path / "llama-int4"
    cf.convert(sources / "llama", target, "int4", progress=False, pack=False)
    assert not list(target.glob("cpuformer_packed.*"))
    reference = cf.load(target)
    assert reference._model.packed_weights is None
    done = subprocess.run([sys.executable, "-m", "cpuformer", "pack", str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {target / packed_file_name()}"
    model = cf.load(target)
    assert model._model.packed_weights.used == 9
    assert np.array_equal(model.logits([[3, 4, 5]]), reference.logits([[3, 4, 5]]))
    assert not [p for p in target.iterdir() if ".partial-" in p.name]


def test_pack_command_errors(sources, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "cpuformer", "pack", *args], capture_output=True, text=True)

    done = run(str(tmp_path / "missing"))
    assert done.returncode != 0
    assert f"{tmp_path / 'missing'} is not a directory (give a directory written by `cpuformer convert`)" in done.stderr
    done = run(str(sources / "llama"))
    assert done.returncode != 0
    assert "not a converted directory (config.json has no 'cpuformer' entry); `cpuformer convert` it first" in \
        done.stderr
    target = _converted(sources, tmp_path)
    (target / packed_file_name()).unlink()
    (target / packed_file_name()).mkdir()  # what is there cannot be replaced by the file
    done = run(str(target))
    assert done.returncode != 0
    assert done.stderr.startswith("cpuformer pack: error: [Errno 21] Is a directory")
    assert "Traceback" not in done.stderr
    assert [p.name for p in target.iterdir() if ".partial-" in p.name] == []  # the partial file removed


def test_a_file_of_another_level_is_not_used(sources, tmp_path):
    """A file written at one level (or with avx512_vnni) is not the file of another level (or of
    the same level without it)."""
    info = cf.cpu_info()
    if info["isa"] == "avx512" and "avx512_vnni" in info["features"]:
        other = {"CPUFORMER_DISABLE_FEATURES": "avx512_vnni"}
    else:
        levels = [level for level in supported_levels() if level != info["isa"]]
        assert levels, "a machine with a single ISA level"
        other = {"CPUFORMER_ISA": levels[-1]}
    target = _converted(sources, tmp_path)
    code = ("import json, sys, warnings, cpuformer as cf; from cpuformer.models._packed import packed_file_name; "
            "warnings.simplefilter('error'); m = cf.load(sys.argv[1]); "
            "print(json.dumps([packed_file_name(), m._model.packed_weights is None]))")
    done = subprocess.run([sys.executable, "-c", code, str(target)], env=dict(os.environ, **other),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    name, unused = json.loads(done.stdout)
    assert name != packed_file_name() and unused


def test_a_stale_file_warns_and_packs(sources, tmp_path):
    target = _converted(sources, tmp_path)
    reference = cf.load(target).logits([[3, 4, 5]])
    # Other weights of the same shapes (the same safetensors header): another seed's conversion.
    torch.manual_seed(99)
    other = tmp_path / "other"
    transformers.LlamaForCausalLM(transformers.LlamaConfig.from_pretrained(sources / "llama")).save_pretrained(other)
    other_converted = _converted(other.parent, tmp_path / "o", name="other")
    shutil.copyfile(other_converted / "model.safetensors", target / "model.safetensors")
    with pytest.warns(UserWarning) as caught:
        model = cf.load(target)
    assert caught[0].filename == __file__  # the line that loads the model
    message = str(caught[0].message)
    assert message == (f"{target / packed_file_name()}: not used (stale: written for other weights than "
                       "model.safetensors now holds); the weights are packed at load. `cpuformer pack <directory>` "
                       "rewrites it")
    assert model._model.packed_weights is None
    assert np.array_equal(model.logits([[3, 4, 5]]), cf.load(other_converted).logits([[3, 4, 5]]))
    assert not np.array_equal(model.logits([[3, 4, 5]]), reference)
    write_packed_file(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cf.load(target)._model.packed_weights.used == 9


def _damage(path: pathlib.Path, how: str) -> None:
    mc = _make_cases()
    data = bytearray(path.read_bytes())
    if how == "tiny":
        path.write_bytes(bytes(data[:10]))
    elif how == "truncated":
        path.write_bytes(bytes(data[:len(data) // 2]))
    elif how == "magic":
        data[:8] = b"NOTPACKD"
        path.write_bytes(bytes(data))
    elif how == "index":
        offset = int.from_bytes(data[8:16], "little")
        data[offset:offset + 1] = b"["
        path.write_bytes(bytes(data))
    elif how == "offset":
        mc.rewrite_packed_index(path, lambda index: index["matrices"][0].update(offset=10 ** 12))
    elif how == "misaligned":
        mc.rewrite_packed_index(path, lambda index: index["matrices"][0].update(offset=index["matrices"][0]["offset"]
                                                                                + 8))
    elif how == "bytes":
        mc.rewrite_packed_index(path, lambda index: index["matrices"][0].update(bytes=index["matrices"][0]["bytes"]
                                                                                - 64))
    elif how == "type":
        mc.rewrite_packed_index(path, lambda index: index["matrices"][0].update(type="int3"))
    elif how == "shape":
        mc.rewrite_packed_index(path, mc.swap_keys("decoder.layers.0.qkv", "decoder.layers.0.up"))
    elif how == "duplicate":
        mc.rewrite_packed_index(path, lambda index: index["matrices"].append(dict(index["matrices"][0])))


def _first(path: pathlib.Path) -> dict:
    return _make_cases().read_packed_index(path)["matrices"][0]


DAMAGED = {
    "tiny": "truncated to 10 bytes (the header alone takes 64)",
    "truncated": "truncated or bad header: the index [",
    "magic": "bad header (no CFPACKED magic)",
    "index": "bad index: JSON",
    "offset": "matrix '{key}': bytes [1000000000000, +{bytes}) are not a 64-byte aligned range of the data section",
    "misaligned": "matrix '{key}': bytes [{offset8}, +{bytes}) are not a 64-byte aligned range",
    "bytes": "matrix '{key}': {bytes64} bytes, but a [{n}, {k}] int8 matrix packs to {bytes} at this level",
    "type": "matrix '{key}': unknown type 'int3'",
    "shape": "matrix 'decoder.layers.0.qkv' is [160, 64], the model's is [128, 64]",
    "duplicate": "matrix '{key}' appears twice",
}


@pytest.mark.parametrize("how", list(DAMAGED))
def test_a_damaged_file_is_a_clear_error(sources, tmp_path, how):
    target = _converted(sources, tmp_path)
    path = target / packed_file_name()
    first = _first(path)
    _damage(path, how)
    expected = DAMAGED[how].format(key=first["key"], bytes=first["bytes"], offset8=first["offset"] + 8,
                                   bytes64=first["bytes"] - 64, n=first["n"], k=first["k"])
    with pytest.raises(ValueError) as error:
        cf.load(target)
    assert str(error.value).startswith(f"{path}: damaged packed-weights file: ")
    assert expected in str(error.value)
    assert str(error.value).endswith("; delete it or rewrite it with `cpuformer pack <directory>`")


def test_an_encoder_whose_head_cpuformer_does_not_run_still_converts(tmp_path):
    """The packed-weights file is written from the encoder alone: a task head the model classes
    refuse (multiple choice) does not stop the conversion."""
    torch.manual_seed(0)
    transformers.BertForMultipleChoice(transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=48)).save_pretrained(tmp_path / "hf")
    cf.convert(tmp_path / "hf", tmp_path / "int8", "int8", progress=False)
    model = cf.Encoder(tmp_path / "int8", head=False)
    assert model._model.packed_weights.used == 5  # qkv, o, up, down, pooler
