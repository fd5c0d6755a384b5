"""The ``cpuformer`` command line.

Every command has ``--help``. User mistakes (a bad path, a bad argument, a directory that holds no
model or the wrong kind of model) end with one line ``cpuformer COMMAND: error: ...`` on stderr
and exit code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from ._arguments import check_prefill_slowdown
from .arch import KIND_TEXT, find, titles
from .models import CLASSES
from .weights import DTYPES, EMBEDDING_DTYPES, GROUP_SIZES

_KIND_COMMAND = {"encoder": "embed", "decoder": "generate", "seq2seq": "translate",
                 "vision": "classify` or `cpuformer embed --images", "clip": "embed` or `cpuformer classify --labels"}


class UserError(Exception):
    """A mistake on the command line: reported as one line, exit code 2."""


# ---- helpers ----------------------------------------------------------------------------------

def _quantization(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """The ``quantization`` argument from --group-size, --zero-point, --lm-head-dtype and
    --embedding-dtype (the ones given), or None."""
    given = {"group_size": getattr(args, "group_size", None), "zero_point": getattr(args, "zero_point", None),
             "lm_head": getattr(args, "lm_head_dtype", None), "embeddings": getattr(args, "embedding_dtype", None)}
    given = {key: value for key, value in given.items() if value is not None}
    return given or None


def _check_model_path(path: str) -> None:
    """UserError unless ``path`` is a directory with a config.json."""
    if not os.path.exists(path):
        raise UserError(f"model directory {path} does not exist")
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a directory (give a Hugging Face model directory)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"{path} is not a model directory: it has no config.json")


def _open_model(path: str, want: str, command: str, dtype: Optional[str] = None, threads: Optional[int] = None,
                quantization: Optional[Dict[str, Any]] = None):
    """Loads the model at ``path``, checking first that it is the kind ``command`` needs."""
    from ._model_dir import ModelDir

    _check_model_path(path)
    model_dir = ModelDir(path)
    try:
        arch, name = find(model_dir.config)
        kind = arch.kind
        if kind != want:
            use = (f"use `cpuformer {_KIND_COMMAND[kind]}`" if kind in _KIND_COMMAND
                   else "no cpuformer command runs it yet; use the Python API, cpuformer.load")
            raise UserError(f"{path} holds {name}, {KIND_TEXT[kind]}; `cpuformer {command}` needs "
                            f"{KIND_TEXT[want]} ({use})")
        return CLASSES[kind](model_dir, dtype=dtype, num_threads=threads, quantization=quantization)
    except BaseException:
        model_dir.close()
        raise


def _model_kind(path: str) -> Any:
    """(the registry kind, the architecture) of the model at ``path`` (kind "encoder", "vision", ...),
    checking the directory first."""
    from ._model_dir import ModelDir

    _check_model_path(path)
    model_dir = ModelDir(path)
    try:
        arch, name = find(model_dir.config)
        return arch.kind, name
    finally:
        model_dir.close()


#: What a directory given to --images is read for (the extensions Pillow reads most commonly).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def _image_paths(items: Sequence[str], option: str) -> List[str]:
    """Image files from paths and directories (a directory: its files with an image extension,
    sorted by name, not recursive). Missing paths and empty directories are UserErrors; a file
    that is not an image fails when it is read."""
    paths: List[str] = []
    for item in items:
        if os.path.isdir(item):
            found = sorted(name for name in os.listdir(item)
                           if name.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(item, name)))
            if not found:
                raise UserError(f"{option} {item}: the directory has no image files "
                                f"({', '.join(IMAGE_EXTENSIONS)})")
            paths.extend(os.path.join(item, name) for name in found)
        elif os.path.isfile(item):
            paths.append(item)
        else:
            raise UserError(f"{option} {item}: no such image file or directory")
    return paths


def _texts(args: argparse.Namespace, keep_blank: bool = False) -> List[str]:
    """The positional texts, or the lines of --file (``-`` is stdin); exactly one of the two.
    Blank lines of --file are dropped, or with keep_blank kept (as they are) so that outputs can
    line up with the input lines."""
    if args.file is not None and args.texts:
        raise UserError("give texts or --file, not both")
    if args.file is None:
        if not args.texts:
            raise UserError("no input: give one or more texts or --file PATH")
        return list(args.texts)
    try:
        if args.file == "-":
            if sys.stdin is None:  # started with stdin closed (`<&-`)
                raise UserError("--file -: standard input is closed")
            lines = sys.stdin.read().splitlines()
        else:
            with open(args.file, encoding="utf-8") as f:
                lines = f.read().splitlines()
    except FileNotFoundError:
        raise UserError(f"--file {args.file} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"--file {args.file} is a directory") from None
    except (OSError, ValueError) as error:  # ValueError: undecodable bytes, a closed stream
        raise UserError(f"--file {args.file}: cannot read ({_one_line(error)})") from None
    if not any(line.strip() for line in lines):
        raise UserError(f"--file {args.file} has no non-empty lines")
    return lines if keep_blank else [line for line in lines if line.strip()]


def _progress(steps: range, desc: str):
    """A progress bar on stderr (tqdm, when installed) for work of more than one step, shown only when
    stderr is a terminal and stdout is not (the bar would otherwise interleave with the output)."""
    if len(steps) < 2 or not sys.stderr.isatty() or sys.stdout.isatty():
        return steps
    from ._bench import progress

    return progress(steps, desc, total=len(steps))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _slowdown(text: str) -> float:
    try:
        return check_prefill_slowdown(_number(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 0 (off) or a number >= 1, got {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# ---- info -------------------------------------------------------------------------------------

def _cmd_info(args: argparse.Namespace) -> int:
    import cpuformer

    info = cpuformer.cpu_info()
    if args.json:
        print(json.dumps({"version": cpuformer.__version__, **info}))
        return 0
    print(f"cpuformer {cpuformer.__version__}")
    print(f"isa:         {info['isa']} (best this CPU supports: {info['best_isa']})")
    print(f"features:    {' '.join(info['features']) or '(none beyond SSE2)'}")
    limit = info["cpu_limit"]
    print(f"num_threads: {info['num_threads']}"
          + (f" (container CPU limit {limit:g})" if limit is not None else ""))
    print("matmul:      " + ", ".join(f"{dtype} {kernel}" for dtype, kernel in info["matmul"].items()))
    return 0


# ---- embed ------------------------------------------------------------------------------------

def _cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    kind, name = _model_kind(args.model_dir)
    if kind == "clip":
        return _embed_clip(args, name)
    if args.images is not None or kind == "vision":
        return _embed_images(args, kind, name)
    if args.pooling == "pooler":
        raise UserError("--pooling pooler is for image models (--images); text models pool with mean, cls, max or "
                        "last")
    args.format = args.format or "json"
    texts: Sequence[Any] = _ids_of(_texts(args)) if args.ids else _texts(args)
    chunk = max(8 * args.batch_size, 256)  # embed() sorts each chunk by length; chunks give a progress bar
    starts = range(0, len(texts), chunk)
    with _open_model(args.model_dir, "encoder", "embed", args.dtype, args.threads, _quantization(args)) as enc:
        parts = [enc.embed(texts[i:i + chunk], pooling=args.pooling, normalize=False if args.no_normalize else None,
                           batch_size=args.batch_size)
                 for i in _progress(starts, "embed")]
    vectors = np.concatenate(parts)
    _write_vectors(args, vectors)
    return 0


def _embed_images(args: argparse.Namespace, kind: str, name: str) -> int:
    """`cpuformer embed MODEL --images DIR_OR_FILES`: pooled image embeddings."""
    import numpy as np

    if kind != "vision":
        raise UserError(f"{args.model_dir} holds {name}, {KIND_TEXT[kind]}; --images needs an image model "
                        f"({titles('vision')})")
    if args.images is None:
        raise UserError(f"{args.model_dir} holds an image model: give the images with --images DIR_OR_FILES "
                        "(it does not embed text)")
    if args.texts or args.file is not None or args.ids:
        raise UserError("--images takes the images; texts, --file and --ids are for text models")
    if args.pooling not in (None, "cls", "mean", "pooler"):
        raise UserError(f"--pooling {args.pooling} is for text models; image models pool with cls (default), "
                        "mean or pooler")
    paths = _image_paths(args.images, "--images")
    args.format = args.format or "npy"
    with _open_model(args.model_dir, "vision", "embed", args.dtype, args.threads, _quantization(args)) as model:
        pooling = args.pooling or getattr(model, "default_pooling", "cls")  # Swin: mean (no CLS token)
        parts = [_numbered(i, lambda part: model.embed(part, pooling=pooling,
                                                       normalize=not args.no_normalize, batch_size=args.batch_size),
                           paths[i:i + args.batch_size])
                 for i in _progress(range(0, len(paths), args.batch_size), "embed")]
    _write_image_vectors(args, paths, np.concatenate(parts))
    return 0


def _write_image_vectors(args: argparse.Namespace, paths: List[str], vectors: Any) -> None:
    """--format npy: the array [N, D]; json: one line {"image", "embedding"} per image."""
    if args.format == "json":
        lines = "".join(json.dumps({"image": path, "embedding": row}) + "\n"
                        for path, row in zip(paths, vectors.tolist()))
        if args.output is None:
            sys.stdout.write(lines)
            sys.stdout.flush()
        else:
            _write(args.output, lambda f: f.write(lines))
        return
    _write_vectors(args, vectors)


def _embed_clip(args: argparse.Namespace, name: str) -> int:
    """`cpuformer embed` on a CLIP checkpoint: image embeddings of --images, or text embeddings of
    the texts (or --file, or --ids), both the projected features, L2-normalized unless --no-normalize."""
    import numpy as np

    if args.pooling is not None:
        raise UserError(f"--pooling is for encoders and image models; {args.model_dir} holds {name}, whose embeddings "
                        "are its projected features (no pooling to choose)")
    images = args.images is not None
    if images and (args.texts or args.file is not None or args.ids):
        raise UserError("give texts (or --file, --ids) or --images, not both: a CLIP model embeds one or the other "
                        "per run")
    if not images and not args.texts and args.file is None:
        raise UserError(f"no input: {args.model_dir} holds {name}; give texts (or --file PATH) to embed texts, or "
                        "--images DIR_OR_FILE to embed images")
    normalize = not args.no_normalize
    with _open_model(args.model_dir, "clip", "embed", args.dtype, args.threads, _quantization(args)) as model:
        if images:
            if not hasattr(model, "embed_images"):
                raise UserError(f"{args.model_dir} holds {name}, CLIP's text tower alone; it does not embed images "
                                "(give texts)")
            paths = _image_paths(args.images, "--images")
            args.format = args.format or "npy"
            parts = [_numbered(i, lambda part: model.embed_images(part, normalize=normalize,
                                                                  batch_size=args.batch_size),
                               paths[i:i + args.batch_size])
                     for i in _progress(range(0, len(paths), args.batch_size), "embed")]
            _write_image_vectors(args, paths, np.concatenate(parts))
            return 0
        if not hasattr(model, "embed_texts"):
            raise UserError(f"{args.model_dir} holds {name}, CLIP's vision tower alone; it does not embed text (give "
                            "the images with --images DIR_OR_FILE)")
        args.format = args.format or "json"
        if args.ids:
            rows = [row for row in _ids_of(_texts(args)) if row is not None]
            vectors = np.concatenate([model.get_text_features(np.array([row], dtype=np.int64))
                                      for row in _progress_items(rows, "embed")])
            if normalize:
                vectors = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
        else:
            texts = _texts(args)
            chunk = max(8 * args.batch_size, 256)
            vectors = np.concatenate([model.embed_texts(texts[i:i + chunk], normalize=normalize,
                                                        batch_size=args.batch_size)
                                      for i in _progress(range(0, len(texts), chunk), "embed")])
    _write_vectors(args, vectors.astype(np.float32, copy=False))
    return 0


def _progress_items(items: List[Any], desc: str) -> Any:
    """The items, with a progress bar (_progress) over them."""
    return (items[i] for i in _progress(range(len(items)), desc))


def _numbered(start: int, run: Callable[[List[str]], Any], paths: List[str]) -> Any:
    """``run(paths)`` on a part of the images that starts at ``start``; its errors name the image by
    its position among all of them."""
    from .models.vision import _renumber

    try:
        return run(paths)
    except (ValueError, TypeError) as error:
        message = _renumber(str(error), start, paths)
        if message == str(error):
            raise
        raise type(error)(message) from None


def _write_vectors(args: argparse.Namespace, vectors: Any) -> None:
    """--format npy / json of the text form: the array [N, D] to --output or stdout."""
    import numpy as np

    if args.format == "npy":
        if args.output is None:
            if sys.stdout.isatty():
                raise UserError("--format npy writes binary data: give --output PATH or redirect stdout")
            np.save(sys.stdout.buffer, vectors)
            sys.stdout.buffer.flush()
        else:
            _write(args.output, lambda f: np.save(f, vectors), binary=True)
        return
    text = json.dumps(vectors.tolist())
    if args.output is None:
        print(text)
    else:
        _write(args.output, lambda f: f.write(text + "\n"))


def _write(path: str, write: Callable[[Any], Any], binary: bool = False) -> None:
    try:
        with open(path, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
    except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError) as error:
        raise UserError(f"cannot write --output {path}: {error.strerror or error}") from None


# ---- generate ---------------------------------------------------------------------------------

def _generation_kwargs(args: argparse.Namespace) -> dict:
    sampling = args.temperature is not None or args.top_k is not None or args.top_p is not None or args.sample
    kwargs = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.min_new_tokens, num_beams=args.num_beams,
                  seed=args.seed)
    if sampling:
        if args.num_beams > 1:
            raise UserError("sampling (--sample, --temperature, --top-k, --top-p) cannot be combined with "
                            "--num-beams > 1")
        kwargs.update(do_sample=True, temperature=1.0 if args.temperature is None else args.temperature,
                      top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p)
    if args.kv_cache_dtype:
        kwargs["kv_cache_dtype"] = args.kv_cache_dtype
    return kwargs


def _cmd_generate(args: argparse.Namespace) -> int:
    kwargs = _generation_kwargs(args)
    prompt = _parse_ids(args.prompt) if args.ids else args.prompt
    out = sys.stdout
    if out is None:  # started with file descriptor 1 closed (`>&-`)
        raise OSError(errno.EBADF, "stdout is closed; nothing can be written")
    if args.draft_dtype and args.assistant_model:
        raise UserError("give --draft-dtype or --assistant-model, not both")
    with _open_model(args.model_dir, "decoder", "generate", args.dtype, args.threads, _quantization(args)) as gen, \
            contextlib.ExitStack() as stack:
        if args.assistant_model:
            kwargs["assistant_model"] = stack.enter_context(
                _open_model(args.assistant_model, "decoder", "generate", None, args.threads))
        elif args.draft_dtype:
            kwargs["assistant_model"] = args.draft_dtype
        if args.prompt_lookup is not None:
            kwargs["prompt_lookup_num_tokens"] = args.prompt_lookup
        if args.echo:
            out.write(" ".join(map(str, prompt)) + " " if args.ids else args.prompt)
            out.flush()
        pieces = gen.stream(prompt, **kwargs)
        for piece in pieces:
            out.write(piece if isinstance(piece, str) else f"{piece} ")
            out.flush()  # stream: each token appears as it is produced
        out.write("\n")
        out.flush()
    return 0


def _parse_ids(text: str, what: str = "the prompt", option: str = "--ids") -> List[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"{option}: {what} must be token ids separated by spaces or commas, got {text!r}") from None
    if not ids:
        raise UserError(f"{option}: {what} holds no token ids")
    return ids


def _ids_of(texts: Sequence[str], option: str = "--ids") -> List[Any]:
    """Each input of _texts() read as token ids ("1 2 3" or "1,2,3"); a blank one (a kept blank
    --file line) stays blank (None)."""
    return [_parse_ids(text, f"input {number}", option) if text.strip() else None
            for number, text in enumerate(texts, 1)]


# ---- chat -------------------------------------------------------------------------------------

_CHAT_HELP = "type a message; /reset clears the history, /exit or Ctrl-D quits, Ctrl-C stops an answer"


def _chat_lines(interactive: bool) -> Callable[[], Optional[str]]:
    """The next line the user typed (without its newline), None at the end of the input."""
    def read() -> Optional[str]:
        if sys.stdin is None:  # started with no stdin (file descriptor 0 closed)
            return None
        if interactive:
            try:
                return input("> ")
            except EOFError:
                return None
        line = sys.stdin.readline()
        return line.rstrip("\r\n") if line else None
    return read


def _chat_session(gen: Any, kwargs: Dict[str, Any], system: Optional[str], read: Callable[[], Optional[str]],
                  out: Any, notes: Any) -> List[Dict[str, str]]:
    """The chat loop: reads a line, streams the reply to ``out``, keeps the history (returned at
    the end). Ctrl-C during an answer stops it (the reply so far stays in the history); at the
    prompt it quits."""
    start = [{"role": "system", "content": system}] if system is not None else []
    history = list(start)
    while True:
        try:
            line = read()
        except KeyboardInterrupt:
            out.write("\n")
            out.flush()
            return history
        if line is None or line.strip() == "/exit":
            return history
        if line.strip() == "/reset":
            history = list(start)
            print("[history cleared]", file=notes, flush=True)
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        reply: List[str] = []
        pieces = None
        try:
            pieces = gen.stream_chat(history, **kwargs)
            for piece in pieces:
                out.write(piece)
                out.flush()  # each piece appears as it is produced
                reply.append(piece)
        except KeyboardInterrupt:
            if pieces is not None:
                pieces.close()  # stops the generation
            out.write("\n")
            out.flush()
            print("[interrupted]", file=notes, flush=True)
            history.append({"role": "assistant", "content": "".join(reply)})
            continue
        except ValueError as error:  # e.g. the conversation outgrew the model's positions
            history.pop()
            print(f"cpuformer chat: error: {_one_line(error)} (/reset clears the history)", file=notes, flush=True)
            continue
        out.write("\n")
        out.flush()
        history.append({"role": "assistant", "content": "".join(reply)})


def _cmd_chat(args: argparse.Namespace) -> int:
    kwargs = _generation_kwargs(args)
    out = sys.stdout
    if out is None:  # started with file descriptor 1 closed (`>&-`)
        raise OSError(errno.EBADF, "stdout is closed; nothing can be written")
    interactive = sys.stdin is not None and sys.stdin.isatty()
    with _open_model(args.model_dir, "decoder", "chat", args.dtype, args.threads, _quantization(args)) as gen:
        # The template, jinja2 and the options are checked before the first line is read (a stream
        # that is never started generates nothing).
        probe = ([{"role": "system", "content": args.system}] if args.system is not None else []) + \
            [{"role": "user", "content": "hello"}]
        try:
            gen.stream_chat(probe, **kwargs).close()
        except ImportError as error:
            raise UserError(str(error)) from None
        if interactive:
            try:
                import readline  # noqa: F401 (line editing and history for input())
            except ImportError:
                pass
            print(f"chatting with {args.model_dir}: {_CHAT_HELP}", file=sys.stderr, flush=True)
        _chat_session(gen, kwargs, args.system, _chat_lines(interactive), out, sys.stderr)
    return 0


# ---- serve ------------------------------------------------------------------------------------

def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from . import serve
        serve._require()  # FastAPI and uvicorn (the serve extra) before the model is loaded
    except ImportError as error:
        raise UserError(str(error)) from None
    kind, name = _model_kind(args.model_dir)
    if kind not in ("decoder", "encoder", "seq2seq"):
        raise UserError(f"{args.model_dir} holds {name}, {KIND_TEXT[kind]}; `cpuformer serve` serves decoders "
                        "(completions, chat), encoder-decoders (completions) and encoders (embeddings; rerank for "
                        "cross-encoders)")
    with _open_model(args.model_dir, kind, "serve", args.dtype, args.threads, _quantization(args)) as model:
        serve.serve(model, host=args.host, port=args.port, model_name=args.model_name, max_batch=args.max_batch,
                    max_queue=args.max_queue, max_body=args.max_body, log_level=args.log_level,
                    max_length=args.max_length, prefill_chunk=args.prefill_chunk, kv_cache_dtype=args.kv_cache_dtype,
                    prefill_slowdown=args.prefill_slowdown, tool_call_parser=args.tool_call_parser)
    return 0


# ---- translate --------------------------------------------------------------------------------

def _cmd_translate(args: argparse.Namespace) -> int:
    # One output line per input line, in order: a blank input line (--file) gives a blank output
    # line without running the model; outputs are printed as soon as every line before them is.
    texts = _texts(args, keep_blank=True)
    sources: Sequence[Any] = _ids_of(texts) if args.ids else texts
    todo = [i for i, text in enumerate(texts) if text.strip()]
    kwargs = _generation_kwargs(args)
    kwargs.update(tgt_lang=args.tgt_lang, src_lang=args.src_lang)
    done: Dict[int, str] = {}
    printed = 0

    def flush() -> None:
        nonlocal printed
        while printed < len(texts) and (printed in done or not texts[printed].strip()):
            print(done.pop(printed, ""), flush=True)
            printed += 1

    with _open_model(args.model_dir, "seq2seq", "translate", args.dtype, args.threads, _quantization(args)) as s2s:
        for start in _progress(range(0, len(todo), args.batch_size), "translate"):
            batch = todo[start:start + args.batch_size]
            results = s2s.generate([sources[i] for i in batch], return_scores=True, **kwargs)
            # token ids in, token ids out; --scores: a tab and the sequence score after each output
            outputs = [(" ".join(map(str, r.token_ids)) if args.ids else str(r.text).replace("\n", " ")) +
                       (f"\t{r.score:.6g}" if args.scores else "") for r in results]
            done.update(zip(batch, outputs))
            flush()
    return 0


# ---- task heads -------------------------------------------------------------------------------

#: task -> the command that runs it, and what the messages call a model with that head.
_TASK_COMMAND = {"sequence_classification": "classify` or `cpuformer rerank", "token_classification": "tag",
                 "question_answering": "answer", "masked_lm": "fill-mask"}


def _open_task_model(args: argparse.Namespace, command: str, task: str):
    """Loads an encoder with the task head ``command`` needs, and its tokenizer.json."""
    from .arch.heads import TASK_TEXT

    model = _open_model(args.model_dir, "encoder", command, args.dtype, args.threads, _quantization(args))
    try:
        if model.task != task:
            if model.task is None:
                other = "an encoder without a task head (use `cpuformer embed` for sentence embeddings)"
            else:
                other = (f"a {TASK_TEXT[model.task]} head (use `cpuformer {_TASK_COMMAND[model.task]}`)")
            raise UserError(f"{args.model_dir} holds {model.architecture}, {other}; `cpuformer {command}` needs a "
                            f"{TASK_TEXT[task]} head")
        if not model._has_tokenizer() and not args.ids:
            raise UserError(f"{args.model_dir} has no tokenizer.json; `cpuformer {command}` needs it to read text "
                            "(or give token ids with --ids)")
        return model
    except BaseException:
        model.close()
        raise


def _print_json_lines(rows: Sequence[Any]) -> None:
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))
    sys.stdout.flush()


def _run_in_chunks(texts: Sequence[Any], batch_size: int, command: str, run: Callable[[List[Any]], List[Any]]) -> None:
    """Runs ``run`` on chunks of the inputs (a progress bar per chunk) and prints one JSON line per
    input, in input order."""
    chunk = max(8 * batch_size, 256)  # each call sorts its inputs by length; chunks give a progress bar
    for start in _progress(range(0, len(texts), chunk), command):
        _print_json_lines(run(list(texts[start:start + chunk])))


def _cmd_classify(args: argparse.Namespace) -> int:
    kind, name = _model_kind(args.model_dir)
    if kind == "clip":
        return _classify_clip(args, name)
    for option, value in (("--labels", args.labels), ("--hypothesis-template", args.hypothesis_template)):
        if value is not None:
            raise UserError(f"{option} is for CLIP models (zero-shot image classification); {args.model_dir} holds "
                            f"{name}, {KIND_TEXT[kind]}, which classifies with its own labels")
    if kind == "vision":
        return _classify_images(args)
    if args.top_k is None:
        args.top_k = 1
    if args.ids:
        from .models import _id_tasks

        sequences = _ids_of(_texts(args))
        with _open_task_model(args, "classify", "sequence_classification") as model:
            _run_in_chunks(sequences, args.batch_size, "classify",
                           lambda chunk: _id_tasks.classify(model, chunk, args.top_k or None, args.function,
                                                           args.batch_size))
        return 0
    texts = _texts(args)
    with _open_task_model(args, "classify", "sequence_classification") as model:
        _run_in_chunks(texts, args.batch_size, "classify",
                       lambda chunk: model.classify(chunk, top_k=args.top_k or None, function_to_apply=args.function,
                                                    batch_size=args.batch_size))
    return 0


def _classify_images(args: argparse.Namespace) -> int:
    """`cpuformer classify` on an image classifier: one JSON line per image file."""
    if args.ids or args.function is not None:
        raise UserError(f"{args.model_dir} holds an image classifier; --ids and --function are for text classifiers")
    items = _image_files(args, "an image classifier")  # the positional paths, or the lines of --file
    top_k = 5 if args.top_k is None else args.top_k
    with _open_model(args.model_dir, "vision", "classify", args.dtype, args.threads, _quantization(args)) as model:
        if not hasattr(model, "classify"):
            raise UserError(f"{args.model_dir} holds {model.architecture}, an image model without a classification "
                            "head; `cpuformer classify` needs an image classifier (use `cpuformer embed --images`)")
        for start in _progress(range(0, len(items), args.batch_size), "classify"):
            paths = items[start:start + args.batch_size]
            results = _numbered(start, lambda part: model.classify(part, top_k=top_k or model.num_labels,
                                                                   batch_size=args.batch_size), paths)
            _print_json_lines([{"image": path, "labels": [{"label": label, "score": score} for label, score in row]}
                               for path, row in zip(paths, results)])
    return 0


#: transformers' zero-shot-image-classification pipeline's default hypothesis_template.
HYPOTHESIS_TEMPLATE = "This is a photo of {}."


def _image_files(args: argparse.Namespace, holds: str) -> List[str]:
    """The positional image files (or the lines of --file) of `classify` on an image model."""
    items = _texts(args)
    for item in items:
        if not os.path.isfile(item):
            what = "a directory" if os.path.isdir(item) else "no such file"
            raise UserError(f"{item}: {what}; {args.model_dir} holds {holds}: give image files (it does not "
                            "classify text)")
    return items


def _classify_clip(args: argparse.Namespace, name: str) -> int:
    """`cpuformer classify CLIP_DIR IMAGE... --labels L1 L2 ...`: zero-shot classification as
    transformers' zero-shot-image-classification pipeline (hypothesis "This is a photo of {}.",
    softmax over the labels of exp(logit_scale) · cosine); one JSON line per image."""
    if args.ids or args.function is not None:
        raise UserError(f"{args.model_dir} holds {name}, a CLIP model; --ids and --function are for text classifiers")
    if not args.labels:
        raise UserError(f"{args.model_dir} holds {name}, a CLIP model: zero-shot classification needs the candidate "
                        "labels, --labels LABEL [LABEL ...] (after the image files)")
    template = HYPOTHESIS_TEMPLATE if args.hypothesis_template is None else args.hypothesis_template
    items = _image_files(args, f"{name}, a CLIP model")
    top_k = 5 if args.top_k is None else args.top_k
    labels = list(args.labels)
    with _open_model(args.model_dir, "clip", "classify", args.dtype, args.threads, _quantization(args)) as model:
        if not hasattr(model, "_zero_shot"):
            raise UserError(f"{args.model_dir} holds {name}, one CLIP tower; zero-shot classification needs both "
                            "(a full CLIP checkpoint)")
        text_embeds = model.embed_texts(model._hypotheses(labels, template), batch_size=args.batch_size)
        k = min(top_k or len(labels), len(labels))
        for start in _progress(range(0, len(items), args.batch_size), "classify"):
            paths = items[start:start + args.batch_size]
            results = _numbered(start, lambda part: model._zero_shot(part, labels, text_embeds, k, args.batch_size),
                                paths)
            _print_json_lines([{"image": path, "labels": [{"label": label, "score": score} for label, score in row]}
                               for path, row in zip(paths, results)])
    return 0


def _cmd_rerank(args: argparse.Namespace) -> int:
    import numpy as np

    from .models import _id_tasks

    passages: Sequence[Any]
    if args.ids:  # the query and each passage are token ids, joined as query + passage
        query, passages = _parse_ids(args.query, "--query"), _ids_of(_texts(args))
    else:
        passages = _texts(args)

    def score(model: Any, part: List[Any]) -> Any:
        if args.ids:
            return _id_tasks.score(model, query, part, args.batch_size)
        return model.score([(args.query, p) for p in part], batch_size=args.batch_size)

    with _open_task_model(args, "rerank", "sequence_classification") as model:
        if len(model.labels) != 1:
            raise UserError(f"{args.model_dir} has {len(model.labels)} labels; `cpuformer rerank` needs a "
                            "cross-encoder with one score per pair (use `cpuformer classify`)")
        chunk = max(8 * args.batch_size, 256)
        scores = np.concatenate([score(model, list(passages[i:i + chunk]))
                                 for i in _progress(range(0, len(passages), chunk), "rerank")])
    order = np.argsort(-scores, kind="stable")[:args.top_k or None]
    _print_json_lines([{"index": int(i), "score": float(scores[i]), "ids" if args.ids else "text": passages[i]}
                       for i in order])
    return 0


def _cmd_tag(args: argparse.Namespace) -> int:
    ignore = [label for label in args.ignore_labels.split(",") if label]
    if args.ids:  # a label per given token: without text there are no words or offsets to group by
        from .models import _id_tasks

        if args.aggregation not in (None, "none"):
            raise UserError(f"--ids labels each token (--aggregation none); --aggregation {args.aggregation} "
                            "groups tokens into words, which needs text and the tokenizer")
        if args.stride is not None:
            raise UserError("--ids reads each input whole; --stride needs text (the tokenizer cuts the windows)")
        sequences = _ids_of(_texts(args))
        with _open_task_model(args, "tag", "token_classification") as model:
            _run_in_chunks(sequences, args.batch_size, "tag",
                           lambda chunk: _id_tasks.tag(model, chunk, ignore, args.batch_size))
        return 0
    texts = _texts(args)
    aggregation = "simple" if args.aggregation is None else args.aggregation
    with _open_task_model(args, "tag", "token_classification") as model:
        _run_in_chunks(texts, args.batch_size, "tag",
                       lambda chunk: model.tag(chunk, aggregation_strategy=aggregation, ignore_labels=ignore,
                                               stride=args.stride, batch_size=args.batch_size))
    return 0


def _cmd_answer(args: argparse.Namespace) -> int:
    pairs = _question_pairs(args)
    if args.ids:  # question and context token ids, joined as question + context; spans are token positions
        from .models import _id_tasks

        if args.doc_stride is not None:
            raise UserError("--ids reads each question and context whole; --doc-stride needs text (the tokenizer "
                            "cuts the windows)")
        id_pairs = [(_parse_ids(question, f"the question of input {number}"),
                     _parse_ids(context, f"the context of input {number}"))
                    for number, (question, context) in enumerate(pairs, 1)]
        with _open_task_model(args, "answer", "question_answering") as model:
            _run_in_chunks(id_pairs, args.batch_size, "answer",
                           lambda chunk: _id_tasks.answer(model, chunk, args.top_k, args.max_answer_len,
                                                         args.handle_impossible, args.batch_size))
        return 0
    options = dict(top_k=args.top_k, doc_stride=args.doc_stride, max_answer_len=args.max_answer_len,
                   handle_impossible_answer=args.handle_impossible, batch_size=args.batch_size)
    with _open_task_model(args, "answer", "question_answering") as model:
        _run_in_chunks(pairs, args.batch_size, "answer", lambda chunk: model.answer(chunk, **options))
    return 0


def _question_pairs(args: argparse.Namespace) -> List[Any]:
    """(question, context) pairs: --question with --context or --context-file, or the JSON lines of
    --file ({"question": ..., "context": ...} each)."""
    if args.file is not None:
        if args.question is not None or args.context is not None or args.context_file is not None:
            raise UserError("give --file, or --question with --context / --context-file, not both")
        pairs = []
        for number, line in enumerate(_texts(argparse.Namespace(file=args.file, texts=[])), 1):
            try:
                item = json.loads(line)
            except ValueError:
                item = None
            if not isinstance(item, dict) or not isinstance(item.get("question"), str) or \
                    not isinstance(item.get("context"), str):
                raise UserError(f"--file {args.file}: line {number} is not a JSON object with string fields "
                                '"question" and "context"')
            pairs.append((item["question"], item["context"]))
        return pairs
    if args.question is None:
        raise UserError("no input: give --question with --context or --context-file, or --file PATH")
    if (args.context is None) == (args.context_file is None):
        raise UserError("give the context with --context TEXT or --context-file PATH (one of the two)")
    context = args.context
    if args.context_file is not None:
        try:
            if args.context_file == "-":
                if sys.stdin is None:
                    raise UserError("--context-file -: standard input is closed")
                context = sys.stdin.read()
            else:
                with open(args.context_file, encoding="utf-8") as f:
                    context = f.read()
        except FileNotFoundError:
            raise UserError(f"--context-file {args.context_file} does not exist") from None
        except IsADirectoryError:
            raise UserError(f"--context-file {args.context_file} is a directory") from None
        except (OSError, ValueError) as error:
            raise UserError(f"--context-file {args.context_file}: cannot read ({_one_line(error)})") from None
    return [(args.question, context)]


def _cmd_fill_mask(args: argparse.Namespace) -> int:
    if args.mask_id is not None and not args.ids:
        raise UserError("--mask-id goes with --ids (a text names its mask token as text)")
    if args.ids:  # token ids that hold the mask id once; prints token ids
        from .models import _id_tasks

        sequences = _ids_of(_texts(args))
        with _open_task_model(args, "fill-mask", "masked_lm") as model:
            mask = args.mask_id
            if mask is None:
                if not model._has_tokenizer():
                    raise UserError(f"{args.model_dir} has no tokenizer.json to name the mask token; give its id "
                                    "with --mask-id N")
                mask = _id_tasks.mask_id(model)
            _run_in_chunks(sequences, args.batch_size, "fill-mask",
                           lambda chunk: _id_tasks.fill_mask(model, chunk, mask, args.top_k, args.batch_size))
        return 0
    texts = _texts(args)
    with _open_task_model(args, "fill-mask", "masked_lm") as model:
        _run_in_chunks(texts, args.batch_size, "fill-mask",
                       lambda chunk: model.fill_mask(chunk, top_k=args.top_k, batch_size=args.batch_size))
    return 0


# ---- tokenize ---------------------------------------------------------------------------------

def _cmd_tokenize(args: argparse.Namespace) -> int:
    from . import _sentence
    from ._tokenizer_dir import open_tokenizer

    inputs: Sequence[Any] = _texts(args)
    if args.decode:
        inputs = _ids_of(inputs, "--decode")
    path = args.model_dir
    _check_model_path(path)
    # The tokenizer alone: no weights are read (a sentence-transformers directory's lowercasing as
    # Encoder.tokenizer applies it).
    tokenizer = open_tokenizer(path)
    if tokenizer is None:
        raise UserError(f"{path} has no tokenizer (tokenizer.json or SentencePiece model)")
    if tokenizer.backend is not None and _sentence.read_do_lower_case(path):
        _sentence.lowercase_tokenizer(tokenizer.backend)
    if args.decode:
        for number, ids in enumerate(inputs, 1):
            unknown = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
            if unknown:
                raise UserError(f"input {number}: token id {unknown[0]} is not in the tokenizer's vocabulary "
                                f"(ids 0 to {tokenizer.vocab_size - 1})")
        texts = tokenizer.decode_batch(inputs, skip_special_tokens=args.no_special_tokens)
        rows = [{"ids": ids, "text": text} for ids, text in zip(inputs, texts)]
    else:
        sequences = tokenizer.encode_batch(inputs, add_special_tokens=not args.no_special_tokens)
        rows = [{"ids": ids, "tokens": [tokenizer.id_to_token(t) for t in ids], "count": len(ids)}
                for ids in sequences]
    _print_json_lines(rows)
    return 0


# ---- convert ----------------------------------------------------------------------------------

def _cmd_convert(args: argparse.Namespace) -> int:
    import cpuformer

    if not os.path.exists(args.src):
        raise UserError(f"model directory {args.src} does not exist")
    if not os.path.isdir(args.src):
        raise UserError(f"{args.src} is not a directory (give a Hugging Face model directory)")
    if not os.path.isfile(os.path.join(args.src, "config.json")):
        raise UserError(f"{args.src} is not a model directory: it has no config.json")
    if os.path.realpath(args.src) == os.path.realpath(args.dst):
        raise UserError("DST must differ from SRC")
    if os.path.exists(args.dst) and not os.path.isdir(args.dst):
        raise UserError(f"{args.dst} exists and is not a directory")
    convert = getattr(cpuformer, "convert", None)
    if convert is None:
        raise UserError(f"this cpuformer build ({cpuformer.__version__}) has no converter (cpuformer.convert)")
    extra = {"pack": False} if args.no_pack else {}
    convert(args.src, args.dst, args.dtype, progress=True, quantization=_quantization(args), **extra)
    print(f"wrote {args.dst} ({args.dtype})")
    return 0


def _cmd_pack(args: argparse.Namespace) -> int:
    from .models._packed import write_packed_file

    if not os.path.isdir(args.model_dir):
        raise UserError(f"{args.model_dir} is not a directory (give a directory written by `cpuformer convert`)")
    if not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        raise UserError(f"{args.model_dir} is not a model directory: it has no config.json")
    try:
        path = write_packed_file(args.model_dir)
    except (ValueError, RuntimeError, OSError) as error:  # not converted, damaged, not writable
        raise UserError(str(error)) from None
    print(f"wrote {path}")
    return 0


# ---- bench ------------------------------------------------------------------------------------

def _cmd_bench(args: argparse.Namespace) -> int:
    from . import _bench

    compare: List[str] = []
    if args.compare:
        for name in (s.strip() for s in args.compare.split(",")):
            if name in ("pytorch", "transformers"):
                name = "torch"
            if name in ("ct2",):
                name = "ctranslate2"
            if name not in _bench.PEERS:
                raise UserError(f"--compare: unknown engine {name!r}; choose from {', '.join(_bench.PEERS)}")
            if name not in compare:
                compare.append(name)
    kinds = _bench.MODEL_KINDS if args.model_kind == "all" else (args.model_kind,)
    payload: Any
    if args.model_kind == "kernels":
        if args.dtype != "float32" or compare:
            raise UserError("--model-kind kernels takes neither --dtype nor --compare (it compares with NumPy)")
        rows = _bench.run_kernel_bench(quick=args.quick, show_progress=True)
        print(_bench.format_table(rows))
        payload = rows
    else:
        if args.threads is not None:
            from . import set_num_threads

            set_num_threads(args.threads)
        missing = [p for p in compare if not _bench.peers_available()[p]]
        for name in missing:
            print(f"cpuformer bench: {name} is not installed; skipping it", file=sys.stderr)
        rows = _bench.run_model_bench(kinds, quick=args.quick, dtype=args.dtype,
                                      compare=[p for p in compare if p not in missing], threads=args.threads,
                                      cache=args.cache_dir)
        print(_bench.format_model_table(rows, args.threads))
        ours = [r for r in rows if r["engine"] == "cpuformer"]
        if not any("tok_per_s" in r for r in ours):
            raise UserError(ours[0].get("skipped", "nothing was measured").removeprefix("failed: "))
        import cpuformer

        payload = {"cpuformer": cpuformer.__version__, "machine": cpuformer.cpu_info(), "quick": args.quick,
                   "rows": rows}
    if args.json:
        _write(args.json, lambda f: json.dump(payload, f, indent=2))
    return 0


# ---- the parser -------------------------------------------------------------------------------

class _VersionAction(argparse.Action):
    """``--version``: imports cpuformer only when asked (the version is compiled into _core)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import cpuformer

        print(f"cpuformer {cpuformer.__version__}")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line (argparse prints the usage first), exit code 2
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_quantization_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group-size", type=int, default=None, choices=GROUP_SIZES,
                   help="int4: input channels per scale (default 32)")
    p.add_argument("--zero-point", action="store_true", default=None,
                   help="int4: a zero point per group (asymmetric; default symmetric)")
    p.add_argument("--lm-head-dtype", default=None, choices=DTYPES,
                   help="dtype of the LM head and task heads (default: the model's dtype; int8 under int4)")
    p.add_argument("--embedding-dtype", default=None, choices=EMBEDDING_DTYPES,
                   help="storage of the token-embedding table (default float32; int8 under int4)")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="weight dtype in memory (default: float32, or the dtype a converted directory stores)")
    _add_quantization_options(p)
    p.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="threads (default: OMP_NUM_THREADS, else the CPUs this process may use)")


def _add_text_inputs(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("texts", nargs="*", metavar="TEXT", help=f"{what} (or use --file)")
    p.add_argument("--file", metavar="PATH", help="read one input per non-empty line of PATH ('-': stdin)")


def _add_ids_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--ids", action="store_true",
                   help=f"{what} (e.g. '101 7592 102' or '101,7592,102'; used as given, no tokenizer needed)")


def _add_generation_options(p: argparse.ArgumentParser, default_new: int) -> None:
    p.add_argument("--max-new-tokens", type=_non_negative_int, default=default_new, metavar="N",
                   help=f"most tokens to generate (default {default_new})")
    p.add_argument("--min-new-tokens", type=_non_negative_int, default=0, metavar="N",
                   help="fewest tokens to generate before EOS may end the output (default 0)")
    p.add_argument("--num-beams", type=_positive_int, default=1, metavar="K", help="beam search width (default 1)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding (implied by the "
                   "three options below)")
    p.add_argument("--temperature", type=_number, default=None, metavar="T", help="sampling temperature (> 0)")
    p.add_argument("--top-k", type=_non_negative_int, default=None, metavar="K",
                   help="sample from the K most likely tokens (0: all)")
    p.add_argument("--top-p", type=_number, default=None, metavar="P", help="nucleus sampling mass in (0, 1]")
    p.add_argument("--seed", type=_non_negative_int, default=None, metavar="S",
                   help="random seed for sampling (default: random)")
    p.add_argument("--kv-cache-dtype", default=None, choices=("float32", "float16", "bfloat16", "int8"),
                   help="the KV cache's element type (default float32; docs/precision.md, 'KV cache')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cpuformer", description="Fast CPU inference for transformer models.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    info = sub.add_parser("info", help="version, ISA level in use, CPU features, threads",
                          description="Prints the version, the ISA level in use, CPU features and threads.")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)

    embed = sub.add_parser("embed", help="sentence or image embeddings (JSON or .npy)",
                           description="Sentence embeddings [N, hidden] of texts with an encoder model directory "
                                       f"({titles('encoder')}; needs tokenizer.json unless --ids), or image "
                                       f"embeddings of --images with an image model ({titles('vision')}; needs "
                                       "preprocessor_config.json); a CLIP model embeds texts or --images.")
    embed.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    _add_text_inputs(embed, "texts to embed")
    embed.add_argument("--images", nargs="+", metavar="DIR_OR_FILE",
                       help="image model: embed these image files, or the image files of these directories (sorted "
                            "by name)")
    embed.add_argument("--pooling", choices=("mean", "cls", "max", "last", "pooler"), default=None,
                       help="token pooling (text: default the sentence-transformers configuration, else mean; images: "
                            "cls (default; Swin: mean), mean of the patch tokens, or pooler)")
    embed.add_argument("--no-normalize", action="store_true",
                       help="do not L2-normalise the embeddings (default: as configured, else normalised)")
    embed.add_argument("--format", choices=("json", "npy"), default=None,
                       help="json: a list of lists on stdout (images: one JSON line per image); npy: a NumPy .npy "
                            "file (default for --images; json for texts)")
    embed.add_argument("--output", "-o", metavar="PATH", help="write to PATH instead of stdout")
    embed.add_argument("--batch-size", type=_positive_int, default=32, metavar="N",
                       help="sequences (images) per batch")
    _add_ids_option(embed, "each input is token ids, special tokens included")
    _add_model_options(embed)
    embed.set_defaults(func=_cmd_embed)

    cls = sub.add_parser("classify", help="text or image classification (JSON lines)",
                         description="Classifies each text with an encoder checkpoint that has a sequence "
                                     "classification head (...ForSequenceClassification; needs tokenizer.json "
                                     "unless --ids), as transformers' text-classification pipeline: one JSON line "
                                     'per input, a list of {"label", "score"}, best first. With an image '
                                     "classifier (...ForImageClassification; needs preprocessor_config.json) the "
                                     'inputs are image files: one line {"image", "labels"} per image; with a CLIP '
                                     "model, image files and --labels (zero-shot).")
    cls.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    _add_text_inputs(cls, "texts (or image files) to classify")
    cls.add_argument("--top-k", type=_non_negative_int, default=None, metavar="K",
                     help="labels per input (default 1 for texts, 5 for images; 0: all)")
    cls.add_argument("--function", choices=("softmax", "sigmoid", "none"), default=None,
                     help="score function (default: as the pipeline, from the config's problem_type and labels)")
    cls.add_argument("--batch-size", type=_positive_int, default=32, metavar="N", help="texts (images) per batch")
    cls.add_argument("--labels", nargs="+", metavar="LABEL", default=None,
                     help="CLIP: the candidate labels of zero-shot classification (give them after the image files)")
    cls.add_argument("--hypothesis-template", metavar="TEMPLATE", default=None,
                     help=f"CLIP: the text each label is put into (default {HYPOTHESIS_TEMPLATE!r}, as transformers' "
                          "zero-shot-image-classification pipeline; '{}': the label alone)")
    _add_ids_option(cls, "each input is token ids, special tokens included")
    _add_model_options(cls)
    cls.set_defaults(func=_cmd_classify)

    rerank = sub.add_parser("rerank", help="rerank passages for a query with a cross-encoder (JSON lines)",
                            description="Scores (query, passage) pairs with a cross-encoder (a "
                                        "...ForSequenceClassification checkpoint with one label; needs "
                                        "tokenizer.json unless --ids), as sentence-transformers' "
                                        "CrossEncoder.predict, and prints the passages best first: one JSON line "
                                        '{"index", "score", "text"} each (index: the passage\'s position in the '
                                        "input).")
    rerank.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    rerank.add_argument("--query", required=True, metavar="TEXT", help="the query")
    _add_text_inputs(rerank, "passages")
    rerank.add_argument("--top-k", type=_non_negative_int, default=0, metavar="K",
                        help="print only the K best passages (default 0: all)")
    rerank.add_argument("--batch-size", type=_positive_int, default=32, metavar="N", help="pairs per batch")
    _add_ids_option(rerank, "--query and each passage are token ids, joined as query + passage (token types 0 "
                    "then 1; include the special tokens: '[CLS] query [SEP]' and 'passage [SEP]'); prints ids")
    _add_model_options(rerank)
    rerank.set_defaults(func=_cmd_rerank)

    tag = sub.add_parser("tag", help="token classification: named entities, parts of speech (JSON lines)",
                         description="Tags the tokens of each text with an encoder checkpoint that has a token "
                                     "classification head (...ForTokenClassification; needs tokenizer.json unless "
                                     "--ids), as transformers' token-classification pipeline: one JSON line per "
                                     'input, a list of entities {"entity_group", "score", "word", "start", "end"} '
                                     '(with --aggregation none: {"entity", "score", "index", "word", "start", "end"} '
                                     "per token); start and end are character offsets in the text.")
    tag.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    _add_text_inputs(tag, "texts to tag")
    tag.add_argument("--aggregation", choices=("none", "simple", "first", "average", "max"), default=None,
                     help="how tokens are grouped into entities (default simple; with --ids: none)")
    tag.add_argument("--ignore-labels", default="O", metavar="LABELS",
                     help="comma-separated labels to leave out (default O; '' keeps every label)")
    tag.add_argument("--stride", type=_non_negative_int, default=None, metavar="N",
                     help="read texts longer than the model in windows overlapping by N tokens (default: "
                          "truncate them)")
    tag.add_argument("--batch-size", type=_positive_int, default=32, metavar="N", help="windows per batch")
    _add_ids_option(tag, "each input is token ids; prints a label per token "
                    '({"entity", "score", "index", "token"}; no words or offsets)')
    _add_model_options(tag)
    tag.set_defaults(func=_cmd_tag)

    answer = sub.add_parser("answer", help="extractive question answering (JSON lines)",
                            description="Finds the answer to a question in a context with an encoder checkpoint "
                                        "that has a question answering head (...ForQuestionAnswering; needs "
                                        "tokenizer.json unless --ids), as transformers' question-answering "
                                        'pipeline: one JSON line per question, {"score", "start", "end", "answer"} '
                                        "(a list of them with --top-k > 1); start and end are character offsets in "
                                        "the context. "
                                        "A long context is read in overlapping windows.")
    answer.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    answer.add_argument("--question", metavar="TEXT", help="the question")
    answer.add_argument("--context", metavar="TEXT", help="the text that holds the answer")
    answer.add_argument("--context-file", metavar="PATH", help="read the context from PATH ('-': stdin)")
    answer.add_argument("--file", metavar="PATH", help='JSON lines {"question": ..., "context": ...}, one '
                        "question per line ('-': stdin)")
    answer.add_argument("--top-k", type=_positive_int, default=1, metavar="K", help="answers per question (default 1)")
    answer.add_argument("--doc-stride", type=_non_negative_int, default=None, metavar="N",
                        help="tokens of overlap between the windows of a long context (default "
                             "min(window // 2, 128))")
    answer.add_argument("--max-answer-len", type=_positive_int, default=15, metavar="N",
                        help="longest answer in tokens (default 15)")
    answer.add_argument("--handle-impossible", action="store_true",
                        help='also offer the empty answer ("no answer in the context")')
    answer.add_argument("--batch-size", type=_positive_int, default=32, metavar="N", help="windows per batch")
    _add_ids_option(answer, "question and context are token ids, joined as question + context (token types 0 "
                    "then 1; include the special tokens); start and end are token positions in the context "
                    "and answer its ids")
    _add_model_options(answer)
    answer.set_defaults(func=_cmd_answer)

    fill = sub.add_parser("fill-mask", help="fill the mask token of each text with a masked LM (JSON lines)",
                          description="Predicts the mask token ([MASK] or <mask>; exactly one per text) with an "
                                      "encoder checkpoint that has a masked-LM head (...ForMaskedLM; needs "
                                      "tokenizer.json unless --ids), as transformers' fill-mask pipeline: one "
                                      'JSON line per input, a list of {"score", "token", "token_str", "sequence"}, '
                                      "best first.")
    fill.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    _add_text_inputs(fill, "texts with one mask token each")
    fill.add_argument("--top-k", type=_positive_int, default=5, metavar="K", help="fillings per text (default 5)")
    fill.add_argument("--batch-size", type=_positive_int, default=32, metavar="N", help="texts per batch")
    _add_ids_option(fill, "each input is token ids holding the mask id once; prints token ids")
    fill.add_argument("--mask-id", type=_non_negative_int, default=None, metavar="ID",
                      help="with --ids: the mask token's id (default: the tokenizer's mask token)")
    _add_model_options(fill)
    fill.set_defaults(func=_cmd_fill_mask)

    gen = sub.add_parser("generate", help="generate text from a prompt, streamed as it is produced",
                         description=f"Continues PROMPT with a decoder model directory ({titles('decoder')}; "
                                     "needs its tokenizer unless --ids: tokenizer.json or SentencePiece files), "
                                     "writing tokens to stdout "
                                     "as they are produced. Greedy unless sampling options are given.")
    gen.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    gen.add_argument("prompt", metavar="PROMPT", help="the prompt text")
    _add_generation_options(gen, 64)
    gen.add_argument("--ids", action="store_true", help="PROMPT is token ids (e.g. '1 2 3'); prints token ids")
    gen.add_argument("--echo", action="store_true", help="print the prompt before the generated text")
    gen.add_argument("--draft-dtype", default=None, choices=("int8", "int4", "float16", "bfloat16"),
                     help="speculative decoding with the model's own weights at this dtype as the draft")
    gen.add_argument("--assistant-model", metavar="DIR", default=None,
                     help="speculative decoding with this smaller decoder (same tokenizer) as the draft")
    gen.add_argument("--prompt-lookup", type=_positive_int, default=None, metavar="K",
                     help="speculative decoding with up to K draft tokens copied from the prompt's n-grams")
    _add_model_options(gen)
    gen.set_defaults(func=_cmd_generate)

    chat = sub.add_parser("chat", help="chat with a model in the terminal (its chat template; needs jinja2)",
                          description=f"An interactive chat with a decoder model directory ({titles('decoder')}; "
                                      "needs its tokenizer and a chat template, and jinja2: pip install "
                                      "'cpuformer[chat]'). Reads a message per line from stdin and streams each "
                                      f"reply; {_CHAT_HELP}. Greedy unless sampling options are given.")
    chat.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    chat.add_argument("--system", metavar="TEXT", default=None, help="a system message that starts the conversation")
    _add_generation_options(chat, 256)
    _add_model_options(chat)
    chat.set_defaults(func=_cmd_chat)

    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server for a model (needs cpuformer[serve])",
                         description="Serves a decoder (/v1/completions, /v1/chat/completions), an "
                                     "encoder-decoder (/v1/completions: translation, summarization) or an encoder "
                                     "(/v1/embeddings; a cross-encoder also /v1/rerank) model directory over an "
                                     "OpenAI-compatible HTTP API, with "
                                     "/v1/models, /health and /metrics (docs/serving.md). Needs FastAPI and "
                                     "uvicorn: pip install \"cpuformer[serve]\".")
    srv.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=_non_negative_int, default=8000, help="port (default 8000)")
    srv.add_argument("--model-name", default=None, metavar="NAME",
                     help="the model id clients name (default: the directory's name)")
    srv.add_argument("--max-batch", type=_positive_int, default=32, metavar="N",
                     help="decoders: most sequences decoded together (KV-cache slots); encoders: most embedding "
                          "inputs batched into one model call (default 32)")
    srv.add_argument("--max-length", type=_positive_int, default=None, metavar="N",
                     help="decoders: longest prompt + completion of a request, in tokens (default: the model's "
                          "context); the KV cache holds max-batch × max-length positions")
    srv.add_argument("--prefill-chunk", type=_positive_int, default=64, metavar="N",
                     help="decoders: most prompt tokens computed per step, so running streams keep their pace "
                          "(default 64)")
    srv.add_argument("--prefill-slowdown", type=_slowdown, default=2.0, metavar="S",
                     help="decoders: while sequences decode, a step takes only as many prompt tokens as keep it "
                          "within about S times a decode-only step of every request present, measured as the "
                          "server runs (at least 4; lower: steadier inter-token latency, later first tokens; "
                          "0: always up to --prefill-chunk; default 2)")
    srv.add_argument("--kv-cache-dtype", default=None, choices=("float32", "float16", "bfloat16", "int8"),
                     help="decoders: the KV cache's element type (default float32)")
    srv.add_argument("--tool-call-parser", default="auto", choices=("auto", "none", "hermes", "llama3_json", "mistral"),
                     help="the format chat replies write tool calls in (default auto: read off the chat template)")
    srv.add_argument("--max-queue", type=_positive_int, default=64, metavar="N",
                     help="most requests waiting for the model; more are answered 429 (default 64)")
    srv.add_argument("--max-body", type=_positive_int, default=10 * 1024 * 1024, metavar="BYTES",
                     help="largest request body; larger ones are answered 413 (default 10 MiB)")
    srv.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                     help="uvicorn's log level (default info)")
    _add_model_options(srv)
    srv.set_defaults(func=_cmd_serve)

    tr = sub.add_parser("translate", help="seq2seq generation (translation, summarisation), one line per input",
                        description=f"Runs an encoder-decoder model directory ({titles('seq2seq')}; needs "
                                    "its tokenizer unless --ids: tokenizer.json or SentencePiece files) on each input "
                                    "and prints one output line per input, in order.")
    tr.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    _add_text_inputs(tr, "source texts")
    _add_generation_options(tr, 128)
    tr.add_argument("--batch-size", type=_positive_int, default=16, metavar="N", help="sources per batch")
    _add_ids_option(tr, "each source is token ids, special tokens included; prints token ids per line")
    tr.add_argument("--tgt-lang", metavar="CODE", default=None,
                    help="target language of a multilingual model: NLLB fra_Latn, mBART-50 fr_XX, M2M100 fr, "
                         "Marian fra")
    tr.add_argument("--src-lang", metavar="CODE", default=None,
                    help="source language (NLLB, mBART-50, M2M100): the sources are encoded with its code")
    tr.add_argument("--scores", action="store_true",
                    help="append a tab and each output's score: beam search's length-normalised score "
                         "(transformers' sequences_scores), else the sum of the tokens' log-probabilities")
    _add_model_options(tr)
    tr.set_defaults(func=_cmd_translate)

    tok = sub.add_parser("tokenize", help="text to token ids and tokens, or ids back to text (JSON lines)",
                         description="Runs the tokenizer of a model directory (model.tokenizer, as the other "
                                     'commands use it) on each input: one JSON line {"ids", "tokens", "count"} '
                                     'per text, or with --decode {"ids", "text"} per line of token ids.')
    tok.add_argument("model_dir", metavar="MODEL_DIR", help="Hugging Face model directory")
    _add_text_inputs(tok, "texts (with --decode: token ids such as '101 7592 102')")
    tok.add_argument("--decode", action="store_true", help="each input is token ids; print its text")
    tok.add_argument("--no-special-tokens", action="store_true",
                     help="encoding: add no special tokens ([CLS]/[SEP], BOS/EOS); --decode: leave special tokens "
                          "out of the text (default: keep them)")
    tok.set_defaults(func=_cmd_tokenize)

    conv = sub.add_parser("convert", help="store a model's weights in another dtype",
                          description="Writes a copy of the model directory SRC to DST with weights stored as "
                                      "--dtype (with a progress bar).")
    conv.add_argument("src", metavar="SRC", help="Hugging Face model directory")
    conv.add_argument("dst", metavar="DST", help="output directory")
    conv.add_argument("--dtype", required=True, choices=("int8", "int4", "float16", "bfloat16", "float32"),
                      help="stored weight dtype (float32: full precision plus the graph manifest the C API opens)")
    _add_quantization_options(conv)
    conv.add_argument("--no-pack", action="store_true",
                      help="write no packed weights for this machine (cpuformer_packed.<level>.bin: loading maps "
                           "them instead of packing; `cpuformer pack DST` adds them later)")
    conv.set_defaults(func=_cmd_convert)

    pack = sub.add_parser("pack", help="store a converted directory's weights packed for this machine",
                          description="Writes MODEL_DIR/cpuformer_packed.<level>.bin: the weights of the converted "
                                      "text model MODEL_DIR packed for this machine's ISA level (CPUFORMER_ISA "
                                      "applies), so loading it here maps them instead of packing. Replaces that "
                                      "level's file; other levels' files are kept.")
    pack.add_argument("model_dir", metavar="MODEL_DIR", help="a directory written by `cpuformer convert`")
    pack.set_defaults(func=_cmd_pack)

    bench = sub.add_parser("bench", help="benchmark standard-shape models with random weights (no download)",
                           description="Builds standard-shape models with seeded random weights (BERT-base, "
                                       "GPT-2 124M, Marian base; --quick: small shapes of the same "
                                       "architectures), cached under $CPUFORMER_CACHE (default "
                                       "~/.cache/cpuformer), and reports sequences/s and tokens/s. --compare "
                                       "runs PyTorch (transformers) and CTranslate2 on the same weights when "
                                       "installed.")
    bench.add_argument("--quick", action="store_true", help="small shapes and few repeats (well under a minute)")
    bench.add_argument("--model-kind", default="all", choices=("all", "encoder", "decoder", "seq2seq", "kernels"),
                       help="what to benchmark (default all model kinds; kernels: GEMM and attention vs NumPy)")
    bench.add_argument("--dtype", default="float32", choices=DTYPES, help="cpuformer weight dtype (default float32)")
    bench.add_argument("--compare", metavar="ENGINES", default="",
                       help="comma-separated peers to run as well: torch, ctranslate2 (skipped when not installed)")
    bench.add_argument("--threads", type=_positive_int, default=None, metavar="N", help="threads for every engine")
    bench.add_argument("--cache-dir", metavar="PATH", default=None,
                       help="where the random-weight models are kept (default $CPUFORMER_CACHE or ~/.cache/cpuformer)")
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse takes the positional texts only before the first option (`rerank M --query Q p1
        # p2` leaves p1 p2 over); texts after an option are texts too, in their order.
        if getattr(args, "texts", None) is not None and not any(e.startswith("-") for e in extra):
            args.texts = list(args.texts) + extra
        else:
            parser.parse_args(argv)  # reports the unrecognized arguments
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"cpuformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `cpuformer generate ... | head`
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except (UserError, ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError,
            IsADirectoryError, PermissionError, NotImplementedError, OverflowError) as error:
        # The library reports every bad argument, file or config value as one of these (a value
        # beyond a C++ field's range as ValueError, checked before it reaches pybind11).
        print(f"cpuformer {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except OSError as error:  # not the user's mistake (disk full, I/O error): still one line, exit code 1
        print(f"cpuformer {args.command}: error: {_one_line(error)}", file=sys.stderr)
        return 1


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
