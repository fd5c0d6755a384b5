// Peak probe of the AVX512-VNNI int8 kernel (gemm.h, gemm_peak.h): 512-bit vpdpbusd, 64
// multiply-adds per instruction.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512vnni {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
}  // namespace

int64_t peak_dpbusd(long steps) {
  return peak_probe<12, 64>(
      steps, _mm512_setzero_si512(), [](__m512i c, __m512i a, __m512i w) { return _mm512_dpbusd_epi32(c, a, w); },
      _mm512_set1_epi8(3), _mm512_set1_epi8(-5));
}

}  // namespace avx512vnni
}  // namespace cpuformer
