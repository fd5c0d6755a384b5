// AVX-512 array forms of vector_math_avx512.h, for the tests (see vector_math.h).
#include "kernels/vector_math/vector_math.h"
#include "kernels/vector_math/vector_math_avx512.h"

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

}  // namespace

const VectorMathKernels kVectorMathKernels = {apply};

}  // namespace avx512
}  // namespace cpuformer
