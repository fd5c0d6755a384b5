// Vectorised elementary functions for the AVX2 kernels. Include only from *_avx2*.cc files:
// everything here lives in cpuformer::avx2 and is compiled with AVX2+FMA flags.
//
// The same functions, constants and special values as vector_math_avx512.h (see there); accuracy
// is checked by tests/kernels/test_vector_math.py at every ISA level.
#pragma once

#include <immintrin.h>

namespace cpuformer {
namespace avx2 {

namespace exp_detail {
constexpr float kLo = -87.33654f;          // below: e^x < FLT_MIN, the result is flushed to exactly 0
constexpr float kHi = 88.3762626647949f;   // keeps n ≤ 127 so 2^n fits the exponent field

// e^xc for xc already in [kLo, kHi]: the AVX-512 reduction, with 2^n built from the exponent bits.
inline __m256 exp_clamped(__m256 xc) {
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
  // n in [-126, 127]: 2^n = (n + 127) << 23 reinterpreted as float. (A NaN n converts to
  // INT_MIN, whose shifted bits are 1.0f, so a NaN p still gives NaN.)
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
}  // namespace exp_detail

// e^x, relative error ≤ 2.5e-7 where the result is a normal float; exactly 0 below -87.3 (so -inf
// gives 0). Inputs are clamped to 88.376, so +inf and every x above give 2.4e38 (finite). A NaN
// input gives about 1.2e-38, not NaN: use exp_ps_nan_propagating where a NaN must survive.
inline __m256 exp_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(exp_detail::kLo), hi = _mm256_set1_ps(exp_detail::kHi);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  return _mm256_andnot_ps(underflow, exp_detail::exp_clamped(xc));
}

// exp_ps, except that a NaN input gives NaN (x is the second operand of the clamps, which
// MAXPS/MINPS return when either operand is NaN).
inline __m256 exp_ps_nan_propagating(__m256 x) {
  const __m256 lo = _mm256_set1_ps(exp_detail::kLo), hi = _mm256_set1_ps(exp_detail::kHi);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  return _mm256_andnot_ps(underflow, exp_detail::exp_clamped(xc));
}

namespace rational_detail {
inline __m256 abs_ps(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }
inline __m256 copysign_one_ps(__m256 x) {
  return _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
}
}  // namespace rational_detail

// erf(x): x·P(x²)/Q(x²) on |x| ≤ 3.85, exactly ±1 beyond (see vector_math_avx512.h).
inline __m256 erf_ps(__m256 x) {
  const __m256 t = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(2.128168397e-08f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.939023150e-06f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.241150458e-04f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(2.889738651e-03f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(4.797575995e-02f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.804315597e-01f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.128379226e+00f));
  __m256 q = _mm256_set1_ps(7.648545434e-04f);
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.268896833e-02f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.069280580e-01f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(4.932375550e-01f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.0f));
  const __m256 r = _mm256_div_ps(_mm256_mul_ps(x, p), q);
  const __m256 saturated = _mm256_cmp_ps(rational_detail::abs_ps(x), _mm256_set1_ps(3.85f), _CMP_GT_OQ);
  return _mm256_blendv_ps(r, rational_detail::copysign_one_ps(x), saturated);
}

// tanh(x): x·P(x²)/Q(x²) on |x| ≤ 9, exactly ±1 beyond (see vector_math_avx512.h).
inline __m256 tanh_ps(__m256 x) {
  const __m256 t = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(1.790272965e-11f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.272775130e-08f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(9.280606719e-06f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(2.924963599e-03f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.292429119e-01f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.0f));
  __m256 q = _mm256_set1_ps(2.285106893e-04f);
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(2.378377318e-02f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(4.625764191e-01f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.0f));
  const __m256 r = _mm256_div_ps(_mm256_mul_ps(x, p), q);
  const __m256 saturated = _mm256_cmp_ps(rational_detail::abs_ps(x), _mm256_set1_ps(9.0f), _CMP_GT_OQ);
  return _mm256_blendv_ps(r, rational_detail::copysign_one_ps(x), saturated);
}

// σ(x) from e = e^-|x| ≤ 1 (see vector_math_avx512.h).
inline __m256 sigmoid_ps(__m256 x) {
  const __m256 e = exp_ps_nan_propagating(_mm256_or_ps(x, _mm256_set1_ps(-0.0f)));  // e^-|x|
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  return _mm256_blendv_ps(r, _mm256_mul_ps(r, e), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

// The activations of activation.h (special values as in vector_math_avx512.h).
inline __m256 gelu_erf_ps(__m256 x) {
  const __m256 e = erf_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f)));
  return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

inline __m256 gelu_tanh_ps(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 two_u =
      _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
  return _mm256_mul_ps(x, sigmoid_ps(two_u));
}

inline __m256 silu_ps(__m256 x) { return _mm256_mul_ps(x, sigmoid_ps(x)); }

inline __m256 quick_gelu_ps(__m256 x) { return _mm256_mul_ps(x, sigmoid_ps(_mm256_mul_ps(_mm256_set1_ps(1.702f), x))); }

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

// Lanes [0, n) set, for the masked loads/stores of a row's last n < 8 elements.
// (_mm256_maskload_ps does not touch memory of masked-off lanes, so reading past the row is safe.)
inline __m256i tail_mask(long n) {
  static const int kBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kBits + 8 - n));
}

}  // namespace avx2
}  // namespace cpuformer
