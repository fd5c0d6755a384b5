#!/usr/bin/env bash
# Cross-builds cpuformer's C++ core and its native kernel tests (tests/native/kernel_tests.cc) for
# AArch64 Linux and runs them under QEMU user-mode emulation at every ARM ISA level, checking the
# level the runtime detects on each emulated CPU (docs/arm.md), then checks the instruction counts of
# benchmarks/arm_instruction_model.py (a QEMU plugin built with the host's cc). Exits non-zero on any failure.
#
# Installs what is missing with apt-get (non-interactive; as root, or through sudo):
#   g++-aarch64-linux-gnu  the cross compiler, with AArch64 libstdc++ under /usr/aarch64-linux-gnu
#   qemu-user              qemu-aarch64, the user-mode emulator
#   cmake, ninja-build     only if cmake / ninja are not on PATH
#
# Build directory: build/aarch64 (kept between runs; remove it for a clean build).
# Usage: scripts/test-aarch64.sh [--sanitize]
#   --sanitize  build with AddressSanitizer + UndefinedBehaviorSanitizer (CPUFORMER_SANITIZE) into
#               build/aarch64-asan; leak detection is off (LeakSanitizer cannot run under QEMU).
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/aarch64
sanitize=OFF
case "${1:-}" in
  "") ;;
  --sanitize)
    build=build/aarch64-asan
    sanitize=ON
    export ASAN_OPTIONS=detect_leaks=0
    ;;
  *) echo "usage: $0 [--sanitize]" >&2; exit 2 ;;
esac
sysroot=/usr/aarch64-linux-gnu

missing=()
command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=scripts/toolchains/aarch64-linux-gnu.cmake \
  -DCPUFORMER_BUILD_PYTHON=OFF -DCPUFORMER_BUILD_TESTS=ON -DCPUFORMER_SANITIZE="$sanitize" >/dev/null
ninja -C "$build" cpuformer_kernel_tests

tests="$build/cpuformer_kernel_tests"
failed=0

# run CPU LEVEL EXPECTED_ISA EXPECTED_BEST: the kernel tests on QEMU's CPU model CPU with
# CPUFORMER_ISA=LEVEL ("" for the default); the runtime must report EXPECTED_ISA and EXPECTED_BEST.
run() {
  local cpu=$1 level=$2 isa=$3 best=$4 out status=0
  echo "== qemu -cpu $cpu, CPUFORMER_ISA=${level:-(unset)}"
  out=$(CPUFORMER_ISA=$level qemu-aarch64 -cpu "$cpu" -L "$sysroot" "$tests" 2>&1) || status=$?
  echo "$out" | grep -v '^threads:'
  if [ "$status" -ne 0 ]; then
    echo "FAILED: exit status $status" >&2
    failed=1
  elif ! echo "$out" | grep -qx "isa $isa (best $best)"; then
    echo "FAILED: expected 'isa $isa (best $best)'" >&2
    failed=1
  fi
}

# QEMU 7.2's CPU models: cortex-a53 is Armv8.0 (NEON only); cortex-a76 and neoverse-n1 are Armv8.2
# with the dot product; max has every extension QEMU emulates (i8mm, bf16, ...).
run cortex-a53 "" neon neon
run cortex-a53 scalar scalar neon
run cortex-a76 "" dotprod dotprod
run neoverse-n1 "" dotprod dotprod
run neoverse-n1 neon neon dotprod
run max "" i8mm i8mm
run max dotprod dotprod i8mm
run max neon neon i8mm
run max scalar scalar i8mm

# A level the CPU lacks: the runtime refuses it (the test executable exits 77).
echo "== qemu -cpu cortex-a53, CPUFORMER_ISA=dotprod (the CPU lacks it)"
status=0
out=$(CPUFORMER_ISA=dotprod qemu-aarch64 -cpu cortex-a53 -L "$sysroot" "$tests" 2>&1) || status=$?
echo "$out"
if [ "$status" -ne 77 ] || ! echo "$out" | grep -q "asks for a level this CPU lacks; it supports up to neon"; then
  echo "FAILED: expected exit status 77 and the 'lacks' message, got $status" >&2
  failed=1
fi

# The instruction counts behind docs/arm.md's speed model: a QEMU plugin counts what each level's
# GEMMs execute, which must be the multiply-add instructions of that level (fmla, sdot, smmla).
if [ "$sanitize" = OFF ]; then
  echo "== instruction counts (benchmarks/arm_instruction_model.py --check)"
  python3 benchmarks/arm_instruction_model.py --dtypes float32,int8,int4 --check \
    --out "$build/arm_model_check.json" | tail -n 2 || failed=1
fi

if [ "$failed" -ne 0 ]; then
  echo "aarch64 kernel tests FAILED" >&2
  exit 1
fi
echo "aarch64 kernel tests passed at every level"
