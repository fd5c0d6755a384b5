// Peak probe of the AVX-VNNI int8 kernel of the avx2 level (gemm.h, gemm_peak.h): 256-bit
// VEX vpdpbusd, 32 multiply-adds per instruction.
#include <immintrin.h>

#include <cstdint>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avxvnni {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
constexpr int kChains = 10;
volatile int32_t sink;
}  // namespace

int64_t peak_dpbusd(long steps) {
  __m256i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi32(i);
  peak_chains<kChains>(steps, acc,
                       [](__m256i c, __m256i a, __m256i w) { return _mm256_dpbusd_avx_epi32(c, a, w); },
                       _mm256_set1_epi8(3), _mm256_set1_epi8(-5));
  alignas(32) int32_t lanes[8];
  __m256i sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  int32_t s = 0;
  for (int32_t x : lanes) s += x;
  sink = s;
  return static_cast<int64_t>(steps) * kChains * 32;
}

}  // namespace avxvnni
}  // namespace cpuformer
