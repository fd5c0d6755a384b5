// The weight quantizers of the scalar level (the baseline instruction set: SSE2 on x86-64, NEON
// on AArch64), and the choice of the running level's: quantize_weights_inl.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "kernels/gemm/quantize_weights.h"
#include "runtime/dispatch.h"

namespace cpuformer {
namespace scalar {
extern const WeightQuantizers kWeightQuantizers;
namespace {

// The baseline x86-64 has no rounding instruction (std::nearbyint is a library call there): adding
// and subtracting 1.5 · 2^23 leaves v rounded to nearest even for |v| < 2^22. This file is built
// with -ffp-contract=off (CMakeLists.txt): AArch64's baseline has fused multiply-adds, which would
// otherwise fuse the product w · inv into the addition and skip its rounding.
inline float round_half_even(float v) {
  const float magic = 12582912.0f;
  return (v + magic) - magic;
}

#include "kernels/gemm/quantize_weights_inl.h"

}  // namespace

const WeightQuantizers kWeightQuantizers = {quantize_rows_s8, quantize_rows_s4, convert_rows_16};

}  // namespace scalar

#if CPUFORMER_X86_64
namespace avx2 { extern const WeightQuantizers kWeightQuantizers; }
namespace avx512 { extern const WeightQuantizers kWeightQuantizers; }

const WeightQuantizers& weight_quantizers() {
  static const WeightQuantizers& table =
      select_for_isa(scalar::kWeightQuantizers, avx2::kWeightQuantizers, avx512::kWeightQuantizers);
  return table;
}
#else
const WeightQuantizers& weight_quantizers() { return scalar::kWeightQuantizers; }
#endif

}  // namespace cpuformer
