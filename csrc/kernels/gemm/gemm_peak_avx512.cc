// Peak probes of the avx512 level (gemm_peak.h): the 512-bit FMA of the float32 and widening
// 16-bit kernels, and the vpmaddubsw sequence of the int8 kernel without VNNI (gemm_int8_avx512.cc:
// sign flip, vpmaddubsw, vpmaddwd, vpaddd per 64 products). 12 chains: FMA latency 4 × 2 pipes
// = 8 in flight, with margin.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512 {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
}  // namespace

int64_t peak_fma(long steps) {
  return peak_probe<12, 16>(
      steps, _mm512_set1_ps(1.0f), [](__m512 c, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, c); },
      _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f));
}

int64_t peak_maddubs(long steps) {
  const __mmask64 negative = 0x5555555555555555ull;
  return peak_probe<12, 64>(
      steps, _mm512_setzero_si512(),
      [negative](__m512i c, __m512i magnitude, __m512i w, __m512i ones) {
        const __m512i signed_w = _mm512_mask_sub_epi8(w, negative, _mm512_setzero_si512(), w);
        return _mm512_add_epi32(c, _mm512_madd_epi16(_mm512_maddubs_epi16(magnitude, signed_w), ones));
      },
      _mm512_set1_epi8(3), _mm512_set1_epi8(-5), _mm512_set1_epi16(1));
}

}  // namespace avx512
}  // namespace cpuformer
