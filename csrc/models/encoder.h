// Encoder graph (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, and any encoder the registry declares):
//
//   h = word[ids] + position[pos] (+ token_type[types]) → embedding norm          h: [B·T, hidden]
//   per layer: a TransformerBlock (self-attention over the unpadded keys, feed-forward); DeBERTa's
//   disentangled attention (layers/disentangled_attention.h) through the block's attention hook
//   (final norm); pooler (BERT): tanh(W · h[:, 0] + b)
//
// Positions are t (arange) or RoBERTa's pad + running count of non-pad tokens; an encoder without
// a position table (Positions::kNone) adds none.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "layers/disentangled_attention.h"
#include "layers/norm.h"
#include "layers/transformer_block.h"
#include "models/model_tensors.h"
#include "models/transformer_config.h"

namespace cpuformer {

class EncoderModel {
 public:
  // The tables in `tensors` are read by pointer (the binding keeps them alive); the rest is copied.
  EncoderModel(const TransformerConfig& config, const GlobalTensors& tensors);
  void add_layer(const BlockTensors& layer);

  const TransformerConfig& config() const { return config_; }
  bool complete() const { return static_cast<long>(layers_.size()) == config_.num_layers; }
  long num_layers_added() const { return static_cast<long>(layers_.size()); }
  bool has_pooler() const { return has_pooler_; }

  // ids, mask, types [batch, seq_len] (mask, types may be null) → out [batch, seq_len, hidden],
  // pooled [batch, hidden] when not null.
  void forward(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids, long batch,
               long seq_len, float* out, float* pooled) const;

 private:
  struct Workspace {
    BlockWorkspace block;
    ScratchBuffer key_mask;
    DisentangledWorkspace disentangled;
  };

  void embed(const int64_t* input_ids, const int64_t* token_type_ids, long batch, long seq_len, float* h) const;
  void run(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids, long batch,
           long seq_len, float* out, float* pooled, Workspace& ws) const;

  TransformerConfig config_;
  const float* word_embeddings_;
  const float* position_embeddings_;
  const float* token_type_embeddings_;
  NormWeights embedding_norm_, final_norm_;
  std::vector<TransformerBlock> layers_;
  std::vector<float> relative_embeddings_;                // normed [2·span, hidden], until the last layer
  std::vector<DisentangledAttention> disentangled_;  // per layer (disentangled attention)
  bool has_pooler_ = false;
  Linear pooler_;

  mutable std::mutex workspace_mutex_;
  mutable Workspace workspace_;  // used by whichever call holds workspace_mutex_
};

}  // namespace cpuformer
