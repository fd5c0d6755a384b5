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

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply};

}  // namespace scalar
}  // namespace cpuformer
