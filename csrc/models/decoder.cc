#include "models/decoder.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/attention/attention.h"
#include "kernels/norm/norm.h"
#include "models/rope.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace {

NormWeights copy_norm(const float* weight, const float* bias, long n, float eps) {
  NormWeights norm;
  norm.weight.assign(weight, weight + n);
  if (bias) norm.bias.assign(bias, bias + n);
  norm.eps = eps;
  return norm;
}

void apply_norm(bool rms, const NormWeights& norm, const float* x, float* y, long rows, long n) {
  if (rms) {
    rms_norm(x, nullptr, nullptr, norm.weight.data(), norm.eps, y, rows, n);
  } else {
    layer_norm(x, nullptr, nullptr, norm.weight.data(), norm.bias.empty() ? nullptr : norm.bias.data(), norm.eps, y,
               rows, n);
  }
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Hugging Face's generate(): position = cumsum(mask) - 1; padding gets position 0 (its value is
// irrelevant: padded slots are masked out as keys). Returns each row's count of tokens.
void positions_from_mask(const int64_t* mask, long rows, long T, long* positions, long* counts) {
  for (long r = 0; r < rows; ++r) {
    long count = 0;
    for (long t = 0; t < T; ++t) {
      const bool token = mask == nullptr || mask[r * T + t] != 0;
      positions[r * T + t] = token ? count : 0;
      if (token) ++count;
    }
    if (counts) counts[r] = count;
  }
}

}  // namespace

DecoderModel::DecoderModel(const DecoderConfig& config, const float* word_embeddings,
                           const float* position_embeddings)
    : config_(config), word_embeddings_(word_embeddings), position_embeddings_(position_embeddings) {
  const DecoderConfig& c = config_;
  if (c.hidden_size <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 || c.intermediate_size <= 0 ||
      c.vocab_size <= 0 || c.num_heads % c.num_kv_heads != 0) {
    throw std::invalid_argument("invalid decoder config: sizes must be positive and kv heads divide heads");
  }
  if (!c.learned_positions && (c.head_dim % 2 != 0 || static_cast<long>(c.rope_inv_freq.size()) != c.head_dim / 2)) {
    throw std::invalid_argument("RoPE needs an even head_dim and head_dim / 2 inverse frequencies");
  }
  if (c.learned_positions && position_embeddings == nullptr) {
    throw std::invalid_argument("learned positions need a position table");
  }
  // The widths forward() multiplies by the token count, checked once here.
  const long qw = checked_multiply(c.num_heads, c.head_dim, "num_attention_heads × head_dim");
  const long kvw = checked_multiply(c.num_kv_heads, c.head_dim, "num_key_value_heads × head_dim");
  checked_add(qw, checked_multiply(2, kvw, "the key and value width"), "the fused q, k, v width");
  checked_multiply(2, c.intermediate_size, "the fused gate and up width (2 × intermediate_size)");
  require_in_features(c.weight_type, {{"hidden_size", c.hidden_size},
                                      {"num_attention_heads × head_dim", qw},
                                      {"intermediate_size", c.intermediate_size}});
  layers_.reserve(c.num_layers);
}

void DecoderModel::add_layer(const DecoderLayerTensors& t) {
  if (static_cast<long>(layers_.size()) >= config_.num_layers) {
    throw std::logic_error("the decoder already has all its layers");
  }
  const DecoderConfig& c = config_;
  const long H = c.hidden_size, I = c.intermediate_size, qw = c.num_heads * c.head_dim,
             kvw = c.num_kv_heads * c.head_dim;
  Layer layer;
  layer.qkv = Linear({{t.q_weight, t.q_bias, qw}, {t.k_weight, t.k_bias, kvw}, {t.v_weight, t.v_bias, kvw}}, H, c.weight_type);
  layer.out = Linear({{t.o_weight, t.o_bias, H}}, qw, c.weight_type);
  if (c.gated_ffn) {
    layer.up = Linear({{t.gate_weight, nullptr, I}, {t.up_weight, nullptr, I}}, H, c.weight_type);
  } else {
    layer.up = Linear({{t.up_weight, t.up_bias, I}}, H, c.weight_type);
  }
  layer.down = Linear({{t.down_weight, t.down_bias, H}}, I, c.weight_type);
  layer.norm1 = copy_norm(t.norm1_weight, c.rms_norm ? nullptr : t.norm1_bias, H, c.norm_eps);
  layer.norm2 = copy_norm(t.norm2_weight, c.rms_norm ? nullptr : t.norm2_bias, H, c.norm_eps);
  if (c.qk_norm) {
    layer.q_norm.assign(t.q_norm_weight, t.q_norm_weight + c.head_dim);
    layer.k_norm.assign(t.k_norm_weight, t.k_norm_weight + c.head_dim);
  }
  layers_.push_back(std::move(layer));
}

void DecoderModel::set_head(const float* norm_weight, const float* norm_bias, WeightRef lm_head) {
  const DecoderConfig& c = config_;
  final_norm_ = copy_norm(norm_weight, c.rms_norm ? nullptr : norm_bias, c.hidden_size, c.norm_eps);
  lm_head_ = Linear({{lm_head ? lm_head : word_embeddings_, nullptr, c.vocab_size}}, c.hidden_size, c.weight_type);
  has_head_ = true;
}

void DecoderModel::forward(KvCache& cache, Workspace& ws, const int64_t* ids, const long* positions, long rows,
                           long t_new, bool all_positions, float* logits) const {
  const DecoderConfig& c = config_;
  const long H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, heads = c.num_heads,
             kv_heads = c.num_kv_heads;
  const long qw = heads * D, kvw = kv_heads * D, row = qw + 2 * kvw;
  const long N = checked_multiply(rows, t_new, "the tokens of a forward pass (rows × new positions)");
  const long start = cache.length();
  if (start + t_new > cache.max_len()) throw std::logic_error("the KV cache is full");
  const long mlp_width = c.gated_ffn ? 2 * I : I;
  float* h = ws.h.reserve({N, H});
  float* x = ws.x.reserve({N, H});
  float* qkv = ws.qkv.reserve({N, row});
  float* context = ws.context.reserve({N, qw});
  float* mlp = ws.mlp.reserve({N, mlp_width});

  const float scale = c.embed_scale;  // 1 (every family but Gemma): the rows are copied, not multiplied
  parallel_ranges(N, 16, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      const float* word = word_embeddings_ + ids[n] * H;
      float* out = h + n * H;
      if (c.learned_positions) {
        const float* pos = position_embeddings_ + positions[n] * H;
        if (scale == 1.0f) {
          for (long j = 0; j < H; ++j) out[j] = word[j] + pos[j];
        } else {
          for (long j = 0; j < H; ++j) out[j] = word[j] * scale + pos[j];
        }
      } else if (scale == 1.0f) {
        std::memcpy(out, word, H * sizeof(float));
      } else {
        for (long j = 0; j < H; ++j) out[j] = word[j] * scale;
      }
    }
  });
  float* cos_sin = nullptr;
  if (!c.learned_positions) {
    cos_sin = ws.rope.reserve({N, D});
    const long half = D / 2;
    parallel_ranges(N, 16, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) rope_angles(c.rope_inv_freq.data(), half, positions[n], cos_sin + n * D);
    });
  }

  AttentionArgs a;
  a.batch = rows;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.q_len = t_new;
  a.kv_len = start + t_new;
  a.head_dim = D;
  a.q = qkv;
  a.q_stride_b = t_new * row;
  a.q_stride_h = D;
  a.q_stride_t = row;
  a.k_stride_b = a.v_stride_b = cache.stride_row();
  a.k_stride_h = a.v_stride_h = cache.stride_head();
  a.k_stride_t = a.v_stride_t = D;
  a.out = context;
  a.out_stride_b = t_new * qw;
  a.out_stride_h = D;
  a.out_stride_t = qw;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.causal = true;
  a.causal_offset = start;
  a.window = c.sliding_window;
  a.mask = cache.key_mask();
  a.mask_stride_b = cache.max_len();
  a.mask_stride_h = 0;
  a.mask_stride_q = 0;
  a.mask_stride_k = 1;

  const NormKernels& nk = norm_kernels();
  for (long l = 0; l < static_cast<long>(layers_.size()); ++l) {
    const Layer& layer = layers_[l];
    apply_norm(c.rms_norm, layer.norm1, h, x, N, H);
    layer.qkv.apply(x, N, H, qkv, row);
    float* k_cache = cache.k(l);
    float* v_cache = cache.v(l);
    // Per token: q/k head norms, RoPE, then k and v into the cache slots.
    parallel_ranges(N, 4, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        float* q = qkv + n * row;
        float* k = q + qw;
        const float* v = k + kvw;
        if (c.qk_norm) {
          for (long i = 0; i < heads; ++i) nk.rms_norm_row(q + i * D, nullptr, nullptr, layer.q_norm.data(), c.norm_eps, q + i * D, D);
          for (long i = 0; i < kv_heads; ++i) nk.rms_norm_row(k + i * D, nullptr, nullptr, layer.k_norm.data(), c.norm_eps, k + i * D, D);
        }
        if (cos_sin) {
          rope_apply(cos_sin + n * D, D / 2, heads, q);
          rope_apply(cos_sin + n * D, D / 2, kv_heads, k);
        }
        const long r = n / t_new, slot = start + n % t_new;
        for (long i = 0; i < kv_heads; ++i) {
          const long offset = r * cache.stride_row() + i * cache.stride_head() + slot * D;
          std::memcpy(k_cache + offset, k + i * D, D * sizeof(float));
          std::memcpy(v_cache + offset, v + i * D, D * sizeof(float));
        }
      }
    });
    a.k = k_cache;
    a.v = v_cache;
    attention(a);
    layer.out.apply(context, N, qw, h, H, Activation::kNone, h, H);
    apply_norm(c.rms_norm, layer.norm2, h, x, N, H);
    if (c.gated_ffn) {
      layer.up.apply(x, N, H, mlp, mlp_width);  // [N, gate | up]
      const ActivationKernels& ak = activation_kernels();
      parallel_ranges(N, 4, [&](long n0, long n1) {
        for (long n = n0; n < n1; ++n) {
          float* gate = mlp + n * mlp_width;
          const float* up = gate + I;
          if (c.activation == Activation::kSilu) {
            ak.silu_mul(gate, up, gate, I);
          } else {
            ak.apply(c.activation, gate, gate, I);
            for (long j = 0; j < I; ++j) gate[j] *= up[j];
          }
        }
      });
    } else {
      layer.up.apply(x, N, H, mlp, mlp_width, c.activation);
    }
    layer.down.apply(mlp, N, mlp_width, h, H, Activation::kNone, h, H);
  }
  cache.set_length(start + t_new);

  if (all_positions) {
    apply_norm(c.rms_norm, final_norm_, h, x, N, H);
    lm_head_.apply(x, N, H, logits, c.vocab_size);
  } else {
    for (long r = 0; r < rows; ++r) {
      apply_norm(c.rms_norm, final_norm_, h + (r * t_new + t_new - 1) * H, x + r * H, 1, H);
    }
    lm_head_.apply(x, rows, H, logits, c.vocab_size);
  }
}

void DecoderModel::logits(const int64_t* ids, const int64_t* mask, long batch, long seq_len, float* out) const {
  if (!complete()) throw std::logic_error("the decoder is missing layers or its head");
  KvCache cache;
  Workspace ws;
  cache.reset(config_.num_layers, batch, config_.num_kv_heads, seq_len, config_.head_dim);
  float* key_mask = cache.key_mask();
  for (long i = 0; i < batch * seq_len; ++i) key_mask[i] = (mask == nullptr || mask[i] != 0) ? 0.0f : kNegInf;
  std::vector<long> positions(checked_count({batch, seq_len}, "the positions"));
  positions_from_mask(mask, batch, seq_len, positions.data(), nullptr);
  forward(cache, ws, ids, positions.data(), batch, seq_len, true, out);
}

void DecoderSession::reserve(long rows, long T, long max_new) {
  const DecoderConfig& c = model_.config_;
  cache_.reset(c.num_layers, rows, c.num_kv_heads, checked_add(T, max_new, "prompt length + max_new_tokens"),
               c.head_dim);
}

void DecoderSession::prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long /*copies*/, long max_new,
                             float* logits) {
  if (!model_.complete()) throw std::logic_error("the decoder is missing layers or its head");
  reserve(rows, T, max_new);  // (allocates nothing when reserve() ran with these sizes)
  float* key_mask = cache_.key_mask();
  const long max_len = cache_.max_len();
  for (long r = 0; r < rows; ++r) {
    for (long t = 0; t < T; ++t) key_mask[r * max_len + t] = mask[r * T + t] != 0 ? 0.0f : kNegInf;
  }
  positions_.resize(checked_count({rows, T}, "the positions"));
  next_position_.resize(rows);
  positions_from_mask(mask, rows, T, positions_.data(), next_position_.data());
  model_.forward(cache_, ws_, ids, positions_.data(), rows, T, false, logits);
}

void DecoderSession::step(const int64_t* tokens, float* logits) {
  const long rows = cache_.rows(), slot = cache_.length(), max_len = cache_.max_len();
  if (slot >= max_len) throw std::logic_error("the KV cache is full");
  positions_.resize(rows);
  for (long r = 0; r < rows; ++r) {
    cache_.key_mask()[r * max_len + slot] = 0.0f;
    positions_[r] = next_position_[r]++;
  }
  model_.forward(cache_, ws_, tokens, positions_.data(), rows, 1, false, logits);
}

void DecoderSession::reorder(const long* source) {
  cache_.reorder(source);
  std::vector<long> old(next_position_);
  for (long r = 0; r < cache_.rows(); ++r) next_position_[r] = old[source[r]];
}

}  // namespace cpuformer
