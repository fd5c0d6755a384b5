#include "models/encoder.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/norm/norm.h"
#include "models/attention_block.h"
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

void apply_layer_norm(const NormWeights& norm, const float* x, float* y, long rows, long n) {
  layer_norm(x, nullptr, nullptr, norm.weight.data(), norm.bias.empty() ? nullptr : norm.bias.data(), norm.eps, y,
             rows, n);
}

}  // namespace

EncoderModel::EncoderModel(const EncoderConfig& config, const EmbeddingTensors& e)
    : config_(config),
      word_embeddings_(e.word_embeddings),
      position_embeddings_(e.position_embeddings),
      token_type_embeddings_(config.type_vocab_size > 0 ? e.token_type_embeddings : nullptr) {
  const long H = config.hidden_size;
  if (H <= 0 || config.intermediate_size <= 0 || config.num_heads <= 0 || H % config.num_heads != 0) {
    throw std::invalid_argument("hidden_size must be a positive multiple of num_attention_heads");
  }
  checked_multiply(3, H, "the fused q, k, v width (3 × hidden_size)");
  require_in_features(config.weight_type, {{"hidden_size", H}, {"intermediate_size", config.intermediate_size}});
  embedding_norm_ = copy_norm(e.norm_weight, e.norm_bias, H, config.layer_norm_eps);
  layers_.reserve(config.num_layers);
}

void EncoderModel::add_layer(const EncoderLayerTensors& lt) {
  if (complete()) throw std::logic_error("the encoder already has all its layers");
  const long H = config_.hidden_size, I = config_.intermediate_size;
  Layer layer;
  const WeightType wt = config_.weight_type;
  layer.qkv = Linear({{lt.q_weight, lt.q_bias, H}, {lt.k_weight, lt.k_bias, H}, {lt.v_weight, lt.v_bias, H}}, H, wt);
  layer.output_proj = Linear({{lt.out_weight, lt.out_bias, H}}, H, wt);
  layer.attention_norm = copy_norm(lt.attention_norm_weight, lt.attention_norm_bias, H, config_.layer_norm_eps);
  layer.intermediate = Linear({{lt.intermediate_weight, lt.intermediate_bias, I}}, H, wt);
  layer.output = Linear({{lt.output_weight, lt.output_bias, H}}, I, wt);
  layer.output_norm = copy_norm(lt.output_norm_weight, lt.output_norm_bias, H, config_.layer_norm_eps);
  layers_.push_back(std::move(layer));
}

void EncoderModel::set_pooler(WeightRef weight, const float* bias) {
  pooler_ = Linear({{weight, bias, config_.hidden_size}}, config_.hidden_size, config_.weight_type);
  has_pooler_ = true;
}

void EncoderModel::embed(const int64_t* input_ids, const int64_t* token_type_ids, long batch, long seq_len,
                         float* h) const {
  const long H = config_.hidden_size;
  const long pad = config_.pad_token_id;
  const bool cumsum = config_.position_ids == PositionIds::kPaddingCumsum;
  // One sequence per work item: RoBERTa positions are a running count along the sequence.
  parallel_ranges(batch, 1, [&](long b0, long b1) {
    for (long b = b0; b < b1; ++b) {
      long count = 0;
      for (long t = 0; t < seq_len; ++t) {
        const long r = b * seq_len + t;
        const int64_t id = input_ids[r];
        long position = t;
        if (cumsum) {
          if (id != pad) ++count;
          position = id != pad ? pad + count : pad;
        }
        const float* word = word_embeddings_ + id * H;
        const float* pos = position_embeddings_ + position * H;
        float* row = h + r * H;
        if (token_type_embeddings_) {
          const float* type = token_type_embeddings_ + (token_type_ids ? token_type_ids[r] : 0) * H;
          for (long j = 0; j < H; ++j) row[j] = word[j] + pos[j] + type[j];
        } else {
          for (long j = 0; j < H; ++j) row[j] = word[j] + pos[j];
        }
      }
    }
  });
  apply_layer_norm(embedding_norm_, h, h, batch * seq_len, H);
}

void EncoderModel::forward(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids,
                           long batch, long seq_len, float* out, float* pooled) const {
  if (!complete()) throw std::logic_error("the encoder is missing layers");
  if (pooled && !has_pooler_) throw std::logic_error("this encoder has no pooler");
  std::unique_lock<std::mutex> lock(workspace_mutex_, std::try_to_lock);
  if (lock.owns_lock()) {
    run(input_ids, attention_mask, token_type_ids, batch, seq_len, out, pooled, workspace_);
  } else {
    Workspace own;  // another thread is using the shared scratch space
    run(input_ids, attention_mask, token_type_ids, batch, seq_len, out, pooled, own);
  }
}

void EncoderModel::run(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids,
                       long batch, long seq_len, float* out, float* pooled, Workspace& ws) const {
  const long H = config_.hidden_size, I = config_.intermediate_size, heads = config_.num_heads;
  const long rows = checked_multiply(batch, seq_len, "the tokens of a batch (batch × seq_len)");
  float* h = out;  // the hidden state lives in the output array from the start
  float* qkv = ws.qkv.reserve({rows, 3, H});              // [B, T, 3, heads, D]
  float* context = ws.context.reserve({rows, H});           // [B, T, heads, D]
  float* sum = ws.sum.reserve({rows, H});                   // [B·T, H] pre-norm sums
  float* intermediate = ws.intermediate.reserve({rows, I}); // [B·T, I]

  const float* key_mask = nullptr;  // additive [B, T]
  if (attention_mask) {
    float* m = ws.key_mask.reserve({rows});
    const float neg_inf = -std::numeric_limits<float>::infinity();
    bool any_masked = false;
    for (long r = 0; r < rows; ++r) {
      m[r] = attention_mask[r] ? 0.0f : neg_inf;
      any_masked = any_masked || !attention_mask[r];
    }
    if (any_masked) key_mask = m;
  }

  embed(input_ids, token_type_ids, batch, seq_len, h);
  SelfAttentionShape shape{batch, seq_len, heads, H / heads};
  const float scale = 1.0f / std::sqrt(static_cast<float>(H / heads));
  for (const Layer& layer : layers_) {
    layer.qkv.apply(h, rows, H, qkv, 3 * H);
    self_attention_fused_qkv(shape, qkv, key_mask, scale, /*causal=*/false, context);
    layer.output_proj.apply(context, rows, H, sum, H, Activation::kNone, h, H);
    apply_layer_norm(layer.attention_norm, sum, h, rows, H);
    layer.intermediate.apply(h, rows, H, intermediate, I, config_.activation);
    layer.output.apply(intermediate, rows, I, sum, H, Activation::kNone, h, H);
    apply_layer_norm(layer.output_norm, sum, h, rows, H);
  }

  if (pooled) {
    // The [CLS] rows are every seq_len-th row of h: a strided GEMM input, no gather.
    pooler_.apply(h, batch, seq_len * H, pooled, H);
    for (long i = 0; i < batch * H; ++i) pooled[i] = std::tanh(pooled[i]);
  }
}

}  // namespace cpuformer
