#include "layers/relative_attention_xl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/attention/attention.h"
#include "runtime/threading.h"

namespace cpuformer {

void relative_sinusoids(long hidden, long keys, long queries, long clamp, float* out) {
  const long half = hidden / 2, rows = keys + queries - 1;
  // float32 as transformers computes it: inv_freq = 1 / 10000^(2k / hidden), then distance · inv_freq.
  std::vector<float> inv_freq(half);
  for (long k = 0; k < half; ++k) {
    const float exponent = static_cast<float>(2 * k) / static_cast<float>(hidden);
    inv_freq[k] = 1.0f / std::pow(10000.0f, exponent);
  }
  parallel_ranges(rows, 16, [&](long r0, long r1) {
    for (long r = r0; r < r1; ++r) {
      long distance = keys - 1 - r;
      if (clamp > 0) distance = std::min(std::max(distance, -clamp), clamp);
      float* row = out + r * hidden;
      for (long k = 0; k < half; ++k) {
        const float angle = static_cast<float>(distance) * inv_freq[k];
        row[k] = std::sin(angle);
        row[half + k] = std::cos(angle);
      }
    }
  });
}

RelativeAttentionXL::RelativeAttentionXL(const TransformerConfig& c, const BlockTensors& t) {
  const long qw = c.q_width();
  if (!t.position_k.weight || !t.content_bias || !t.position_bias || !t.segment_bias || !t.segment_embed) {
    throw std::invalid_argument(
        "Transformer-XL attention needs attn.position_k and the content, position and "
        "segment biases and embeddings");
  }
  position_ = Linear({{t.position_k.weight, t.position_k.bias, qw}}, c.hidden_size, c.matmul_format());
  content_bias_.assign(t.content_bias, t.content_bias + qw);
  position_bias_.assign(t.position_bias, t.position_bias + qw);
  segment_bias_.assign(t.segment_bias, t.segment_bias + qw);
  segment_embed_.assign(t.segment_embed, t.segment_embed + 2 * qw);
}

namespace {

float dot(const float* a, const float* b, long n) {
  float sum = 0.0f;
  for (long d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

}  // namespace

void RelativeAttentionXL::attend(const TransformerConfig& c, const AttentionArgs& a, const RelativeAttentionXLInput& in,
                                 RelativeAttentionXLWorkspace& ws) const {
  const long B = a.batch, T = a.q_len, heads = a.heads, D = a.head_dim, H = c.hidden_size;
  const long qw = heads * D, M = in.memory_len, K = M + T;
  if (a.kv_len != T || a.q_stride_b != T * a.q_stride_t || a.kv_heads != heads || a.q_stride_h != D ||
      a.k_stride_h != D || a.v_stride_h != D) {
    throw std::logic_error("Transformer-XL attention needs self-attention over the fused projection");
  }

  // P = Wr · e for every distance K - 1 … -(T - 1), then one contiguous [rows_p, D] table per head
  // (a window of its rows is the weight matrix of a GEMM), and v·P per head and row.
  const long rows_p = K + T - 1;
  float* projected = ws.projected.reserve({rows_p, qw});
  position_.apply(in.sinusoids, rows_p, H, projected, qw);
  float* positions = ws.positions.reserve({heads, rows_p, D});
  float* position_bias = ws.position_bias.reserve({heads, rows_p});
  parallel_ranges(heads * rows_p, 64, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      const long h = n / rows_p, r = n % rows_p;
      float* row = positions + n * D;
      std::memcpy(row, projected + r * qw + h * D, D * sizeof(float));
      position_bias[n] = dot(position_bias_.data() + h * D, row, D);
    }
  });

  // Keys and values: the fused projection's rows, or [memory; current] in one buffer.
  const float* k = a.k;
  const float* v = a.v;
  long k_stride_b = a.k_stride_b, k_stride_t = a.k_stride_t, v_stride_b = a.v_stride_b, v_stride_t = a.v_stride_t;
  if (M > 0) {
    const long row = in.qkv->out_features();  // q | k | v (the memory's queries are not used)
    float* kv = ws.keys.reserve({B, K, row});
    for (long b = 0; b < B; ++b) in.qkv->apply(in.memory + b * M * H, M, H, kv + b * K * row, row);
    parallel_ranges(B * T, 16, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        const long b = n / T, t = n % T;
        float* dst = kv + (b * K + M + t) * row;
        std::memcpy(dst + qw, a.k + b * a.k_stride_b + t * a.k_stride_t, qw * sizeof(float));
        std::memcpy(dst + 2 * qw, a.v + b * a.v_stride_b + t * a.v_stride_t, qw * sizeof(float));
      }
    });
    k = kv + qw;
    v = kv + 2 * qw;
    k_stride_b = v_stride_b = K * row;
    k_stride_t = v_stride_t = row;
  }

  // u·k_j per sequence, head and key; (q_i + s)·S[0] and (q_i + s)·S[1] per query and head.
  float* content = ws.content.reserve({B, heads, K});
  parallel_ranges(B * heads * K, 256, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      const long j = n % K, h = (n / K) % heads, b = n / (K * heads);
      content[n] = dot(content_bias_.data() + h * D, k + b * k_stride_b + j * k_stride_t + h * D, D);
    }
  });
  const int64_t* types = in.token_types;
  float* segment = types ? ws.segment.reserve({B * T, heads, 2}) : nullptr;
  if (types) {
    parallel_ranges(B * T * heads, 64, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        const long h = n % heads, token = n / heads;
        const float* q = a.q + token * a.q_stride_t + h * D;  // (q_stride_b == T · q_stride_t)
        const float* s = segment_bias_.data() + h * D;
        float same = 0.0f, differs = 0.0f;
        for (long d = 0; d < D; ++d) {
          const float x = q[d] + s[d];
          same += x * segment_embed_[h * D + d];
          differs += x * segment_embed_[qw + h * D + d];
        }
        segment[2 * n] = same;
        segment[2 * n + 1] = differs;
      }
    });
  }

  // Tiles: several whole sequences, or query blocks of one sequence when a sequence is too long.
  const long per_sequence = heads * T * (K + rows_p);
  long sequences_per_tile = 1, block = T;
  if (per_sequence <= kRelativeAttentionXLScratchFloats) {
    sequences_per_tile = std::min(B, kRelativeAttentionXLScratchFloats / std::max(per_sequence, 1L));
  } else {
    // A block of n queries needs heads · n · (K + n + K - 1) ≤ heads · n · 3K floats.
    block = std::max(1L, std::min(T, kRelativeAttentionXLScratchFloats / (3 * heads * K)));
  }
  const float scale = a.scale;
  for (long b0 = 0; b0 < B; b0 += sequences_per_tile) {
    const long sequences = std::min(sequences_per_tile, B - b0);
    for (long i0 = 0; i0 < T; i0 += block) {
      const long i1 = std::min(T, i0 + block), queries = i1 - i0, rows = sequences * queries;
      // Query i and key j read P row T - 1 - i + j: the tile reaches rows [T - i1, T - 1 - i0 + K - 1].
      const long lowest = T - i1, window = queries + K - 1;
      float* scores = ws.scores.reserve({heads, rows, window});  // q_i·P[lowest + w]
      // (sequences > 1 only with whole sequences: the tile's query rows are consecutive)
      const float* q_tile = a.q + (b0 * T + i0) * a.q_stride_t;
      for (long h = 0; h < heads; ++h) {
        const Linear table({{positions + (h * rows_p + lowest) * D, nullptr, window}}, D);
        table.apply(q_tile + h * D, rows, a.q_stride_t, scores + h * rows * window, window);
      }
      float* bias = ws.bias.reserve({sequences, heads, queries, K});
      parallel_ranges(sequences * heads * queries, 4, [&](long n0, long n1) {
        for (long n = n0; n < n1; ++n) {
          const long i = i0 + n % queries, h = (n / queries) % heads, s = n / (queries * heads), b = b0 + s;
          float* out = bias + n * K;
          const float* score = scores + (h * rows + s * queries + (i - i0)) * window + (i1 - 1 - i);
          const float* by_distance = position_bias + h * rows_p + (T - 1 - i);
          const float* by_key = content + (b * heads + h) * K;
          for (long j = 0; j < K; ++j) out[j] = score[j] + by_distance[j] + by_key[j];
          if (types) {
            const int64_t* key_types = types + b * T;
            const int64_t type = key_types[i];
            const float* terms = segment + 2 * ((b * T + i) * heads + h);
            const float same = terms[0], differs = terms[1];
            for (long j = 0; j < M; ++j) out[j] += type != 0 ? differs : same;
            for (long t = 0; t < T; ++t) out[M + t] += key_types[t] != type ? differs : same;
          }
          for (long j = 0; j < K; ++j) out[j] *= scale;
          if (in.key_mask) {
            const float* mask = in.key_mask + b * T;
            for (long t = 0; t < T; ++t) {
              if (t != i) out[M + t] += mask[t];
            }
          }
        }
      });
      AttentionArgs part = a;
      part.batch = sequences;
      part.q_len = queries;
      part.kv_len = K;
      part.q = a.q + b0 * a.q_stride_b + i0 * a.q_stride_t;
      part.k = k + b0 * k_stride_b;
      part.v = v + b0 * v_stride_b;
      part.k_stride_b = k_stride_b;
      part.k_stride_t = k_stride_t;
      part.v_stride_b = v_stride_b;
      part.v_stride_t = v_stride_t;
      part.out = a.out + b0 * a.out_stride_b + i0 * a.out_stride_t;
      part.causal = false;
      part.window = 0;
      part.mask = bias;
      part.mask_stride_b = heads * queries * K;
      part.mask_stride_h = queries * K;
      part.mask_stride_q = K;
      part.mask_stride_k = 1;
      attention(part);
    }
  }
}

}  // namespace cpuformer
