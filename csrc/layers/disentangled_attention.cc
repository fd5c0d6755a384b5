#include "layers/disentangled_attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "kernels/attention/attention.h"
#include "layers/linear.h"
#include "runtime/threading.h"

namespace cpuformer {

long disentangled_relative_position(long relative, long position_buckets, long max_position) {
  if (position_buckets <= 0) return relative;
  const long mid = position_buckets / 2;
  const long magnitude = relative < 0 ? -relative : relative;
  if (magnitude <= mid) return relative;
  // float32 throughout, as transformers: log of the float32 quotient, the denominator a Python
  // float (double) quotient rounded to a float32 tensor, ceil of the float32 product.
  const float ratio = std::log(static_cast<float>(magnitude) / static_cast<float>(mid));
  const float denominator = std::log(static_cast<float>(static_cast<double>(max_position - 1) / mid));
  const float bucket = std::ceil(ratio / denominator * static_cast<float>(mid - 1)) + static_cast<float>(mid);
  const long large = static_cast<long>(bucket);
  return relative < 0 ? -large : large;
}

namespace {

// [2·span, heads·D] rows → [heads, 2·span, D] (one contiguous table per head, so a window of
// rows is a contiguous weight matrix for the GEMM).
std::vector<float> per_head(const float* rows, long row_stride, long span2, long heads, long D) {
  std::vector<float> out(static_cast<size_t>(heads) * span2 * D);
  for (long h = 0; h < heads; ++h)
    for (long r = 0; r < span2; ++r)
      std::copy(rows + r * row_stride + h * D, rows + r * row_stride + (h + 1) * D, out.begin() + (h * span2 + r) * D);
  return out;
}

}  // namespace

DisentangledAttention::DisentangledAttention(const TransformerConfig& c, const float* relative,
                                             const LinearTensors& query, const LinearTensors& key)
    : span_(c.relative_span()), head_dim_(c.head_dim) {
  const long H = c.hidden_size, qw = c.q_width(), span2 = 2 * span_;
  std::vector<float> projected(static_cast<size_t>(span2) * qw);
  auto project = [&](const LinearTensors& t) {
    const Linear linear({{t.weight, t.bias, qw}}, H, c.matmul_format());
    linear.apply(relative, span2, H, projected.data(), qw);
    return per_head(projected.data(), qw, span2, c.num_heads, head_dim_);
  };
  if (c.position_to_content) position_query_ = project(query);
  if (c.content_to_position) position_key_ = project(key);
}

void DisentangledAttention::attend(const TransformerConfig& c, const AttentionArgs& a,
                                   DisentangledWorkspace& ws) const {
  const long B = a.batch, T = a.q_len, heads = a.heads, D = head_dim_, span2 = 2 * span_;
  if (a.kv_len != T || a.q_stride_b != T * a.q_stride_t || a.k_stride_b != T * a.k_stride_t || a.kv_heads != heads) {
    throw std::logic_error("disentangled attention needs self-attention over the fused projection");
  }
  // δ for every i - j in [-(T - 1), T - 1]; the window [lowest, highest] of table rows it reaches.
  ws.index.resize(2 * T - 1);
  for (long r = -(T - 1); r <= T - 1; ++r) {
    const long bucket = disentangled_relative_position(r, c.position_buckets, c.max_relative_positions);
    ws.index[r + T - 1] = std::min(std::max(span_ + bucket, 0L), span2 - 1);
  }
  const long lowest = *std::min_element(ws.index.begin(), ws.index.end());
  const long highest = *std::max_element(ws.index.begin(), ws.index.end());
  const long window = highest - lowest + 1;
  const long* index = ws.index.data() + (T - 1);  // index[i - j]

  const bool c2p = !position_key_.empty(), p2c = !position_query_.empty();
  const long per_sequence = heads * T * (T + (c2p + p2c) * window);
  const long chunk = std::max(1L, std::min(B, kDisentangledScratchFloats / std::max(per_sequence, 1L)));
  for (long b0 = 0; b0 < B; b0 += chunk) {
    const long sequences = std::min(chunk, B - b0), rows = sequences * T;
    // [heads, rows, window]: row n of head h holds q_n·Pk[lowest + w] (c2p) and k_n·Pq[lowest + w] (p2c).
    float* content_to_position = c2p ? ws.content_to_position.reserve({heads, rows, window}) : nullptr;
    float* position_to_content = p2c ? ws.position_to_content.reserve({heads, rows, window}) : nullptr;
    for (long h = 0; h < heads; ++h) {
      if (c2p) {
        const Linear table({{position_key_.data() + (h * span2 + lowest) * D, nullptr, window}}, D);
        table.apply(a.q + b0 * a.q_stride_b + h * a.q_stride_h, rows, a.q_stride_t,
                    content_to_position + h * rows * window, window);
      }
      if (p2c) {
        const Linear table({{position_query_.data() + (h * span2 + lowest) * D, nullptr, window}}, D);
        table.apply(a.k + b0 * a.k_stride_b + h * a.k_stride_h, rows, a.k_stride_t,
                    position_to_content + h * rows * window, window);
      }
    }
    // bias [sequences, heads, T, T] = scale · (c2p[i, δ(i, j)] + p2c[j, δ(i, j)]) + mask.
    float* bias = ws.bias.reserve({sequences, heads, T, T});
    const float scale = a.scale;
    parallel_ranges(sequences * heads * T, 8, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        const long i = n % T, h = (n / T) % heads, s = n / (T * heads);
        const long first = h * rows + s * T;  // this sequence's first row in the [heads, rows, window] buffers
        float* out = bias + n * T;
        const long* delta = index + i;  // delta[-j] = δ(i, j)
        const float* mask =
            a.mask ? a.mask + (b0 + s) * a.mask_stride_b + h * a.mask_stride_h + i * a.mask_stride_q : nullptr;
        // c2p reads row i; p2c reads rows j (row j, column δ(i, j)): one pass over the keys.
        const float* row_i = c2p ? content_to_position + (first + i) * window - lowest : nullptr;
        const float* rows_j = p2c ? position_to_content + first * window - lowest : nullptr;
        const long mask_stride = a.mask_stride_k;
        auto fill = [&](auto with_c2p, auto with_p2c, auto with_mask) {
          for (long j = 0; j < T; ++j) {
            const long d = delta[-j];
            float sum = 0.0f;
            if (with_c2p) sum += row_i[d];
            if (with_p2c) sum += rows_j[j * window + d];
            out[j] = with_mask ? sum * scale + mask[j * mask_stride] : sum * scale;
          }
        };
        using Yes = std::true_type;
        using No = std::false_type;
        if (mask) {
          if (c2p && p2c) fill(Yes(), Yes(), Yes());
          else if (c2p) fill(Yes(), No(), Yes());
          else fill(No(), Yes(), Yes());
        } else {
          if (c2p && p2c) fill(Yes(), Yes(), No());
          else if (c2p) fill(Yes(), No(), No());
          else fill(No(), Yes(), No());
        }
      }
    });
    AttentionArgs part = a;
    part.batch = sequences;
    part.q = a.q + b0 * a.q_stride_b;
    part.k = a.k + b0 * a.k_stride_b;
    part.v = a.v + b0 * a.v_stride_b;
    part.out = a.out + b0 * a.out_stride_b;
    part.mask = bias;
    part.mask_stride_b = heads * T * T;
    part.mask_stride_h = T * T;
    part.mask_stride_q = T;
    part.mask_stride_k = 1;
    attention(part);
  }
}

}  // namespace cpuformer
