// Vectorised elementary functions for the NEON kernels (AArch64: the neon, dotprod and i8mm
// levels). Include only from *_neon*.cc files: everything here lives in cpuformer::neon.
//
// The same functions, constants, operations and special values as vector_math_avx2.h (see
// vector_math_avx512.h for the error bounds): 4 lanes instead of 8, FMLA/FMLS for the fused
// multiply-adds, FDIV for the quotients. The results need not match AVX2's bit for bit: GCC's
// arm_neon.h writes vmulq_f32 / vaddq_f32 as plain vector operators, which it may contract into
// FMLA. tests/native/kernel_tests.cc checks the bounds at every ARM level (scripts/test-aarch64.sh).
//
// NaN: NEON's FMAX/FMIN return NaN when either operand is NaN and FMAXNM/FMINNM return the number,
// where x86's MAXPS/MINPS return their second operand. The clamps below pick the variant that
// gives the x86 special values: exp_ps turns NaN into a tiny number, exp_ps_nan_propagating and
// the rest keep it.
#pragma once

#include <arm_neon.h>

namespace cpuformer {
namespace neon {

namespace exp_detail {
constexpr float kLo = -87.33654f;         // below: e^x < FLT_MIN, the result is flushed to exactly 0
constexpr float kHi = 88.3762626647949f;  // keeps n ≤ 127 so 2^n fits the exponent field

// e^xc for xc in [kLo, kHi] (or NaN): x = n·ln2 + r, |r| ≤ ln2/2, degree-6 polynomial for e^r,
// then 2^n built from the exponent bits. A NaN n converts to 0, whose shifted bits are 1.0f, so a
// NaN p still gives NaN.
inline float32x4_t exp_clamped(float32x4_t xc) {
  const float32x4_t n = vrndnq_f32(vmulq_f32(xc, vdupq_n_f32(1.44269504088896341f)));  // to nearest, ties even
  float32x4_t r = vfmsq_f32(xc, n, vdupq_n_f32(0.693359375f));  // xc - n·ln2_hi, fused
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.0f / 720);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}
}  // namespace exp_detail

// e^x, relative error ≤ 2.5e-7 where the result is a normal float; exactly 0 below -87.3 (so -inf
// gives 0). Inputs are clamped to 88.376, so +inf and every x above give 2.4e38 (finite). A NaN
// input gives about 1.2e-38 (FMAXNM drops it for kLo), not NaN: use exp_ps_nan_propagating where a
// NaN must survive.
inline float32x4_t exp_ps(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(exp_detail::kLo), hi = vdupq_n_f32(exp_detail::kHi);
  const uint32x4_t underflow = vcltq_f32(x, lo);  // false for NaN
  const float32x4_t xc = vminnmq_f32(vmaxnmq_f32(x, lo), hi);
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(exp_detail::exp_clamped(xc)), underflow));
}

// exp_ps, except that a NaN input gives NaN (FMAX/FMIN propagate it through the clamps).
inline float32x4_t exp_ps_nan_propagating(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(exp_detail::kLo), hi = vdupq_n_f32(exp_detail::kHi);
  const uint32x4_t underflow = vcltq_f32(x, lo);
  const float32x4_t xc = vminq_f32(vmaxq_f32(x, lo), hi);
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(exp_detail::exp_clamped(xc)), underflow));
}

namespace rational_detail {
inline float32x4_t copysign_one_ps(float32x4_t x) { return vbslq_f32(vdupq_n_u32(0x80000000u), x, vdupq_n_f32(1.0f)); }
}  // namespace rational_detail

// erf(x): x·P(x²)/Q(x²) on |x| ≤ 3.85, exactly ±1 beyond (see vector_math_avx512.h).
inline float32x4_t erf_ps(float32x4_t x) {
  const float32x4_t t = vmulq_f32(x, x);
  float32x4_t p = vdupq_n_f32(2.128168397e-08f);
  p = vfmaq_f32(vdupq_n_f32(-1.939023150e-06f), p, t);
  p = vfmaq_f32(vdupq_n_f32(1.241150458e-04f), p, t);
  p = vfmaq_f32(vdupq_n_f32(2.889738651e-03f), p, t);
  p = vfmaq_f32(vdupq_n_f32(4.797575995e-02f), p, t);
  p = vfmaq_f32(vdupq_n_f32(1.804315597e-01f), p, t);
  p = vfmaq_f32(vdupq_n_f32(1.128379226e+00f), p, t);
  float32x4_t q = vdupq_n_f32(7.648545434e-04f);
  q = vfmaq_f32(vdupq_n_f32(1.268896833e-02f), q, t);
  q = vfmaq_f32(vdupq_n_f32(1.069280580e-01f), q, t);
  q = vfmaq_f32(vdupq_n_f32(4.932375550e-01f), q, t);
  q = vfmaq_f32(vdupq_n_f32(1.0f), q, t);
  // Large |x| overflows t to inf and the quotient to NaN; those lanes are replaced below.
  const float32x4_t r = vdivq_f32(vmulq_f32(x, p), q);
  const uint32x4_t saturated = vcgtq_f32(vabsq_f32(x), vdupq_n_f32(3.85f));  // false for NaN
  return vbslq_f32(saturated, rational_detail::copysign_one_ps(x), r);
}

// tanh(x): x·P(x²)/Q(x²) on |x| ≤ 9, exactly ±1 beyond (see vector_math_avx512.h).
inline float32x4_t tanh_ps(float32x4_t x) {
  const float32x4_t t = vmulq_f32(x, x);
  float32x4_t p = vdupq_n_f32(1.790272965e-11f);
  p = vfmaq_f32(vdupq_n_f32(-1.272775130e-08f), p, t);
  p = vfmaq_f32(vdupq_n_f32(9.280606719e-06f), p, t);
  p = vfmaq_f32(vdupq_n_f32(2.924963599e-03f), p, t);
  p = vfmaq_f32(vdupq_n_f32(1.292429119e-01f), p, t);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, t);
  float32x4_t q = vdupq_n_f32(2.285106893e-04f);
  q = vfmaq_f32(vdupq_n_f32(2.378377318e-02f), q, t);
  q = vfmaq_f32(vdupq_n_f32(4.625764191e-01f), q, t);
  q = vfmaq_f32(vdupq_n_f32(1.0f), q, t);
  const float32x4_t r = vdivq_f32(vmulq_f32(x, p), q);
  const uint32x4_t saturated = vcgtq_f32(vabsq_f32(x), vdupq_n_f32(9.0f));
  return vbslq_f32(saturated, rational_detail::copysign_one_ps(x), r);
}

// σ(x) from e = e^-|x| ≤ 1 (see vector_math_avx512.h).
inline float32x4_t sigmoid_ps(float32x4_t x) {
  const float32x4_t e = exp_ps_nan_propagating(vnegq_f32(vabsq_f32(x)));  // e^-|x|
  const float32x4_t r = vdivq_f32(vdupq_n_f32(1.0f), vaddq_f32(vdupq_n_f32(1.0f), e));
  return vbslq_f32(vcltzq_f32(x), vmulq_f32(r, e), r);
}

// The activations of activation.h (special values as in vector_math_avx512.h).
inline float32x4_t gelu_erf_ps(float32x4_t x) {
  const float32x4_t e = erf_ps(vmulq_f32(x, vdupq_n_f32(0.70710678118654752f)));
  return vmulq_f32(vmulq_f32(x, vdupq_n_f32(0.5f)), vaddq_f32(vdupq_n_f32(1.0f), e));
}

inline float32x4_t gelu_tanh_ps(float32x4_t x) {
  const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
  const float32x4_t two_u =
      vmulq_f32(vdupq_n_f32(2.0f * 0.7978845608028654f), vfmaq_f32(x, vdupq_n_f32(0.044715f), x3));
  return vmulq_f32(x, sigmoid_ps(two_u));
}

inline float32x4_t silu_ps(float32x4_t x) { return vmulq_f32(x, sigmoid_ps(x)); }

inline float32x4_t quick_gelu_ps(float32x4_t x) { return vmulq_f32(x, sigmoid_ps(vmulq_f32(vdupq_n_f32(1.702f), x))); }

// x86 MAXPS: a > b ? a : b, so b (the second operand) when either is NaN.
inline float32x4_t max_second_on_nan(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }

inline float reduce_add(float32x4_t v) { return vaddvq_f32(v); }
inline float reduce_max(float32x4_t v) { return vmaxvq_f32(v); }  // NaN if a lane is NaN

// The first n < 4 elements of p, the other lanes 0; reads only p[0, n).
inline float32x4_t load_tail(const float* p, long n) {
  float32x4_t x = vdupq_n_f32(0.0f);
  x = vld1q_lane_f32(p, x, 0);
  if (n > 1) x = vld1q_lane_f32(p + 1, x, 1);
  if (n > 2) x = vld1q_lane_f32(p + 2, x, 2);
  return x;
}

// Stores lanes [0, n) of x, n < 4; writes only p[0, n).
inline void store_tail(float* p, float32x4_t x, long n) {
  vst1q_lane_f32(p, x, 0);
  if (n > 1) vst1q_lane_f32(p + 1, x, 1);
  if (n > 2) vst1q_lane_f32(p + 2, x, 2);
}

}  // namespace neon
}  // namespace cpuformer
