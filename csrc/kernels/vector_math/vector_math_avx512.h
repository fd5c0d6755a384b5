// Vectorised elementary functions for the AVX-512 kernels. Include only from *_avx512*.cc files:
// everything here lives in cpuformer::avx512 and is compiled with AVX-512 flags.
#pragma once

#include <immintrin.h>

namespace cpuformer {
namespace avx512 {

// e^x, relative error ~2e-7 over the float range; exactly 0 below -87.3 (so -inf gives 0) and
// +inf above 88.7. Range reduction x = n·ln2 + r, |r| ≤ ln2/2, degree-6 polynomial for e^r,
// then scalef by 2^n.
inline __m512 exp_ps(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
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
  const __m512 result = _mm512_scalef_ps(p, n);
  return _mm512_mask_blend_ps(underflow, result, _mm512_setzero_ps());
}

inline float reduce_add(__m512 v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(__m512 v) { return _mm512_reduce_max_ps(v); }

}  // namespace avx512
}  // namespace cpuformer
