// Encoder-decoder (seq2seq) graph: Marian, BART, mBART, T5 / mT5 / flan-T5.
//
//   encoder:  h = word[src]·embed_scale (+ enc_pos[t + offset]); (LN_emb(h))         h: [B·Ts, d]
//             per layer: h = attn_block(h, self-attention over the source, key-padding mask
//                        (+ T5 bidirectional relative bias)); h = ffn_block(h)
//             (final norm: mBART, T5)
//   decoder:  h = word[tgt]·embed_scale (+ dec_pos[t + offset]); (LN_emb(h))        h: [rows·Tt, d]
//             per layer: self-attention over the KV cache (causal, + T5 causal relative bias),
//                        cross-attention over the encoder output, ffn
//             (final norm); logits = (h·head_scale)·Wlmᵀ + final_logits_bias
//   a block:  post-norm (Marian, BART):  h = norm(h + f(h))
//             pre-norm (mBART, T5):      h = h + f(norm(h))
//   ffn:      down(act(up(x)))  or gated (T5 v1.1): down(act(gate(x)) ⊙ up(x))
//
// Attention scale is 1/√D except T5 (1: its init absorbs it). Norms are LayerNorm with bias, or
// RMSNorm without mean (T5). Cross-attention keys/values are projected once per source and
// layer when a run starts; during generation the beams of one source attend to the same cross
// keys as consecutive queries of one attention batch entry (no copies per beam).
//
// Weights are packed/copied at construction except the shared word embeddings and the position
// tables, which are read by pointer: whoever builds the model (the Python binding) keeps those
// arrays alive.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/activation/activation.h"
#include "models/generation.h"
#include "models/kv_cache.h"
#include "models/linear.h"
#include "models/workspace.h"

namespace cpuformer {

struct Seq2SeqConfig {
  long vocab_size = 0, d_model = 0, encoder_layers = 0, decoder_layers = 0, heads = 0, head_dim = 0, ffn_dim = 0;
  long max_positions = 0;    // longest source / target a position table covers; 0: no limit (T5)
  long position_offset = 0;  // BART / mBART learned positions start at row 2
  bool position_table = false;       // Marian (sinusoidal), BART (learned): a table per stack
  bool relative_attention = false;   // T5: bucketed relative position bias from layer 0's table
  long num_buckets = 32, max_distance = 128;
  bool rms_norm = false;
  float norm_eps = 1e-5f;
  bool pre_norm = false;
  bool embedding_norm = false;  // BART / mBART layernorm_embedding
  bool final_norm = false;      // mBART layer_norm, T5 final_layer_norm (both stacks)
  float embed_scale = 1.0f;     // √d_model with scale_embedding
  float attention_scale = 1.0f;
  Activation activation = Activation::kRelu;
  bool gated_ffn = false;
  float head_scale = 1.0f;      // T5 with a tied head: d_model^-0.5
  // Storage of every projection weight and of the LM head (tied or not); embeddings, norms, biases
  // and the relative-position bias stay float32 (docs/precision.md, "Which tensors are quantized").
  WeightType weight_type = WeightType::kFloat32;
};

// Borrowed float32 tensors, PyTorch layout; biases may be null (T5 has none). Projection weights
// may already be stored in config.weight_type (WeightRef).
struct Seq2SeqLayerTensors {
  // [heads·D, d] ×3, out [d, heads·D]
  WeightRef q_weight, k_weight;
  const float *q_bias = nullptr, *k_bias = nullptr;
  WeightRef v_weight, o_weight;
  const float *v_bias = nullptr, *o_bias = nullptr;
  const float *self_norm_weight = nullptr, *self_norm_bias = nullptr;  // [d]
  // decoder layers only: cross-attention over the encoder output
  WeightRef cross_q_weight, cross_k_weight;
  const float *cross_q_bias = nullptr, *cross_k_bias = nullptr;
  WeightRef cross_v_weight, cross_o_weight;
  const float *cross_v_bias = nullptr, *cross_o_bias = nullptr;
  const float *cross_norm_weight = nullptr, *cross_norm_bias = nullptr;
  // up [F, d] (+ bias), gate [F, d] (gated), down [d, F] (+ bias)
  WeightRef up_weight, gate_weight;
  const float *up_bias = nullptr;
  WeightRef down_weight;
  const float *down_bias = nullptr;
  const float *ffn_norm_weight = nullptr, *ffn_norm_bias = nullptr;
};

struct Seq2SeqEmbeddingTensors {
  const float* word_embeddings = nullptr;         // [V, d]  kept by pointer (shared by both stacks)
  const float* encoder_positions = nullptr;       // [offset + P, d] kept by pointer (position_table)
  const float* decoder_positions = nullptr;       // [offset + P, d] kept by pointer (position_table)
  const float* encoder_relative_bias = nullptr;   // [num_buckets, heads] copied (relative_attention)
  const float* decoder_relative_bias = nullptr;   // [num_buckets, heads] copied (relative_attention)
  const float *encoder_norm_weight = nullptr, *encoder_norm_bias = nullptr;  // [d] (embedding_norm)
  const float *decoder_norm_weight = nullptr, *decoder_norm_bias = nullptr;  // [d] (embedding_norm)
};

struct Seq2SeqHeadTensors {
  const float *encoder_norm_weight = nullptr, *encoder_norm_bias = nullptr;  // [d] (final_norm)
  const float *decoder_norm_weight = nullptr, *decoder_norm_bias = nullptr;  // [d] (final_norm)
  WeightRef lm_head;                         // [V, d], null: tied to the word embeddings
  const float* final_logits_bias = nullptr;  // [V] or null
};

class Seq2SeqSession;

class Seq2SeqModel {
 public:
  Seq2SeqModel(const Seq2SeqConfig& config, const Seq2SeqEmbeddingTensors& embeddings);
  void add_encoder_layer(const Seq2SeqLayerTensors& layer);
  void add_decoder_layer(const Seq2SeqLayerTensors& layer);
  void set_head(const Seq2SeqHeadTensors& head);

  const Seq2SeqConfig& config() const { return config_; }
  bool complete() const;
  long inner_dim() const { return config_.heads * config_.head_dim; }

  // Inputs validated by the caller (ids in range, lengths within max_positions, mask 0/1 with
  // every row starting with a token: sources are right-padded). mask may be null (all ones).
  // src [B, Ts] → out [B, Ts, d].
  void encode(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* out) const;
  // Teacher-forced decoder logits: src [B, Ts], tgt [B, Tt] → out [B, Tt, V].
  void logits(const int64_t* src, const int64_t* src_mask, long batch, long src_len, const int64_t* tgt,
              long tgt_len, float* out) const;

 private:
  friend class Seq2SeqSession;
  struct Layer {
    Linear qkv, out;                     // self-attention: [3·inner, d], [d, inner]
    Linear cross_q, cross_kv, cross_out; // [inner, d], [2·inner, d], [d, inner]
    Linear up, down;                     // up: [F, d] or [gate | up] = [2F, d]; down [d, F]
    NormWeights self_norm, cross_norm, ffn_norm;
  };
  struct Workspace {
    ScratchBuffer h, x, sum, qkv, q, context, ffn, bias, key_mask;
  };
  // The encoder output's cross-attention keys/values and key mask for one run.
  struct CrossState {
    long sources = 0, src_len = 0;
    std::vector<float> kv;          // [decoder_layers][sources·Ts, 2·inner]: per token k heads | v heads
    std::vector<float> key_mask;    // [sources, Ts] additive; empty when nothing is padded
  };

  Layer make_layer(const Seq2SeqLayerTensors& t, bool decoder) const;
  void embed(const int64_t* ids, const float* positions, const NormWeights& norm, long rows, long len, long start,
             float* h) const;
  void norm(const NormWeights& weights, const float* x, float* y, long rows) const;
  // h += f(norm(h)) (pre-norm) or h = norm(h + f(h)) (post-norm), with f's output projection
  // applied here; `inner` is what f computed from x (the context), [rows, out.in_features()].
  void residual_out(const Linear& out, const NormWeights& weights, const float* inner, float* h, long rows,
                    Workspace& ws) const;
  // Where a block's input comes from: norm(h) (pre-norm) or h itself.
  const float* block_input(const NormWeights& weights, const float* h, float* x, long rows) const;
  void ffn_block(const Layer& layer, float* h, long rows, Workspace& ws) const;
  void run_encoder(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* h,
                   Workspace& ws) const;
  void prepare_cross(const float* encoded, const int64_t* src_mask, long sources, long src_len,
                     CrossState& cross) const;
  // `t_new` tokens per row (ids [rows, t_new]) at positions [cache.length(), + t_new), rows in
  // groups of `copies` per source. logits of each row's last position [rows, V] or of every
  // position [rows, t_new, V].
  void run_decoder(KvCache& cache, const CrossState& cross, long copies, const int64_t* ids, long rows, long t_new,
                   bool all_positions, float* logits, Workspace& ws) const;

  Seq2SeqConfig config_;
  const float* word_embeddings_;
  const float* encoder_positions_;
  const float* decoder_positions_;
  std::vector<float> encoder_relative_bias_, decoder_relative_bias_;  // [num_buckets, heads]
  NormWeights encoder_embedding_norm_, decoder_embedding_norm_, encoder_final_norm_, decoder_final_norm_;
  std::vector<Layer> encoder_layers_, decoder_layers_;
  Linear lm_head_;
  bool has_head_ = false;
};

// One generation run: the encoder output's cross keys/values and the decoder's self-attention
// KV cache. The decoder of every row starts from decoder_start_token_id.
class Seq2SeqSession : public StepModel {
 public:
  Seq2SeqSession(const Seq2SeqModel& model, int64_t decoder_start_token_id)
      : model_(model), start_token_(decoder_start_token_id) {}
  long vocab_size() const override { return model_.config_.vocab_size; }
  // ids/mask: the sources, left-padded by the loop; re-packed right-padded for the encoder.
  void reserve(long rows, long T, long max_new) override;
  void prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
               float* logits) override;
  void step(const int64_t* tokens, float* logits) override;
  void reorder(const long* source) override { cache_.reorder(source); }

 private:
  const Seq2SeqModel& model_;
  int64_t start_token_;
  long copies_ = 1;
  KvCache cache_;
  Seq2SeqModel::CrossState cross_;
  Seq2SeqModel::Workspace ws_;
};

}  // namespace cpuformer
