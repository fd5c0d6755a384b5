// NEON activations, softmax and SwiGLU (see activation.h) for AArch64: the neon, dotprod and i8mm
// levels. The structure of activation_avx2.cc on 4-lane vectors; the last n % 4 elements go
// through the same vector functions on a partial vector loaded and stored lane by lane (NEON has
// no masked loads), so a range of any length is handled without reading or writing past its end.
#include <arm_neon.h>

#include "kernels/activation/activation.h"
#include "kernels/vector_math/vector_math_neon.h"

namespace cpuformer {
namespace neon {
namespace {

constexpr long kLanes = 4;

template <typename Fn>
inline void map(const float* x, float* y, long n, Fn fn) {
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) vst1q_f32(y + i, fn(vld1q_f32(x + i)));
  if (i < n) store_tail(y + i, fn(load_tail(x + i, n - i)), n - i);
}

void apply(Activation act, const float* x, float* y, long n) {
  switch (act) {
    case Activation::kNone:
      if (x != y) map(x, y, n, [](float32x4_t v) { return v; });
      return;
    // v < 0 ? 0 : v, the reference's expression: NaN stays NaN and -0 stays -0.
    case Activation::kRelu:
      return map(x, y, n, [](float32x4_t v) { return vbslq_f32(vcltzq_f32(v), vdupq_n_f32(0.0f), v); });
    case Activation::kGeluErf: return map(x, y, n, [](float32x4_t v) { return gelu_erf_ps(v); });
    case Activation::kGeluTanh: return map(x, y, n, [](float32x4_t v) { return gelu_tanh_ps(v); });
    case Activation::kSilu: return map(x, y, n, [](float32x4_t v) { return silu_ps(v); });
    case Activation::kQuickGelu: return map(x, y, n, [](float32x4_t v) { return quick_gelu_ps(v); });
  }
}

void softmax_row(const float* x, float* y, long n) {
  // Pass 1: the maximum; NaN entries are skipped (FMAXNM returns the number), tail lanes read as
  // -inf.
  const float32x4_t neg_inf = vdupq_n_f32(-__builtin_inff());
  float32x4_t m0 = neg_inf, m1 = neg_inf, m2 = neg_inf, m3 = neg_inf;
  long i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    m0 = vmaxnmq_f32(m0, vld1q_f32(x + i));
    m1 = vmaxnmq_f32(m1, vld1q_f32(x + i + kLanes));
    m2 = vmaxnmq_f32(m2, vld1q_f32(x + i + 2 * kLanes));
    m3 = vmaxnmq_f32(m3, vld1q_f32(x + i + 3 * kLanes));
  }
  for (; i + kLanes <= n; i += kLanes) m0 = vmaxnmq_f32(m0, vld1q_f32(x + i));
  float max_value = vmaxnmvq_f32(vmaxnmq_f32(vmaxnmq_f32(m0, m1), vmaxnmq_f32(m2, m3)));
  for (; i < n; ++i) max_value = x[i] > max_value ? x[i] : max_value;
  if (max_value == -__builtin_inff()) {  // every entry masked
    map(x, y, n, [](float32x4_t) { return vdupq_n_f32(0.0f); });
    return;
  }

  // Pass 2: e = exp(x - max) into y, summed; a NaN entry makes the sum NaN and so the whole row,
  // as in the reference (and +inf: inf - inf).
  const float32x4_t vmax = vdupq_n_f32(max_value);
  float32x4_t s0 = vdupq_n_f32(0.0f), s1 = vdupq_n_f32(0.0f);
  i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const float32x4_t e0 = exp_ps_nan_propagating(vsubq_f32(vld1q_f32(x + i), vmax));
    const float32x4_t e1 = exp_ps_nan_propagating(vsubq_f32(vld1q_f32(x + i + kLanes), vmax));
    vst1q_f32(y + i, e0);
    vst1q_f32(y + i + kLanes, e1);
    s0 = vaddq_f32(s0, e0);
    s1 = vaddq_f32(s1, e1);
  }
  for (; i + kLanes <= n; i += kLanes) {
    const float32x4_t e = exp_ps_nan_propagating(vsubq_f32(vld1q_f32(x + i), vmax));
    vst1q_f32(y + i, e);
    s0 = vaddq_f32(s0, e);
  }
  if (i < n) {  // the lanes past the row are exp(0 - max): zeroed before the sum
    const long rest = n - i;
    const float32x4_t e = exp_ps_nan_propagating(vsubq_f32(load_tail(x + i, rest), vmax));
    store_tail(y + i, e, rest);
    static const uint32_t kKeep[7] = {~0u, ~0u, ~0u, 0u, 0u, 0u, 0u};
    const uint32x4_t keep = vld1q_u32(kKeep + 3 - rest);
    s1 = vaddq_f32(s1, vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), keep)));
  }

  // Pass 3: normalise in place.
  const float32x4_t inv = vdupq_n_f32(1.0f / reduce_add(vaddq_f32(s0, s1)));
  map(y, y, n, [inv](float32x4_t v) { return vmulq_f32(v, inv); });
}

void silu_mul(const float* gate, const float* up, float* y, long n) {
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) vst1q_f32(y + i, vmulq_f32(silu_ps(vld1q_f32(gate + i)), vld1q_f32(up + i)));
  if (i < n) {
    const long rest = n - i;
    store_tail(y + i, vmulq_f32(silu_ps(load_tail(gate + i, rest)), load_tail(up + i, rest)), rest);
  }
}

}  // namespace

const ActivationKernels kActivationKernels = {apply, softmax_row, silu_mul};

}  // namespace neon
}  // namespace cpuformer
