// The vector primitives the tiled attention kernel (attention_tiled_inl.h) is written in, for
// AVX-512: 16 float lanes, lane masks in k-registers. Include only from *_avx512*.cc files;
// everything lives in cpuformer::avx512::attention_simd.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/vector_math/vector_math_avx512.h"

namespace cpuformer {
namespace avx512 {
namespace attention_simd {

constexpr int kLanes = 16;
// P·V register tile: kPvRows rows × kPvVecs vectors of accumulators (16 of the 32 registers),
// plus kPvVecs rows of V and one broadcast.
constexpr int kPvRows = 4;
constexpr int kPvVecs = 4;

// Keys per online-softmax step (a multiple of kLanes and kScoreKeys), and keys per pass of the
// wide score loop (two FMA chains each: more than FMA latency × issue width = 8 in flight).
constexpr long kKeyBlock = 32;
constexpr int kScoreKeys = 8;

using Vec = __m512;
using IVec = __m512i;
using TailMask = __mmask16;  // which lanes of a partial vector are real

// Keeps a loaded value in a register: without it GCC folds the load into every FMA that uses
// it, and the P·V loop turns load-bound (one load per FMA instead of one per row of V).
inline Vec in_register(Vec x) {
  __asm__("" : "+v"(x));
  return x;
}

inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset1(float x) { return _mm512_set1_ps(x); }
inline Vec vneg_inf() { return _mm512_set1_ps(-__builtin_inff()); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec x) { _mm512_storeu_ps(p, x); }
using ::cpuformer::avx512::tail_mask;  // lanes [0, n), 0 < n ≤ lanes (vector_math)
inline TailMask full_mask() { return static_cast<TailMask>(0xFFFF); }
// Lanes outside the mask read as 0 and are never touched in memory.
inline Vec vload_tail(const float* p, TailMask m) { return _mm512_maskz_loadu_ps(m, p); }
inline void vstore_tail(float* p, Vec x, TailMask m) { _mm512_mask_storeu_ps(p, m, x); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vfmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }  // a·b + c
// 2^x for x ≤ 0 (scores are kept in base 2: q is pre-scaled by log2(e)), exactly 0 below -126
// and for -inf, NaN for NaN (a NaN score must reach the row's output, as in the scalar level).
// x = n + r with |r| ≤ 1/2; 2^r = e^(r·ln2) by its degree-6 Taylor polynomial (relative error
// < 2e-7), then scaled by 2^n.
inline Vec vexp2(Vec x) {
  const Vec lo = _mm512_set1_ps(-126.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);  // true for NaN
  const Vec xc = _mm512_max_ps(lo, x);  // vmaxps returns its second operand, x, for NaN
  const Vec n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = _mm512_sub_ps(xc, n);
  Vec p = _mm512_set1_ps(1.5403530393381606e-4f);  // ln2^6 / 720
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3333558146428443e-3f));  // ln2^5 / 120
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6181291076284772e-3f));  // ln2^4 / 24
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5504108664821580e-2f));  // ln2^3 / 6
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022650695910071e-1f));  // ln2^2 / 2
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314718055994531e-1f));  // ln2
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}
inline float hsum(Vec x) { return reduce_add(x); }
inline float hmax(Vec x) { return reduce_max(x); }
inline float vfirst(Vec x) { return _mm512_cvtss_f32(x); }

// The running max with -inf replaced by 0, so that s - m stays -inf (not NaN) for a row that
// has seen only -inf scores so far.
inline Vec vfinite_or_zero(Vec m) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, vneg_inf(), _CMP_EQ_OQ), m, vzero());
}

// mask · log2 e, the additive mask in base-2 score units, without overflowing: -inf stays -inf
// and a finite mask stays finite (HF's finfo(float32).min masking keeps its meaning).
inline Vec vmask_to_base2(Vec mask, Vec log2e) {
  const __mmask16 removed = _mm512_cmp_ps_mask(mask, vneg_inf(), _CMP_EQ_OQ);
  const Vec scaled = _mm512_max_ps(_mm512_set1_ps(-3.40282347e38f), _mm512_mul_ps(mask, log2e));  // NaN stays NaN
  return _mm512_mask_blend_ps(removed, scaled, vneg_inf());
}

inline IVec iset1(int x) { return _mm512_set1_epi32(x); }
inline IVec iload(const int* p) { return _mm512_loadu_si512(p); }
inline IVec iota_plus(int base) {
  return _mm512_add_epi32(_mm512_set1_epi32(base),
                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// Lane masks: which lanes (query rows or keys) a key is removed from.
using LaneMask = __mmask16;
inline LaneMask lanes_none() { return 0; }
inline LaneMask lanes_all() { return static_cast<LaneMask>(0xFFFF); }
inline LaneMask lanes_or(LaneMask a, LaneMask b) { return static_cast<LaneMask>(a | b); }
// Lanes whose key index lies outside [first, last].
inline LaneMask lanes_outside(IVec key, IVec first, IVec last) {
  return static_cast<LaneMask>(_mm512_cmp_epi32_mask(key, first, _MM_CMPINT_LT) |
                               _mm512_cmp_epi32_mask(key, last, _MM_CMPINT_GT));
}
inline LaneMask lanes_neg_inf(Vec x) { return _mm512_cmp_ps_mask(x, vneg_inf(), _CMP_EQ_OQ); }
// -inf in the removed lanes whatever s holds there (a NaN or +inf score of a removed key must
// not become NaN by adding the mask's -inf).
inline Vec vremove(Vec s, LaneMask removed) { return _mm512_mask_blend_ps(removed, s, vneg_inf()); }
// Bit t set for lane t in the mask.
inline unsigned lane_bits(LaneMask m) { return static_cast<unsigned>(m); }
// -inf in every lane whose key index lies outside [first, last].
inline Vec vmask_outside(Vec s, IVec key, IVec first, IVec last) { return vremove(s, lanes_outside(key, first, last)); }
// In-place transpose of a kLanes × kLanes block held in r[0..15]: pairs of 32-bit, then 64-bit
// elements are interleaved within 128-bit lanes, then 128-bit lanes are exchanged twice.
inline void transpose(Vec* r) {
  Vec t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// Scores of a wide-engine tile of at most 8 rows (a grouped-query decode step: 8 query heads per
// kv head) in 8-lane vectors: wide_scores (attention_tiled_inl.h) with Qᵀ's lanes 0-7 only, lanes
// 8-15 of s stored as +0 (what the zero query lanes of the missing rows give there). Same products
// and sums in the same order for the rows, so the same bits; half the FMA work, where a 512-bit FMA
// costs two 256-bit ones (Zen 4) or as much as one (then nothing is lost).
#define CPUFORMER_ATTENTION_HALF_SCORES 1
inline void wide_scores_half(const float* qt, long dim, const float* k, long k_stride, long nk, float* s, Vec* max) {
  const float* kp[kScoreKeys];
  for (int j = 0; j < kScoreKeys; ++j) kp[j] = k + (j < nk ? j : nk - 1) * k_stride;
  __m256 even[kScoreKeys], odd[kScoreKeys];
  for (int j = 0; j < kScoreKeys; ++j) even[j] = odd[j] = _mm256_setzero_ps();
  long d = 0;
  for (; d + 2 <= dim; d += 2) {
    const __m256 q0 = _mm256_loadu_ps(qt + d * kLanes), q1 = _mm256_loadu_ps(qt + (d + 1) * kLanes);
    for (int j = 0; j < kScoreKeys; ++j) {
      even[j] = _mm256_fmadd_ps(q0, _mm256_broadcast_ss(kp[j] + d), even[j]);
      odd[j] = _mm256_fmadd_ps(q1, _mm256_broadcast_ss(kp[j] + d + 1), odd[j]);
    }
  }
  if (d < dim) {
    const __m256 q0 = _mm256_loadu_ps(qt + d * kLanes);
    for (int j = 0; j < kScoreKeys; ++j) even[j] = _mm256_fmadd_ps(q0, _mm256_broadcast_ss(kp[j] + d), even[j]);
  }
  for (int j = 0; j < kScoreKeys; ++j) {
    const Vec score = _mm512_zextps256_ps512(_mm256_add_ps(even[j], odd[j]));
    _mm512_storeu_ps(s + j * kLanes, score);
    *max = _mm512_max_ps(*max, score);
  }
}

inline Vec vgather(const float* base, IVec index) { return _mm512_i32gather_ps(index, base, 4); }

// Lane t of the result is the sum of the lanes of acc[t]: 16 horizontal sums in 30 shuffles and
// 15 adds. Pairs, then quads, are summed within 128-bit lanes; then the four 128-bit lanes.
inline Vec vsum_transposed(const Vec* acc) {
  Vec quad[4];
  for (int g = 0; g < 4; ++g) {
    const Vec a = acc[4 * g], b = acc[4 * g + 1], c = acc[4 * g + 2], d = acc[4 * g + 3];
    const Vec ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const Vec cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    // per 128-bit lane: [Σa, Σb, Σc, Σd] over that lane's four elements
    quad[g] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const Vec x0 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(quad[0], quad[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const Vec x1 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2], quad[3], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(quad[2], quad[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}

#include "kernels/attention/attention_widen_x86_inl.h"

}  // namespace attention_simd
}  // namespace avx512
}  // namespace cpuformer
