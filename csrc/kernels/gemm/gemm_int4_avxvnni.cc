// AVX-VNNI int4 GEMM for the avx2 level (see Int4GemmKernels in gemm.h for the arithmetic; it
// matches the scalar reference bit for bit): the AVX2 kernel's tile (gemm_int4_avx2_inl.h) and
// packed layout (gemm_int4_layout_inl.h) with the 256-bit VEX vpdpbusd, which multiplies the u8
// nibbles by the s8 activations and adds groups of 4 products straight into int32 lanes (exact:
// a group's sum is below 2^19), in place of vpmaddubsw + the int16 sums + vpmaddwd.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx2.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avxvnni {
extern const Int4GemmKernels kInt4GemmKernels;
namespace {

constexpr long kMR = 4;
constexpr long kNR = 8;
constexpr bool kUnsignedA = false;  // A rows as signed int8 (quantize_row of the int8 kernels)

// gemm_int8_avx2_inl.h: quantize_row, i8_activate, i8_mask8 (the int8 GEMM's A quantization and
// epilogue pieces).
#include "kernels/gemm/gemm_int4_layout_inl.h"
#include "kernels/gemm/gemm_int8_avx2_inl.h"
#include "kernels/gemm/gemm_rowwise_inl.h"

struct Int4Dot {
  static __m256i step(__m256i part, __m256i w_lo, __m256i w_hi, __m256i a_lo, __m256i a_hi) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(part, w_lo, a_lo), w_hi, a_hi);
  }
  static __m256i add_part(__m256i dot, __m256i part) { return _mm256_add_epi32(dot, part); }
};

#include "kernels/gemm/gemm_int4_avx2_inl.h"

}  // namespace

const Int4GemmKernels kInt4GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avxvnni
}  // namespace cpuformer
