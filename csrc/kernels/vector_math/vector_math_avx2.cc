// AVX2 array forms of vector_math_avx2.h, for the tests (see vector_math.h).
#include "kernels/vector_math/vector_math_avx2.h"

#include <cmath>

#include "kernels/vector_math/vector_math.h"

namespace cpuformer {
namespace avx2 {
namespace {

template <typename Fn>
void map(const float* x, float* y, long n, Fn fn) {
  long i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, fn(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, fn(_mm256_maskload_ps(x + i, m)));
  }
}

void apply(VectorFunction f, const float* x, float* y, long n) {
  switch (f) {
    case VectorFunction::kExp: return map(x, y, n, [](__m256 v) { return exp_ps(v); });
    case VectorFunction::kExpNanPropagating: return map(x, y, n, [](__m256 v) { return exp_ps_nan_propagating(v); });
    case VectorFunction::kErf: return map(x, y, n, [](__m256 v) { return erf_ps(v); });
    case VectorFunction::kTanh: return map(x, y, n, [](__m256 v) { return tanh_ps(v); });
    case VectorFunction::kSigmoid: return map(x, y, n, [](__m256 v) { return sigmoid_ps(v); });
  }
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// max_ps(x, m) returns m when x is NaN (the second operand wins), so NaN is skipped.
float max_value(const float* x, long n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
  long i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
  }
  float m = hmax(_mm256_max_ps(m0, m1));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

double sum_exp(const float* x, long n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(m), exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), s)));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  const __m256d t = _mm256_add_pd(lo, hi);
  const __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
  return _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
}

long find_greater(const float* x, long n, float offset, float threshold) {
  const __m256 o = _mm256_set1_ps(offset), t = _mm256_set1_ps(threshold);
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_add_ps(_mm256_loadu_ps(x + i), o), t, _CMP_GT_OQ));
    if (hit) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (; i < n; ++i) {
    if (x[i] + offset > threshold) return i;
  }
  return n;
}

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply, max_value, sum_exp, find_greater};

}  // namespace avx2
}  // namespace cpuformer
