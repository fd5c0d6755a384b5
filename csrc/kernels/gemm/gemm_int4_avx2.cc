// AVX2 int4 GEMM (see Int4GemmKernels in gemm.h for the arithmetic; it matches the scalar reference
// bit for bit). The weights are unsigned nibbles u ∈ [0, 15] and the A rows signed int8, so
// vpmaddubsw multiplies them directly: each int16 pair sum is at most 2·15·127 = 3810, and eight of
// them (32 input channels) at most 30480, so products are summed in int16 over 32 channels and
// widened to int32 once (vpmaddwd with ones) — one widening per 32 channels instead of per 4.
// Packed layout: gemm_int4_layout_inl.h (shared by every x86 level); tile and driver:
// gemm_int4_avx2_inl.h (shared with gemm_int4_avxvnni.cc). The avx512 level uses this kernel
// too on a CPU without AVX512-VNNI (gemm.cc).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx2.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx2 {
namespace {

constexpr long kMR = 4;
constexpr long kNR = 8;
constexpr bool kUnsignedA = false;  // A rows as signed int8 (quantize_row of the int8 kernels)

// gemm_int8_avx2_inl.h: quantize_row, i8_activate, i8_mask8 (the int8 GEMM's A quantization and
// epilogue pieces).
#include "kernels/gemm/gemm_int4_layout_inl.h"
#include "kernels/gemm/gemm_int8_avx2_inl.h"
#include "kernels/gemm/gemm_rowwise_inl.h"

// vpmaddubsw multiplies u8 nibbles by s8 activations into int16 pairs (at most 2·15·127 = 3810);
// a part sums 32 channels in int16 (at most 8·3810 = 30480) and is widened once (vpmaddwd with
// ones): one widening per 32 channels instead of per 4.
struct Int4Dot {
  static __m256i step(__m256i part, __m256i w_lo, __m256i w_hi, __m256i a_lo, __m256i a_hi) {
    const __m256i p_lo = _mm256_maddubs_epi16(w_lo, a_lo);
    const __m256i p_hi = _mm256_maddubs_epi16(w_hi, a_hi);
    return _mm256_add_epi16(part, _mm256_add_epi16(p_lo, p_hi));
  }
  static __m256i add_part(__m256i dot, __m256i part) {
    return _mm256_add_epi32(dot, _mm256_madd_epi16(part, _mm256_set1_epi16(1)));
  }
};

#include "kernels/gemm/gemm_int4_avx2_inl.h"

}  // namespace

const Int4GemmKernels kInt4GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx2
}  // namespace cpuformer
