// AVX-512 VNNI int8 GEMM: A rows quantized to u8 (qa + 128), vpdpbusd against s8 weights, the
// compensation 128·Σq subtracted in the epilogue. Register tile 6 rows × 64 features (24 zmm
// accumulators); driver and packed layout in gemm_int8_inl.h.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx512.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512vnni {
extern const Int8GemmKernels kInt8GemmKernels;
namespace {

constexpr long kMR = 6;
constexpr long kNR = 64;
constexpr bool kUnsignedA = true;

#include "kernels/gemm/gemm_int8_inl.h"
#include "kernels/gemm/gemm_int8_avx512_inl.h"

// U independent accumulator sets over consecutive k groups: with few rows (decode) one set alone
// would wait on the latency of vpdpbusd.
template <int R, int U>
__attribute__((always_inline)) inline void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp,
                                                     int32_t* out) {
  __m512i acc[U][R][4];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[u][r][v] = _mm512_setzero_si512();
  long p = 0;
  for (; p + 4 * U <= kp; p += 4 * U) {
    for (int u = 0; u < U; ++u) {
      const int8_t* wu = wp + u * 4 * kNR;
      const __m512i w0 = _mm512_load_si512(wu), w1 = _mm512_load_si512(wu + 64);
      const __m512i w2 = _mm512_load_si512(wu + 128), w3 = _mm512_load_si512(wu + 192);
      for (int r = 0; r < R; ++r) {
        int32_t a4;
        std::memcpy(&a4, a + r * lda + p + 4 * u, 4);
        const __m512i av = _mm512_set1_epi32(a4);
        acc[u][r][0] = _mm512_dpbusd_epi32(acc[u][r][0], av, w0);
        acc[u][r][1] = _mm512_dpbusd_epi32(acc[u][r][1], av, w1);
        acc[u][r][2] = _mm512_dpbusd_epi32(acc[u][r][2], av, w2);
        acc[u][r][3] = _mm512_dpbusd_epi32(acc[u][r][3], av, w3);
      }
    }
    wp += U * 4 * kNR;
  }
  for (; p < kp; p += 4) {
    const __m512i w0 = _mm512_load_si512(wp), w1 = _mm512_load_si512(wp + 64);
    const __m512i w2 = _mm512_load_si512(wp + 128), w3 = _mm512_load_si512(wp + 192);
    wp += 4 * kNR;
    for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, a + r * lda + p, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      acc[0][r][0] = _mm512_dpbusd_epi32(acc[0][r][0], av, w0);
      acc[0][r][1] = _mm512_dpbusd_epi32(acc[0][r][1], av, w1);
      acc[0][r][2] = _mm512_dpbusd_epi32(acc[0][r][2], av, w2);
      acc[0][r][3] = _mm512_dpbusd_epi32(acc[0][r][3], av, w3);
    }
  }
  for (int u = 1; u < U; ++u)  // wrapping int32 adds: the order does not matter
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[0][r][v] = _mm512_add_epi32(acc[0][r][v], acc[u][r][v]);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_si512(out + r * kNR + 16 * v, acc[0][r][v]);
}

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out) {
  switch (rows) {
    case 6: tile_rows<6, 1>(a, lda, wp, kp, out); break;
    case 5: tile_rows<5, 1>(a, lda, wp, kp, out); break;
    case 4: tile_rows<4, 1>(a, lda, wp, kp, out); break;
    case 3: tile_rows<3, 2>(a, lda, wp, kp, out); break;
    case 2: tile_rows<2, 2>(a, lda, wp, kp, out); break;
    default: tile_rows<1, 4>(a, lda, wp, kp, out); break;
  }
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx512vnni
}  // namespace cpuformer
