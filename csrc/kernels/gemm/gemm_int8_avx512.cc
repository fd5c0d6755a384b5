// AVX-512 (BW, no VNNI) int8 GEMM: signed A and W, both in [-127, 127]. vpmaddubsw takes |qa| as
// u8 and the weights with the sign of qa moved onto them (a masked byte negation), so each int16
// pair sum is at most 2·127·127 = 32258 and never saturates; vpmaddwd with ones widens the pairs
// to int32. Register tile 4 rows × 64 features; driver and packed layout in gemm_int8_inl.h.
// With AVX512-VNNI the level uses gemm_int8_avx512vnni.cc instead.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx512.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512 {
namespace {

constexpr long kMR = 4;
constexpr long kNR = 64;
constexpr long kKGroup = 4;
constexpr bool kUnsignedA = false;

#include "kernels/gemm/gemm_int8_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_int8_avx512_inl.h"

template <int R>
__attribute__((always_inline)) inline void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp,
                                                     int32_t* out) {
  const __m512i ones = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
  __m512i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_si512();
  for (long p = 0; p < kp; p += 4) {
    __m512i w[4];
    for (int v = 0; v < 4; ++v) w[v] = _mm512_load_si512(wp + 64 * v);
    wp += 4 * kNR;
    for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, a + r * lda + p, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      const __mmask64 negative = _mm512_movepi8_mask(av);
      const __m512i magnitude = _mm512_abs_epi8(av);
      for (int v = 0; v < 4; ++v) {
        const __m512i signed_w = _mm512_mask_sub_epi8(w[v], negative, zero, w[v]);
        const __m512i pairs = _mm512_maddubs_epi16(magnitude, signed_w);
        acc[r][v] = _mm512_add_epi32(acc[r][v], _mm512_madd_epi16(pairs, ones));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_si512(out + r * kNR + 16 * v, acc[r][v]);
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

}  // namespace avx512
}  // namespace cpuformer
