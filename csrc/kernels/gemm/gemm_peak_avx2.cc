// Peak probes of the avx2 level (gemm_peak.h): the 256-bit FMA of the float32 and widening 16-bit
// kernels, and the vpmaddubsw sequence of the int8 kernel without AVX-VNNI (gemm_int8_avx2.cc:
// vpsignb, vpmaddubsw, vpmaddwd, vpaddd per 32 products; the kernel's vpabsb is shared by two
// vectors and left out). 10 chains: with the four operands they fit the 16 ymm registers.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx2 {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
}  // namespace

int64_t peak_fma(long steps) {
  return peak_probe<10, 8>(
      steps, _mm256_set1_ps(1.0f), [](__m256 c, __m256 a, __m256 b) { return _mm256_fmadd_ps(a, b, c); },
      _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-3f));
}

int64_t peak_maddubs(long steps) {
  return peak_probe<10, 32>(
      steps, _mm256_setzero_si256(),
      [](__m256i c, __m256i magnitude, __m256i a, __m256i w, __m256i ones) {
        const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w, a));
        return _mm256_add_epi32(c, _mm256_madd_epi16(pairs, ones));
      },
      _mm256_set1_epi8(3), _mm256_set1_epi8(-3), _mm256_set1_epi8(5), _mm256_set1_epi16(1));
}

}  // namespace avx2
}  // namespace cpuformer
