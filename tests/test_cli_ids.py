"""``--ids`` on every command that reads text (token ids in place of text, no tokenizer needed) and
``cpuformer tokenize``: each against the Python API on the same token sequences (the text methods
on the texts the ids encode, or the model's logits), on test_cli.py's tiny models.

The commands run in this process through ``cli.main`` (as ``python -m cpuformer`` runs them), which
keeps the file fast; test_cli.py runs the command line in subprocesses."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import types

import numpy as np
import pytest
import test_cli
from test_cli import HEAD_TEXTS, MASKED, TEXTS, assert_user_error

import cpuformer as cf
from cpuformer import cli

tiny = test_cli.tiny  # test_cli.py's fixtures: tiny NumPy-written models with WordLevel tokenizers "t0".."t199"
heads = test_cli.heads  # and tiny random BERT task-head checkpoints with the all-MiniLM-L6-v2 tokenizer


def run(*args, stdin=None):
    """``cpuformer ARGS`` in this process: (returncode, stdout, stderr) as test_cli.run_cli gives them."""
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as done:  # argparse's own errors
            code = done.code
        return types.SimpleNamespace(returncode=code, stdout=sys.stdout.getvalue(), stderr=sys.stderr.getvalue())
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


def json_lines(out):
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def ids_text(ids):
    return " ".join(map(str, ids))


def without_tokenizer(directory, target):
    """A copy of a model directory (weights linked) without its tokenizer files."""
    os.makedirs(target)
    for name in os.listdir(directory):
        if name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            continue
        source = os.path.join(directory, name)
        if name.endswith(".json"):
            shutil.copyfile(source, os.path.join(target, name))
        else:
            os.symlink(source, os.path.join(target, name))
    return target


# ---- help ---------------------------------------------------------------------------------------

def test_help_shows_ids_and_tokenize():
    for command in ("embed", "translate", "generate", "classify", "rerank", "tag", "answer", "fill-mask"):
        out = run(command, "--help")
        assert out.returncode == 0 and "--ids" in out.stdout, command
    assert "--mask-id" in run("fill-mask", "--help").stdout
    out = run("tokenize", "--help")
    assert out.returncode == 0 and "--decode" in out.stdout and "--no-special-tokens" in out.stdout
    assert "tokenize" in run("--help").stdout


# ---- the ids parser -------------------------------------------------------------------------------

def test_ids_are_separated_by_spaces_or_commas(tiny):
    with cf.Encoder(tiny["encoder"]) as enc:
        expected = enc.embed([[5, 6, 7], [9, 10]])
    got = np.array(json.loads(run("embed", tiny["encoder"], "--ids", "5,6, 7", " 9  10 ").stdout), dtype=np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_ids_errors(tiny):
    assert_user_error(run("embed", tiny["encoder"], "--ids", "5 6", "t5 t6"), "embed",
                      "--ids: input 2 must be token ids separated by spaces or commas, got 't5 t6'")
    assert_user_error(run("classify", tiny["encoder"], "--ids", "5 6", "1.5"), "classify",
                      "--ids: input 2 must be token ids")
    assert_user_error(run("embed", tiny["encoder"], "--ids", "5 200"), "embed", "200", "vocab")
    assert_user_error(run("embed", tiny["encoder"], "--ids", "--file", "-", stdin=" \n\n"), "embed",
                      "--file - has no non-empty lines")
    too_long = ids_text(range(3, 3 + 70))  # the tiny encoder has 64 positions
    assert_user_error(run("embed", tiny["encoder"], "--ids", too_long), "embed", "70", "64")
    # generate keeps its own wording
    assert_user_error(run("generate", tiny["decoder"], "five", "--ids"), "generate",
                      "--ids: the prompt must be token ids separated by spaces or commas, got 'five'")


# ---- embed, translate ---------------------------------------------------------------------------

def test_embed_ids_without_tokenizer_matches_the_api(tiny, tmp_path):
    bare = without_tokenizer(tiny["encoder"], tmp_path / "bare")
    sequences = [[5, 6, 7], [9, 10], [11, 12, 13, 14, 15]]
    lines = tmp_path / "ids.txt"
    lines.write_text("\n".join(map(ids_text, sequences)) + "\n")
    out = run("embed", bare, "--ids", "--file", lines, "--pooling", "cls", "--no-normalize")
    with cf.Encoder(tiny["encoder"]) as enc:
        expected = enc.embed(sequences, pooling="cls", normalize=False)
    np.testing.assert_allclose(np.array(json.loads(out.stdout), dtype=np.float32), expected, rtol=1e-6, atol=1e-7)
    assert_user_error(run("embed", bare, "t5"), "embed", "has no tokenizer.json", "pass lists of token ids")


def test_translate_ids_one_line_of_ids_per_input(tiny, tmp_path):
    sources = [[5, 6, 7, 0], [9, 10, 0], [11, 12, 13, 14, 15, 0]]
    bare = without_tokenizer(tiny["seq2seq"], tmp_path / "bare")
    lines = tmp_path / "sources.txt"
    lines.write_text(f"{ids_text(sources[0])}\n\n{ids_text(sources[1])}\n  \n{ids_text(sources[2])}\n")
    out = run("translate", bare, "--ids", "--file", lines, "--max-new-tokens", 5, "--batch-size", 2)
    assert out.returncode == 0, out.stderr
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        expected = s2s.generate(sources, max_new_tokens=5)
    assert all(expected)
    assert out.stdout.split("\n") == [ids_text(expected[0]), "", ids_text(expected[1]), "", ids_text(expected[2]), ""]
    beams = run("translate", bare, "--ids", *map(ids_text, sources), "--max-new-tokens", 5, "--num-beams", 2)
    with cf.Seq2Seq(tiny["seq2seq"]) as s2s:
        assert beams.stdout.splitlines() == [ids_text(s) for s in s2s.generate(sources, max_new_tokens=5,
                                                                                num_beams=2)]
    from_stdin = run("translate", bare, "--ids", "--file", "-", "--max-new-tokens", 5,
                     stdin=f"{ids_text(sources[0])}\n\n{ids_text(sources[1])}\n")
    assert from_stdin.stdout.split("\n") == [ids_text(expected[0]), "", ids_text(expected[1]), ""]
    assert_user_error(run("translate", bare, "--ids", "5 6", "hello"), "translate", "--ids: input 2 must be token ids")
    assert_user_error(run("translate", bare, "--ids", "--file", "-", stdin="5 6\n\nfive\n"), "translate",
                      "--ids: input 3 must be token ids")  # input numbers count --file lines, blank ones too
    assert_user_error(run("translate", bare, "hello"), "translate",
                      "has no tokenizer (tokenizer.json or SentencePiece model)", "pass token ids")


# ---- encoder task heads ---------------------------------------------------------------------------

def _encode(path, texts, add_special_tokens=True):
    with cf.load(path) as model:
        return [model.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]


def test_classify_ids_match_the_text_results(heads, tmp_path):
    sequences = _encode(heads["classify"], HEAD_TEXTS)
    bare = without_tokenizer(heads["classify"], tmp_path / "bare")
    got = json_lines(run("classify", bare, "--ids", *map(ids_text, sequences), "--top-k", 0, "--batch-size", 2))
    single = json_lines(run("classify", bare, "--ids", ids_text(sequences[0]), "--function", "sigmoid"))
    with cf.load(heads["classify"]) as model:
        expected = model.classify(HEAD_TEXTS, top_k=None)
        expected_single = model.classify(HEAD_TEXTS[0], function_to_apply="sigmoid")
    assert [[r["label"] for r in row] for row in got] == [[r["label"] for r in row] for row in expected]
    np.testing.assert_allclose([[r["score"] for r in row] for row in got],
                               [[r["score"] for r in row] for row in expected], rtol=1e-5)
    assert [r["label"] for r in single[0]] == [r["label"] for r in expected_single]
    np.testing.assert_allclose(single[0][0]["score"], expected_single[0]["score"], rtol=1e-5)
    assert_user_error(run("classify", bare, "Great film!"), "classify", "has no tokenizer.json",
                      "(or give token ids with --ids)")


def test_rerank_ids_join_query_and_passage(heads, tmp_path):
    query = "how do plants make energy"
    passages = ["Plants turn light into energy.", "The market fell.", "Photosynthesis happens in leaves."]
    query_ids = _encode(heads["rerank"], [query])[0]  # [CLS] query [SEP]
    sep = query_ids[-1]
    passage_ids = [ids + [sep] for ids in _encode(heads["rerank"], passages, add_special_tokens=False)]
    bare = without_tokenizer(heads["rerank"], tmp_path / "bare")
    got = json_lines(run("rerank", bare, "--ids", "--query", ids_text(query_ids), *map(ids_text, passage_ids)))
    with cf.load(heads["rerank"]) as model:
        scores = model.score([(query, p) for p in passages])
    order = list(np.argsort(-scores, kind="stable"))
    assert [row["index"] for row in got] == order
    assert [row["ids"] for row in got] == [passage_ids[i] for i in order]
    np.testing.assert_allclose([row["score"] for row in got], scores[order], rtol=1e-5)
    assert_user_error(run("rerank", bare, "--ids", "--query", "how", ids_text(passage_ids[0])), "rerank",
                      "--ids: --query must be token ids separated by spaces or commas, got 'how'")


def test_tag_ids_label_every_token(heads, tmp_path):
    sequences = _encode(heads["tag"], HEAD_TEXTS)
    bare = without_tokenizer(heads["tag"], tmp_path / "bare")
    got = json_lines(run("tag", bare, "--ids", *map(ids_text, sequences), "--ignore-labels", ""))
    with cf.load(heads["tag"]) as model:
        expected = model.tag(HEAD_TEXTS, aggregation_strategy="none", ignore_labels=[])
    for row, ids, text_row in zip(got, sequences, expected):
        assert [e["index"] for e in row] == list(range(len(ids)))
        assert [e["token"] for e in row] == ids
        assert set(row[0]) == {"entity", "score", "index", "token"}
        inner = row[1:-1]  # the text method leaves out [CLS] and [SEP]
        assert [(e["entity"], e["index"]) for e in inner] == [(e["entity"], e["index"]) for e in text_row]
        np.testing.assert_allclose([e["score"] for e in inner], [e["score"] for e in text_row], rtol=1e-5)
    ignored = json_lines(run("tag", bare, "--ids", *map(ids_text, sequences), "--ignore-labels", "O,B-PER"))
    assert ignored == [[e for e in row if e["entity"] not in ("O", "B-PER")] for row in got]
    assert any(len(a) < len(b) for a, b in zip(ignored, got))
    assert json_lines(run("tag", bare, "--ids", ids_text(sequences[0]), "--aggregation", "none")) == \
        json_lines(run("tag", bare, "--ids", ids_text(sequences[0]), "--ignore-labels", "O"))
    assert_user_error(run("tag", bare, "--ids", "101 102", "--aggregation", "first"), "tag",
                      "--ids labels each token (--aggregation none); --aggregation first groups tokens into words")
    assert_user_error(run("tag", bare, "--ids", "101 102", "--stride", 4), "tag",
                      "--ids reads each input whole; --stride needs text")


def _best_span(model, question, context, max_answer_len):
    """The best (score, start, end) of a context by brute force over the start/end probabilities."""
    start_logits, end_logits = model.logits([question + context],
                                            token_type_ids=[[0] * len(question) + [1] * len(context)])
    allowed = np.zeros(len(question) + len(context), dtype=bool)
    allowed[len(question):] = allowed[0] = True

    def probabilities(logits):
        masked = np.where(allowed, logits[0].astype(np.float64), -10000.0)
        e = np.exp(masked - masked.max())
        return e / e.sum()

    p_start, p_end = probabilities(start_logits), probabilities(end_logits)
    spans = [(p_start[s] * p_end[e], s - len(question), e - len(question) + 1)
             for s in range(len(question), len(allowed)) for e in range(s, min(s + max_answer_len, len(allowed)))]
    return max(spans), p_start[0] * p_end[0]


def test_answer_ids_spans_are_token_positions(heads, tmp_path):
    question_text, context_text = "Where did they meet?", "Ada Lovelace met Charles Babbage in London in 1833."
    question = _encode(heads["answer"], [question_text])[0]  # [CLS] question [SEP]
    context = _encode(heads["answer"], [context_text], add_special_tokens=False)[0] + [question[-1]]
    bare = without_tokenizer(heads["answer"], tmp_path / "bare")
    got = json_lines(run("answer", bare, "--ids", "--question", ids_text(question), "--context", ids_text(context),
                         "--max-answer-len", 4))
    with cf.load(heads["answer"]) as model:
        (score, start, end), null = _best_span(model, question, context, 4)
    assert got == [{"score": pytest.approx(score, rel=1e-5), "start": start, "end": end,
                    "answer": context[start:end]}]
    assert end - start <= 4
    top = json_lines(run("answer", bare, "--ids", "--question", ids_text(question), "--context", ids_text(context),
                         "--max-answer-len", 4, "--top-k", 3, "--handle-impossible"))[0]
    assert len(top) == 3 and top[0]["start"] == start and top[0]["end"] == end
    assert [a["score"] for a in top] == sorted((a["score"] for a in top), reverse=True)
    assert all(a["answer"] == context[a["start"]:a["end"]] for a in top)
    impossible = json_lines(run("answer", bare, "--ids", "--question", ids_text(question), "--context",
                                ids_text(context), "--handle-impossible", "--top-k", 500))[0]
    assert {"score": pytest.approx(null, rel=1e-5), "start": 0, "end": 0, "answer": []} in impossible
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": ids_text(question), "context": ids_text(context)}) + "\n" +
                         json.dumps({"question": ids_text(question), "context": ids_text(context[3:])}) + "\n")
    batch = json_lines(run("answer", bare, "--ids", "--file", questions, "--max-answer-len", 4))
    assert batch[0] == got[0] and len(batch) == 2
    assert_user_error(run("answer", bare, "--ids", "--question", ids_text(question), "--context", "Ada met Babbage"),
                      "answer", "--ids: the context of input 1 must be token ids")
    assert_user_error(run("answer", bare, "--ids", "--question", ids_text(question), "--context", ids_text(context),
                          "--doc-stride", 8), "answer", "--ids reads each question and context whole; --doc-stride "
                      "needs text")
    assert_user_error(run("answer", bare, "--ids", "--question", ids_text(question), "--context",
                          ids_text(context * 6)), "answer", "--ids: question + context 1 has", "more than the "
                      "model's 64 positions")


def test_fill_mask_ids_print_ids(heads, tmp_path):
    sequences = _encode(heads["fill-mask"], MASKED)
    got = json_lines(run("fill-mask", heads["fill-mask"], "--ids", *map(ids_text, sequences), "--top-k", 3))
    with cf.load(heads["fill-mask"]) as model:
        expected = model.fill_mask(MASKED, top_k=3)
        mask = model.tokenizer.token_to_id("[MASK]")
    assert [[r["token"] for r in row] for row in got] == [[r["token"] for r in row] for row in expected]
    np.testing.assert_allclose([[r["score"] for r in row] for row in got],
                               [[r["score"] for r in row] for row in expected], rtol=1e-5)
    assert set(got[0][0]) == {"score", "token", "sequence"}
    for row, ids in zip(got, sequences):
        for r in row:
            assert r["sequence"] == [r["token"] if t == mask else t for t in ids]
    bare = without_tokenizer(heads["fill-mask"], tmp_path / "bare")
    assert json_lines(run("fill-mask", bare, "--ids", *map(ids_text, sequences), "--top-k", 3,
                          "--mask-id", mask)) == got
    assert_user_error(run("fill-mask", bare, "--ids", ids_text(sequences[0])), "fill-mask",
                      "has no tokenizer.json to name the mask token; give its id with --mask-id N")
    assert_user_error(run("fill-mask", bare, "--ids", "101 2003 102", "--mask-id", mask), "fill-mask",
                      f"--ids: input 1 must hold the mask id {mask} exactly once, found it 0 times")
    assert_user_error(run("fill-mask", heads["fill-mask"], MASKED[0], "--mask-id", mask), "fill-mask",
                      "--mask-id goes with --ids")


# ---- tokenize -------------------------------------------------------------------------------------

def test_tokenize_prints_ids_tokens_and_count(heads, tiny, tmp_path):
    texts = ["Paris is the capital of France.", "Hello"]
    got = json_lines(run("tokenize", heads["fill-mask"], *texts))
    with cf.load(heads["fill-mask"]) as model:
        tokenizer = model.tokenizer
        expected = [{"ids": tokenizer.encode(t), "tokens": tokenizer.tokens(t, add_special_tokens=True),
                     "count": tokenizer.count(t)} for t in texts]
        plain = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        decoded = [tokenizer.decode(e["ids"], skip_special_tokens=False) for e in expected]
        decoded_plain = [tokenizer.decode(e["ids"]) for e in expected]
    assert got == expected and expected[0]["tokens"][0] == "[CLS]"
    assert [row["ids"] for row in json_lines(run("tokenize", heads["fill-mask"], *texts,
                                                 "--no-special-tokens"))] == plain
    back = json_lines(run("tokenize", heads["fill-mask"], "--decode", "--file", "-",
                          stdin="\n".join(ids_text(e["ids"]) for e in expected)))
    assert back == [{"ids": e["ids"], "text": text} for e, text in zip(expected, decoded)]
    assert back[0]["text"].startswith("[CLS] paris")
    assert [row["text"] for row in json_lines(run("tokenize", heads["fill-mask"], "--decode", "--no-special-tokens",
                                                  *(ids_text(e["ids"]) for e in expected)))] == decoded_plain
    for kind in ("decoder", "seq2seq"):  # every model kind has model.tokenizer
        with cf.load(tiny[kind]) as model:
            assert json_lines(run("tokenize", tiny[kind], *TEXTS))[1] == {
                "ids": model.tokenizer.encode(TEXTS[1]), "tokens": model.tokenizer.tokens(TEXTS[1], True),
                "count": model.tokenizer.count(TEXTS[1])}


def test_tokenize_errors(heads, tmp_path):
    assert_user_error(run("tokenize", heads["fill-mask"], "--decode", "101 x"), "tokenize",
                      "--decode: input 1 must be token ids separated by spaces or commas, got '101 x'")
    assert_user_error(run("tokenize", heads["fill-mask"], "--decode", "101 40000"), "tokenize",
                      "input 1: token id 40000 is not in the tokenizer's vocabulary (ids 0 to 30521)")
    assert_user_error(run("tokenize", tmp_path / "missing", "x"), "tokenize", "does not exist")
    assert_user_error(run("tokenize", tmp_path, "x"), "tokenize", "it has no config.json")
    bare = without_tokenizer(heads["fill-mask"], tmp_path / "bare")
    assert_user_error(run("tokenize", bare, "x"), "tokenize", "tokenizer.json")
    assert_user_error(run("tokenize", heads["fill-mask"]), "tokenize", "no input")
