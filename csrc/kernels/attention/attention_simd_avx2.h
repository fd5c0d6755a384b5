// The vector primitives the tiled attention kernel (attention_tiled_inl.h) is written in, for
// AVX2 + FMA: 8 float lanes, lane masks as all-ones/all-zeros integer vectors. Include only from
// *_avx2*.cc files; everything lives in cpuformer::avx2::attention_simd.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/vector_math/vector_math_avx2.h"

namespace cpuformer {
namespace avx2 {
namespace attention_simd {

constexpr int kLanes = 8;
// P·V register tile: kPvRows rows × kPvVecs vectors of accumulators (8 of the 16 registers),
// plus kPvVecs rows of V and one broadcast.
constexpr int kPvRows = 4;
constexpr int kPvVecs = 2;

// Keys per online-softmax step (a multiple of kLanes and kScoreKeys), and keys per pass of the
// wide score loop (two FMA chains each: more than FMA latency × issue width = 8 in flight).
constexpr long kKeyBlock = 48;
constexpr int kScoreKeys = 6;

using Vec = __m256;
using IVec = __m256i;
using TailMask = __m256i;  // which lanes of a partial vector are real (all ones)

// Keeps a loaded value in a register: without it GCC folds the load into every FMA that uses
// it, and the P·V loop turns load-bound (one load per FMA instead of one per row of V).
inline Vec in_register(Vec x) {
  __asm__("" : "+v"(x));
  return x;
}

inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset1(float x) { return _mm256_set1_ps(x); }
inline Vec vneg_inf() { return _mm256_set1_ps(-__builtin_inff()); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec x) { _mm256_storeu_ps(p, x); }
using ::cpuformer::avx2::tail_mask;  // lanes [0, n), 0 < n ≤ lanes (vector_math)
inline TailMask full_mask() { return _mm256_set1_epi32(-1); }
// Lanes outside the mask read as 0 and are never touched in memory.
inline Vec vload_tail(const float* p, TailMask m) { return _mm256_maskload_ps(p, m); }
inline void vstore_tail(float* p, Vec x, TailMask m) { _mm256_maskstore_ps(p, m, x); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }  // a·b + c
// 2^x for x ≤ 0 (scores are kept in base 2: q is pre-scaled by log2(e)), exactly 0 below -126
// and for -inf, NaN for NaN (a NaN score must reach the row's output, as in the scalar level).
// x = n + r with |r| ≤ 1/2; 2^r = e^(r·ln2) by its degree-6 Taylor polynomial (relative error
// < 2e-7), then scaled by 2^n built from the exponent bits.
inline Vec vexp2(Vec x) {
  const Vec lo = _mm256_set1_ps(-126.0f);
  const Vec underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);  // false for NaN
  const Vec xc = _mm256_max_ps(lo, x);                     // maxps returns its second operand, x, for NaN
  const Vec n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = _mm256_sub_ps(xc, n);
  Vec p = _mm256_set1_ps(1.5403530393381606e-4f);  // ln2^6 / 720
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3333558146428443e-3f));  // ln2^5 / 120
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.6181291076284772e-3f));  // ln2^4 / 24
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.5504108664821580e-2f));  // ln2^3 / 6
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.4022650695910071e-1f));  // ln2^2 / 2
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.9314718055994531e-1f));  // ln2
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n in [-126, 0]: 2^n = (n + 127) << 23 reinterpreted as float.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
inline float hsum(Vec x) { return reduce_add(x); }
inline float hmax(Vec x) { return reduce_max(x); }
inline float vfirst(Vec x) { return _mm256_cvtss_f32(x); }

// The running max with -inf replaced by 0, so that s - m stays -inf (not NaN) for a row that
// has seen only -inf scores so far.
inline Vec vfinite_or_zero(Vec m) { return _mm256_blendv_ps(m, vzero(), _mm256_cmp_ps(m, vneg_inf(), _CMP_EQ_OQ)); }

// mask · log2 e, the additive mask in base-2 score units, without overflowing: -inf stays -inf
// and a finite mask stays finite (HF's finfo(float32).min masking keeps its meaning).
inline Vec vmask_to_base2(Vec mask, Vec log2e) {
  const Vec removed = _mm256_cmp_ps(mask, vneg_inf(), _CMP_EQ_OQ);
  const Vec scaled = _mm256_max_ps(_mm256_set1_ps(-3.40282347e38f), _mm256_mul_ps(mask, log2e));  // NaN stays NaN
  return _mm256_blendv_ps(scaled, vneg_inf(), removed);
}

inline IVec iset1(int x) { return _mm256_set1_epi32(x); }
inline IVec iload(const int* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline IVec iota_plus(int base) {
  return _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Lane masks: which lanes (query rows or keys) a key is removed from, all ones per lane.
using LaneMask = __m256;
inline LaneMask lanes_none() { return _mm256_setzero_ps(); }
inline LaneMask lanes_all() { return _mm256_castsi256_ps(_mm256_set1_epi32(-1)); }
inline LaneMask lanes_or(LaneMask a, LaneMask b) { return _mm256_or_ps(a, b); }
// Lanes whose key index lies outside [first, last].
inline LaneMask lanes_outside(IVec key, IVec first, IVec last) {
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_cmpgt_epi32(first, key), _mm256_cmpgt_epi32(key, last)));
}
inline LaneMask lanes_neg_inf(Vec x) { return _mm256_cmp_ps(x, vneg_inf(), _CMP_EQ_OQ); }
// -inf in the removed lanes whatever s holds there (a NaN or +inf score of a removed key must
// not become NaN by adding the mask's -inf).
inline Vec vremove(Vec s, LaneMask removed) { return _mm256_blendv_ps(s, vneg_inf(), removed); }
// Bit t set for lane t in the mask.
inline unsigned lane_bits(LaneMask m) { return static_cast<unsigned>(_mm256_movemask_ps(m)); }
// -inf in every lane whose key index lies outside [first, last].
inline Vec vmask_outside(Vec s, IVec key, IVec first, IVec last) { return vremove(s, lanes_outside(key, first, last)); }
// In-place transpose of a kLanes × kLanes block held in r[0..7].
inline void transpose(Vec* r) {
  Vec t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

inline Vec vgather(const float* base, IVec index) { return _mm256_i32gather_ps(base, index, 4); }

// Lane t of the result is the sum of the lanes of acc[t]: 8 horizontal sums in 14 shuffles and
// 7 adds. Pairs, then quads, are summed within 128-bit lanes; then the two 128-bit lanes.
inline Vec vsum_transposed(const Vec* acc) {
  Vec quad[2];
  for (int g = 0; g < 2; ++g) {
    const Vec a = acc[4 * g], b = acc[4 * g + 1], c = acc[4 * g + 2], d = acc[4 * g + 3];
    const Vec ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    const Vec cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    // per 128-bit lane: [Σa, Σb, Σc, Σd] over that lane's four elements
    quad[g] = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(quad[0], quad[1], 0x20), _mm256_permute2f128_ps(quad[0], quad[1], 0x31));
}

#include "kernels/attention/attention_widen_x86_inl.h"

}  // namespace attention_simd
}  // namespace avx2
}  // namespace cpuformer
