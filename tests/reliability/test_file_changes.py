"""A loaded model does not depend on its weights file: truncating it, overwriting it in place,
replacing or deleting it leaves every later result unchanged and cannot crash the process.

Each case runs in a child process (a SIGBUS there fails the test instead of killing pytest): it
loads a GPT-2 (tied head, learned positions) and a BERT, records their outputs, then changes the
files step by step — overwritten in place with another model's weights of the same shapes,
truncated to half, truncated to 0 bytes, replaced (os.replace) by another model's file, deleted —
and checks after every step that the outputs are bitwise the same. Mechanism: docs/reliability.md,
"fork() and files changing after load".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(r"""
    import json, os, sys
    import numpy as np
    import cpuformer as cf

    dtype = None if sys.argv[1] == "converted" else sys.argv[1]
    decoder_dir, encoder_dir, other_decoder, other_encoder = sys.argv[2:6]
    decoder = cf.Generator(decoder_dir, dtype=dtype)
    encoder = cf.Encoder(encoder_dir, dtype=dtype)

    def outputs():
        return (decoder.logits([[5, 6, 7, 8, 9]]), np.array(decoder.generate([[5, 6, 7]], max_new_tokens=8)),
                encoder([[2, 3, 4, 5, 6, 7]]))

    reference = outputs()
    files = [(os.path.join(decoder_dir, "model.safetensors"), os.path.join(other_decoder, "model.safetensors")),
             (os.path.join(encoder_dir, "model.safetensors"), os.path.join(other_encoder, "model.safetensors"))]

    def overwrite(path, other):
        with open(other, "rb") as source, open(path, "r+b") as target:
            target.write(source.read())  # same header (same shapes), different weights

    def truncate(fraction):
        def step(path, _):
            os.truncate(path, int(os.path.getsize(path) * fraction))
        return step

    def replace(path, other):
        os.replace(other, path)

    def delete(path, _):
        os.remove(path)

    steps = [("overwritten in place", overwrite), ("truncated to half", truncate(0.5)),
             ("truncated to 0 bytes", truncate(0.0)), ("replaced", replace), ("deleted", delete)]
    assert decoder.num_parameters > 0 and encoder.num_parameters > 0  # read from the headers at load
    for name, step in steps:
        for path, other in files:
            step(path, other)
        same = all(np.array_equal(a, b) for a, b in zip(outputs(), reference))
        print(json.dumps(dict(step=name, same=same)), flush=True)  # what happened before a crash, if any
""")


def build(directory, seed):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    decoder = transformers.GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(decoder).eval().save_pretrained(directory / "decoder", safe_serialization=True)
    encoder = transformers.BertConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=48, max_position_embeddings=24)
    transformers.BertModel(encoder).eval().save_pretrained(directory / "encoder", safe_serialization=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two sets (seed 0 and seed 1) of the same shapes, plus int8-converted copies of both."""
    import cpuformer as cf

    root = tmp_path_factory.mktemp("file_changes")
    for seed in (0, 1):
        build(root / f"seed{seed}", seed)
        for kind in ("decoder", "encoder"):
            cf.convert(root / f"seed{seed}" / kind, root / f"seed{seed}" / f"{kind}_int8", "int8", progress=False)
    return root


@pytest.mark.parametrize("load", ["float32", "int8", "converted"])
def test_model_ignores_changes_to_its_files(checkpoints, tmp_path, load):
    suffix = "_int8" if load == "converted" else ""
    directories = []
    for seed in (0, 1):
        for kind in ("decoder", "encoder"):
            copy = tmp_path / f"{kind}{seed}"
            shutil.copytree(checkpoints / f"seed{seed}" / f"{kind}{suffix}", copy)
            directories.append(str(copy))
    # (the files of seed 1 are the ones written over, or moved onto, those of seed 0)
    child = subprocess.run([sys.executable, "-c", CHILD, load, *directories], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ))
    steps = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    changed = [step["step"] for step in steps if not step["same"]]
    assert child.returncode == 0, (f"the child died (exit status {child.returncode}) after the steps {steps}: "
                                   f"{child.stderr[-3000:]}")
    assert len(steps) == 5
    assert changed == [], f"results changed after the weights files were {', '.join(changed)}"
