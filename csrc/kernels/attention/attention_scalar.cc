// Portable reference attention: one query row at a time, online softmax over the keys
// (running max m, running denominator l, unnormalised accumulator acc):
//   for each key j the row sees: s = scale·q·k_j + mask; m' = max(m, s); μ = m' (0 while m' = -inf)
//   acc = acc·e^(m−μ) + e^(s−μ)·v_j; l = l·e^(m−μ) + e^(s−μ); m = m'
//   out = acc / l (zeros when l = 0)
// Keys outside the causal/window range or with a -inf mask value are skipped, so their k and v
// never reach the row (docs/reliability.md, "Non-finite values"); a NaN score makes the row NaN.
// A reduced-precision k / v (AttentionArgs::kv_type) is widened one key row at a time.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention/attention.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {
namespace {

void attention(const AttentionArgs& a) {
  const long group = a.heads / a.kv_heads;
  const long rows = a.batch * a.heads * a.q_len;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  run_team(current_num_threads(), [&](const Team& team) {
    std::vector<float> acc(a.head_dim), kw(a.head_dim), vw(a.head_dim);
    const bool widen = a.kv_type != KvType::kFloat32;
    long row0, row1;
    team.range(rows, &row0, &row1);
    for (long row = row0; row < row1; ++row) {
      const long i = row % a.q_len, h = (row / a.q_len) % a.heads, b = row / (a.q_len * a.heads);
      const long hk = h / group;
      const float* q = a.q + b * a.q_stride_b + h * a.q_stride_h + i * a.q_stride_t;
      const float* kb = widen ? nullptr : a.k + b * a.k_stride_b + hk * a.k_stride_h;
      const float* vb = widen ? nullptr : a.v + b * a.v_stride_b + hk * a.v_stride_h;
      const float* mask_row =
          a.mask ? a.mask + b * a.mask_stride_b + h * a.mask_stride_h + i * a.mask_stride_q : nullptr;
      long end = a.kv_len, begin = 0;
      if (a.causal) {
        const long last = i + a.causal_offset;  // last visible key
        end = last + 1 < end ? last + 1 : end;
        if (a.window > 0 && last - a.window + 1 > begin) begin = last - a.window + 1;
      } else if (a.window > 0) {
        const long center = i + a.causal_offset;  // keys within window - 1 positions on both sides
        if (center - a.window + 1 > begin) begin = center - a.window + 1;
        if (center + a.window < end) end = center + a.window;
      }
      float m = neg_inf, l = 0.0f;
      for (long d = 0; d < a.head_dim; ++d) acc[d] = 0.0f;
      for (long j = begin; j < end; ++j) {
        const float mask = mask_row ? mask_row[j * a.mask_stride_k] : 0.0f;
        if (mask == neg_inf) continue;  // removed: nothing of key j may reach this row
        const float* kj = kw.data();
        if (widen) {
          widen_kv_row(a, false, b, hk, j, kw.data());
        } else {
          kj = kb + j * a.k_stride_t;
        }
        float s = 0.0f;
        for (long d = 0; d < a.head_dim; ++d) s += q[d] * kj[d];
        s = s * a.scale + mask;
        const float m_new = s > m ? s : m;  // a NaN s leaves m; its p below is NaN
        const float m_use = m_new == neg_inf ? 0.0f : m_new;  // keeps s - m_use = -inf, not NaN
        const float correction = std::exp(m - m_use);  // 0 on the first key with a finite score
        const float p = std::exp(s - m_use);
        const float* vj = vw.data();
        if (widen) {
          widen_kv_row(a, true, b, hk, j, vw.data());
        } else {
          vj = vb + j * a.v_stride_t;
        }
        for (long d = 0; d < a.head_dim; ++d) acc[d] = acc[d] * correction + p * vj[d];
        l = l * correction + p;
        m = m_new;
      }
      float* out = a.out + b * a.out_stride_b + h * a.out_stride_h + i * a.out_stride_t;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      for (long d = 0; d < a.head_dim; ++d) out[d] = acc[d] * inv;
    }
  });
}

// The reference runs several calls one after another.
void attention_each(const AttentionArgs* calls, long count) {
  for (long c = 0; c < count; ++c) {
    if (calls[c].batch > 0 && calls[c].heads > 0 && calls[c].q_len > 0) scalar::attention(calls[c]);
  }
}

}  // namespace

const AttentionKernels kAttentionKernels = {attention, attention_each};

}  // namespace scalar
}  // namespace cpuformer
