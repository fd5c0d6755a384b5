// NEON layer norm and RMS norm rows for AArch64 (the neon, dotprod and i8mm levels): the
// three-pass scheme of norm_avx512.cc / norm_avx2.cc with 4 lanes and 4 vectors of partial sums.
// The last n % 4 elements go through scalar code (NEON has no masked loads), summed separately.
#include <arm_neon.h>

#include <cmath>

#include "kernels/norm/norm.h"

namespace cpuformer {
namespace neon {
namespace {

constexpr long kLanes = 4;

// See norm_avx512.cc: where s lives after pass 1 and whether pass 1 writes it.
struct RowSource {
  const float* s;
  float* store;
};

inline RowSource row_source(const float* x, const float* residual, float* sum_out, float* y) {
  if (sum_out) return {sum_out, sum_out};
  if (residual) return {y, y};
  return {x, nullptr};
}

// Pass 1: s = x + residual (stored when kStore), returns Σ s or Σ s².
template <bool kResidual, bool kStore, bool kSquares>
float first_pass(const float* x, const float* residual, float* store, long n) {
  float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  auto step = [&](int a, long i) {
    float32x4_t v = vld1q_f32(x + i);
    if (kResidual) v = vaddq_f32(v, vld1q_f32(residual + i));
    if (kStore) vst1q_f32(store + i, v);
    acc[a] = kSquares ? vfmaq_f32(acc[a], v, v) : vaddq_f32(acc[a], v);
  };
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes)
    for (int a = 0; a < 4; ++a) step(a, i + a * kLanes);
  for (; i + kLanes <= n; i += kLanes) step(0, i);
  float tail = 0.0f;
  for (; i < n; ++i) {
    const float v = kResidual ? x[i] + residual[i] : x[i];
    if (kStore) store[i] = v;
    tail += kSquares ? v * v : v;
  }
  return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]))) + tail;
}

template <bool kSquares>
float first_pass(const float* x, const float* residual, float* store, long n) {
  if (residual) {
    return store ? first_pass<true, true, kSquares>(x, residual, store, n)
                 : first_pass<true, false, kSquares>(x, residual, store, n);
  }
  return store ? first_pass<false, true, kSquares>(x, residual, store, n)
               : first_pass<false, false, kSquares>(x, residual, store, n);
}

// Pass 2 of the layer norm: Σ (s - mean)².
float centred_squares(const float* s, float mean, long n) {
  const float32x4_t vmean = vdupq_n_f32(mean);
  float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes)
    for (int a = 0; a < 4; ++a) {
      const float32x4_t d = vsubq_f32(vld1q_f32(s + i + a * kLanes), vmean);
      acc[a] = vfmaq_f32(acc[a], d, d);
    }
  for (; i + kLanes <= n; i += kLanes) {
    const float32x4_t d = vsubq_f32(vld1q_f32(s + i), vmean);
    acc[0] = vfmaq_f32(acc[0], d, d);
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += (s[i] - mean) * (s[i] - mean);
  return vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]))) + tail;
}

void layer_norm_row(const float* x, const float* residual, float* sum_out, const float* weight, const float* bias,
                    float eps, float* y, long n) {
  const RowSource src = row_source(x, residual, sum_out, y);
  const float mean = first_pass<false>(x, residual, src.store, n) / static_cast<float>(n);
  const float var = centred_squares(src.s, mean, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(var + eps);
  const float32x4_t vmean = vdupq_n_f32(mean), vinv = vdupq_n_f32(inv);
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const float32x4_t t = vmulq_f32(vsubq_f32(vld1q_f32(src.s + i), vmean), vinv);
    const float32x4_t w = vld1q_f32(weight + i);
    vst1q_f32(y + i, bias ? vfmaq_f32(vld1q_f32(bias + i), t, w) : vmulq_f32(t, w));
  }
  for (; i < n; ++i) {
    const float t = (src.s[i] - mean) * inv;
    y[i] = bias ? std::fma(t, weight[i], bias[i]) : t * weight[i];
  }
}

void rms_norm_row(const float* x, const float* residual, float* sum_out, const float* weight, float eps, float* y,
                  long n) {
  const RowSource src = row_source(x, residual, sum_out, y);
  const float sum_sq = first_pass<true>(x, residual, src.store, n);
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  const float32x4_t vinv = vdupq_n_f32(inv);
  long i = 0;
  for (; i + kLanes <= n; i += kLanes)
    vst1q_f32(y + i, vmulq_f32(vmulq_f32(vld1q_f32(src.s + i), vinv), vld1q_f32(weight + i)));
  for (; i < n; ++i) y[i] = src.s[i] * inv * weight[i];
}

}  // namespace

const NormKernels kNormKernels = {layer_norm_row, rms_norm_row};

}  // namespace neon
}  // namespace cpuformer
