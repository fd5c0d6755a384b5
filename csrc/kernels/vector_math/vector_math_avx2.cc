// AVX2 array forms of vector_math_avx2.h, for the tests (see vector_math.h).
#include "kernels/vector_math/vector_math.h"
#include "kernels/vector_math/vector_math_avx2.h"

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

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply};

}  // namespace avx2
}  // namespace cpuformer
