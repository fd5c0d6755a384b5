"""The command line's user-error path: bad values found by the library (beyond int64, corrupt
tokenizer or generation files), a closed stdin for ``--file -`` end in one line on stderr and exit
code 2; a conversion interrupted during its write leaves nothing behind (or, killed outright, a
hidden directory the next conversion removes); a symbolic link as DST is followed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import test_cli
from test_cli import PACKAGE_PARENT, assert_user_error, run_cli

import cpuformer as cf

tiny = test_cli.tiny  # the fixture of test_cli.py: its tiny model directories


def _copy(source, target, **files):
    """A copy of the model directory ``source`` (weights linked) with ``files`` {name: text} replaced."""
    os.makedirs(target)
    for name in os.listdir(source):
        if name.endswith(".json"):
            with open(os.path.join(source, name), "rb") as f, open(os.path.join(target, name), "wb") as out:
                out.write(f.read())
        else:
            os.symlink(os.path.join(source, name), os.path.join(target, name))
    for name, text in files.items():
        with open(os.path.join(target, name), "w") as f:
            f.write(text)
    return str(target)


def test_file_from_closed_stdin(tiny):
    out = run_cli("embed", tiny["encoder"], "--file", "-", preexec_fn=lambda: os.close(0))
    assert_user_error(out, "embed", "--file -: standard input is closed")


def test_integers_beyond_int64(tiny):
    huge = 10 ** 30
    assert_user_error(run_cli("generate", tiny["decoder"], "t1 t2", "--max-new-tokens", huge), "generate",
                      f"max_new_tokens must be an integer >= 0 and <= 2**63 - 1, got {huge}")
    assert_user_error(run_cli("translate", tiny["seq2seq"], "t1 t2", "--num-beams", 2 ** 64), "translate",
                      f"num_beams must be an integer >= 1 and <= 2**63 - 1, got {2 ** 64}")
    assert_user_error(run_cli("embed", tiny["encoder"], "t1 t2", "--threads", 2 ** 40), "embed",
                      f"num_threads must be an integer >= 1 and <= 1024 or None, got {2 ** 40}")
    assert_user_error(run_cli("generate", tiny["decoder"], "--ids", f"1 {2 ** 64}"), "generate",
                      f"prompt token ids: token id {2 ** 64} is out of range; token ids must be in [0, 200)")


def test_corrupt_model_files(tiny, tmp_path):
    broken_tokenizer = _copy(tiny["decoder"], tmp_path / "tokenizer", **{"tokenizer.json": "{nope"})
    assert_user_error(run_cli("generate", broken_tokenizer, "t1 t2", "--max-new-tokens", 2), "generate",
                      "tokenizer.json: not a valid tokenizer file (")
    broken_generation = _copy(tiny["seq2seq"], tmp_path / "generation",
                              **{"generation_config.json": json.dumps({"eos_token_id": "abc"})})
    assert_user_error(run_cli("translate", broken_generation, "t1 t2"), "translate",
                      "generation_config.json: 'eos_token_id' must be a token id or a list of token ids")


def test_convert_onto_a_symlink_to_an_empty_directory(tiny, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    out = run_cli("convert", tiny["decoder"], link, "--dtype", "int8")
    assert out.returncode == 0, out.stderr
    assert link.is_symlink() and os.path.isfile(target / "model.safetensors")
    with cf.load(link) as gen:
        assert gen.dtype == "int8"
    assert not [name for name in os.listdir(tmp_path) if ".partial-" in name]


# A `cpuformer convert` that stops inside its write phase (after the weights file is written) and
# says so on stdout, so that the test can signal it there.
_STOPS_WHILE_WRITING = """
import importlib, sys, time
from cpuformer import cli
convert = importlib.import_module("cpuformer.weights")  # the module convert() lives in
write = convert.save_safetensors
def write_then_wait(*args, **kwargs):
    write(*args, **kwargs)
    print("writing", flush=True)
    time.sleep(600)
convert.save_safetensors = write_then_wait
sys.exit(cli.main(sys.argv[1:]))
"""


def _convert_signalled(source, destination, signum):
    environment = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with subprocess.Popen([sys.executable, "-c", _STOPS_WHILE_WRITING, "convert", source, str(destination),
                           "--dtype", "int8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=environment) as child:
        try:
            assert child.stdout.readline() == "writing\n", child.stderr.read()
            child.send_signal(signum)
            _, stderr = child.communicate(timeout=120)
        finally:
            child.kill()  # (no-op once it has ended)
    return child.returncode, stderr


def _partials(directory):
    return sorted(name for name in os.listdir(directory) if ".partial-" in name)


def test_convert_interrupted_while_writing_leaves_nothing(tiny, tmp_path):
    """SIGTERM (exit status 143, as if killed by it) and Ctrl-C (130) during the write."""
    for signum, returncode in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)):
        code, stderr = _convert_signalled(tiny["decoder"], tmp_path / "out", signum)
        assert code == returncode, stderr
        assert "Traceback" not in stderr
        assert os.listdir(tmp_path) == []


def test_convert_killed_while_writing_is_cleaned_up_next_time(tiny, tmp_path):
    """SIGKILL leaves the hidden directory; the next conversion into the same directory removes it,
    but not one named after a live process (a conversion running now)."""
    code, _ = _convert_signalled(tiny["decoder"], tmp_path / "out", signal.SIGKILL)
    assert code == -signal.SIGKILL
    leftover = _partials(tmp_path)
    assert len(leftover) == 1 and leftover[0].startswith(".out.partial-")
    running = tmp_path / f".other.partial-{os.getppid()}-0123abcd"  # the parent: alive
    running.mkdir()
    cf.convert(tiny["decoder"], tmp_path / "again", "int8", progress=False)
    assert _partials(tmp_path) == [running.name] and "again" in os.listdir(tmp_path)
