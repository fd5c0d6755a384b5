// Peak probe of the AVX-VNNI int8 kernel of the avx2 level (gemm.h, gemm_peak.h): 256-bit VEX
// vpdpbusd, 32 multiply-adds per instruction.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avxvnni {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
}  // namespace

int64_t peak_dpbusd(long steps) {
  return peak_probe<10, 32>(
      steps, _mm256_setzero_si256(), [](__m256i c, __m256i a, __m256i w) { return _mm256_dpbusd_avx_epi32(c, a, w); },
      _mm256_set1_epi8(3), _mm256_set1_epi8(-5));
}

}  // namespace avxvnni
}  // namespace cpuformer
