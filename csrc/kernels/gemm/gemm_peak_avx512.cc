// Peak probes of the avx512 level (gemm_peak.h): the 512-bit FMA of the float32 and widening
// 16-bit kernels, and the vpmaddubsw sequence of the int8 kernel without VNNI (gemm_int8_avx512.cc:
// sign flip, vpmaddubsw, vpmaddwd, vpaddd per 64 products).
#include <immintrin.h>

#include <cstdint>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512 {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
constexpr int kChains = 12;  // FMA latency 4 × 2 pipes = 8 in flight, with margin
volatile int32_t sink;
}  // namespace

int64_t peak_fma(long steps) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  peak_chains<kChains>(steps, acc, [](__m512 c, __m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, c); },
                       _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-3f));
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  sink = static_cast<int32_t>(_mm512_reduce_add_ps(sum));
  return static_cast<int64_t>(steps) * kChains * 16;
}

int64_t peak_maddubs(long steps) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __mmask64 negative = 0x5555555555555555ull;
  peak_chains<kChains>(
      steps, acc,
      [negative](__m512i c, __m512i magnitude, __m512i w, __m512i ones) {
        const __m512i signed_w = _mm512_mask_sub_epi8(w, negative, _mm512_setzero_si512(), w);
        return _mm512_add_epi32(c, _mm512_madd_epi16(_mm512_maddubs_epi16(magnitude, signed_w), ones));
      },
      _mm512_set1_epi8(3), _mm512_set1_epi8(-5), _mm512_set1_epi16(1));
  __m512i sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  sink = _mm512_reduce_add_epi32(sum);
  return static_cast<int64_t>(steps) * kChains * 64;
}

}  // namespace avx512
}  // namespace cpuformer
