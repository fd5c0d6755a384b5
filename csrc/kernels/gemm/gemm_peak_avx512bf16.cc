// Peak probe of the AVX512-BF16 kernel for bfloat16 weights (gemm.h, gemm_peak.h): 512-bit
// vdpbf16ps, 32 multiply-adds per instruction.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512bf16 {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"

__m512bh as_bh(__m512i v) {
  __m512bh r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}
}  // namespace

int64_t peak_dpbf16(long steps) {
  // 0x3F80 is bfloat16 1.0, 0x3A83 about 1e-3.
  return peak_probe<12, 32>(
      steps, _mm512_setzero_ps(), [](__m512 c, __m512bh a, __m512bh w) { return _mm512_dpbf16_ps(c, a, w); },
      as_bh(_mm512_set1_epi16(0x3F80)), as_bh(_mm512_set1_epi16(0x3A83)));
}

}  // namespace avx512bf16
}  // namespace cpuformer
