"""scripts/aarch64_crosscheck.py, the check of the AArch64 build under QEMU against the host's outputs
(docs/arm.md), run here on the host: `build` checks the host against transformers and records the
reference; `check` passes on the same outputs at another ISA level and fails, naming each output,
when a float array moves beyond its bound or a greedy token changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import cpuformer as cf  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "aarch64_crosscheck.py"


def run(mode: str, directory: Path, **env: str) -> subprocess.CompletedProcess:
    package = str(Path(cf.__file__).resolve().parents[1])
    environment = dict(os.environ, PYTHONPATH=package, HF_HUB_OFFLINE="1", **env)
    return subprocess.run([sys.executable, str(SCRIPT), mode, str(directory)], capture_output=True, text=True,
                          env=environment, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("crosscheck")
    built = run("build", directory)
    assert built.returncode == 0, built.stdout + built.stderr
    # hidden states (bert), logits (gpt2), encoder outputs and logits (marian, t5); 2 greedy runs but bert's
    assert built.stdout.count("host float32 vs transformers: ok") == 6
    assert built.stdout.count("host float32 vs transformers: tokens identical") == 6
    return directory


def test_check_passes_at_the_scalar_level(reference):
    checked = run("check", reference, CPUFORMER_ISA="scalar")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "isa scalar against the host's cpuformer" in checked.stdout
    assert "all 60 outputs match the host's" in checked.stdout


def test_check_fails_on_a_changed_output_and_a_changed_token(reference, tmp_path):
    for name in os.listdir(reference):
        target = tmp_path / name
        if (reference / name).is_dir():
            target.symlink_to(reference / name)
        else:
            target.write_bytes((reference / name).read_bytes())
    arrays = dict(np.load(tmp_path / "reference.npz"))
    hidden = arrays["bert/float32/hidden"]
    hidden[0, 0, 0] += 1e-3 * np.abs(hidden).max()  # 10 x the float32 bound
    arrays["t5/int4/tokens1"][3] += 1
    np.savez(tmp_path / "reference.npz", **arrays)
    # The host's vdpbf16ps (AVX512-BF16) rounds activations to bfloat16: beyond the bfloat16 bound of
    # the widening kernels that `build` records and ARM runs.
    checked = run("check", tmp_path, CPUFORMER_DISABLE_FEATURES="avx512_bf16")
    assert checked.returncode == 1
    assert "FAILED: 2 of 60 outputs differ from the host's" in checked.stderr
    assert "bert/float32/hidden: max |difference| / max |reference| = 0.001 > 0.0001" in checked.stderr
    assert "t5/int4/tokens1: tokens" in checked.stderr


def test_check_fails_on_a_missing_reference(tmp_path):
    checked = run("check", tmp_path)
    assert checked.returncode == 2
    assert f"no reference outputs in {tmp_path}: run `aarch64_crosscheck.py build {tmp_path}` on the host first" \
        in checked.stderr
