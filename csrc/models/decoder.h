// Decoder-only causal LM graph (GPT-2; Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3), pre-norm layers:
//
//   h = word[ids]·embed_scale (+ position[pos] for learned positions, GPT-2)     h: [N, hidden]
//   per layer:
//     x   = norm1(h)                        LayerNorm (GPT-2) or RMSNorm
//     qkv = x · Wqkvᵀ (+ b)                 one row per token: [q heads | k heads | v heads]
//     q,k = RMSNorm per head (Qwen3); RoPE(q, k, pos) (Llama family)
//     k,v → KV cache at the next slots; ctx = attention(q, cache[:length], causal, window, mask)
//     h   = ctx · Woᵀ (+ bo) + h            residual in the GEMM epilogue
//     x   = norm2(h)
//     h   = W2 · act(W1 · x + b1) + b2 + h  (GPT-2)   or gated: Wd · (act(Wg·x) ⊙ Wu·x) + h (SwiGLU, GeGLU)
//   logits = normf(h) · Wlmᵀ               (tied head: Wlm = word embeddings)
// Positions come from the attention mask like Hugging Face's generate(): cumsum(mask) - 1.
//
// Weights are packed/copied at construction except the embedding tables, which the model reads
// by pointer: whoever builds it (the Python binding) keeps those arrays alive.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/activation/activation.h"
#include "models/generation.h"
#include "models/kv_cache.h"
#include "models/linear.h"
#include "models/workspace.h"

namespace cpuformer {

struct DecoderConfig {
  long vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  long intermediate_size = 0, max_positions = 0;
  bool rms_norm = false;            // RMSNorm (Llama family) instead of LayerNorm with bias (GPT-2)
  float norm_eps = 1e-5f;
  bool learned_positions = false;   // GPT-2: a position table; otherwise RoPE with rope_inv_freq
  std::vector<float> rope_inv_freq; // [head_dim / 2]
  bool gated_ffn = false;           // gate/up/down MLP; otherwise fc → activation → proj
  Activation activation = Activation::kGeluTanh;  // of fc, or of the gate (silu: SwiGLU, gelu_tanh: Gemma)
  float embed_scale = 1.0f;         // Gemma: √hidden_size as float32; 1: the embeddings are not multiplied
  long sliding_window = 0;          // 0: full causal attention
  bool qk_norm = false;             // Qwen3: RMSNorm over each q and k head
  // Storage of every projection weight and of the LM head (tied or not); embeddings and norms
  // stay float32 (docs/precision.md, "Which tensors are quantized").
  WeightType weight_type = WeightType::kFloat32;
};

struct DecoderLayerTensors {
  // [heads·D, hidden], [kv_heads·D, hidden] ×2, biases or null; out [hidden, heads·D]
  WeightRef q_weight, k_weight;
  const float *q_bias = nullptr, *k_bias = nullptr;
  WeightRef v_weight, o_weight;
  const float *v_bias = nullptr, *o_bias = nullptr;
  const float *norm1_weight = nullptr, *norm1_bias = nullptr, *norm2_weight = nullptr, *norm2_bias = nullptr;
  const float *q_norm_weight = nullptr, *k_norm_weight = nullptr;  // [D] (qk_norm)
  // fc / up [I, hidden] (+ bias), gate [I, hidden] (gated_ffn), proj / down [hidden, I] (+ bias)
  WeightRef up_weight, gate_weight;
  const float *up_bias = nullptr;
  WeightRef down_weight;
  const float *down_bias = nullptr;
};

class DecoderSession;

class DecoderModel {
 public:
  // word_embeddings [V, hidden] and position_embeddings [P, hidden] (learned positions only) are
  // kept by pointer.
  DecoderModel(const DecoderConfig& config, const float* word_embeddings, const float* position_embeddings);
  void add_layer(const DecoderLayerTensors& layer);
  // final norm [hidden] (+ bias); lm head [V, hidden], or null for a head tied to the embeddings.
  void set_head(const float* norm_weight, const float* norm_bias, WeightRef lm_head);

  const DecoderConfig& config() const { return config_; }
  bool complete() const { return has_head_ && static_cast<long>(layers_.size()) == config_.num_layers; }
  long num_layers_added() const { return static_cast<long>(layers_.size()); }

  // Logits of every position: ids/mask [B, T] (mask may be null = all ones) → logits [B, T, V].
  void logits(const int64_t* ids, const int64_t* mask, long batch, long seq_len, float* out) const;

 private:
  friend class DecoderSession;
  struct Layer {
    Linear qkv, out, up, down;  // up: fc, or [gate | up] fused for a gated FFN
    NormWeights norm1, norm2;
    std::vector<float> q_norm, k_norm;
  };
  struct Workspace {
    ScratchBuffer h, x, qkv, context, mlp, rope;
  };

  // Runs `t_new` new tokens per row (ids/positions [rows, t_new]) through the layers, writing K/V
  // at cache slots [length, length + t_new) and advancing the length. Logits of the last
  // position of each row [rows, V], or of every position [rows, t_new, V] if all_positions.
  void forward(KvCache& cache, Workspace& ws, const int64_t* ids, const long* positions, long rows, long t_new,
               bool all_positions, float* logits) const;

  DecoderConfig config_;
  const float* word_embeddings_;
  const float* position_embeddings_;
  std::vector<Layer> layers_;
  NormWeights final_norm_;
  Linear lm_head_;
  bool has_head_ = false;
};

// One generation run's state: the KV cache, the key mask and each row's next position.
class DecoderSession : public StepModel {
 public:
  explicit DecoderSession(const DecoderModel& model) : model_(model) {}
  long vocab_size() const override { return model_.config_.vocab_size; }
  void reserve(long rows, long T, long max_new) override;
  void prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
               float* logits) override;
  void step(const int64_t* tokens, float* logits) override;
  void reorder(const long* source) override;

 private:
  const DecoderModel& model_;
  KvCache cache_;
  DecoderModel::Workspace ws_;
  std::vector<long> next_position_;  // [rows]
  std::vector<long> positions_;      // scratch [rows, T]
};

}  // namespace cpuformer
