"""cpuformer._model_dir: opening model directories, reading safetensors through mmap, config checks."""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import re
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

from cpuformer._model_dir import (
    MAX_HEADER_BYTES,
    ModelDir,
    config_float,
    config_int,
    save_safetensors,
)

PAGE = mmap.PAGESIZE


# ---- helpers --------------------------------------------------------------------------------

def make_dir(path: pathlib.Path, config: object = None) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"hidden_size": 8} if config is None else config))
    return path


def write_raw(path: pathlib.Path, header: object, data: bytes = b"", header_length: int | None = None) -> None:
    """A safetensors file from a header (dict → JSON, or raw bytes), with an optional lying length."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(header_bytes) if header_length is None else header_length
    path.write_bytes(struct.pack("<Q", length) + header_bytes + data)


def mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The mmap at the end of the array's base chain (NumPy wraps it in a memoryview)."""
    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


# ---- round trips ----------------------------------------------------------------------------

ROUND_TRIP_DTYPES = {
    "F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "U8": np.uint8,
    "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32, "I64": np.int64,
    "U64": np.uint64, "BOOL": np.bool_, "C64": np.complex64,
}


def random_tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    tensors = {}
    shapes = [(1,), (3,), (7, 17), (33, 4), (2, 3, 5), (), (0, 5), (65,), (127,), (4097,)]
    for index, (name, dtype) in enumerate(ROUND_TRIP_DTYPES.items()):
        shape = shapes[index % len(shapes)]
        if dtype is np.bool_:
            tensors[f"t.{name}"] = rng.random(shape) < 0.5
        elif dtype is np.complex64:
            tensors[f"t.{name}"] = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            tensors[f"t.{name}"] = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        else:
            tensors[f"t.{name}"] = rng.standard_normal(shape).astype(dtype)
    return tensors


def test_reads_files_written_by_safetensors(tmp_path, rng):
    tensors = random_tensors(rng)
    directory = make_dir(tmp_path / "model")
    safetensors.numpy.save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "np"})
    with ModelDir(directory) as model:
        assert sorted(model.names()) == sorted(tensors)
        assert len(model) == len(tensors)
        for name, expected in tensors.items():
            dtype, shape = model.tensor_info(name)
            assert dtype == name.split(".")[1]
            assert shape == expected.shape
            got = model.tensor(name, shape=expected.shape, dtype=expected.dtype)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert got.flags.c_contiguous and got.flags.aligned and not got.flags.writeable
            np.testing.assert_array_equal(got, expected)


def test_save_safetensors_is_read_by_safetensors_and_model_dir(tmp_path, rng):
    tensors = random_tensors(rng)
    bf16 = rng.integers(0, 1 << 16, size=(5, 3), dtype=np.uint16)
    tensors["t.BF16"] = bf16
    directory = make_dir(tmp_path / "model")
    path = directory / "model.safetensors"
    save_safetensors(path, tensors, metadata={"format": "pt", "note": "x"}, dtypes={"t.BF16": "BF16"})
    size = path.stat().st_size
    header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert header_length % 8 == 0
    assert size == 8 + header_length + sum(a.nbytes for a in tensors.values())  # contiguous, no gaps
    with safetensors.safe_open(str(path), framework="pt") as reference:
        assert reference.metadata() == {"format": "pt", "note": "x"}
        assert list(reference.keys()) == sorted(tensors)
        for name, expected in tensors.items():
            got = reference.get_tensor(name)
            if name == "t.BF16":
                assert got.dtype == torch.bfloat16
                got = got.view(torch.int16).numpy().view(np.uint16)
            else:
                got = got.numpy()
            np.testing.assert_array_equal(got, expected)
    with ModelDir(directory) as model:
        assert model.names() == list(tensors)  # header order = insertion order
        assert model.tensor_info("t.BF16") == ("BF16", (5, 3))
        np.testing.assert_array_equal(model.tensor("t.BF16", dtype=np.uint16), bf16)
        for name, expected in tensors.items():
            if name != "t.BF16":
                np.testing.assert_array_equal(model.tensor(name, dtype=expected.dtype), expected)


def test_save_safetensors_fp8_and_big_endian(tmp_path):
    directory = make_dir(tmp_path / "model")
    bits = np.arange(7, dtype=np.uint8)
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    save_safetensors(directory / "model.safetensors", {"f8": bits, "big": big}, dtypes={"f8": "F8_E4M3"})
    with ModelDir(directory) as model:
        assert model.tensor_info("f8") == ("F8_E4M3", (7,))
        np.testing.assert_array_equal(model.tensor("f8", dtype=np.uint8), bits)
        got = model.tensor("big")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, big)
        with pytest.raises(ValueError, match=r"tensor 'f8' is stored as F8_E4M3, which reads as uint8 only, "
                                             r"not as float32"):
            model.tensor("f8")


def test_save_safetensors_errors(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError, match=r"tensor 'c': cannot store NumPy dtype complex128 in safetensors"):
        save_safetensors(path, {"c": np.zeros(2, np.complex128)})
    with pytest.raises(ValueError, match=r"tensor 'a': dtype override 'BF16' needs an array of uint16, got float32"):
        save_safetensors(path, {"a": np.zeros(2, np.float32)}, dtypes={"a": "BF16"})
    with pytest.raises(ValueError, match=r"tensor 'a': dtype override 'F4' needs an array of a supported dtype"):
        save_safetensors(path, {"a": np.zeros(2, np.uint8)}, dtypes={"a": "F4"})
    with pytest.raises(ValueError, match=r"dtypes names tensors that are not being saved: \['b'\]"):
        save_safetensors(path, {"a": np.zeros(2, np.uint16)}, dtypes={"b": "BF16"})
    with pytest.raises(TypeError, match="metadata must map str to str"):
        save_safetensors(path, {"a": np.zeros(2)}, metadata={"n": 1})
    with pytest.raises(ValueError, match="invalid tensor name '__metadata__'"):
        save_safetensors(path, {"__metadata__": np.zeros(2)})


def test_empty_and_scalar_tensors(tmp_path):
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors",
                     {"empty": np.zeros((0, 5), np.float32), "scalar": np.float32(2.5), "tail": np.ones(3, np.float32)})
    with ModelDir(directory) as model:
        empty = model.tensor("empty", shape=[0, 5])
        assert empty.shape == (0, 5) and not empty.flags.writeable
        scalar = model.tensor("scalar", shape=())
        assert scalar.shape == () and scalar[()] == 2.5
        np.testing.assert_array_equal(model.tensor("tail"), np.ones(3, np.float32))


LAYOUT_ERRORS = [  # (header, data bytes, message): the safetensors library rejects each of these too
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}}, 20,
     r"model.safetensors: bytes \[8, 16\) of the data section belong to no tensor \(a gap before tensor 'b'\); "
     r"the tensors must cover the data section exactly$"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8,
     r"bytes \[0, 4\) of the data section belong to no tensor \(a gap before tensor 'a'\)"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 7,
     r"model.safetensors: bytes \[4, 7\) of the data section belong to no tensor \(after the last one\); "
     r"the tensors must cover the data section exactly$"),
    ({}, 2, r"bytes \[0, 2\) of the data section belong to no tensor \(after the last one\)"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}}, 8,
     r"bytes \[4, 8\) of the data section belong to no tensor \(a gap before tensor 'e'\)"),
    ({"b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 4,
     r"model.safetensors: tensors 'b' and 'a' overlap: 'a' begins at byte 0, before 'b' ends at byte 4$"),
]


@pytest.mark.parametrize("header,size,message", LAYOUT_ERRORS, ids=[f"layout{i}" for i in range(len(LAYOUT_ERRORS))])
def test_tensors_must_tile_the_data_section(tmp_path, header, size, message):
    directory = make_dir(tmp_path / "model")
    write_raw(directory / "model.safetensors", header, bytes(size))
    with pytest.raises(ValueError, match=message):
        ModelDir(directory)


def test_empty_tensors_may_sit_between_and_after_others(tmp_path):
    data = np.array([1, 2], np.float32).tobytes() + np.array([3], np.float32).tobytes()
    directory = make_dir(tmp_path / "model")
    write_raw(directory / "model.safetensors", {
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        "e": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "f": {"dtype": "F16", "shape": [0, 3], "data_offsets": [12, 12]},
        "__metadata__": None,
    }, data)
    with ModelDir(directory) as model:
        np.testing.assert_array_equal(model.tensor("a"), [1, 2])
        np.testing.assert_array_equal(model.tensor("b"), [3])
        assert model.tensor("e").shape == (0,) and model.tensor("f", shape=(0, 3)).shape == (0, 3)


# ---- zero copy and conversions ----------------------------------------------------------------

def test_f32_is_a_read_only_zero_copy_view_of_the_map(tmp_path, rng):
    expected = rng.standard_normal((33, 17)).astype(np.float32)
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"w": expected, "i": np.arange(7, dtype=np.int8)})
    with ModelDir(directory) as model:
        got = model.tensor("w", shape=(33, 17))
        mapping = mapping_of(got)
        assert mapping is not None
        whole_file = np.frombuffer(mapping, dtype=np.uint8)
        assert np.shares_memory(got, whole_file)
        header_length = struct.unpack("<Q", bytes(mapping[:8]))[0]
        offset = got.__array_interface__["data"][0] - whole_file.__array_interface__["data"][0]
        assert offset == 8 + header_length  # the array starts at the tensor's bytes in the map
        assert got.flags.writeable is False
        assert got.flags.c_contiguous
        with pytest.raises(ValueError, match="read-only"):
            got[0, 0] = 1.0
        np.testing.assert_array_equal(got, expected)
        # Other stored dtypes read as themselves are views too.
        int8 = model.tensor("i", dtype=np.int8)
        assert np.shares_memory(int8, whole_file) and int8.flags.writeable is False
        del whole_file, got, int8


def test_misaligned_tensor_is_an_aligned_read_only_copy(tmp_path):
    odd = np.arange(3, dtype=np.int8)
    expected = np.arange(5, dtype=np.float32) / 3
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"odd": odd, "w": expected})  # w starts at byte 3
    with ModelDir(directory) as model:
        got = model.tensor("w")
        assert got.flags.aligned and got.flags.c_contiguous and got.flags.writeable is False
        assert mapping_of(got) is None
        np.testing.assert_array_equal(got, expected)


SPECIAL_VALUES = [0.0, -0.0, 1.0, -2.5, 65504.0, -65504.0, 6.1e-5, 6e-8, 1e-7, 3.0e38, -1.0e-39,
                  np.inf, -np.inf, np.nan, 0.333333, 1234.5678]


def test_f16_to_f32_is_exact(tmp_path, rng):
    values = np.concatenate([np.array(SPECIAL_VALUES, np.float32),
                             rng.standard_normal(4097).astype(np.float32) * 100])
    with np.errstate(over="ignore"):  # 3e38 becomes inf on purpose
        expected16 = values.astype(np.float16)
    bits = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # every half-precision value
    directory = make_dir(tmp_path / "model")
    safetensors.numpy.save_file({"h": expected16, "all": bits}, str(directory / "model.safetensors"))
    with ModelDir(directory) as model:
        for name, source in (("h", expected16), ("all", bits)):
            got = model.tensor(name)
            assert got.dtype == np.float32 and got.flags.writeable is False and got.flags.c_contiguous
            reference = source.astype(np.float32)
            finite = ~np.isnan(reference)
            np.testing.assert_array_equal(got.view(np.uint32)[finite], reference.view(np.uint32)[finite])
            np.testing.assert_array_equal(np.isnan(got), ~finite)
        # read as itself: a view of the stored halves
        np.testing.assert_array_equal(model.tensor("h", dtype=np.float16).view(np.uint16), expected16.view(np.uint16))


def test_bf16_to_f32_matches_torch_bit_for_bit(tmp_path, rng):
    values = torch.tensor(np.concatenate([np.array(SPECIAL_VALUES, np.float32),
                                          rng.standard_normal(4097).astype(np.float32)]))
    every = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)
    tensors = {"b": values.to(torch.bfloat16).reshape(-1, 1), "all": every}
    directory = make_dir(tmp_path / "model")
    safetensors.torch.save_file(tensors, str(directory / "model.safetensors"))
    with ModelDir(directory) as model:
        for name, source in tensors.items():
            assert model.tensor_info(name) == ("BF16", tuple(source.shape))
            got = model.tensor(name, shape=tuple(source.shape))
            assert got.dtype == np.float32 and got.flags.writeable is False
            reference = source.float().numpy()
            np.testing.assert_array_equal(got.view(np.uint32), reference.view(np.uint32))
            raw = model.tensor(name, dtype=np.uint16)  # the raw bits, zero-copy
            assert mapping_of(raw) is not None
            np.testing.assert_array_equal(raw, source.view(torch.int16).numpy().view(np.uint16))


def test_f64_to_f32(tmp_path, rng):
    signalling_nan = np.frombuffer(struct.pack("<Q", 0x7FF0000000000001), np.float64)
    values = np.concatenate([rng.standard_normal(33) * 1e3, [np.inf, -np.inf, 1e300, -1e-300, np.nan],
                             signalling_nan])
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"d": values})
    with ModelDir(directory) as model:
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_array_equal(model.tensor("d"), values.astype(np.float32))
        np.testing.assert_array_equal(model.tensor("d", dtype=np.float64), values)


def test_dtype_request_that_does_not_match(tmp_path):
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"w": np.zeros(3, np.float32), "h": np.zeros(3, np.float16)})
    with ModelDir(directory) as model:
        with pytest.raises(ValueError, match=r"tensor 'w' is stored as F32, which reads as float32 only, not as int8"):
            model.tensor("w", dtype=np.int8)
        with pytest.raises(ValueError, match=r"tensor 'h' is stored as F16, which reads as float16 or float32, "
                                             r"not as float64"):
            model.tensor("h", dtype=np.float64)


# ---- release() --------------------------------------------------------------------------------

def test_release_drops_resident_memory(tmp_path):
    megabytes = 64
    big = np.arange(megabytes * (1 << 20) // 4, dtype=np.float32)
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"small": np.ones(5, np.float32), "big": big})
    expected_sum = float(big.sum(dtype=np.float64))
    del big
    with ModelDir(directory) as model:
        tensor = model.tensor("big")
        before = resident_bytes()
        assert float(tensor.sum(dtype=np.float64)) == expected_sum  # touches every page
        touched = resident_bytes()
        assert touched - before > (megabytes - 8) << 20, (before, touched)
        model.release("big")
        released = resident_bytes()
        assert touched - released > (megabytes - 8) << 20, (touched, released)
        # the view stays valid: pages come back from the file
        assert float(tensor.sum(dtype=np.float64)) == expected_sum
        np.testing.assert_array_equal(model.tensor("small"), np.ones(5, np.float32))
        model.release("small")  # smaller than a page: nothing to drop, no error
        np.testing.assert_array_equal(model.tensor("small"), np.ones(5, np.float32))
        with pytest.raises(ValueError, match=r"model.safetensors has no tensor 'nope'"):
            model.release("nope")


# ---- sharded directories, side files ----------------------------------------------------------

def write_sharded(directory: pathlib.Path, shards: dict[str, dict[str, np.ndarray]],
                  weight_map: dict | None = None) -> None:
    make_dir(directory)
    for file_name, tensors in shards.items():
        save_safetensors(directory / file_name, tensors)
    if weight_map is None:
        weight_map = {name: file_name for file_name, tensors in shards.items() for name in tensors}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def test_sharded_directory(tmp_path, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float16)
    c = np.arange(5, dtype=np.int64)
    directory = tmp_path / "model"
    write_sharded(directory, {"model-00001-of-00002.safetensors": {"a": a, "b": b},
                              "model-00002-of-00002.safetensors": {"c": c}})
    with ModelDir(directory) as model:
        assert model.names() == ["a", "b", "c"]
        assert "c" in model and "d" not in model
        np.testing.assert_array_equal(model.tensor("a"), a)
        np.testing.assert_array_equal(model.tensor("b"), b.astype(np.float32))
        np.testing.assert_array_equal(model.tensor("c", dtype=np.int64), c)
        with pytest.raises(ValueError, match=r"model.safetensors.index.json has no tensor 'd'"):
            model.tensor("d")


def test_sharded_directory_saved_by_transformers(tmp_path):
    import transformers
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=64)
    hf_model = transformers.BertModel(config).eval()
    hf_model.save_pretrained(tmp_path / "bert", safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "bert" / "model.safetensors.index.json").exists()
    assert not (tmp_path / "bert" / "model.safetensors").exists()
    state = hf_model.state_dict()
    weight_map = json.loads((tmp_path / "bert" / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 1  # really several shards
    with ModelDir(tmp_path / "bert") as model:
        assert model.config["hidden_size"] == 32
        assert config_int(model.config, "num_hidden_layers") == 2
        assert sorted(model.names()) == sorted(state)
        for name in model.names():
            expected = state[name].numpy()
            np.testing.assert_array_equal(model.tensor(name, shape=expected.shape), expected)


def test_generation_config_and_tokenizer_path(tmp_path):
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"w": np.zeros(1, np.float32)})
    with ModelDir(directory) as model:
        assert model.generation_config == {}
        assert model.tokenizer_path is None
        assert model.path == directory
    (directory / "generation_config.json").write_text(json.dumps({"max_new_tokens": 5, "eos_token_id": [1, 2]}))
    (directory / "tokenizer.json").write_text("{}")
    with ModelDir(str(directory)) as model:
        assert model.generation_config == {"max_new_tokens": 5, "eos_token_id": [1, 2]}
        assert model.tokenizer_path == directory / "tokenizer.json"
        assert model.config == {"hidden_size": 8}
        assert repr(model) == f"ModelDir({str(directory)!r}, 1 tensors)"


def test_close(tmp_path):
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"w": np.arange(4, dtype=np.float32)})
    model = ModelDir(directory)
    kept = model.tensor("w")
    model.close()
    model.close()  # idempotent
    assert repr(model).endswith("closed)")
    with pytest.raises(ValueError, match=r"the model directory is closed"):
        model.tensor("w")
    with pytest.raises(ValueError, match=r"the model directory is closed"):
        model.release("w")
    # a view that outlived close() still points at mapped memory (the map is freed with it)
    np.testing.assert_array_equal(kept, np.arange(4, dtype=np.float32))
    with ModelDir(directory) as model:
        model.tensor("w")
    with pytest.raises(ValueError, match=r"closed"):
        model.tensor("w")


# ---- error messages: files --------------------------------------------------------------------

def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model directory .*nowhere does not exist"):
        ModelDir(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    with pytest.raises(FileNotFoundError, match=r"model directory .*file is not a directory"):
        ModelDir(tmp_path / "file")


def test_missing_config(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(FileNotFoundError,
                       match=r"model/config.json does not exist: a model directory needs config.json"):
        ModelDir(tmp_path / "model")


def test_links_that_lead_nowhere(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(FileNotFoundError, match=r"model directory .*loop is a symbolic link that leads nowhere "
                                                r"\(its target is missing, or the links form a loop\)$"):
        ModelDir(tmp_path / "loop")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(FileNotFoundError, match=r"model/config.json is a symbolic link that leads nowhere "
                                                r"\(its target is missing, or the links form a loop\): a model "
                                                r"directory needs config.json$"):
        ModelDir(tmp_path / "model")


def test_missing_weights(tmp_path):
    directory = make_dir(tmp_path / "model")
    with pytest.raises(FileNotFoundError, match=r"no weights in .*model: expected model.safetensors or "
                                                r"model.safetensors.index.json$"):
        ModelDir(directory)
    (directory / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"pytorch_model.bin is not read: save the model with "
                                                r"save_pretrained\(..., safe_serialization=True\)"):
        ModelDir(directory)


def test_missing_shard(tmp_path):
    directory = tmp_path / "model"
    write_sharded(directory, {"one.safetensors": {"a": np.zeros(2, np.float32)}},
                  weight_map={"a": "one.safetensors", "b": "two.safetensors"})
    with pytest.raises(FileNotFoundError, match=r"model/two.safetensors does not exist: "
                                                r"model.safetensors.index.json names it as a shard"):
        ModelDir(directory)


@pytest.mark.parametrize("weight_map,message", [
    ({"a": "one.safetensors", "b": "one.safetensors"},
     r"index.json: maps tensor 'b' to one.safetensors, which has no such tensor"),
    ({"a": "../one.safetensors"}, r"index.json: shard '../one.safetensors' for tensor 'a' must be a plain file name"),
    ({"a": ""}, r"index.json: shard '' for tensor 'a' must be a plain file name in the model directory"),
    ({"a": 3}, r"index.json: shard for tensor 'a' must be a file name, got 3"),
    ({"a": "n" * 300}, r"model/n{300}: cannot be opened \(File name too long\)"),
    ({}, r"index.json: 'weight_map' names no tensors"),
    ([1], r"index.json: 'weight_map' must be an object of tensor name -> shard file, got \[1\]"),
])
def test_bad_index(tmp_path, weight_map, message):
    directory = tmp_path / "model"
    write_sharded(directory, {"one.safetensors": {"a": np.zeros(2, np.float32)}}, weight_map=weight_map)
    with pytest.raises(ValueError, match=message):
        ModelDir(directory)


def test_index_without_weight_map_and_bad_index_json(tmp_path):
    directory = tmp_path / "model"
    write_sharded(directory, {"one.safetensors": {"a": np.zeros(2, np.float32)}})
    index = directory / "model.safetensors.index.json"
    index.write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match=r"index.json: 'weight_map' must be an object .* got None"):
        ModelDir(directory)
    index.write_text('{"weight_map": {"a": "one.safetensors", "a": "one.safetensors"}}')
    with pytest.raises(ValueError, match=r"index.json: invalid JSON \(duplicate key 'a'\)"):
        ModelDir(directory)
    index.write_text('{"weight_map": ')
    with pytest.raises(ValueError, match=r"index.json: invalid JSON \(Expecting value"):
        ModelDir(directory)
    index.write_text('[]')
    with pytest.raises(ValueError, match=r"index.json: must contain a JSON object, got list"):
        ModelDir(directory)


def test_duplicate_tensor_across_shards(tmp_path):
    directory = tmp_path / "model"
    write_sharded(directory, {"one.safetensors": {"a": np.zeros(2, np.float32)},
                              "two.safetensors": {"a": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}},
                  weight_map={"a": "one.safetensors", "b": "two.safetensors"})
    with pytest.raises(ValueError, match=r"tensor 'a' is in both .*one.safetensors and .*two.safetensors"):
        ModelDir(directory)


BAD_CONFIGS = [
    (b"{\"hidden_size\": ", r"config.json: invalid JSON \(Expecting value: line 1"),
    (b"[1, 2]", r"config.json: must contain a JSON object, got list"),
    (b"\xff\xfe{}", r"config.json: invalid JSON \('utf-8' codec can't decode"),
    (b"[" * 100000, r"config.json: invalid JSON \(nested too deeply\)"),
    (b"{\"a\": 1" + b"0" * 5000 + b"}", r"config.json: invalid JSON \(Exceeds the limit"),
]


def short_id(message: str) -> str:
    """A readable test id from an expected message (the inputs themselves can be huge)."""
    return re.sub(r"\W+", "-", message.replace("\\", ""))[:60].strip("-")


@pytest.mark.parametrize("content,message", BAD_CONFIGS, ids=[short_id(m) for _, m in BAD_CONFIGS])
def test_bad_config_json(tmp_path, content, message):
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"w": np.zeros(1, np.float32)})
    (directory / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        ModelDir(directory)


def test_json_file_too_large(tmp_path):
    directory = make_dir(tmp_path / "model")
    with open(directory / "config.json", "r+b") as config:
        config.truncate(64_000_001)  # sparse: costs no disk
    with pytest.raises(ValueError, match=r"config.json: 64000001 bytes is larger than the 64000000 byte limit "
                                         r"for a JSON file"):
        ModelDir(directory)


def test_bad_generation_config(tmp_path):
    directory = make_dir(tmp_path / "model")
    save_safetensors(directory / "model.safetensors", {"w": np.zeros(1, np.float32)})
    (directory / "generation_config.json").write_text("3")
    with pytest.raises(ValueError, match=r"generation_config.json: must contain a JSON object, got int"):
        ModelDir(directory)


def test_special_files_do_not_hang(tmp_path):
    directory = make_dir(tmp_path / "model")
    os.mkfifo(directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors is not a regular file"):
        ModelDir(directory)
    os.unlink(directory / "model.safetensors")
    (directory / "model.safetensors").mkdir()
    with pytest.raises(ValueError, match=r"model.safetensors is not a regular file"):
        ModelDir(directory)


# ---- error messages: safetensors contents -----------------------------------------------------

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def test_truncated_files(tmp_path):
    directory = make_dir(tmp_path / "model")
    path = directory / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00")
    with pytest.raises(ValueError, match=r"model.safetensors: file is 3 bytes, too short for the 8-byte "
                                         r"header length \(truncated or not a safetensors file\)"):
        ModelDir(directory)
    save_safetensors(path, {"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)})
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])  # the data region lost its last byte
    with pytest.raises(ValueError, match=r"tensor 'b': data_offsets \[16, 32\] are out of range: the data region "
                                         r"is 31 bytes \(file truncated or offsets wrong\)"):
        ModelDir(directory)
    path.write_bytes(whole[:20])  # cut inside the header
    with pytest.raises(ValueError, match=r"header length \d+ is beyond the end of the file \(20 bytes; "
                                         r"truncated or not a safetensors file\)"):
        ModelDir(directory)


def test_header_length_too_large(tmp_path):
    directory = make_dir(tmp_path / "model")
    path = directory / "model.safetensors"
    write_raw(path, b"{}", header_length=(1 << 64) - 1)
    with pytest.raises(ValueError, match=r"header length 18446744073709551615 is beyond the end of the file"):
        ModelDir(directory)
    # a sparse file big enough to hold the declared header: the limit applies before any read
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        out.truncate(MAX_HEADER_BYTES + 100)
    with pytest.raises(ValueError, match=r"header length 100000001 exceeds the limit of 100000000 bytes"):
        ModelDir(directory)


CORRUPT_HEADERS = [
    (b"{\"a\": ", r"model.safetensors: invalid JSON \(Expecting value"),
    (b"\x80{}", r"model.safetensors: invalid JSON \('utf-8' codec can't decode byte 0x80"),
    (b"[]", r"model.safetensors: header must be a JSON object, got list"),
    (b"{\"a\": {}, \"a\": {}}", r"model.safetensors: invalid JSON \(duplicate key 'a'\)"),
    (b"[" * 5000, r"model.safetensors: invalid JSON \(nested too deeply\)"),
    ({"a": [1]}, r"tensor 'a': entry must be a JSON object, got list"),
    ({"a": {"dtype": "F32", "shape": [2]}}, r"tensor 'a': missing 'data_offsets'"),
    ({"a": dict(F32_2, dtype="F33")}, r"tensor 'a': unknown or unsupported dtype 'F33' \(supported: BF16, BOOL, "),
    ({"a": dict(F32_2, dtype=3)}, r"tensor 'a': unknown or unsupported dtype 3"),
    ({"a": dict(F32_2, shape=[-2])}, r"tensor 'a': shape \[-2\] has a negative dimension"),
    ({"a": dict(F32_2, shape="2")}, r"tensor 'a': shape must be a list of integers, got '2'"),
    ({"a": dict(F32_2, shape=[2.0])}, r"tensor 'a': shape must be a list of integers, got \[2.0\]"),
    ({"a": dict(F32_2, shape=[True])}, r"tensor 'a': shape must be a list of integers, got \[True\]"),
    ({"a": dict(F32_2, shape=[1] * 33)}, r"tensor 'a': shape has 33 dimensions, more than 32"),
    ({"a": dict(F32_2, shape=[1 << 40, 1 << 40, 0])}, r"tensor 'a': shape \[1099511627776, 1099511627776, 0\] is "
                                                       r"absurdly large"),
    ({"a": dict(F32_2, shape=[1 << 62])}, r"tensor 'a': shape \[4611686018427387904\] is absurdly large"),
    ({"a": dict(F32_2, data_offsets=[0])}, r"tensor 'a': data_offsets must be a list of two integers, got \[0\]"),
    ({"a": dict(F32_2, data_offsets=[0, 8.0])}, r"data_offsets must be a list of two integers, got \[0, 8.0\]"),
    ({"a": dict(F32_2, data_offsets=[8, 0])}, r"tensor 'a': data_offsets \[8, 0\] must satisfy 0 <= begin <= end"),
    ({"a": dict(F32_2, data_offsets=[-8, 0])}, r"data_offsets \[-8, 0\] must satisfy 0 <= begin <= end"),
    ({"a": dict(F32_2, data_offsets=[8, 16])}, r"tensor 'a': data_offsets \[8, 16\] are out of range: the data "
                                                r"region is 12 bytes"),
    ({"a": dict(F32_2, data_offsets=[0, 1 << 70])}, r"data_offsets \[0, 1180591620717411303424\] are out of range"),
    ({"a": dict(F32_2, data_offsets=[0, 4])}, r"tensor 'a': data_offsets \[0, 4\] span 4 bytes, but shape \[2\] of "
                                               r"F32 needs 8"),
    ({"a": dict(F32_2, shape=[1 << 20, 1 << 20])}, r"data_offsets \[0, 8\] span 8 bytes, but shape \[1048576, "
                                                    r"1048576\] of F32 needs 4398046511104"),
    ({"a": F32_2, "b": {"dtype": "I8", "shape": [2], "data_offsets": [7, 9]}},
     r"model.safetensors: tensors 'a' and 'b' overlap: 'b' begins at byte 7, before 'a' ends at byte 8$"),
    # an empty tensor inside another's range overlaps it (the safetensors library: "invalid offset")
    ({"a": F32_2, "b": {"dtype": "F16", "shape": [0], "data_offsets": [4, 4]},
      "c": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]}},
     r"tensors 'a' and 'b' overlap: 'b' begins at byte 4, before 'a' ends at byte 8$"),
    ({"a": F32_2, "__metadata__": {"k": 1}}, r"__metadata__ must be an object of strings, got \{'k': 1\}"),
    ({"a": F32_2, "__metadata__": []}, r"__metadata__ must be an object of strings, got \[\]"),
]


@pytest.mark.parametrize("header,message", CORRUPT_HEADERS, ids=[short_id(m) for _, m in CORRUPT_HEADERS])
def test_corrupt_header(tmp_path, header, message):
    directory = make_dir(tmp_path / "model")
    write_raw(directory / "model.safetensors", header, bytes(12))
    with pytest.raises(ValueError, match=message):
        ModelDir(directory)


def test_long_names_in_messages_are_shortened(tmp_path):
    name = "x" * 100000
    directory = make_dir(tmp_path / "model")
    write_raw(directory / "model.safetensors", {name: dict(F32_2, dtype="nope")}, bytes(8))
    with pytest.raises(ValueError, match=r"tensor 'x{50,}\.\.\.x+': unknown or unsupported dtype 'nope'") as error:
        ModelDir(directory)
    assert len(str(error.value)) < 1000


# ---- error messages: reading ------------------------------------------------------------------

def test_missing_tensor_and_shape_mismatch(tmp_path):
    directory = make_dir(tmp_path / "model")
    name = "encoder.layer.0.attention.self.query.weight"
    save_safetensors(directory / "model.safetensors", {name: np.zeros((768, 512), np.float32)})
    with ModelDir(directory) as model:
        with pytest.raises(ValueError, match=r"model.safetensors has no tensor 'x'"):
            model.tensor("x")
        with pytest.raises(ValueError, match=r"model.safetensors has no tensor 'x'"):
            model.tensor_info("x")
        with pytest.raises(ValueError, match=r"tensor 'encoder.layer.0.attention.self.query.weight' has shape "
                                             r"\[768, 512\], expected \[768, 768\]"):
            model.tensor(name, shape=(768, 768))
        assert model.tensor(name, shape=[768, 512]).shape == (768, 512)


# ---- config helpers ---------------------------------------------------------------------------

def test_config_int():
    config = {"hidden_size": 768, "negative": -3, "text": "12", "flag": True, "real": 2.5, "whole": 64.0,
              "huge": 1 << 40, "null": None}
    assert config_int(config, "hidden_size") == 768
    assert config_int(config, "whole") == 64 and isinstance(config_int(config, "whole"), int)
    assert config_int(config, "absent", default=7) == 7
    assert config_int(config, "null", default=None) is None
    assert config_int(config, "negative", minimum=-5) == -3
    assert config_int(config, "huge", maximum=None) == 1 << 40
    assert config_int(config, "negative", minimum=None, maximum=None) == -3
    with pytest.raises(ValueError, match=r"^config.json: 'hidden_size' must be an integer >= 1, got -3$"):
        config_int({"hidden_size": -3}, "hidden_size")
    with pytest.raises(ValueError, match=r"^config.json: 'absent' is missing$"):
        config_int(config, "absent")
    with pytest.raises(ValueError, match=r"^config.json: 'null' is missing$"):
        config_int(config, "null")
    with pytest.raises(ValueError, match=r"^config.json: 'text' must be an integer >= 1, got '12'$"):
        config_int(config, "text")
    with pytest.raises(ValueError, match=r"^config.json: 'flag' must be an integer >= 1, got True$"):
        config_int(config, "flag")
    with pytest.raises(ValueError, match=r"^config.json: 'real' must be an integer >= 1, got 2.5$"):
        config_int(config, "real")
    with pytest.raises(ValueError, match=r"^config.json: 'huge' must be an integer >= 1 and <= 2147483648, "
                                         r"got 1099511627776$"):
        config_int(config, "huge")
    with pytest.raises(ValueError, match=r"^config.json: 'hidden_size' must be an integer >= 1 and <= 512, got 768$"):
        config_int(config, "hidden_size", maximum=512)
    with pytest.raises(ValueError, match=r"^config.json: 'text' must be an integer, got '12'$"):
        config_int(config, "text", minimum=None)
    with pytest.raises(ValueError, match=r"^generation_config.json: 'max_length' is missing$"):
        config_int({}, "max_length", source="generation_config.json")
    with pytest.raises(ValueError, match=r"^config.json: must be a JSON object, got list$"):
        config_int([], "hidden_size")


def test_config_float():
    config = {"eps": 1e-12, "int": 3, "negative": -1, "nan": float("nan"), "inf": float("inf"), "text": "0.1",
              "flag": False}
    assert config_float(config, "eps") == 1e-12
    assert config_float(config, "int") == 3.0 and isinstance(config_float(config, "int"), float)
    assert config_float(config, "absent", default=0.5) == 0.5
    with pytest.raises(ValueError, match=r"^config.json: 'absent' is missing$"):
        config_float(config, "absent")
    with pytest.raises(ValueError, match=r"^config.json: 'negative' must be a finite number >= 0, got -1$"):
        config_float(config, "negative", minimum=0)
    with pytest.raises(ValueError, match=r"^config.json: 'int' must be a finite number >= 0 and <= 1, got 3$"):
        config_float(config, "int", minimum=0, maximum=1)
    with pytest.raises(ValueError, match=r"^config.json: 'nan' must be a finite number, got nan$"):
        config_float(config, "nan")
    with pytest.raises(ValueError, match=r"^config.json: 'inf' must be a finite number, got inf$"):
        config_float(config, "inf")
    with pytest.raises(ValueError, match=r"^config.json: 'text' must be a finite number, got '0.1'$"):
        config_float(config, "text")
    with pytest.raises(ValueError, match=r"^config.json: 'flag' must be a finite number <= 2, got False$"):
        config_float(config, "flag", maximum=2)
