// Vectorised elementary functions for the AVX2 kernels. Include only from *_avx2*.cc files:
// everything here lives in cpuformer::avx2 and is compiled with AVX2+FMA flags.
#pragma once

#include <immintrin.h>

namespace cpuformer {
namespace avx2 {

// e^x, relative error ~2e-7; exactly 0 below -87.3 (so -inf gives 0). Same reduction as the
// AVX-512 version, with 2^n built from the exponent bits.
inline __m256 exp_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n in [-126, 127]: 2^n = (n + 127) << 23 reinterpreted as float.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 result = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(underflow, result);
}

inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float reduce_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace avx2
}  // namespace cpuformer
