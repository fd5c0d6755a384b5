// The weight quantizers at the avx512 level (AVX-512 vectors): quantize_weights_inl.h.
#include <immintrin.h>

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

namespace cpuformer {
namespace avx512 {
extern const WeightQuantizers kWeightQuantizers;
namespace {

// With SSE4.1 and up (and -fno-math-errno), nearbyint is one vroundps per vector.
inline float round_half_even(float v) { return std::nearbyint(v); }

#include "kernels/gemm/quantize_weights_inl.h"

}  // namespace

const WeightQuantizers kWeightQuantizers = {quantize_rows_s8, quantize_rows_s4, convert_rows_16};

}  // namespace avx512
}  // namespace cpuformer
