// AVX2 int8 GEMM (no VNNI): signed A and W, both in [-127, 127]. vpmaddubsw takes |qa| as u8 and
// vpsignb(w, qa) as s8, so each int16 pair sum is at most 2·127·127 = 32258 and never saturates;
// vpmaddwd with ones widens the pairs to int32. Register tile 4 rows × 16 features; driver and
// packed layout in gemm_int8_inl.h. With AVX-VNNI the level uses gemm_int8_avxvnni.cc instead.
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
constexpr long kNR = 16;
constexpr long kKGroup = 4;
constexpr bool kUnsignedA = false;

#include "kernels/gemm/gemm_int8_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_int8_avx2_inl.h"

template <int R>
__attribute__((always_inline)) inline void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp,
                                                     int32_t* out) {
  const __m256i ones = _mm256_set1_epi16(1);
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
      const __m256i magnitude = _mm256_abs_epi8(av);
      const __m256i p0 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w0, av));
      const __m256i p1 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w1, av));
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + r * kNR), acc[r][0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + r * kNR + 8), acc[r][1]);
  }
}

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out, const char*, long) {
  switch (rows) {
    case 4: tile_rows<4>(a, lda, wp, kp, out); break;
    case 3: tile_rows<3>(a, lda, wp, kp, out); break;
    case 2: tile_rows<2>(a, lda, wp, kp, out); break;
    default: tile_rows<1>(a, lda, wp, kp, out); break;
  }
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx2
}  // namespace cpuformer
