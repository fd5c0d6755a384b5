"""The graph manifest ``cpuformer convert`` writes for the C API (cpuformer_graph.json,
python/cpuformer/models/_graph_file.py; docs/c-api.md): its config and generation options are
what the Python model hands the C++ graph, and following its tensor entries with the loader's
edits (row block, transpose, 1 + w) over model.safetensors reproduces, bit for bit, every array
the Python loader reads. (The C++ loader's side is tests/c/capi_tests.c, run by
scripts/test-c-api.sh.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

import cpuformer as cf
from cpuformer._model_dir import ModelDir
from cpuformer.models._graph_file import GRAPH_FILE, GRAPH_FORMAT_VERSION
from cpuformer.weights import Checkpoint, graph_format

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODELS = {
    # GPT-2: a fused c_attn split by rows, Conv1D weights transposed at conversion
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=67, n_embd=32, n_layer=2, n_head=4, n_positions=40,
                                                   eos_token_id=3, bos_token_id=3)),
    # Gemma: norms stored as w - 1 (plus_one), RoPE frequencies computed from the config (values)
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(vocab_size=61, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                                      intermediate_size=48, max_position_embeddings=40)),
    "bert": ("BertModel", "BertConfig", dict(vocab_size=70, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=48, max_position_embeddings=40)),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                                          num_heads=4, decoder_start_token_id=0, eos_token_id=1)),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    out = {}
    for i, (name, (model_class, config_class, config)) in enumerate(MODELS.items()):
        directory = tmp_path_factory.mktemp(name)
        torch.manual_seed(40 + i)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
        with torch.no_grad():  # nonzero norm offsets, so 1 + w is visible
            for p in model.parameters():
                if p.ndim == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(directory)
        out[name] = directory
    return out


def _follow(md: ModelDir, entry: dict) -> np.ndarray:
    """What csrc/models/graph_loader.cc does with one manifest entry, in NumPy."""
    if "values" in entry:
        return np.array(entry["values"], dtype=np.float32).reshape(entry["shape"])
    dtype = {"float32": np.float32, "float16": np.float16, "uint16": np.uint16, "int8": np.int8,
             "uint8": np.uint8}[entry["dtype"]]
    array = md.tensor(entry["name"], dtype=dtype)
    if entry.get("transpose"):
        array = array.T
    if "rows" in entry:
        start, stop = entry["rows"]
        array = array[start:stop]
    if entry.get("plus_one"):
        array = array + np.float32(1)
    return np.ascontiguousarray(array).reshape(entry["shape"])


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", ["float32", "int8", "int4"])
def test_manifest_reproduces_the_loader(sources, tmp_path, name, dtype):
    dst = tmp_path / "converted"
    cf.convert(sources[name], dst, dtype, progress=False)
    manifest = json.loads((dst / GRAPH_FILE).read_text())
    model = cf.load(dst)
    assert manifest["format_version"] == GRAPH_FORMAT_VERSION
    assert manifest["kind"] == model.config["kind"]
    assert manifest["config"] == dict(model.config, **graph_format(model.dtype, model.quantization))
    assert set(manifest["config"]) == set(cf._core.transformer_config_fields())
    if manifest["kind"] == "encoder":
        assert "generation" not in manifest
    else:
        generation = manifest["generation"]
        assert generation["eos_token_ids"] == list(model.eos_token_ids)
        assert generation["pad_token_id"] == model.pad_token_id
        assert generation["max_new_tokens"] == 20 and generation["do_sample"] is False
        if manifest["kind"] == "seq2seq":
            assert generation["decoder_start_token_id"] == model.decoder_start_token_id
    model.close()

    md = ModelDir(dst)
    try:
        arch = model._arch
        checkpoint = Checkpoint(md, arch, arch.hparams(md.config), dtype, None, model.quantization)
        groups = [("model", checkpoint.top, "")]
        for stack, count in arch.stacks(checkpoint.hp):
            groups.append(("model", checkpoint.stack_sources(stack), f"{stack}."))
            groups += [((stack, layer), checkpoint.layer_sources(stack, layer), "") for layer in range(count)]
        seen = 0
        for where, sources_, prefix in groups:
            arrays, _ = checkpoint.read(sources_)
            entries = manifest["tensors"]["model"] if where == "model" else manifest["tensors"][where[0]][where[1]]
            for key, array in arrays.items():
                entry = entries[prefix + key]
                got = _follow(md, entry)
                want = np.ascontiguousarray(array)
                assert got.dtype == want.dtype and got.shape == want.shape, (where, key)
                assert got.tobytes() == want.tobytes(), (where, key)
                seen += 1
        total = len(manifest["tensors"]["model"]) + sum(
            len(layer) for stack, layers in manifest["tensors"].items() if stack != "model" for layer in layers)
        assert seen == total  # no entry the loader does not read
    finally:
        md.close()
    if name == "gpt2":
        q = manifest["tensors"]["decoder"][0]["attn.q"]
        assert q["rows"] == [0, 32] and "transpose" not in q  # Conv1D: transposed once, at conversion
    if name == "gemma":
        assert manifest["tensors"]["decoder"][0]["attn_norm"]["plus_one"] is True
        assert "values" in manifest["tensors"]["model"]["decoder.rope.inv_freq"]


def test_a_failing_manifest_fails_the_conversion(sources, tmp_path, monkeypatch):
    from cpuformer.models import _graph_file

    def broken(directory):
        raise RuntimeError("manifest writer failed")

    monkeypatch.setattr(cf.api, "write_graph_file", broken)
    dst = tmp_path / "converted"
    with pytest.raises(RuntimeError, match="manifest writer failed"):
        cf.convert(sources["gpt2"], dst, "int8", progress=False)
    assert not dst.exists() and list(tmp_path.iterdir()) == []  # no partial directory left
    assert _graph_file.write_graph_file is not broken


class _Recorder:
    """Stands in for a model's C++ graph: records the options dict generate() hands it."""

    def __init__(self, graph):
        self.graph, self.options = graph, None

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def generate(self, ids, options, *rest):
        self.options = dict(options)
        return self.graph.generate(ids, options, *rest)


def _marian_with_forced_and_banned_tokens(directory):
    """Marian as the Helsinki-NLP checkpoints ship it: the pad token banned (bad_words_ids) and
    forced last (forced_eos_token_id), decoder start = pad, all in generation_config.json."""
    torch.manual_seed(44)
    transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
        pad_token_id=59, eos_token_id=0, decoder_start_token_id=59)).eval().save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps(
        {"bad_words_ids": [[59], [7, 8]], "forced_eos_token_id": 0, "forced_bos_token_id": 5,
         "decoder_start_token_id": 59, "eos_token_id": 0, "pad_token_id": 59}))


def _gpt2_with_banned_tokens(source, directory):
    """The GPT-2 fixture with generation_config.json: banned words, two EOS ids, a pad id."""
    for f in source.iterdir():
        (directory / f.name).write_bytes(f.read_bytes())
    (directory / "generation_config.json").write_text(json.dumps(
        {"bad_words_ids": [[9], [4, 5, 6]], "eos_token_id": [3, 11], "pad_token_id": 2}))


@pytest.mark.parametrize("name", ["gpt2", "gpt2-banned", "t5", "marian-forced"])
def test_manifest_generation_is_what_generate_passes(sources, tmp_path, name):
    """The manifest's generation section (computed from the config files, without loading the
    model) equals the options a loaded model's plain generate() hands its C++ graph."""
    if name == "marian-forced":
        source = tmp_path / "source"
        source.mkdir()
        _marian_with_forced_and_banned_tokens(source)
    elif name == "gpt2-banned":
        source = tmp_path / "source"
        source.mkdir()
        _gpt2_with_banned_tokens(sources["gpt2"], source)
    else:
        source = sources[name]
    dst = tmp_path / "converted"
    cf.convert(source, dst, "int8", progress=False)
    generation = json.loads((dst / GRAPH_FILE).read_text())["generation"]
    with cf.load(dst) as model:
        recorder = _Recorder(model._model)
        model._model = recorder
        try:
            model.generate([5, 6, 7], seed=0)
        finally:
            model._model = recorder.graph
    passed = recorder.options
    # speculation() adds adaptive_draft (no draft here); the manifest leaves it at the C++ default
    assert passed.pop("adaptive_draft") is True  # GenerationOptions::adaptive_draft (models/generation.h)
    assert generation == passed
    if name == "marian-forced":  # the fixture's settings really are in play
        assert generation["bad_words_ids"] == [[59], [7, 8]] and generation["forced_eos_token_id"] == 0
        assert generation["forced_bos_token_id"] == 5 and generation["decoder_start_token_id"] == 59
    if name == "gpt2-banned":
        assert generation["bad_words_ids"] == [[9], [4, 5, 6]] and generation["eos_token_ids"] == [3, 11]
        assert generation["pad_token_id"] == 2
    if name == "t5":
        assert generation["decoder_start_token_id"] == 0


def test_the_manifest_does_not_build_the_model(sources, tmp_path, monkeypatch):
    """Writing the manifest builds no C++ graph (it used to load and pack the whole model once)."""
    from cpuformer.models import _graph

    def refuse(*args, **kwargs):
        raise AssertionError("the graph manifest built the model")

    dst = tmp_path / "converted"
    cf.convert(sources["t5"], dst, "int8", progress=False)
    before = (dst / GRAPH_FILE).read_text()
    (dst / GRAPH_FILE).unlink()
    monkeypatch.setattr(_graph, "build", refuse)
    from cpuformer.models._graph_file import write_graph_file
    write_graph_file(dst)
    assert (dst / GRAPH_FILE).read_text() == before
