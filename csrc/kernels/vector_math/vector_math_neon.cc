// NEON array forms of vector_math_neon.h, for the tests (see vector_math.h). The last n % 4
// elements go through the same vector functions on a partial vector (NEON has no masked loads).
#include "kernels/vector_math/vector_math_neon.h"

#include <cmath>

#include "kernels/vector_math/vector_math.h"

namespace cpuformer {
namespace neon {
namespace {

constexpr long kLanes = 4;

template <typename Fn>
void map(const float* x, float* y, long n, Fn fn) {
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) vst1q_f32(y + i, fn(vld1q_f32(x + i)));
  if (i < n) store_tail(y + i, fn(load_tail(x + i, n - i)), n - i);
}

void apply(VectorFunction f, const float* x, float* y, long n) {
  switch (f) {
    case VectorFunction::kExp: return map(x, y, n, [](float32x4_t v) { return exp_ps(v); });
    case VectorFunction::kExpNanPropagating:
      return map(x, y, n, [](float32x4_t v) { return exp_ps_nan_propagating(v); });
    case VectorFunction::kErf: return map(x, y, n, [](float32x4_t v) { return erf_ps(v); });
    case VectorFunction::kTanh: return map(x, y, n, [](float32x4_t v) { return tanh_ps(v); });
    case VectorFunction::kSigmoid: return map(x, y, n, [](float32x4_t v) { return sigmoid_ps(v); });
  }
}

// FMAXNM returns the number when one operand is NaN, so NaN is skipped (an all-NaN row gives -inf).
float max_value(const float* x, long n) {
  float32x4_t m0 = vdupq_n_f32(-INFINITY), m1 = m0;
  long i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    m0 = vmaxnmq_f32(m0, vld1q_f32(x + i));
    m1 = vmaxnmq_f32(m1, vld1q_f32(x + i + kLanes));
  }
  float m = vmaxnmvq_f32(vmaxnmq_f32(m0, m1));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

double sum_exp(const float* x, long n, float shift) {
  const float32x4_t s = vdupq_n_f32(shift);
  float64x2_t lo = vdupq_n_f64(0.0), hi = vdupq_n_f64(0.0);
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const float32x4_t e = exp_ps(vsubq_f32(vld1q_f32(x + i), s));
    lo = vaddq_f64(lo, vcvt_f64_f32(vget_low_f32(e)));
    hi = vaddq_f64(hi, vcvt_high_f64_f32(e));
  }
  double sum = vaddvq_f64(vaddq_f64(lo, hi));
  if (i < n) {  // the tail's terms with the same function, added in order
    float e[kLanes];
    vst1q_f32(e, exp_ps(vsubq_f32(load_tail(x + i, n - i), s)));
    for (long j = 0; j < n - i; ++j) sum += e[j];
  }
  return sum;
}

long find_greater(const float* x, long n, float offset, float threshold) {
  const float32x4_t o = vdupq_n_f32(offset), t = vdupq_n_f32(threshold);
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const uint32x4_t hit = vcgtq_f32(vaddq_f32(vld1q_f32(x + i), o), t);  // false for NaN
    if (vmaxvq_u32(hit) != 0) break;  // the first hit is in this vector: the scalar loop finds it
  }
  for (; i < n; ++i) {
    if (x[i] + offset > threshold) return i;
  }
  return n;
}

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply, max_value, sum_exp, find_greater};

}  // namespace neon
}  // namespace cpuformer
