// Picks one function table per kernel family from the level chosen once in cpu_features.
//
// Each per-ISA translation unit (foo_avx2.cc, foo_avx512.cc, foo_neon.cc) defines its table inside
// its own namespace (cpuformer::avx2, cpuformer::avx512, cpuformer::neon) so that nothing compiled
// with wide-vector flags can be linked into the scalar path by accident (the Highway rule).
//
// A build compiles only its own architecture's ISA files (CMakeLists.txt), so each family's
// dispatch function names the tables of its architecture under CPUFORMER_X86_64 or
// CPUFORMER_AARCH64 below.
#pragma once

#include "runtime/cpu_features.h"

#if defined(__x86_64__)
#define CPUFORMER_X86_64 1
#elif defined(__aarch64__)
#define CPUFORMER_AARCH64 1
#else
#error "cpuformer builds for x86-64 and AArch64 only"
#endif

namespace cpuformer {

#if CPUFORMER_X86_64
template <typename Table>
const Table& select_for_isa(const Table& scalar, const Table& avx2, const Table& avx512) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512;
    case Isa::kAvx2: return avx2;
    default: break;
  }
  return scalar;
}
#endif

#if CPUFORMER_AARCH64
// One table for the neon, dotprod and i8mm levels; a family whose kernels differ between them
// (int8 GEMM with SDOT / SMMLA) picks inside the level from cpu_features().
template <typename Table>
const Table& select_for_isa(const Table& scalar, const Table& neon) {
  return active_isa() == Isa::kScalar ? scalar : neon;
}
#endif

}  // namespace cpuformer
