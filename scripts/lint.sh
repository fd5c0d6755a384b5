#!/usr/bin/env bash
# Lint and formatting checks that .ci/run runs: ruff over the Python code (configuration in
# pyproject.toml, [tool.ruff]) and clang-format over the C++ (configuration in .clang-format).
# Checks only; to fix: `ruff check --fix .` and `clang-format -i <files>` (docs/contributing.md).
# Both tools come with the test extra (pip install ".[test]"), pinned: a newer release may
# format or lint differently.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
ruff check . || status=1
# Every tracked and untracked (not ignored) C and C++ source under csrc/, include/, tests/native/,
# tests/c/ and examples/c/.
mapfile -t sources < <(git ls-files --cached --others --exclude-standard -- \
  'csrc/*.h' 'csrc/*.cc' 'include/*.h' 'tests/native/*.cc' 'tests/c/*.c' 'examples/c/*.c' 2>/dev/null ||
  find csrc include tests/native tests/c examples/c -name '*.h' -o -name '*.cc' -o -name '*.c')
clang-format --dry-run -Werror "${sources[@]}" || status=1
if [ "$status" -ne 0 ]; then
  echo "lint failed: see docs/contributing.md (ruff check --fix ., clang-format -i)" >&2
fi
exit "$status"
