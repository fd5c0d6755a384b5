// Vectorised elementary functions for the AVX-512 kernels. Include only from *_avx512*.cc files:
// everything here lives in cpuformer::avx512 and is compiled with AVX-512 flags.
//
// Special values: every function below except exp_ps returns NaN for a NaN input. The stated
// errors are against the exact function, measured over every float input (the AVX2 versions give
// bit-identical results); tests/kernels/test_vector_math.py checks them at every ISA level.
#pragma once

#include <immintrin.h>

namespace cpuformer {
namespace avx512 {

namespace exp_detail {
constexpr float kLo = -87.33654f;    // below: e^x < FLT_MIN, the result is flushed to exactly 0
constexpr float kHi = 88.72283f;     // just under ln(FLT_MAX)

// e^xc for xc already in [kLo, kHi]: x = n·ln2 + r, |r| ≤ ln2/2, degree-6 polynomial for e^r,
// then scalef by 2^n.
inline __m512 exp_clamped(__m512 xc) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);  // ln2 split in hi + lo
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
}  // namespace exp_detail

// e^x, relative error ≤ 2.3e-7 (3 ulp) where the result is a normal float; exactly 0 below
// -87.3 (so -inf gives 0). Inputs are clamped to 88.72283, so +inf and every x above give
// 3.4027e38 (finite, not inf). A NaN input gives about 1.2e-38, not NaN: use
// exp_ps_nan_propagating where a NaN must survive.
inline __m512 exp_ps(__m512 x) {
  const __m512 lo = _mm512_set1_ps(exp_detail::kLo), hi = _mm512_set1_ps(exp_detail::kHi);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  return _mm512_mask_blend_ps(underflow, exp_detail::exp_clamped(xc), _mm512_setzero_ps());
}

// exp_ps, except that a NaN input gives NaN. MAXPS/MINPS return their second operand when either
// operand is NaN, so putting x second lets the NaN through the clamps.
inline __m512 exp_ps_nan_propagating(__m512 x) {
  const __m512 lo = _mm512_set1_ps(exp_detail::kLo), hi = _mm512_set1_ps(exp_detail::kHi);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  return _mm512_mask_blend_ps(underflow, exp_detail::exp_clamped(xc), _mm512_setzero_ps());
}

namespace rational_detail {
inline __m512 abs_ps(__m512 x) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x); }
inline __m512 copysign_one_ps(__m512 x) {
  return _mm512_or_ps(_mm512_and_ps(x, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
}
}  // namespace rational_detail

// erf(x), absolute and relative error ≤ 4e-7. erf(x) = x·P(x²)/Q(x²) on |x| ≤ 3.85, a minimax
// rational fit (relative error 7e-8 with these float coefficients; the rest is float rounding).
// Beyond 3.85 erf(x) rounds to ±1 in float, which is returned exactly, so 1 ± erf cancels to
// exactly 0 in the tails, never to a residue.
inline __m512 erf_ps(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(2.128168397e-08f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.939023150e-06f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.241150458e-04f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(2.889738651e-03f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(4.797575995e-02f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.804315597e-01f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.128379226e+00f));
  __m512 q = _mm512_set1_ps(7.648545434e-04f);
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.268896833e-02f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.069280580e-01f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(4.932375550e-01f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.0f));
  // Large |x| overflows t to inf and the quotient to NaN; those lanes are replaced below.
  const __m512 r = _mm512_div_ps(_mm512_mul_ps(x, p), q);
  const __mmask16 saturated = _mm512_cmp_ps_mask(rational_detail::abs_ps(x), _mm512_set1_ps(3.85f), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(r, saturated, rational_detail::copysign_one_ps(x));
}

// tanh(x), absolute and relative error ≤ 4e-7. tanh(x) = x·P(x²)/Q(x²) on |x| ≤ 9, a minimax
// rational fit (relative error 1.5e-7 with these float coefficients), exact at 0; beyond 9
// tanh(x) rounds to ±1, returned exactly.
inline __m512 tanh_ps(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(1.790272965e-11f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.272775130e-08f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(9.280606719e-06f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(2.924963599e-03f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.292429119e-01f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.0f));
  __m512 q = _mm512_set1_ps(2.285106893e-04f);
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(2.378377318e-02f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(4.625764191e-01f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.0f));
  const __m512 r = _mm512_div_ps(_mm512_mul_ps(x, p), q);
  const __mmask16 saturated = _mm512_cmp_ps_mask(rational_detail::abs_ps(x), _mm512_set1_ps(9.0f), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(r, saturated, rational_detail::copysign_one_ps(x));
}

// σ(x) = 1/(1+e^-x), absolute error ≤ 1e-7, relative ≤ 3.3e-7. With e = e^-|x| ≤ 1:
// σ(|x|) = 1/(1+e) and σ(-|x|) = e/(1+e), so nothing overflows and the far negative tail keeps
// its relative accuracy; σ(x) is exactly 0 below -87.3, σ(-inf) = 0, σ(+inf) = 1.
inline __m512 sigmoid_ps(__m512 x) {
  const __m512 e = exp_ps_nan_propagating(_mm512_or_ps(x, _mm512_set1_ps(-0.0f)));  // e^-|x|
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  return _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), r, e);
}

// The activations of activation.h, with the same special values as the scalar reference:
// f(+inf) = +inf, f(-inf) = NaN (the reference's -inf·0), large negative x gives ±0.

// x·Φ(x) = 0.5·x·(1 + erf(x/√2)), absolute error ≤ 1.2e-6 (largest near |x| = 5.3). Like the
// reference formula, it has no relative accuracy where the result is tiny (x < -4).
inline __m512 gelu_erf_ps(__m512 x) {
  const __m512 e = erf_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
  return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// 0.5·x·(1 + tanh(u)) with u = √(2/π)·(x + 0.044715·x³), absolute error ≤ 6e-7. Evaluated as
// x·σ(2u) (the same function: 0.5·(1 + tanh(u)) = σ(2u)), which has no 1 + tanh cancellation in
// the negative tail.
inline __m512 gelu_tanh_ps(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 two_u =
      _mm512_mul_ps(_mm512_set1_ps(2.0f * 0.7978845608028654f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
  return _mm512_mul_ps(x, sigmoid_ps(two_u));
}

// x·σ(x), relative error ≤ 3.6e-7
inline __m512 silu_ps(__m512 x) { return _mm512_mul_ps(x, sigmoid_ps(x)); }

inline __m512 quick_gelu_ps(__m512 x) { return _mm512_mul_ps(x, sigmoid_ps(_mm512_mul_ps(_mm512_set1_ps(1.702f), x))); }

inline float reduce_add(__m512 v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(__m512 v) { return _mm512_reduce_max_ps(v); }

// Lanes [0, n) set, for the masked loads/stores of a row's last n < 16 elements (masked-off lanes
// are not read, so loading past the end of the row cannot fault).
inline __mmask16 tail_mask(long n) { return static_cast<__mmask16>((1u << n) - 1u); }

}  // namespace avx512
}  // namespace cpuformer
