// BERT-family encoder graph (BERT, RoBERTa, XLM-RoBERTa, DistilBERT): post-LN transformer layers.
//
//   h = LN(word[ids] + position[pos] + token_type[tt])                      h: [B·T, H]
//   per layer:
//     qkv = h · Wqkvᵀ + bqkv                                                [B, T, 3, H/D heads, D]
//     ctx = attention(q, k, v, key-padding mask)                            [B, T, heads, D]
//     h   = LN(ctx · Woᵀ + bo + h)        residual in the GEMM epilogue
//     f   = act(h · W1ᵀ + b1)             activation in the GEMM epilogue   [B·T, I]
//     h   = LN(f · W2ᵀ + b2 + h)
//   pooler (BERT checkpoints that have one): tanh(h[:, 0] · Wpᵀ + bp)       [B, H]
//
// Projection weights and norms are packed/copied at construction. The embedding tables are NOT
// copied: the model keeps raw pointers to them, and whoever builds the model (the Python binding)
// must keep those arrays alive for the model's whole life.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/activation/activation.h"
#include "models/linear.h"
#include "models/workspace.h"

namespace cpuformer {

enum class PositionIds : int {
  kArange = 0,          // BERT, DistilBERT: position = t
  kPaddingCumsum = 1,   // RoBERTa, XLM-R: pad + running count of non-pad tokens; pad tokens get pad
};

struct EncoderConfig {
  long vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, intermediate_size = 0;
  long max_positions = 0;    // rows of the position table
  long type_vocab_size = 0;  // 0: the model has no token-type table (DistilBERT)
  long pad_token_id = 0;
  PositionIds position_ids = PositionIds::kArange;
  float layer_norm_eps = 1e-12f;
  Activation activation = Activation::kGeluErf;
  // Storage of every projection weight (q/k/v/out/intermediate/output/pooler); embeddings, norms
  // and biases stay float32 (docs/precision.md, "Which tensors are quantized").
  WeightType weight_type = WeightType::kFloat32;

  // Longest sequence the position table covers (RoBERTa reserves the first pad+1 rows).
  long max_seq_len() const {
    return position_ids == PositionIds::kArange ? max_positions : max_positions - pad_token_id - 1;
  }
};

// Borrowed tensors (row-major, PyTorch layout) the model is built from: float32, except that the
// projection weights may already be stored in config.weight_type (WeightRef).
struct EncoderLayerTensors {
  WeightRef q_weight, k_weight, v_weight, out_weight;                       // [H, H]
  const float *q_bias, *k_bias, *v_bias, *out_bias;                         // [H]
  const float *attention_norm_weight, *attention_norm_bias;                 // [H]
  WeightRef intermediate_weight;                                            // [I, H]
  const float* intermediate_bias;                                           // [I]
  WeightRef output_weight;                                                  // [H, I]
  const float* output_bias;                                                 // [H]
  const float *output_norm_weight, *output_norm_bias;                       // [H]
};

struct EmbeddingTensors {
  const float* word_embeddings = nullptr;        // [V, H]   kept by pointer
  const float* position_embeddings = nullptr;    // [P, H]   kept by pointer
  const float* token_type_embeddings = nullptr;  // [TV, H]  kept by pointer; null if TV == 0
  const float* norm_weight = nullptr;            // [H]
  const float* norm_bias = nullptr;              // [H]
};

// Built in steps (embeddings, then one layer at a time, then the optional pooler) so the loader
// can drop each layer's source pages as soon as it is packed: peak memory stays near one copy of
// the weights.
class EncoderModel {
 public:
  EncoderModel(const EncoderConfig& config, const EmbeddingTensors& embeddings);
  void add_layer(const EncoderLayerTensors& layer);
  void set_pooler(WeightRef weight, const float* bias);  // [H, H], [H]

  const EncoderConfig& config() const { return config_; }
  bool complete() const { return static_cast<long>(layers_.size()) == config_.num_layers; }
  long num_layers_added() const { return static_cast<long>(layers_.size()); }
  bool has_pooler() const { return has_pooler_; }

  // input_ids, attention_mask, token_type_ids: [B, T] row-major; mask and token types may be null
  // (all ones / all zeros). Inputs must already be validated (ids in range, T ≤ max_seq_len(),
  // mask entries 0/1). out: [B, T, H]; pooled: [B, H] or null (requires has_pooler()).
  // Requires complete(). Thread-safe: concurrent calls use separate scratch space.
  void forward(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids, long batch,
               long seq_len, float* out, float* pooled) const;

 private:
  struct Layer {
    Linear qkv;           // [3H, H]
    Linear output_proj;   // [H, H]
    NormWeights attention_norm;
    Linear intermediate;  // [I, H]
    Linear output;        // [H, I]
    NormWeights output_norm;
  };
  struct Workspace {
    ScratchBuffer qkv, context, sum, intermediate, key_mask;
  };

  void embed(const int64_t* input_ids, const int64_t* token_type_ids, long batch, long seq_len, float* h) const;
  void run(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids, long batch,
           long seq_len, float* out, float* pooled, Workspace& ws) const;

  EncoderConfig config_;
  const float* word_embeddings_;
  const float* position_embeddings_;
  const float* token_type_embeddings_;
  NormWeights embedding_norm_;
  std::vector<Layer> layers_;
  bool has_pooler_ = false;
  Linear pooler_;

  mutable std::mutex workspace_mutex_;
  mutable Workspace workspace_;  // used by whichever call holds workspace_mutex_
};

}  // namespace cpuformer
