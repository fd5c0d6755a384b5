#!/usr/bin/env bash
# Cross-builds cpuformer's Python extension (_core.cpython-311-aarch64-linux-gnu.so) for AArch64 Linux
# and runs the Python package under QEMU user-mode emulation with an AArch64 CPython 3.11 made from
# Debian's arm64 packages and PyPI's aarch64 wheels (scripts/aarch64-python-env.sh, docs/arm.md).
# Exits non-zero on any failure.
#
# At two emulated CPUs, `qemu-aarch64 -cpu max` (level i8mm: NEON float32/float16/bfloat16 GEMMs,
# SMMLA int8, SDOT int4) and `-cpu cortex-a53` (level neon: NEON float32/float16/bfloat16 GEMMs,
# scalar int8 and int4), it runs
#   python -m cpuformer --version   must print pyproject.toml's version
#   python -m cpuformer info        must report the expected level (and that it is the best)
#   python -m cpuformer bench --quick  random-weight encoder, decoder and encoder-decoder (QEMU's
#                                      timings mean nothing; this checks that they run; the slow part:
#                                      several minutes per CPU under emulation; --no-bench skips it)
#   scripts/aarch64_crosscheck.py check  BERT, GPT-2, Marian and T5 at float32, int8 and int4 against
#                                      the outputs of the host's (x86-64) cpuformer, which `build`
#                                      checks against transformers first
#
# The host side needs the test dependencies (torch, transformers) and an importable cpuformer: the
# installed package (as after scripts/build-wheel.sh --install test), or PYTHONPATH=python with the
# development build's _core in python/cpuformer.
#
# Build directory: build/aarch64-python (kept between runs); the sysroot: build/aarch64-py.
# Usage: scripts/test-aarch64-python.sh [--jobs N] [--no-bench]
#   --jobs N     ninja's parallel jobs (default: ninja's own)
#   --no-bench   skip `bench --quick` (.ci/run: the correctness check covers the same model kinds)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=()
bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=(-j "$2"); shift 2 ;;
    --no-bench) bench=0; shift ;;
    *) echo "usage: $0 [--jobs N] [--no-bench]" >&2; exit 2 ;;
  esac
done

start=$(date +%s)
# timed LABEL COMMAND...: runs COMMAND and prints how long it took.
timed() {
  local label=$1 t0 status=0
  shift
  t0=$(date +%s)
  "$@" || status=$?
  echo "-- $label: $(( $(date +%s) - t0 )) s"
  return "$status"
}
# shellcheck source=scripts/aarch64-python-env.sh
source scripts/aarch64-python-env.sh
aarch64_python_setup

build=build/aarch64-python
aarch64_configure_extension "$build"
ninja "${jobs[@]}" -C "$build" _core
echo "== the extension built ($(( $(date +%s) - start )) s since the start)"

# The package as the AArch64 Python imports it: python/cpuformer with the AArch64 extension only.
pkg=$build/package
rm -rf "$pkg"
mkdir -p "$pkg"
cp -r python/cpuformer "$pkg/"
rm -f "$pkg"/cpuformer/_core*.so
find "$pkg" -name __pycache__ -prune -exec rm -rf {} +
cp "$build"/_core.cpython-311-aarch64-linux-gnu.so "$pkg/cpuformer/"

work=$(mktemp -d "${TMPDIR:-/tmp}/cpuformer-aarch64.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "== host reference: $(python3 -c 'import cpuformer; print(cpuformer.__file__)' 2>&1 | tail -n 1)"
timed "host reference (aarch64_crosscheck.py build)" python3 scripts/aarch64_crosscheck.py build "$work/models"

version=$(sed -n 's/^version = "\([^"]*\)"/\1/p' pyproject.toml | head -n 1)
failed=()
# check CPU LEVEL: every check on QEMU's CPU model CPU, where cpuformer must pick LEVEL.
check() {
  local cpu=$1 level=$2 out
  local py=(env PYTHONPATH="$ROOT/$pkg:$AARCH64_SITE" CPUFORMER_CACHE="$work/cache"
            qemu-aarch64 -cpu "$cpu" -L "$AARCH64_SYSROOT" "$AARCH64_SYSROOT/usr/bin/python3.11")
  echo "== qemu-aarch64 -cpu $cpu (expected level $level)"
  out=$(cd "$work" && "${py[@]}" -m cpuformer --version 2>&1) || true
  echo "$out"
  [ "$out" = "cpuformer $version" ] || failed+=("$cpu: cpuformer --version printed '$out', expected 'cpuformer $version'")
  out=$(cd "$work" && "${py[@]}" -m cpuformer info 2>&1) || failed+=("$cpu: cpuformer info failed")
  echo "$out"
  grep -q "^isa: *$level (best this CPU supports: $level)" <<<"$out" || failed+=("$cpu: cpuformer info does not report level $level")
  if [ "$bench" -eq 1 ]; then
    (cd "$work" && timed "bench --quick" "${py[@]}" -m cpuformer bench --quick) ||
      failed+=("$cpu: cpuformer bench --quick failed")
  fi
  (cd "$work" && timed "aarch64_crosscheck.py check" "${py[@]}" "$ROOT/scripts/aarch64_crosscheck.py" check "$work/models") ||
    failed+=("$cpu: the outputs differ from the host's (above)")
}
ROOT=$PWD
check max i8mm
check cortex-a53 neon

echo "== $(( $(date +%s) - start )) s"
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "the Python package passed under QEMU at levels i8mm and neon"
