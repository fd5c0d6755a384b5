// Picks one function table per kernel family from the level chosen once in cpu_features.
//
// Each per-ISA translation unit (foo_avx2.cc, foo_avx512.cc) defines its table inside its own
// namespace (cpuformer::avx2, cpuformer::avx512) so that nothing compiled with wide-vector flags
// can be linked into the scalar path by accident (the Highway rule).
#pragma once

#include "runtime/cpu_features.h"

namespace cpuformer {

template <typename Table>
const Table& select_for_isa(const Table& scalar, const Table& avx2, const Table& avx512) {
  switch (active_isa()) {
    case Isa::kAvx512: return avx512;
    case Isa::kAvx2: return avx2;
    case Isa::kScalar: break;
  }
  return scalar;
}

}  // namespace cpuformer
