#!/usr/bin/env bash
# The C API from a clean checkout (docs/c-api.md): builds libcpuformer and its C tests (Release),
# installs the library, header and CMake package into a temporary prefix, builds examples/c
# against that install with find_package(cpuformer), writes the test fixtures with the Python
# package (tests/c/make_cases.py: needs cpuformer, torch and transformers importable, as after
# `pip install ".[test]"`), runs the file readers' tests (tests/native/io_tests.cc: JSON,
# safetensors), the C tests — outputs bit for bit against the Python API, then every error path —
# and both examples; then builds the C tests and the readers' tests with AddressSanitizer +
# UndefinedBehaviorSanitizer and runs them again. Exits non-zero on any failure.
#
#   scripts/test-c-api.sh [--no-sanitize]
#
# Build directories: build/capi and build/capi-asan (CPUFORMER_CAPI_BUILD_DIR overrides the first;
# the second is its name + "-asan"). PYTHON picks the interpreter (default python, as .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${CPUFORMER_CAPI_BUILD_DIR:-$ROOT/build/capi}
PYTHON=${PYTHON:-python}
JOBS=${CPUFORMER_CAPI_JOBS:-2}
sanitize=1
case "${1:-}" in
  --no-sanitize) sanitize=0 ;;
  "") ;;
  *) echo "test-c-api.sh: unknown argument '$1' (use --no-sanitize)" >&2; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/cpuformer-capi.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
models=$work/models
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

echo "== libcpuformer (Release) and its C tests"
cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCPUFORMER_BUILD_PYTHON=OFF \
  -DCPUFORMER_BUILD_CAPI=ON -DCPUFORMER_BUILD_CAPI_TESTS=ON -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$BUILD" -j "$JOBS"
cmake --install "$BUILD" >/dev/null
test -f "$prefix/include/cpuformer.h"

echo "== examples/c against the installed package (find_package(cpuformer))"
cmake -S "$ROOT/examples/c" -B "$work/examples" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/examples"

echo "== fixtures from the Python package"
"$PYTHON" "$ROOT/tests/c/make_cases.py" "$models"

echo "== the file readers' tests (tests/native/io_tests.cc)"
"$BUILD/cpuformer_io_tests"
echo "== C tests"
"$BUILD/cpuformer_capi_tests" "$models"
echo "== examples"
"$work/examples/embed" "$models/bert-int8" 5,6,7,8,9 5,6,7,10
"$work/examples/embed" "$models/hf/bert" 5,6,7,8,9 5,6,7,10
"$work/examples/generate" "$models/gpt2-float32" 5,6,7 --max 8
"$work/examples/generate" "$models/hf/gpt2" 5,6,7 --max 8
"$work/examples/generate" "$models/t5-int8" 5,6,7,8 --max 6 --sample 3

if [ $sanitize -eq 1 ]; then
  echo "== C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
  cmake -S "$ROOT" -B "$BUILD-asan" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCPUFORMER_SANITIZE=ON \
    -DCPUFORMER_BUILD_PYTHON=OFF -DCPUFORMER_BUILD_CAPI=ON -DCPUFORMER_BUILD_CAPI_TESTS=ON >/dev/null
  cmake --build "$BUILD-asan" -j "$JOBS" --target cpuformer_capi_tests cpuformer_io_tests
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD-asan/cpuformer_io_tests"
  # Compiled at -O1 (CMakeLists.txt): floats compared within 1e-4, tokens not compared.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$BUILD-asan/cpuformer_capi_tests" "$models" --tolerant
fi
echo "test-c-api.sh: passed"
