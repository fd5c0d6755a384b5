// AVX-512 activations, softmax and SwiGLU (see activation.h). Tails use masked loads and stores,
// so a range of any length is handled without reading or writing past its end.
#include <immintrin.h>

#include "kernels/activation/activation.h"
#include "kernels/vector_math/vector_math_avx512.h"

namespace cpuformer {
namespace avx512 {
namespace {

constexpr long kLanes = 16;

template <typename Fn>
inline void map(const float* x, float* y, long n, Fn fn) {
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(y + i, fn(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, fn(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void apply(Activation act, const float* x, float* y, long n) {
  switch (act) {
    case Activation::kNone:
      if (x != y) map(x, y, n, [](__m512 v) { return v; });
      return;
    // MAXPS returns its second operand when either is NaN: x second keeps NaN, like the reference.
    case Activation::kRelu: return map(x, y, n, [](__m512 v) { return _mm512_max_ps(_mm512_setzero_ps(), v); });
    case Activation::kGeluErf: return map(x, y, n, [](__m512 v) { return gelu_erf_ps(v); });
    case Activation::kGeluTanh: return map(x, y, n, [](__m512 v) { return gelu_tanh_ps(v); });
    case Activation::kSilu: return map(x, y, n, [](__m512 v) { return silu_ps(v); });
    case Activation::kQuickGelu: return map(x, y, n, [](__m512 v) { return quick_gelu_ps(v); });
  }
}

void softmax_row(const float* x, float* y, long n) {
  // Pass 1: the maximum. max(v, m) returns m when v is NaN, so NaN entries are skipped like the
  // reference's `x > max` test; tail lanes read as -inf.
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 m0 = neg_inf, m1 = neg_inf, m2 = neg_inf, m3 = neg_inf;
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + kLanes), m1);
    m2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 2 * kLanes), m2);
    m3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 3 * kLanes), m3);
  }
  for (; i + kLanes <= n; i += kLanes) m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
  if (i < n) m0 = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, tail_mask(n - i), x + i), m0);
  const float max_value = reduce_max(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
  if (max_value == -__builtin_inff()) {  // every entry masked
    map(x, y, n, [](__m512) { return _mm512_setzero_ps(); });
    return;
  }

  // Pass 2: e = exp(x - max) into y, summed. The NaN-propagating exp keeps NaN (and +inf - +inf)
  // in the sum, so such a row becomes NaN as in the reference.
  const __m512 vmax = _mm512_set1_ps(max_value);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const __m512 e0 = exp_ps_nan_propagating(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
    const __m512 e1 = exp_ps_nan_propagating(_mm512_sub_ps(_mm512_loadu_ps(x + i + kLanes), vmax));
    _mm512_storeu_ps(y + i, e0);
    _mm512_storeu_ps(y + i + kLanes, e1);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 e = exp_ps_nan_propagating(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
    _mm512_storeu_ps(y + i, e);
    s0 = _mm512_add_ps(s0, e);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp_ps_nan_propagating(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax));
    _mm512_mask_storeu_ps(y + i, m, e);
    s1 = _mm512_mask_add_ps(s1, m, s1, e);
  }

  // Pass 3: normalise in place.
  const __m512 inv = _mm512_set1_ps(1.0f / reduce_add(_mm512_add_ps(s0, s1)));
  map(y, y, n, [inv](__m512 v) { return _mm512_mul_ps(v, inv); });
}

void silu_mul(const float* gate, const float* up, float* y, long n) {
  long i = 0;
  for (; i + kLanes <= n; i += kLanes)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(silu_ps(_mm512_loadu_ps(gate + i)), _mm512_loadu_ps(up + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_mul_ps(silu_ps(_mm512_maskz_loadu_ps(m, gate + i)), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

}  // namespace

const ActivationKernels kActivationKernels = {apply, softmax_row, silu_mul};

}  // namespace avx512
}  // namespace cpuformer
