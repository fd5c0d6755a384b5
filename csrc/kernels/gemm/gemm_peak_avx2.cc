// Peak probes of the avx2 level (gemm_peak.h): the 256-bit FMA of the float32 and widening 16-bit
// kernels, and the vpmaddubsw sequence of the int8 kernel without AVX-VNNI (gemm_int8_avx2.cc:
// vpsignb, vpmaddubsw, vpmaddwd, vpaddd per 32 products; the kernel's vpabsb is shared by two
// vectors and left out). 10 chains: with the four operands they fit the 16 ymm registers.
#include <immintrin.h>

#include <cstdint>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx2 {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
constexpr int kChains = 10;
volatile int32_t sink;

int32_t lane_sum(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  int32_t s = 0;
  for (int32_t x : lanes) s += x;
  return s;
}
}  // namespace

int64_t peak_fma(long steps) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  peak_chains<kChains>(steps, acc, [](__m256 c, __m256 a, __m256 b) { return _mm256_fmadd_ps(a, b, c); },
                       _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-3f));
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  sink = lane_sum(_mm256_cvttps_epi32(sum));
  return static_cast<int64_t>(steps) * kChains * 8;
}

int64_t peak_maddubs(long steps) {
  __m256i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi32(i);
  peak_chains<kChains>(
      steps, acc,
      [](__m256i c, __m256i magnitude, __m256i a, __m256i w, __m256i ones) {
        const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w, a));
        return _mm256_add_epi32(c, _mm256_madd_epi16(pairs, ones));
      },
      _mm256_set1_epi8(3), _mm256_set1_epi8(-3), _mm256_set1_epi8(5), _mm256_set1_epi16(1));
  __m256i sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  sink = lane_sum(sum);
  return static_cast<int64_t>(steps) * kChains * 32;
}

}  // namespace avx2
}  // namespace cpuformer
