// Portable reference normalisations (see norm.h for the definitions).
#include <cmath>

#include "kernels/norm/norm.h"

namespace cpuformer {
namespace scalar {
namespace {

// s = x + residual, written to sum_out and to y (y is the scratch for s; both may alias inputs).
inline void residual_sum(const float* x, const float* residual, float* sum_out, float* y, long n) {
  for (long i = 0; i < n; ++i) {
    const float s = residual ? x[i] + residual[i] : x[i];
    if (sum_out) sum_out[i] = s;
    y[i] = s;
  }
}

void layer_norm_row(const float* x, const float* residual, float* sum_out, const float* weight, const float* bias,
                    float eps, float* y, long n) {
  residual_sum(x, residual, sum_out, y, n);
  float mean = 0.0f;
  for (long i = 0; i < n; ++i) mean += y[i];
  mean /= static_cast<float>(n);
  float var = 0.0f;
  for (long i = 0; i < n; ++i) var += (y[i] - mean) * (y[i] - mean);
  var /= static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + eps);
  for (long i = 0; i < n; ++i) y[i] = (y[i] - mean) * inv * weight[i] + (bias ? bias[i] : 0.0f);
}

void rms_norm_row(const float* x, const float* residual, float* sum_out, const float* weight, float eps, float* y,
                  long n) {
  residual_sum(x, residual, sum_out, y, n);
  float sum_sq = 0.0f;
  for (long i = 0; i < n; ++i) sum_sq += y[i] * y[i];
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  for (long i = 0; i < n; ++i) y[i] = y[i] * inv * weight[i];
}

}  // namespace

const NormKernels kNormKernels = {layer_norm_row, rms_norm_row};

}  // namespace scalar
}  // namespace cpuformer
