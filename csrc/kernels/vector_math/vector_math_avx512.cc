// AVX-512 array forms of vector_math_avx512.h, for the tests (see vector_math.h).
#include "kernels/vector_math/vector_math_avx512.h"

#include <cmath>

#include "kernels/vector_math/vector_math.h"

namespace cpuformer {
namespace avx512 {
namespace {

template <typename Fn>
void map(const float* x, float* y, long n, Fn fn) {
  long i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, fn(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, fn(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void apply(VectorFunction f, const float* x, float* y, long n) {
  switch (f) {
    case VectorFunction::kExp: return map(x, y, n, [](__m512 v) { return exp_ps(v); });
    case VectorFunction::kExpNanPropagating: return map(x, y, n, [](__m512 v) { return exp_ps_nan_propagating(v); });
    case VectorFunction::kErf: return map(x, y, n, [](__m512 v) { return erf_ps(v); });
    case VectorFunction::kTanh: return map(x, y, n, [](__m512 v) { return tanh_ps(v); });
    case VectorFunction::kSigmoid: return map(x, y, n, [](__m512 v) { return sigmoid_ps(v); });
  }
}

// max_ps(x, m) returns m when x is NaN (the second operand wins), so NaN is skipped.
float max_value(const float* x, long n) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  long i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
  }
  for (; i + 16 <= n; i += 16) m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
  if (i < n) m1 = _mm512_mask_max_ps(m1, tail_mask(n - i), _mm512_maskz_loadu_ps(tail_mask(n - i), x + i), m1);
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

double sum_exp(const float* x, long n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  long i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

long find_greater(const float* x, long n, float offset, float threshold) {
  const __m512 o = _mm512_set1_ps(offset), t = _mm512_set1_ps(threshold);
  long i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_add_ps(_mm512_loadu_ps(x + i), o), t, _CMP_GT_OQ);
    if (hit) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), o), t, _CMP_GT_OQ);
    if (hit) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  return n;
}

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply, max_value, sum_exp, find_greater};

}  // namespace avx512
}  // namespace cpuformer
