// Portable reference activations: plain loops, the definition every SIMD variant is tested against.
#include <cmath>
#include <limits>

#include "kernels/activation/activation.h"

namespace cpuformer {
namespace scalar {
namespace {

inline float activate(Activation act, float v) {
  switch (act) {
    case Activation::kNone: return v;
    case Activation::kRelu: return v < 0.0f ? 0.0f : v;  // NaN stays NaN
    case Activation::kGeluErf: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case Activation::kGeluTanh: {
      const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
      return 0.5f * v * (1.0f + std::tanh(inner));
    }
    case Activation::kSilu: return v / (1.0f + std::exp(-v));
    case Activation::kQuickGelu: return v / (1.0f + std::exp(-1.702f * v));
  }
  return v;
}

void apply(Activation act, const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = activate(act, x[i]);
}

void softmax_row(const float* x, float* y, long n) {
  float max_value = -std::numeric_limits<float>::infinity();
  for (long i = 0; i < n; ++i) max_value = x[i] > max_value ? x[i] : max_value;
  if (max_value == -std::numeric_limits<float>::infinity()) {  // every entry masked
    for (long i = 0; i < n; ++i) y[i] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (long i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - max_value);
    sum += y[i];
  }
  const float inv = 1.0f / sum;
  for (long i = 0; i < n; ++i) y[i] *= inv;
}

void silu_mul(const float* gate, const float* up, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace

const ActivationKernels kActivationKernels = {apply, softmax_row, silu_mul};

}  // namespace scalar
}  // namespace cpuformer
