// The vdpbf16ps pieces of the query-block ("wide") attention engine (AttentionArgs::bf16_products),
// used by attention_tiled_inl.h when it is compiled in attention_avx512bf16.cc
// (CPUFORMER_ATTENTION_BF16). Include only from *_avx512bf16.cc files; everything lives in
// cpuformer::avx512bf16::attention_bf16.
//
// vdpbf16ps(acc, a, b): acc[i] += a[2i]·b[2i] + a[2i+1]·b[2i+1] for the 16 float32 lanes i, with
// a and b 32 bfloat16 values; each product of two bfloat16 values is exact in float32. The engine
// keeps the query rows in lanes, as the float32 wide engine does, so both products broadcast one
// 32-bit pair per instruction:
//   scores  s[j][row] += Σ_pair (q[row][2p], q[row][2p+1]) · (k_j[2p], k_j[2p+1])
//           Qᵀ pairs [D/2][kLanes] (lane row: the row's d pair), K rows [Tk][D] in bfloat16
//   P·V     accᵀ[d][row] += Σ_pair (P[row][2m], P[row][2m+1]) · (v_2m[d], v_2m+1[d])
//           P pairs [keys/2][kLanes], V key pairs [Tk/2][D][2] (each d: two keys' values)
// Rounding: vcvtne2ps2bf16 (nearest even; NaN stays NaN).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace cpuformer {
namespace avx512bf16 {
namespace attention_bf16 {

// Interleaves two vectors' bfloat16 roundings: lane i of the result is the pair (lo[i], hi[i]).
inline __m512i pack_pairs(__m512 lo, __m512 hi) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // [lo 0..15 | hi 0..15]
  // (_mm512_set_epi16 lists elements from the last to the first)
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(index, both);
}

inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

// K rows t ∈ [0, Tk2) of one (batch, kv head) in bfloat16: dst [Tk2][D], rows ≥ kv_len zero.
// V as key pairs: dst [Tk2 / 2][D][2]. D a multiple of 16, Tk2 = kv_len rounded up to even.
inline void convert_keys(const float* k, long k_stride, long kv_len, long tk2, long dim, uint16_t* dst) {
  for (long t = 0; t < tk2; ++t) {
    uint16_t* row = dst + t * dim;
    for (long d = 0; d < dim; d += 32) {
      const __m512 lo = t < kv_len ? _mm512_loadu_ps(k + t * k_stride + d) : _mm512_setzero_ps();
      const __m512 hi = d + 16 < dim && t < kv_len ? _mm512_loadu_ps(k + t * k_stride + d + 16) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      if (d + 16 < dim) _mm512_storeu_si512(row + d, both);
      else _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + d), _mm512_castsi512_si256(both));
    }
  }
}

inline void convert_value_pairs(const float* v, long v_stride, long kv_len, long tk2, long dim, uint16_t* dst) {
  for (long t = 0; t < tk2; t += 2) {
    uint16_t* pair = dst + t * dim;  // [D][2] for keys t, t + 1
    for (long d = 0; d < dim; d += 16) {
      const __m512 v0 = t < kv_len ? _mm512_loadu_ps(v + t * v_stride + d) : _mm512_setzero_ps();
      const __m512 v1 = t + 1 < kv_len ? _mm512_loadu_ps(v + (t + 1) * v_stride + d) : _mm512_setzero_ps();
      _mm512_storeu_si512(pair + 2 * d, pack_pairs(v0, v1));
    }
  }
}

// s[j][lane] = Σ_p qt2[p][lane] · k_j[p] (pairs) for 8 keys; keys ≥ nk repeat key nk − 1 (their
// scores land in scratch past the block's end and are never used, and leave `max` unchanged).
// pairs = D / 2, a multiple of 8; k rows of D bfloat16 (pairs as 32-bit words).
inline void wide_scores(const uint32_t* qt2, long pairs, const uint32_t* k, long nk, float* s, __m512* max) {
  constexpr int kKeys = 8;
  const uint32_t* kp[kKeys];
  for (int j = 0; j < kKeys; ++j) kp[j] = k + (j < nk ? j : nk - 1) * pairs;
  __m512 even[kKeys], odd[kKeys];
  for (int j = 0; j < kKeys; ++j) even[j] = odd[j] = _mm512_setzero_ps();
  for (long p = 0; p < pairs; p += 2) {
    const __m512i q0 = _mm512_loadu_si512(qt2 + p * 16), q1 = _mm512_loadu_si512(qt2 + (p + 1) * 16);
    for (int j = 0; j < kKeys; ++j) {
      even[j] = dot_pairs(even[j], q0, _mm512_set1_epi32(static_cast<int>(kp[j][p])));
      odd[j] = dot_pairs(odd[j], q1, _mm512_set1_epi32(static_cast<int>(kp[j][p + 1])));
    }
  }
  for (int j = 0; j < kKeys; ++j) {
    const __m512 score = _mm512_add_ps(even[j], odd[j]);
    _mm512_storeu_ps(s + j * 16, score);
    *max = _mm512_max_ps(*max, score);
  }
}

// accᵀ[d][lane] = accᵀ[d][lane] · corr[lane] + Σ_m p2[m][lane] · v2[m][d] over m < npairs key pairs,
// d < dim (a multiple of 16); accᵀ [dim][16].
inline void pv_accumulate(float* acct, __m512 corr, const uint32_t* p2, long npairs, const uint32_t* v2, long dim) {
  for (long d0 = 0; d0 < dim; d0 += 16) {
    __m512 c[16];
    for (int i = 0; i < 16; ++i) c[i] = _mm512_mul_ps(_mm512_loadu_ps(acct + (d0 + i) * 16), corr);
    for (long m = 0; m < npairs; ++m) {
      const __m512i p = _mm512_loadu_si512(p2 + m * 16);
      const uint32_t* v = v2 + m * dim + d0;
      for (int i = 0; i < 16; ++i) c[i] = dot_pairs(c[i], p, _mm512_set1_epi32(static_cast<int>(v[i])));
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(acct + (d0 + i) * 16, c[i]);
  }
}

}  // namespace attention_bf16
}  // namespace avx512bf16
}  // namespace cpuformer
