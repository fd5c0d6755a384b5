"""cpuformer.ray (docs/ray.md): Ray Data's map_batches with one model per actor, on one local Ray
cluster (``ray.init(num_cpus=2)``) shared by the module.

docs/ray.md's Python blocks run as written over a JSONL and a Parquet corpus written here, with its
placeholder model paths replaced by the models of tests/test_readme.py (the real all-MiniLM-L6-v2,
a random BERT sentiment classifier, a random GPT-2 and Marian with trained tokenizers); every
output column is compared with the single-process API on the whole corpus: generated and
translated text and labels identical, embeddings and scores to 1e-6 (docs/ray.md says why not bit
for bit). Bad input is tested in the calling process (what the functions check before Ray starts
an actor) and inside actors (what Ray reports).
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import site
import sys
from typing import Dict, List

import numpy as np
import pytest
import ray
import ray.data
from ray.exceptions import RayError
from test_cli import PACKAGE_PARENT
from test_readme import CORPUS, code_blocks, placeholder_models, replace_paths

import cpuformer as cf
from cpuformer import ray as cf_ray

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "ray.md"
EMBEDDING_TOLERANCE = 1e-6


def _texts(count: int, seed: int) -> List[str]:
    """Sentences of 1-14 words from the tokenizers' training corpus (various lengths, so batches pad)."""
    words = " ".join(CORPUS).split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(1, 15)))) for _ in range(count)]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module (starting one takes seconds). Its workers import
    cpuformer from where this process does (a source tree run with a relative PYTHONPATH too)."""
    with pytest.MonkeyPatch.context() as patch:
        if PACKAGE_PARENT not in site.getsitepackages():  # a source tree; an installed cpuformer is found anyway
            patch.setenv("PYTHONPATH", PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Dict[str, str]:
    return placeholder_models(tmp_path_factory.mktemp("ray_models"), chat=False)


def _by_id(rows: List[dict]) -> List[dict]:
    return sorted(rows, key=lambda row: row["id"])


# ---- docs/ray.md, as written --------------------------------------------------------------------------

def test_docs_example_runs_and_equals_the_single_process_api(cluster, models, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl_texts, parquet_texts = _texts(40, seed=1), _texts(30, seed=2)
    with open(tmp_path / "corpus.jsonl", "w") as f:
        for i, text in enumerate(jsonl_texts):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    pq.write_table(pa.table({"id": list(range(len(parquet_texts))), "text": parquet_texts}),
                   tmp_path / "corpus.parquet")

    blocks = code_blocks(DOC.read_text(), "python")
    assert len(blocks) == 2, "docs/ray.md has a new Python block: extend this test"
    code = replace_paths("\n".join(blocks), {**models, '"/data/': f'"{tmp_path}/'})
    assert "path/to/" not in code and '"/data/' not in code, "a docs/ray.md path this test does not replace"
    inits = []
    # The module's cluster stands for the one the example starts (ray.init twice is an error).
    monkeypatch.setattr(ray, "init", lambda **kwargs: inits.append(kwargs))
    exec(compile(code, str(DOC), "exec"), {})
    assert inits == [{"num_cpus": 2}]

    embedded = _by_id(ray.data.read_parquet(str(tmp_path / "embeddings")).take_all())
    assert [row["text"] for row in embedded] == jsonl_texts
    vectors = np.stack([row["embedding"] for row in embedded])
    with cf.load(models["path/to/all-MiniLM-L6-v2"]) as enc:
        reference = enc.embed(jsonl_texts)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape == (40, 384)
    np.testing.assert_allclose(vectors, reference, rtol=0, atol=EMBEDDING_TOLERANCE)

    translated = []
    for path in sorted(glob.glob(str(tmp_path / "translations" / "*.json"))):
        with open(path) as f:
            translated += [json.loads(line) for line in f if line.strip()]
    translated = _by_id(translated)
    assert [row["text"] for row in translated] == parquet_texts
    with cf.load(models["path/to/opus-mt-en-de"]) as s2s:
        reference_text = s2s.generate(parquet_texts, num_beams=4, max_new_tokens=64)
    assert [row["translation"] for row in translated] == reference_text

    labelled = _by_id(ray.data.read_parquet(str(tmp_path / "sentiment")).take_all())
    assert [row["text"] for row in labelled] == jsonl_texts
    with cf.load(models["path/to/bert-sentiment"]) as clf:
        best = [result[0] for result in clf.classify(jsonl_texts)]
    assert [row["sentiment"] for row in labelled] == [b["label"] for b in best]
    np.testing.assert_allclose([row["score"] for row in labelled], [b["score"] for b in best], rtol=0,
                               atol=EMBEDDING_TOLERANCE)


# ---- the other classes and options on the cluster ----------------------------------------------------------

def test_generate_dataset_equals_generate(cluster, models):
    prompts = _texts(24, seed=3)
    dataset = ray.data.from_items([{"id": i, "prompt": p} for i, p in enumerate(prompts)])
    # Two actors take both CPUs: fine for a dataset in memory consumed by take_all (no read or write
    # task), which is why it is a warning and not an error.
    with pytest.warns(UserWarning, match=r"2 actors of 1 CPUs take all 2 CPUs of the Ray cluster: the dataset's "
                                         r"read and write tasks need CPUs too"):
        generated = cf_ray.generate_dataset(dataset, models["path/to/llama-or-gpt2"], concurrency=2, batch_size=5,
                                            model_batch_size=2, max_new_tokens=10)
    rows = _by_id(generated.take_all())
    with cf.load(models["path/to/llama-or-gpt2"]) as gen:
        assert [row["generated"] for row in rows] == gen.generate(prompts, max_new_tokens=10)


def test_pandas_batches_classifier_scores_and_pairs(cluster, models):
    texts, pairs = _texts(20, seed=4), _texts(20, seed=5)
    dataset = ray.data.from_items([{"id": i, "text": t, "other": p} for i, (t, p) in enumerate(zip(texts, pairs))])
    rows = _by_id(dataset.map_batches(
        cf_ray.Classifier, fn_constructor_kwargs={"model_path": models["path/to/bert-sentiment"],
                                                  "pair_column": "other", "scores_output": "scores"},
        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=2, batch_size=6, batch_format="pandas").take_all())
    with cf.load(models["path/to/bert-sentiment"]) as clf:
        results = clf.classify(list(zip(texts, pairs)), top_k=None)
        labels = clf.labels
    assert [row["label"] for row in rows] == [r[0]["label"] for r in results]
    expected = np.array([[next(x["score"] for x in r if x["label"] == label) for label in labels] for r in results])
    np.testing.assert_allclose(np.stack([row["scores"] for row in rows]), expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose([row["score"] for row in rows], expected.max(axis=1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("cpus, threads, explicit", [(2, 2, None), (0.5, 1, None), (2, 1, 1)])
def test_threads_are_the_actors_cpus(cluster, models, cpus, threads, explicit):
    actor = ray.remote(cf_ray.Embedder).options(num_cpus=cpus).remote(models["path/to/all-MiniLM-L6-v2"],
                                                                    num_threads=explicit)
    try:
        seen = ray.get(actor.__ray_call__.remote(lambda self: (self.num_threads, self.model.num_threads)), timeout=120)
    finally:
        ray.kill(actor)
    assert seen == (threads, threads)


def test_errors_inside_actors_reach_the_caller(cluster, models, tmp_path):
    # A file dataset knows its columns only when it runs: the actor's check names them.
    with open(tmp_path / "corpus.jsonl", "w") as f:
        f.write(json.dumps({"id": 0, "body": "hello"}) + "\n")
    dataset = ray.data.read_json(str(tmp_path / "corpus.jsonl"))
    with pytest.raises(RayError, match=r"Embedder: the batch has no column 'text'; its columns: 'id', 'body'"):
        cf_ray.embed_dataset(dataset, models["path/to/all-MiniLM-L6-v2"]).take_all()
    # A constructor that fails in the actor (map_batches called directly, without check()).
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(RayError, match="does not exist"):
        dataset.map_batches(cf_ray.Embedder, fn_constructor_kwargs={"model_path": missing, "column": "body"},
                            compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1).take_all()


# ---- the classes in-process: batches of both formats, and their checks ---------------------------------------

def test_classes_in_process_numpy_and_pandas(models):
    import pandas as pd

    texts = _texts(9, seed=6)
    embedder = cf_ray.Embedder(models["path/to/all-MiniLM-L6-v2"], output="vector", model_batch_size=4)
    assert embedder.num_threads is None  # outside Ray: the process default
    batch = {"id": np.arange(9), "text": np.array(texts, dtype=object)}
    out = embedder(batch)
    assert set(out) == {"id", "text", "vector"} and "vector" not in batch  # a new batch, the input unchanged
    with cf.load(models["path/to/all-MiniLM-L6-v2"]) as enc:
        np.testing.assert_array_equal(out["vector"], enc.embed(texts, batch_size=4))  # the same batches: exact
    frame = embedder(pd.DataFrame({"text": texts}))
    np.testing.assert_array_equal(np.stack(frame["vector"]), out["vector"])
    empty = embedder({"text": np.array([], dtype=object)})
    assert empty["vector"].shape == (0, 384) and empty["vector"].dtype == np.float32
    embedder.close()

    translator = cf_ray.Translator(models["path/to/opus-mt-en-de"], generate_kwargs={"max_new_tokens": 6})
    generator = cf_ray.TextGenerator(models["path/to/opus-mt-en-de"], column="text",
                                     generate_kwargs={"max_new_tokens": 6})
    with cf.load(models["path/to/opus-mt-en-de"]) as s2s:
        expected = s2s.generate(texts, max_new_tokens=6)
    assert translator(batch)["translation"].tolist() == expected
    assert generator(pd.DataFrame({"text": texts}))["generated"].tolist() == expected
    assert translator({"text": np.array([], dtype=object)})["translation"].tolist() == []


def test_bad_rows_and_batches(models):
    embedder = cf_ray.Embedder(models["path/to/all-MiniLM-L6-v2"])
    with pytest.raises(KeyError, match=r"Embedder: the batch has no column 'text'; its columns: 'body'"):
        embedder({"body": np.array(["a"], dtype=object)})
    with pytest.raises(TypeError, match=r"Embedder: column 'text' must hold strings; row 1 of the batch holds "
                                        r"NoneType None"):
        embedder({"text": np.array(["a", None], dtype=object)})
    with pytest.raises(TypeError, match=r"Embedder: column 'text' must hold strings; row 0 .* holds float nan"):
        import pandas as pd
        embedder(pd.DataFrame({"text": [float("nan")]}))
    with pytest.raises(ValueError, match=r"Embedder: the batch already has a column 'embedding'; choose another"):
        embedder({"text": np.array(["a"], dtype=object), "embedding": np.zeros(1)})
    with pytest.raises(TypeError, match=r"a batch must be a dict of NumPy arrays \(batch_format='numpy'\) or a "
                                        r"pandas DataFrame \(batch_format='pandas'\), got list"):
        embedder(["a"])
    embedder.close()


@pytest.mark.parametrize("cls, key, kwargs, error, message", [
    (cf_ray.Translator, "path/to/all-MiniLM-L6-v2", {}, ValueError,
     r"Translator needs an encoder-decoder \(seq2seq\) model; .* holds BertModel, an encoder model \(embed it "
     r"with Embedder, or classify with Classifier"),
    (cf_ray.TextGenerator, "path/to/bert-sentiment", {}, ValueError,
     r"TextGenerator needs a decoder \(causal LM\) or an encoder-decoder \(seq2seq\) model; .* holds "
     r"BertForSequenceClassification, an encoder model"),
    (cf_ray.Embedder, "path/to/llama-or-gpt2", {}, ValueError,
     r"Embedder needs an encoder model; .* holds GPT2LMHeadModel, a decoder \(causal LM\) model \(generate with "
     r"TextGenerator\)"),
    (cf_ray.Classifier, "path/to/all-MiniLM-L6-v2", {}, ValueError,
     r"Classifier needs a sequence classification checkpoint .* holds BertModel, which has no task head"),
    (cf_ray.Classifier, "path/to/opus-mt-en-de", {}, ValueError, r"Classifier needs an encoder model; .* holds "
     r"MarianMTModel, an encoder-decoder \(seq2seq\) model \(translate with Translator or TextGenerator\)"),
    (cf_ray.Classifier, "path/to/bert-sentiment", {"function_to_apply": "relu"}, ValueError,
     r"function_to_apply must be one of 'softmax', 'sigmoid', 'none' or None, got 'relu'"),
    (cf_ray.TextGenerator, "path/to/llama-or-gpt2", {"generate_kwargs": {"return_scores": True}}, ValueError,
     r"TextGenerator: generate argument return_scores=True is not supported here \(the column holds text\)"),
    (cf_ray.TextGenerator, "path/to/llama-or-gpt2", {"generate_kwargs": {"num_return_sequences": 2}}, ValueError,
     r"num_return_sequences=2 is not supported here \(one row gets one text\)"),
    (cf_ray.TextGenerator, "path/to/llama-or-gpt2", {"generate_kwargs": {"tgt_lang": "de"}}, TypeError,
     r"TextGenerator: Generator.generate\(\) has no argument 'tgt_lang'"),
    (cf_ray.Translator, "path/to/opus-mt-en-de", {"generate_kwargs": {"assistant_model": object()}}, TypeError,
     r"assistant_model must be a dtype name \('int8', 'int4'\) or None here"),
    (cf_ray.Embedder, "path/to/all-MiniLM-L6-v2", {"model_batch_size": 0}, ValueError,
     r"model_batch_size must be an integer >= 1, got 0"),
    (cf_ray.Embedder, "path/to/all-MiniLM-L6-v2", {"num_threads": 0}, ValueError,
     r"num_threads must be an integer >= 1 or None, got 0"),
    (cf_ray.Embedder, "path/to/all-MiniLM-L6-v2", {"dtype": "int3"}, ValueError,
     r"dtype must be one of 'float32', .* \(or None\), got 'int3'"),
    (cf_ray.Embedder, "path/to/all-MiniLM-L6-v2", {"pooling": "sum"}, ValueError,
     r"pooling must be None, 'mean', 'cls', 'max' or 'last', got 'sum'"),
    (cf_ray.Embedder, "path/to/all-MiniLM-L6-v2", {"normalize": "yes"}, TypeError,
     r"normalize must be None, True or False, got 'yes'"),
    (cf_ray.Embedder, "path/to/all-MiniLM-L6-v2", {"column": ""}, TypeError,
     r"column must be a non-empty column name \(str\), got ''"),
    (cf_ray.Classifier, "path/to/bert-sentiment", {"scores_output": 3}, TypeError,
     r"scores_output must be a non-empty column name \(str\), got 3"),
])
def test_constructor_errors(models, cls, key, kwargs, error, message):
    with pytest.raises(error, match=message):
        cls.check(models[key], **kwargs)
    with pytest.raises(error, match=message):
        cls(models[key], **kwargs)


def test_missing_model_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model directory .*no-such-model does not exist"):
        cf_ray.Embedder(tmp_path / "no-such-model")


# ---- the dataset functions check before Ray starts an actor -------------------------------------------------

def test_functions_check_in_the_calling_process(cluster, models, tmp_path):
    dataset = ray.data.from_items([{"id": 0, "text": "hello", "label": "x"}])
    minilm, gpt2 = models["path/to/all-MiniLM-L6-v2"], models["path/to/llama-or-gpt2"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cf_ray.embed_dataset(dataset, tmp_path / "no-such-model")
    with pytest.raises(ValueError, match=r"Translator needs an encoder-decoder \(seq2seq\) model"):
        cf_ray.translate_dataset(dataset, minilm)
    with pytest.raises(KeyError, match=r"the dataset has no column 'body'; its columns: 'id', 'text', 'label'"):
        cf_ray.embed_dataset(dataset, minilm, column="body")
    with pytest.raises(ValueError, match=r"the dataset already has a column 'label'; choose another output"):
        cf_ray.classify_dataset(dataset, models["path/to/bert-sentiment"])
    with pytest.raises(TypeError, match=r"Generator.generate\(\) has no argument 'max_length'"):
        cf_ray.generate_dataset(dataset, gpt2, column="text", max_length=5)
    with pytest.raises(TypeError, match=r"dataset must be a ray.data.Dataset, got list"):
        cf_ray.embed_dataset([{"text": "a"}], minilm)
    with pytest.raises(ValueError, match=r"concurrency must be an integer >= 1 or a \(min, max\) pair, got 0"):
        cf_ray.embed_dataset(dataset, minilm, concurrency=0)
    with pytest.raises(ValueError, match=r"concurrency\[1\] must be an integer >= 2, got 1"):
        cf_ray.embed_dataset(dataset, minilm, concurrency=(2, 1))
    with pytest.raises(ValueError, match=r"num_cpus must be a number > 0, got 0"):
        cf_ray.embed_dataset(dataset, minilm, num_cpus=0)
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1 or None, got 0"):
        cf_ray.embed_dataset(dataset, minilm, batch_size=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'poolin'"):
        cf_ray.embed_dataset(dataset, minilm, poolin="mean")


def test_without_ray_the_error_names_the_extra(models, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r'cpuformer.ray needs Ray Data \(ray\[data\] >= 2.9\): pip install '
                                          r'"cpuformer\[ray\]"'):
        cf_ray.embed_dataset(object(), models["path/to/all-MiniLM-L6-v2"])
    assert cf_ray.assigned_cpus() is None
