// AVX-VNNI int8 GEMM for the avx2 level: A rows quantized to u8 (qa + 128), 256-bit vpdpbusd
// against s8 weights, the compensation 128·Σq subtracted in the epilogue. Register tile 6 rows ×
// 16 features (12 ymm accumulators); driver and packed layout in gemm_int8_inl.h.
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
extern const Int8GemmKernels kInt8GemmKernels;
namespace {

constexpr long kMR = 6;
constexpr long kNR = 16;
constexpr long kKGroup = 4;
constexpr bool kUnsignedA = true;

#include "kernels/gemm/gemm_int8_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_int8_avx2_inl.h"

template <int R>
__attribute__((always_inline)) inline void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp,
                                                     int32_t* out) {
  __m256i acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  for (long p = 0; p < kp; p += 4) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32));
    wp += 4 * kNR;
    for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, a + r * lda + p, 4);
      const __m256i av = _mm256_set1_epi32(a4);
      acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], av, w0);
      acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], av, w1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + r * kNR), acc[r][0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + r * kNR + 8), acc[r][1]);
  }
}

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out, const char*, long) {
  switch (rows) {
    case 6: tile_rows<6>(a, lda, wp, kp, out); break;
    case 5: tile_rows<5>(a, lda, wp, kp, out); break;
    case 4: tile_rows<4>(a, lda, wp, kp, out); break;
    case 3: tile_rows<3>(a, lda, wp, kp, out); break;
    case 2: tile_rows<2>(a, lda, wp, kp, out); break;
    default: tile_rows<1>(a, lda, wp, kp, out); break;
  }
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avxvnni
}  // namespace cpuformer
