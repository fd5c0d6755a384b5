// Peak probe of the AVX512-VNNI int8 kernel (gemm.h, gemm_peak.h): 512-bit vpdpbusd, 64
// multiply-adds per instruction.
#include <immintrin.h>

#include <cstdint>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512vnni {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
constexpr int kChains = 12;
volatile int32_t sink;
}  // namespace

int64_t peak_dpbusd(long steps) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  peak_chains<kChains>(steps, acc, [](__m512i c, __m512i a, __m512i w) { return _mm512_dpbusd_epi32(c, a, w); },
                       _mm512_set1_epi8(3), _mm512_set1_epi8(-5));
  __m512i sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  sink = _mm512_reduce_add_epi32(sum);
  return static_cast<int64_t>(steps) * kChains * 64;
}

}  // namespace avx512vnni
}  // namespace cpuformer
