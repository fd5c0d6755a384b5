// Compute peak of the matmul kernels: the multiply-adds per second that the instruction sequence
// a kernel's inner loop issues per vector of weights reaches when every operand is in a register
// (no loads, no epilogue, independent accumulators). No GEMM of that weight type can run faster on
// the same threads, so benchmarks state their GEMM rates as a fraction of it (bench_ops.py,
// `cpuformer bench`). It is measured rather than computed from a clock and a per-core width because
// neither is reliable: cpuinfo reports a nominal clock, and a CPU may run 512-bit instructions on
// 256-bit units (Zen 4), halving the width-based figure.
#pragma once

#include <cstdint>

#include "kernels/gemm/gemm.h"

namespace cpuformer {

// Multiply-adds per second of the instruction that matmul_instruction(type) names, on
// current_num_threads() threads, measured for about `seconds` (> 0 and finite: the caller checks),
// also with more threads than CPUs: the best of three timed passes after a calibration. Blocks the
// calling thread for that long.
double gemm_peak_macs(WeightType type, double seconds);

// Per-level probes: run `steps` iterations of a fixed set of independent accumulator chains and
// return the multiply-adds done. Each is compiled with its level's flags; call one only when the
// CPU has that level.
using PeakProbe = int64_t (*)(long steps);
namespace avx2 {
int64_t peak_fma(long steps);
int64_t peak_maddubs(long steps);
}  // namespace avx2
namespace avx512 {
int64_t peak_fma(long steps);
int64_t peak_maddubs(long steps);
}  // namespace avx512
namespace avx512vnni { int64_t peak_dpbusd(long steps); }
namespace avxvnni { int64_t peak_dpbusd(long steps); }
namespace avx512bf16 { int64_t peak_dpbf16(long steps); }
// AMX (x86-64 with AMX-INT8 / AMX-BF16): TDPBUSD on four C tiles, 16 × 16 × 64 multiply-adds each;
// TDPBF16PS, 16 × 16 × 32.
namespace avx512amx {
int64_t peak_tdpbusd(long steps);
int64_t peak_tdpbf16ps(long steps);
}  // namespace avx512amx
// AArch64
namespace dotprod { int64_t peak_sdot(long steps); }
namespace i8mm { int64_t peak_smmla(long steps); }

}  // namespace cpuformer
