#!/usr/bin/env bash
# Builds cpuformer._core with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DCPUFORMER_SANITIZE=ON) and runs the tests against it at every ISA level this CPU has.
# Fails on any sanitizer report (and on any test failure).
#
#   scripts/sanitize.sh            full run: kernel, encoder, loader and reliability tests, every ISA level
#   scripts/sanitize.sh --quick    CI subset: kernel + encoder tests at every level, reliability ops tests
#                                  at the best level (a few minutes on 2 cores)
#   scripts/sanitize.sh --ci       what the test suite runs (tests/reliability/test_sanitizers.py): the kernel
#                                  tests at every level, then a subset of the encoder, decoder, seq2seq,
#                                  loader, generation-property and interruption tests at the best level
#   scripts/sanitize.sh [--quick|--ci] -- <pytest args>    run these pytest args instead of the default set
#
# The normal build (build/dev, python/cpuformer/_core*.so) is not touched: the sanitized module is
# built in build/sanitize (CPUFORMER_SANITIZE_BUILD_DIR overrides) and copied, with the Python
# sources, into a temporary package directory that the tests import from.
#
# CPython itself is not instrumented, so the gcc ASan runtime is LD_PRELOADed; leak detection is
# off because CPython's own allocations (interned strings, arenas) look like leaks at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

quick=0
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --ci) quick=2; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument '$1' (use --quick, or -- <pytest args>)" >&2; exit 2 ;;
  esac
done

default_build=$ROOT/build/sanitize
[ $quick -eq 2 ] && default_build=$ROOT/build/sanitize-ci
BUILD=${CPUFORMER_SANITIZE_BUILD_DIR:-$default_build}
PYTHON=${PYTHON:-python3}
JOBS=${CPUFORMER_SANITIZE_JOBS:-2}

generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
# CPUFORMER_SANITIZE=ON compiles at -O1 -g1 (CMakeLists.txt): line tables for symbolised reports.
cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCPUFORMER_SANITIZE=ON \
  -DCPUFORMER_DEV_INPLACE=OFF -DPython_EXECUTABLE="$(command -v "$PYTHON")" >/dev/null
cmake --build "$BUILD" -j "$JOBS"

module=$(find "$BUILD" -maxdepth 1 -name '_core*.so' | head -n 1)
if [ -z "$module" ]; then
  echo "sanitize.sh: no _core*.so in $BUILD" >&2
  exit 1
fi

pkg=$(mktemp -d "${TMPDIR:-/tmp}/cpuformer-sanitize.XXXXXX")
mkdir -p "$pkg/cpuformer"
# The Python sources only, subpackages (arch/, models/) included: never the normal build's _core.
(cd "$ROOT/python/cpuformer" &&
  find . -type f ! -name '_core*.so' ! -path '*/__pycache__/*' -exec cp --parents {} "$pkg/cpuformer/" \;)
cp "$module" "$pkg/cpuformer/"

libasan=$(gcc -print-file-name=libasan.so)
# python does not link libstdc++: preloaded too, ASan's __cxa_throw interceptor finds the real
# one (otherwise the first C++ exception dies in "CHECK failed: real___cxa_throw != 0").
libstdcxx=$(gcc -print-file-name=libstdc++.so)
for lib in "$libasan" "$libstdcxx"; do
  if [ ! -e "$lib" ]; then
    echo "sanitize.sh: '$lib' not found (gcc -print-file-name)" >&2
    exit 1
  fi
done
preload="$libasan $libstdcxx"

export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
# Reports go to files as well: pytest captures a test's stderr, and a process that dies
# mid-test (or a child process of a test) would take its report with it.
reports=$(mktemp -d "${TMPDIR:-/tmp}/cpuformer-sanitize-reports.XXXXXX")
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:exitcode=99:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:log_path=$reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=98:log_path=$reports/ubsan"
export HF_HUB_OFFLINE=1
# Reliability tests scale their hypothesis budgets down under the sanitizer (it is ~5-20x slower).
export CPUFORMER_SANITIZED=1

levels="scalar avx2 avx512"
# The best level comes from the sanitized module itself, under the ASan runtime.
best=$(LD_PRELOAD="$preload" "$PYTHON" -c "import cpuformer; print(cpuformer.cpu_info()['best_isa'])")
supported=""
for level in $levels; do
  supported="$supported $level"
  [ "$level" = "$best" ] && break
done

if [ ${#pytest_args[@]} -eq 0 ]; then
  if [ $quick -eq 2 ]; then
    per_level=(tests/kernels)
    best_only=(tests/models/test_encoder.py -k "not base and not minilm and not peak_memory"
               tests/models/test_decoder.py::test_logits_match_transformers
               tests/models/test_decoder.py::test_greedy_64_tokens_match_transformers
               tests/models/test_decoder.py::test_beam_search_matches_transformers
               tests/models/test_decoder.py::test_stream_yields_the_generated_tokens
               tests/models/test_decoder.py::test_bad_input_raises_clear_errors
               tests/models/test_seq2seq.py tests/test_model_dir.py
               tests/reliability/test_generate_properties.py tests/reliability/test_interrupt.py
               tests/reliability/test_limits.py tests/reliability/test_nonfinite.py tests/reliability/test_fork.py
               tests/reliability/test_file_changes.py tests/reliability/test_stream_lifecycle.py
               tests/reliability/test_sampling_limits.py
               "tests/models/test_speculative.py::test_greedy_speculation_equals_plain_decoding_on_every_family[llama]"
               "tests/models/test_speculative.py::test_greedy_speculation_keeps_the_logits_processors_and_stops[t5]"
               tests/models/test_speculative.py::test_a_separate_smaller_assistant_gives_the_same_greedy_tokens
               tests/models/test_kv_cache_dtype.py::test_speculative_decoding_with_a_typed_cache
               tests/models/test_kv_cache_dtype.py::test_beam_search_reorders_typed_rows)
  elif [ $quick -eq 1 ]; then
    per_level=(tests/kernels tests/models/test_encoder.py)
    best_only=(tests/reliability/test_ops_properties.py tests/reliability/test_encoder_properties.py)
  else
    per_level=(tests/kernels tests/models tests/reliability)
    best_only=(tests/test_model_dir.py tests/test_runtime.py)
  fi
else
  per_level=("${pytest_args[@]}")
  best_only=()
fi
# RSS measurements mean nothing under ASan (shadow memory, quarantined frees): skipped here, they
# run in the normal suite.
exclude=(--deselect tests/models/test_encoder.py::test_load_peak_memory --ignore=tests/reliability/test_memory.py
         --ignore=tests/reliability/test_memory_generate.py --ignore=tests/reliability/test_sanitizers.py)

log=$(mktemp "${TMPDIR:-/tmp}/cpuformer-sanitize-log.XXXXXX")
trap 'rm -rf "$pkg" "$log" "$reports"' EXIT
status=0
run() {  # run <isa> <pytest args...>
  local isa=$1
  shift
  echo "== sanitize: CPUFORMER_ISA=$isa pytest $*"
  set +e
  CPUFORMER_ISA=$isa LD_PRELOAD="$preload" "$PYTHON" -m pytest -q -p no:cacheprovider "${exclude[@]}" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "== sanitize: FAILED (exit $rc) at CPUFORMER_ISA=$isa"
    status=1
  fi
}

start=$(date +%s)
for level in $supported; do
  run "$level" "${per_level[@]}"
done
if [ ${#best_only[@]} -gt 0 ]; then
  run "$best" "${best_only[@]}"
fi

# A report in a child process (pytest subprocess tests) need not fail the parent: look for it too.
if [ -n "$(ls -A "$reports")" ] || grep -E -q "ERROR: AddressSanitizer|runtime error:|CHECK failed" "$log"; then
  echo "== sanitize: sanitizer report(s) found:"
  for report in "$reports"/*; do
    [ -e "$report" ] || continue
    echo "---- $(basename "$report")"
    grep -v -E "Python/|Objects/|Include/|Modules/" "$report" | head -n 60
  done
  grep -E -n "ERROR: AddressSanitizer|runtime error:|CHECK failed" "$log" | head -n 20
  status=1
fi
echo "== sanitize: levels:$supported; $(( $(date +%s) - start )) s of tests; $([ $status -eq 0 ] && echo clean || echo FAILED)"
exit $status
