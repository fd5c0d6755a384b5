// The vector primitives the tiled attention kernel (attention_tiled_inl.h) is written in, for NEON
// on AArch64 (the neon, dotprod and i8mm levels): 4 float lanes, lane masks as all-ones/all-zeros
// integer vectors, and a partial vector's length where x86 has a load/store mask (NEON has no
// masked loads: a partial vector is loaded and stored lane by lane). Include only from *_neon*.cc
// files; everything lives in cpuformer::neon::attention_simd.
//
// Special values follow the x86 primitives: vmax is MAXPS (a > b ? a : b, the second operand when
// either is NaN), vexp2 gives NaN for NaN and exactly 0 below -126.
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "kernels/vector_math/vector_math_neon.h"

namespace cpuformer {
namespace neon {
namespace attention_simd {

constexpr int kLanes = 4;
// P·V register tile: kPvRows rows × kPvVecs vectors of accumulators (16 of the 32 registers),
// plus kPvVecs rows of V and one broadcast.
constexpr int kPvRows = 4;
constexpr int kPvVecs = 4;

// Keys per online-softmax step (a multiple of kLanes and kScoreKeys), and keys per pass of the
// wide score loop (two FMA chains each: 16 accumulators).
constexpr long kKeyBlock = 32;
constexpr int kScoreKeys = 8;

using Vec = float32x4_t;
using IVec = int32x4_t;
using TailMask = long;  // how many lanes of a partial vector are real, 1..kLanes

// Keeps a loaded value in a register, as on x86 (GCC would otherwise reload it for every FMA).
inline Vec in_register(Vec x) {
  __asm__("" : "+w"(x));
  return x;
}

inline Vec vzero() { return vdupq_n_f32(0.0f); }
inline Vec vset1(float x) { return vdupq_n_f32(x); }
inline Vec vneg_inf() { return vdupq_n_f32(-__builtin_inff()); }
inline Vec vload(const float* p) { return vld1q_f32(p); }
inline void vstore(float* p, Vec x) { vst1q_f32(p, x); }
inline TailMask tail_mask(long n) { return n; }  // lanes [0, n), 0 < n ≤ kLanes
inline TailMask full_mask() { return kLanes; }
// Lanes outside the mask read as 0 and are never touched in memory.
inline Vec vload_tail(const float* p, TailMask n) { return n >= kLanes ? vld1q_f32(p) : load_tail(p, n); }
inline void vstore_tail(float* p, Vec x, TailMask n) {
  if (n >= kLanes) vst1q_f32(p, x);
  else store_tail(p, x, n);
}
inline Vec vadd(Vec a, Vec b) { return vaddq_f32(a, b); }
inline Vec vsub(Vec a, Vec b) { return vsubq_f32(a, b); }
inline Vec vmul(Vec a, Vec b) { return vmulq_f32(a, b); }
inline Vec vmax(Vec a, Vec b) { return max_second_on_nan(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }  // a·b + c
// 2^x for x ≤ 0 (scores are kept in base 2: q is pre-scaled by log2(e)), exactly 0 below -126
// and for -inf, NaN for NaN (a NaN score must reach the row's output, as in the scalar level).
// x = n + r with |r| ≤ 1/2; 2^r = e^(r·ln2) by its degree-6 Taylor polynomial (relative error
// < 2e-7), then scaled by 2^n built from the exponent bits (a NaN n converts to 0: 2^0 · NaN).
inline Vec vexp2(Vec x) {
  const Vec lo = vdupq_n_f32(-126.0f);
  const uint32x4_t underflow = vcltq_f32(x, lo);  // false for NaN
  const Vec xc = vmaxq_f32(lo, x);                // FMAX keeps a NaN x
  const Vec n = vrndnq_f32(xc);
  const Vec r = vsubq_f32(xc, n);
  Vec p = vdupq_n_f32(1.5403530393381606e-4f);            // ln2^6 / 720
  p = vfmaq_f32(vdupq_n_f32(1.3333558146428443e-3f), p, r);  // ln2^5 / 120
  p = vfmaq_f32(vdupq_n_f32(9.6181291076284772e-3f), p, r);  // ln2^4 / 24
  p = vfmaq_f32(vdupq_n_f32(5.5504108664821580e-2f), p, r);  // ln2^3 / 6
  p = vfmaq_f32(vdupq_n_f32(2.4022650695910071e-1f), p, r);  // ln2^2 / 2
  p = vfmaq_f32(vdupq_n_f32(6.9314718055994531e-1f), p, r);  // ln2
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
  // n in [-126, 0]: 2^n = (n + 127) << 23 reinterpreted as float.
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const Vec y = vmulq_f32(p, vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), underflow));
}
inline float hsum(Vec x) { return vaddvq_f32(x); }
inline float hmax(Vec x) { return vmaxvq_f32(x); }  // NaN if some lane is NaN
inline float vfirst(Vec x) { return vgetq_lane_f32(x, 0); }

// The running max with -inf replaced by 0, so that s - m stays -inf (not NaN) for a row that
// has seen only -inf scores so far.
inline Vec vfinite_or_zero(Vec m) { return vbslq_f32(vceqq_f32(m, vneg_inf()), vzero(), m); }

// mask · log2 e, the additive mask in base-2 score units, without overflowing: -inf stays -inf
// and a finite mask stays finite (HF's finfo(float32).min masking keeps its meaning).
inline Vec vmask_to_base2(Vec mask, Vec log2e) {
  const uint32x4_t removed = vceqq_f32(mask, vneg_inf());
  const Vec scaled = vmaxq_f32(vdupq_n_f32(-3.40282347e38f), vmulq_f32(mask, log2e));  // FMAX: NaN stays NaN
  return vbslq_f32(removed, vneg_inf(), scaled);
}

inline IVec iset1(int x) { return vdupq_n_s32(x); }
inline IVec iload(const int* p) { return vld1q_s32(p); }
inline IVec iota_plus(int base) {
  static const int32_t kIota[4] = {0, 1, 2, 3};
  return vaddq_s32(vdupq_n_s32(base), vld1q_s32(kIota));
}

// Lane masks: which lanes (query rows or keys) a key is removed from, all ones per lane.
using LaneMask = uint32x4_t;
inline LaneMask lanes_none() { return vdupq_n_u32(0); }
inline LaneMask lanes_all() { return vdupq_n_u32(~0u); }
inline LaneMask lanes_or(LaneMask a, LaneMask b) { return vorrq_u32(a, b); }
// Lanes whose key index lies outside [first, last].
inline LaneMask lanes_outside(IVec key, IVec first, IVec last) {
  return vorrq_u32(vcltq_s32(key, first), vcgtq_s32(key, last));
}
inline LaneMask lanes_neg_inf(Vec x) { return vceqq_f32(x, vneg_inf()); }
// -inf in the removed lanes whatever s holds there (a NaN or +inf score of a removed key must
// not become NaN by adding the mask's -inf).
inline Vec vremove(Vec s, LaneMask removed) { return vbslq_f32(removed, vneg_inf(), s); }
// Bit t set for lane t in the mask.
inline unsigned lane_bits(LaneMask m) {
  static const uint32_t kBits[4] = {1, 2, 4, 8};
  return vaddvq_u32(vandq_u32(m, vld1q_u32(kBits)));
}
// -inf in every lane whose key index lies outside [first, last].
inline Vec vmask_outside(Vec s, IVec key, IVec first, IVec last) { return vremove(s, lanes_outside(key, first, last)); }
// In-place transpose of a kLanes × kLanes block held in r[0..3]: 32-bit, then 64-bit pairs.
inline void transpose(Vec* r) {
  const Vec t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
  const Vec t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
  r[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
  r[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
  r[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
  r[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

// No gather instruction: four scalar loads.
inline Vec vgather(const float* base, IVec index) {
  Vec x = vld1q_dup_f32(base + vgetq_lane_s32(index, 0));
  x = vld1q_lane_f32(base + vgetq_lane_s32(index, 1), x, 1);
  x = vld1q_lane_f32(base + vgetq_lane_s32(index, 2), x, 2);
  return vld1q_lane_f32(base + vgetq_lane_s32(index, 3), x, 3);
}

// Lane t of the result is the sum of the lanes of acc[t]: 4 horizontal sums in 3 pairwise adds.
inline Vec vsum_transposed(const Vec* acc) {
  return vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3]));
}

// dst[0, n) = the float16 values src[0, n) as float32 (FCVTL, exact).
inline void widen_f16(const uint16_t* src, float* dst, long n) {
  long x = 0;
  for (; x + 4 <= n; x += 4) vst1q_f32(dst + x, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + x))));
  for (; x < n; ++x) dst[x] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(src[x]))), 0);
}

// dst[0, n) = the bfloat16 values src[0, n) as float32 (a 16-bit shift, exact).
inline void widen_bf16(const uint16_t* src, float* dst, long n) {
  long x = 0;
  for (; x + 4 <= n; x += 4) vst1q_f32(dst + x, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(src + x), 16)));
  for (; x < n; ++x) {
    const uint32_t bits = static_cast<uint32_t>(src[x]) << 16;
    __builtin_memcpy(dst + x, &bits, sizeof(float));
  }
}

// dst[0, n) = scale · src[0, n), one rounding per element as in the scalar level.
inline void widen_s8(const int8_t* src, float scale, float* dst, long n) {
  const Vec s = vdupq_n_f32(scale);
  long x = 0;
  for (; x + 8 <= n; x += 8) {
    const int16x8_t wide = vmovl_s8(vld1_s8(src + x));
    vst1q_f32(dst + x, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide))), s));
    vst1q_f32(dst + x + 4, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(wide)), s));
  }
  for (; x < n; ++x) dst[x] = scale * static_cast<float>(src[x]);
}

// kLanes cache values from p as float32, converted exactly as the widen_* functions above convert
// them (int8: the codes, not yet scaled): the narrow engine reads the cache into registers.
inline Vec vload_f16(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
inline Vec vload_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
inline Vec vload_s8(const int8_t* p) {
  int32_t four;
  __builtin_memcpy(&four, p, sizeof(four));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(four))))));
}

}  // namespace attention_simd
}  // namespace neon
}  // namespace cpuformer
