"""Ray Data for corpora: embed, classify, generate or translate the rows of a ``ray.data.Dataset``
with one cpuformer model per actor (docs/ray.md).

Each class here is a callable class for ``Dataset.map_batches`` (Ray's actor-pool form): Ray
constructs it once in each actor, so the model is loaded once per worker process, with
``num_threads`` equal to the CPUs Ray assigned that actor (``num_cpus=`` of ``map_batches``); each
call takes a batch with a text column and returns it with a new column:

- ``Embedder``: ``Encoder.embed`` -> a float32 [N, D] column;
- ``Classifier``: ``Encoder.classify`` (a sequence-classification checkpoint) -> the best label and
  its score, optionally every label's score;
- ``TextGenerator``: ``Generator.generate`` / ``Seq2Seq.generate`` on text -> the generated text;
- ``Translator``: ``TextGenerator`` for encoder-decoders only, with ``tgt_lang`` / ``src_lang``.

``embed_dataset``, ``classify_dataset``, ``generate_dataset`` and ``translate_dataset`` wire
``map_batches`` with a fixed-size actor pool and check the model directory (and the column, when
the dataset's schema is known without running it) in the calling process first, so that those
mistakes fail at once with their own exception instead of inside an actor.

Batches are ``dict[str, numpy.ndarray]`` (Ray's "numpy" format, what the functions ask for) or
``pandas.DataFrame`` ("pandas"). Ray is imported only by the functions that need it, so this module
imports without it; ``pip install "cpuformer[ray]"`` installs it.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._arguments import check_integer, check_num_threads
from ._model_dir import ModelDir, PathLike
from .arch import KIND_TEXT, find
from .arch.heads import TASK_TEXT, task_of
from .models import Encoder, Generator, Seq2Seq
from .models._tasks import _FUNCTIONS as CLASSIFY_FUNCTIONS
from .weights import check_dtype

#: generate() arguments a dataset column cannot hold (they change what one row's result is).
_REFUSED_GENERATE = {
    "return_scores": "the column holds text",
    "return_log_probs": "the column holds text",
    "return_stats": "the column holds text",
    "num_return_sequences": "one row gets one text",
}
_POOLINGS = (None, "mean", "cls", "max", "last")  # Encoder.embed's
_KIND_CLASSES = {"decoder": Generator, "seq2seq": Seq2Seq}


def _require_ray() -> Any:
    """The ``ray`` package with Ray Data, or an ImportError naming the extra."""
    try:
        import ray
        import ray.data  # noqa: F401  (the Dataset API is a separate module)
    except ImportError as error:
        raise ImportError('cpuformer.ray needs Ray Data (ray[data] >= 2.9): pip install "cpuformer[ray]" '
                          f"({error})") from None
    return ray


def assigned_cpus() -> Optional[int]:
    """The CPUs Ray assigned the calling actor or task, at least 1 (a fraction rounds down); None
    outside a Ray worker (no Ray, Ray not initialised, or the driver)."""
    ray = sys.modules.get("ray")
    if ray is None or not hasattr(ray, "is_initialized") or not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except (AssertionError, RuntimeError):  # the driver: "only available when the process is a worker"
        return None
    return None if cpus is None else max(1, int(cpus))


# ---- the model directory, checked without loading it ---------------------------------------------------

def _peek(model_path: PathLike) -> Tuple[str, str]:
    """(kind, architecture class name) of a model directory, from config.json and the weights'
    headers only (no weight is read)."""
    model_dir = ModelDir(model_path)
    try:
        arch, name = find(model_dir.config)
    finally:
        model_dir.close()
    return arch.kind, name


#: What to use instead, by the kind of model a class was given.
_INSTEAD = {"encoder": "embed it with Embedder, or classify with Classifier (a classification checkpoint)",
            "decoder": "generate with TextGenerator", "seq2seq": "translate with Translator or TextGenerator",
            "vision": "cpuformer.ray runs text models", "clip": "cpuformer.ray runs text models"}


def _check_kind(who: str, model_path: PathLike, kinds: Sequence[str]) -> Tuple[str, str]:
    kind, name = _peek(model_path)
    if kind not in kinds:
        wanted = " or ".join(KIND_TEXT[k] for k in kinds)
        raise ValueError(f"{who} needs {wanted} model; {model_path} holds {name}, {KIND_TEXT[kind]} model "
                         f"({_INSTEAD[kind]})")
    return kind, name


def _check_classifier(model_path: PathLike) -> None:
    _, name = _check_kind("Classifier", model_path, ("encoder",))
    task = task_of(name)
    if task != "sequence_classification":
        has = "no task head" if not task else f"a {TASK_TEXT[task]} head" if task in TASK_TEXT else "its own head"
        raise ValueError(f"Classifier needs a sequence classification checkpoint (a ...ForSequenceClassification "
                         f"class in config.json); {model_path} holds {name}, which has {has}")


def _check_generate_kwargs(who: str, kind: str, kwargs: Mapping[str, Any]) -> None:
    """generate() arguments a dataset run can pass: the model class's own, less those that change
    the result's shape; ValueError / TypeError naming the argument."""
    accepted = inspect.signature(_KIND_CLASSES[kind].generate).parameters
    for key, value in kwargs.items():
        if key in _REFUSED_GENERATE and not (key == "num_return_sequences" and value == 1) and value:
            raise ValueError(f"{who}: generate argument {key}={value!r} is not supported here "
                             f"({_REFUSED_GENERATE[key]})")
        if key not in accepted or key in ("self", "prompts", "sources"):
            raise TypeError(f"{who}: {_KIND_CLASSES[kind].__name__}.generate() has no argument {key!r}")
        if key == "assistant_model" and value is not None and not isinstance(value, str):
            raise TypeError(f"{who}: assistant_model must be a dtype name ('int8', 'int4') or None here; a model "
                            "object cannot be sent to the actors")


# ---- batches -------------------------------------------------------------------------------------------

def _is_pandas(batch: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(batch, pandas.DataFrame)


def _columns(batch: Any) -> List[str]:
    if _is_pandas(batch):
        return [str(c) for c in batch.columns]
    if isinstance(batch, Mapping):
        return [str(c) for c in batch]
    raise TypeError(f"a batch must be a dict of NumPy arrays (batch_format='numpy') or a pandas DataFrame "
                    f"(batch_format='pandas'), got {type(batch).__name__}")


def _texts(batch: Any, column: str, who: str) -> List[str]:
    """The strings of ``batch[column]``; KeyError naming the batch's columns, TypeError naming the
    first row that holds no string."""
    names = _columns(batch)
    if column not in names:
        raise KeyError(f"{who}: the batch has no column {column!r}; its columns: {', '.join(map(repr, names))}")
    values = batch[column]
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    for row, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"{who}: column {column!r} must hold strings; row {row} of the batch holds "
                            f"{type(value).__name__} {value!r:.60}")
    return values


def _with_columns(batch: Any, columns: Dict[str, Any], who: str) -> Any:
    """A new batch: ``batch`` plus ``columns`` (arrays of one row per input row)."""
    names = _columns(batch)
    for name in columns:
        if name in names:
            raise ValueError(f"{who}: the batch already has a column {name!r}; choose another output column name")
    if _is_pandas(batch):
        out = batch.copy(deep=False)
        for name, values in columns.items():
            out[name] = list(values) if isinstance(values, np.ndarray) and values.ndim > 1 else values
        return out
    return {**batch, **columns}


def _check_column_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} must be a non-empty column name (str), got {name!r}")
    return name


class _BatchModel:
    """What the callable classes share: the model opened once (``self.model``), the text column
    and the thread count."""

    _NAME = ""
    _loading = True  # False in check(): every check of the constructor, no model loaded

    @classmethod
    def check(cls, *args: Any, **kwargs: Any) -> None:
        """Raises what constructing ``cls(*args, **kwargs)`` would raise before it loads the model:
        the arguments, the model directory's kind and task (config.json and the weights' headers are
        read, no weight). The dataset functions call it in the calling process, before Ray starts
        any actor."""
        instance = cls.__new__(cls)
        instance._loading = False
        instance.__init__(*args, **kwargs)  # type: ignore[misc]

    def __init__(self, column: str, num_threads: Optional[int], dtype: Optional[str]) -> None:
        self.column = _check_column_name(column, "column")
        check_num_threads(num_threads)
        check_dtype(dtype)
        #: The model's thread count: ``num_threads``, else the CPUs Ray assigned this actor, else
        #: None (the process default, outside Ray).
        self.num_threads = num_threads if num_threads is not None else assigned_cpus()
        self.model: Any = None

    def __call__(self, batch: Any) -> Any:
        texts = _texts(batch, self.column, self._NAME)
        return _with_columns(batch, self._run(texts), self._NAME)

    def _run(self, texts: List[str]) -> Dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        """Frees the model (Ray does so when the actor exits)."""
        if self.model is not None:
            self.model.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, column={self.column!r})"


class Embedder(_BatchModel):
    """``Dataset.map_batches(Embedder, fn_constructor_kwargs={"model_path": ...}, ...)``: adds the
    column ``output``, ``Encoder.embed`` of the strings in ``column`` (float32 [N, D]; one
    D-vector per row).

    model_path: an encoder's model directory (reachable from every node). dtype, quantization:
    as ``cpuformer.load``. num_threads: None uses the CPUs Ray assigned the actor. pooling,
    normalize: as ``Encoder.embed`` (None: the directory's sentence-transformers configuration).
    model_batch_size: sequences per model call within one Ray batch (``embed``'s batch_size)."""

    _NAME = "Embedder"

    def __init__(self, model_path: PathLike, column: str = "text", output: str = "embedding",
                 dtype: Optional[str] = None, num_threads: Optional[int] = None, pooling: Optional[str] = None,
                 normalize: Optional[bool] = None, model_batch_size: int = 32,
                 quantization: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(column, num_threads, dtype)
        self.output = _check_column_name(output, "output")
        if pooling not in _POOLINGS:
            raise ValueError(f"pooling must be None, 'mean', 'cls', 'max' or 'last', got {pooling!r}")
        if normalize not in (None, True, False):
            raise TypeError(f"normalize must be None, True or False, got {normalize!r}")
        self.options = dict(pooling=pooling, normalize=normalize,
                            batch_size=check_integer("model_batch_size", model_batch_size, 1))
        _check_kind("Embedder", model_path, ("encoder",))
        if self._loading:
            self.model = Encoder(model_path, dtype=dtype, num_threads=self.num_threads, head=False,
                                 quantization=quantization)
        self._width: Optional[int] = None

    def _run(self, texts: List[str]) -> Dict[str, Any]:
        if texts:
            vectors = self.model.embed(texts, **self.options)
            self._width = vectors.shape[1]
        else:  # an empty block: the column still has its width
            if self._width is None:
                self._width = self.model.embed([[self.model.pad_token_id]], **self.options).shape[1]
            vectors = np.empty((0, self._width), dtype=np.float32)
        return {self.output: vectors}


class Classifier(_BatchModel):
    """``Dataset.map_batches(Classifier, ...)``: ``Encoder.classify`` of the strings in ``column``
    (or of (``column``, ``pair_column``) pairs) with a sequence-classification checkpoint. Adds
    ``output``, the best label (str), ``score_output``, its score (float64), and with
    ``scores_output`` set, every label's score in ``model.labels`` order (float64 [N, labels]).

    function_to_apply: as ``classify`` ("softmax", "sigmoid", "none"; None: the checkpoint's
    problem type decides). Other arguments as ``Embedder``."""

    _NAME = "Classifier"

    def __init__(self, model_path: PathLike, column: str = "text", output: str = "label",
                 score_output: str = "score", scores_output: Optional[str] = None,
                 pair_column: Optional[str] = None, function_to_apply: Optional[str] = None,
                 dtype: Optional[str] = None, num_threads: Optional[int] = None, model_batch_size: int = 32,
                 quantization: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(column, num_threads, dtype)
        self.output = _check_column_name(output, "output")
        self.score_output = _check_column_name(score_output, "score_output")
        self.scores_output = None if scores_output is None else _check_column_name(scores_output, "scores_output")
        self.pair_column = None if pair_column is None else _check_column_name(pair_column, "pair_column")
        self.function_to_apply = function_to_apply
        self.model_batch_size = check_integer("model_batch_size", model_batch_size, 1)
        if function_to_apply is not None and function_to_apply not in CLASSIFY_FUNCTIONS:
            raise ValueError(f"function_to_apply must be one of {', '.join(map(repr, CLASSIFY_FUNCTIONS))} or None, "
                             f"got {function_to_apply!r}")
        _check_classifier(model_path)
        if not self._loading:
            return
        self.model = Encoder(model_path, dtype=dtype, num_threads=self.num_threads, quantization=quantization)
        labels = self.model.labels
        if self.scores_output is not None and len(set(labels)) != len(labels):
            raise ValueError(f"Classifier: {model_path} has duplicate labels {labels}; scores_output needs distinct "
                             "labels (config.json's id2label)")
        self._index = {label: i for i, label in enumerate(labels)}

    def __call__(self, batch: Any) -> Any:
        texts = _texts(batch, self.column, self._NAME)
        inputs: List[Any] = texts
        if self.pair_column is not None:
            inputs = list(zip(texts, _texts(batch, self.pair_column, self._NAME)))
        return _with_columns(batch, self._run(inputs), self._NAME)

    def _run(self, inputs: List[Any]) -> Dict[str, Any]:
        results = self.model.classify(inputs, top_k=None, function_to_apply=self.function_to_apply,
                                      batch_size=self.model_batch_size) if inputs else []
        columns: Dict[str, Any] = {
            self.output: np.array([r[0]["label"] for r in results], dtype=object),
            self.score_output: np.array([r[0]["score"] for r in results], dtype=np.float64)}
        if self.scores_output is not None:
            scores = np.zeros((len(results), len(self._index)), dtype=np.float64)
            for row, result in enumerate(results):
                for item in result:
                    scores[row, self._index[item["label"]]] = item["score"]
            columns[self.scores_output] = scores
        return columns


class TextGenerator(_BatchModel):
    """``Dataset.map_batches(TextGenerator, ...)``: ``generate`` of a decoder (``cpuformer.Generator``)
    or an encoder-decoder (``cpuformer.Seq2Seq``) on the strings in ``column``; adds ``output``, the
    generated text of each row (str).

    generate_kwargs: ``generate``'s arguments (max_new_tokens, num_beams, do_sample, seed, stop,
    tgt_lang, ...), except those that change a row's result into something else than one text
    (return_scores, return_log_probs, return_stats, num_return_sequences > 1). model_batch_size:
    prompts per generate call. Other arguments as ``Embedder``."""

    _NAME = "TextGenerator"
    _KINDS: Tuple[str, ...] = ("decoder", "seq2seq")

    def __init__(self, model_path: PathLike, column: str = "prompt", output: str = "generated",
                 generate_kwargs: Optional[Mapping[str, Any]] = None, dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, model_batch_size: int = 8,
                 quantization: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(column, num_threads, dtype)
        self.output = _check_column_name(output, "output")
        self.model_batch_size = check_integer("model_batch_size", model_batch_size, 1)
        kind, _ = _check_kind(self._NAME, model_path, self._KINDS)
        self.generate_kwargs = dict(generate_kwargs or {})
        _check_generate_kwargs(self._NAME, kind, self.generate_kwargs)
        if self._loading:
            self.model = _KIND_CLASSES[kind](model_path, dtype=dtype, num_threads=self.num_threads,
                                             quantization=quantization)

    def _run(self, texts: List[str]) -> Dict[str, Any]:
        out: List[str] = []
        for start in range(0, len(texts), self.model_batch_size):
            out += self.model.generate(texts[start:start + self.model_batch_size], **self.generate_kwargs)
        return {self.output: np.array(out, dtype=object)}


class Translator(TextGenerator):
    """``Dataset.map_batches(Translator, ...)``: ``TextGenerator`` for encoder-decoder (translation)
    models only, with the target and source language of multilingual models as arguments
    (``Seq2Seq.generate``'s tgt_lang / src_lang); adds ``output``, the translation of each row."""

    _NAME = "Translator"
    _KINDS = ("seq2seq",)

    def __init__(self, model_path: PathLike, column: str = "text", output: str = "translation",
                 tgt_lang: Optional[str] = None, src_lang: Optional[str] = None,
                 generate_kwargs: Optional[Mapping[str, Any]] = None, dtype: Optional[str] = None,
                 num_threads: Optional[int] = None, model_batch_size: int = 8,
                 quantization: Optional[Mapping[str, Any]] = None) -> None:
        kwargs = dict(generate_kwargs or {})
        for key, value in (("tgt_lang", tgt_lang), ("src_lang", src_lang)):
            if value is not None:
                kwargs[key] = value
        super().__init__(model_path, column, output, kwargs, dtype, num_threads, model_batch_size, quantization)


# ---- the Dataset helpers ---------------------------------------------------------------------------------

def _map(dataset: Any, cls: type, constructor_kwargs: Dict[str, Any], concurrency: Union[int, Tuple[int, int]],
         num_cpus: float, batch_size: Optional[int]) -> Any:
    """``dataset.map_batches(cls, ...)`` with an actor pool of ``concurrency`` actors (or
    (min, max), autoscaling) of ``num_cpus`` CPUs each."""
    ray = _require_ray()
    if not isinstance(dataset, ray.data.Dataset):
        raise TypeError(f"dataset must be a ray.data.Dataset, got {type(dataset).__name__}")
    if isinstance(concurrency, tuple) and len(concurrency) == 2:
        low = check_integer("concurrency[0]", concurrency[0], 1)
        actors = check_integer("concurrency[1]", concurrency[1], low)
        compute = ray.data.ActorPoolStrategy(min_size=low, max_size=actors)
    else:
        actors = check_integer("concurrency", concurrency, 1, note=" or a (min, max) pair")
        compute = ray.data.ActorPoolStrategy(size=actors)
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or not num_cpus > 0:
        raise ValueError(f"num_cpus must be a number > 0, got {num_cpus!r}")
    cluster_cpus = ray.cluster_resources().get("CPU", 0) if ray.is_initialized() else 0
    if cluster_cpus and actors * num_cpus >= cluster_cpus:
        # Not an error: an autoscaling cluster may add nodes, and a dataset built in memory and
        # consumed by take_all has no read or write task.
        warnings.warn(f"{actors} actors of {num_cpus} CPUs take all {cluster_cpus:g} CPUs of the Ray cluster: the "
                      "dataset's read and write tasks need CPUs too and would wait for ever; use fewer actors or "
                      "CPUs per actor (docs/ray.md, 'Leave CPUs for reading and writing')", stacklevel=3)
    if batch_size is not None:
        batch_size = check_integer("batch_size", batch_size, 1, note=" or None")
    schema = dataset.schema(fetch_if_missing=False)  # known without running the pipeline, or None
    if schema is not None:
        names = list(schema.names)
        for key in ("column", "pair_column"):
            column = constructor_kwargs.get(key)
            if column is not None and column not in names:
                raise KeyError(f"the dataset has no column {column!r}; its columns: {', '.join(map(repr, names))}")
        for key in ("output", "score_output", "scores_output"):
            column = constructor_kwargs.get(key)
            if column is not None and column in names:
                raise ValueError(f"the dataset already has a column {column!r}; choose another {key}")
    cls.check(**constructor_kwargs)
    return dataset.map_batches(cls, fn_constructor_kwargs=constructor_kwargs, compute=compute, num_cpus=num_cpus,
                               batch_size=batch_size, batch_format="numpy")


def embed_dataset(dataset: Any, model_path: PathLike, *, column: str = "text", output: str = "embedding",
                  concurrency: Union[int, Tuple[int, int]] = 1, num_cpus: float = 1, batch_size: Optional[int] = 256,
                  **options: Any) -> Any:
    """``dataset`` with the column ``output``: the embedding of each row's ``column``
    (``Embedder``), computed by ``concurrency`` actors of ``num_cpus`` CPUs (each loads the model
    once and runs it on that many threads), ``batch_size`` rows per call. options: the rest of
    ``Embedder``'s arguments (dtype, pooling, normalize, model_batch_size, num_threads,
    quantization). Lazy, as every Ray Dataset transformation: nothing runs until the result is
    consumed (``write_parquet``, ``take_all``, ``iter_batches``, ...)."""
    return _map(dataset, Embedder, dict(model_path=model_path, column=column, output=output, **options),
                concurrency, num_cpus, batch_size)


def classify_dataset(dataset: Any, model_path: PathLike, *, column: str = "text", output: str = "label",
                     concurrency: Union[int, Tuple[int, int]] = 1, num_cpus: float = 1,
                     batch_size: Optional[int] = 256, **options: Any) -> Any:
    """``dataset`` with the best label of each row in ``output`` and its score in ``score_output``
    ("score"); options: the rest of ``Classifier``'s arguments (pair_column, scores_output,
    function_to_apply, ...). The rest as ``embed_dataset``."""
    return _map(dataset, Classifier, dict(model_path=model_path, column=column, output=output, **options),
                concurrency, num_cpus, batch_size)


def generate_dataset(dataset: Any, model_path: PathLike, *, column: str = "prompt", output: str = "generated",
                     concurrency: Union[int, Tuple[int, int]] = 1, num_cpus: float = 1,
                     batch_size: Optional[int] = 64, dtype: Optional[str] = None, num_threads: Optional[int] = None,
                     model_batch_size: int = 8, quantization: Optional[Mapping[str, Any]] = None,
                     **generate_kwargs: Any) -> Any:
    """``dataset`` with the text a decoder or encoder-decoder generates from each row's ``column``
    (``TextGenerator``); generate_kwargs: ``generate``'s arguments (max_new_tokens=64, num_beams=4,
    ...). The rest as ``embed_dataset``."""
    return _map(dataset, TextGenerator,
                dict(model_path=model_path, column=column, output=output, generate_kwargs=generate_kwargs,
                     dtype=dtype, num_threads=num_threads, model_batch_size=model_batch_size,
                     quantization=quantization), concurrency, num_cpus, batch_size)


def translate_dataset(dataset: Any, model_path: PathLike, *, column: str = "text", output: str = "translation",
                      tgt_lang: Optional[str] = None, src_lang: Optional[str] = None,
                      concurrency: Union[int, Tuple[int, int]] = 1, num_cpus: float = 1,
                      batch_size: Optional[int] = 64, dtype: Optional[str] = None, num_threads: Optional[int] = None,
                      model_batch_size: int = 8, quantization: Optional[Mapping[str, Any]] = None,
                      **generate_kwargs: Any) -> Any:
    """``dataset`` with the translation of each row's ``column`` by an encoder-decoder
    (``Translator``; tgt_lang / src_lang for multilingual models); generate_kwargs: ``generate``'s
    arguments (max_new_tokens, num_beams, ...). The rest as ``embed_dataset``."""
    return _map(dataset, Translator,
                dict(model_path=model_path, column=column, output=output, tgt_lang=tgt_lang, src_lang=src_lang,
                     generate_kwargs=generate_kwargs, dtype=dtype, num_threads=num_threads,
                     model_batch_size=model_batch_size, quantization=quantization), concurrency, num_cpus,
                batch_size)


__all__ = ["Classifier", "Embedder", "TextGenerator", "Translator", "assigned_cpus", "classify_dataset",
           "embed_dataset", "generate_dataset", "translate_dataset"]
