"""The AddressSanitizer + UndefinedBehaviorSanitizer build passes its CI subset.

Runs `scripts/sanitize.sh --ci` (docs/reliability.md, "Sanitize"): builds `_core` with
`-DCPUFORMER_SANITIZE=ON` in build/sanitize-ci, then runs the kernel tests at every ISA level this
CPU has and a subset of the model, loader, generation-property and interruption tests at the best
level, failing on any sanitizer report. Needs the source tree (scripts/) and a C++ toolchain;
cmake, ninja and pybind11 come with the [test] extras.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sanitized_build_passes_the_ci_subset():
    script = ROOT / "scripts" / "sanitize.sh"
    assert script.exists(), f"{script} is missing (the sanitizer run needs the source tree)"
    assert shutil.which("cmake"), "cmake not found: install the [test] extras"
    env = dict(os.environ, PYTHONPATH="")  # the script puts its own sanitized package first
    run = subprocess.run(["bash", str(script), "--ci"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=40 * 60)
    tail = run.stdout[-6000:] + run.stderr[-3000:]
    print(tail)
    assert run.returncode == 0, tail
    assert "; clean" in run.stdout, tail
    assert " passed" in run.stdout and " failed" not in run.stdout, tail
