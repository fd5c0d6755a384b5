// AVX-512 VNNI int8 GEMM: A rows quantized to u8 (qa + 128), vpdpbusd against s8 weights, the
// compensation 128·Σq subtracted in the epilogue. Register tile 6 rows × 64 features (24 zmm
// accumulators); driver and packed layout in gemm_int8_inl.h.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512vnni {
extern const Int8GemmKernels kInt8GemmKernels;
namespace {

constexpr long kMR = 6;
constexpr long kNR = 64;
constexpr bool kUnsignedA = true;
using avx512::kActivationKernels;

#include "kernels/gemm/gemm_int8_inl.h"
#include "kernels/gemm/gemm_int8_avx512_inl.h"

template <int R>
__attribute__((always_inline)) inline void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp,
                                                     int32_t* out) {
  __m512i acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_si512();
  for (long p = 0; p < kp; p += 4) {
    const __m512i w0 = _mm512_load_si512(wp), w1 = _mm512_load_si512(wp + 64);
    const __m512i w2 = _mm512_load_si512(wp + 128), w3 = _mm512_load_si512(wp + 192);
    wp += 4 * kNR;
    for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, a + r * lda + p, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], av, w0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], av, w1);
      acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], av, w2);
      acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], av, w3);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_si512(out + r * kNR + 16 * v, acc[r][v]);
}

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out) {
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

}  // namespace avx512vnni
}  // namespace cpuformer
