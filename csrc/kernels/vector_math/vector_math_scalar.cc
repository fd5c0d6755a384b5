// Portable reference of the vector functions: <cmath> in float.
#include <cmath>

#include "kernels/vector_math/vector_math.h"

namespace cpuformer {
namespace scalar {
namespace {

inline float evaluate(VectorFunction f, float v) {
  switch (f) {
    case VectorFunction::kExp:
    case VectorFunction::kExpNanPropagating: return std::exp(v);
    case VectorFunction::kErf: return std::erf(v);
    case VectorFunction::kTanh: return std::tanh(v);
    case VectorFunction::kSigmoid: return 1.0f / (1.0f + std::exp(-v));
  }
  return v;
}

void apply(VectorFunction f, const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = evaluate(f, x[i]);
}

float max_value(const float* x, long n) {
  float m = -INFINITY;
  for (long i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

double sum_exp(const float* x, long n, float shift) {
  double s = 0.0;
  for (long i = 0; i < n; ++i) s += std::exp(x[i] - shift);
  return s;
}

long find_greater(const float* x, long n, float offset, float threshold) {
  for (long i = 0; i < n; ++i) {
    if (x[i] + offset > threshold) return i;
  }
  return n;
}

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply, max_value, sum_exp, find_greater};

}  // namespace scalar
}  // namespace cpuformer
