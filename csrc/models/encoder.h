// Encoder graph (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, and any encoder the registry declares):
//
//   e = word[ids] + position[pos] (+ token_type[types]) → embedding norm          e: [B·T, E]
//   h = e, or embed.project(e) when the tables are narrower (E < hidden: ELECTRA)    h: [B·T, hidden]
//   per layer: a TransformerBlock (self-attention over the unpadded keys, plus the relative
//   position bias [heads, T, T] when config.relative_bias (MPNet); feed-forward)
//   (final norm); pooler (BERT): tanh(W · h[:, 0] + b)
//
// Positions are t (arange) or RoBERTa's pad + running count of non-pad tokens: rows of a
// position table, or rotary angles of q and k (RoPE, no table; positions t). With a
// sliding_window, a layer attends to the keys within sliding_window - 1 positions on both sides;
// global_attention_every makes every n-th layer attend to all keys, with its own RoPE
// frequencies (ModernBERT: rope.inv_freq for the global layers, rope.local_inv_freq for the others).
// An encoder without a position table (Positions::kNone) adds none. DeBERTa's disentangled
// attention (layers/disentangled_attention.h) and XLNet's Transformer-XL attention
// (layers/relative_attention_xl.h, with its optional memory of earlier hidden states) run through
// the block's attention hook.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "layers/disentangled_attention.h"
#include "layers/embedding_table.h"
#include "layers/norm.h"
#include "layers/relative_attention_xl.h"
#include "layers/transformer_block.h"
#include "models/model_tensors.h"
#include "models/transformer_config.h"

namespace cpuformer {

// Transformer-XL memory (config.transformer_xl_attention): per layer, `length` earlier hidden
// states per sequence that the layer's keys and values extend over, and where each layer's input
// hidden states (what transformers' cache_mem keeps) are written for the next call.
struct EncoderMemory {
  const float* const* layers = nullptr;  // [num_layers] pointers to [batch, length, hidden], or null (length 0)
  long length = 0;
  float* layer_inputs = nullptr;  // [num_layers, batch, seq_len, hidden], or null
};

class EncoderModel {
 public:
  // The tables in `tensors` are read by pointer (the binding keeps them alive); the rest is copied.
  EncoderModel(const TransformerConfig& config, const GlobalTensors& tensors);
  void add_layer(const BlockTensors& layer);

  const TransformerConfig& config() const { return config_; }
  bool complete() const { return static_cast<long>(layers_.size()) == config_.distinct_layers(); }
  long num_layers_added() const { return static_cast<long>(layers_.size()); }
  bool has_pooler() const { return has_pooler_; }

  // ids, mask, types [batch, seq_len] (mask, types may be null) → out [batch, seq_len, hidden],
  // pooled [batch, hidden] when not null. memory: Transformer-XL attention only (null: none).
  // skip_padding: the padded rows of out are zero and, where the layout allows (each sequence's
  // unpadded tokens contiguous, row 0 unpadded when pooled, no relative / disentangled /
  // Transformer-XL attention), never computed: the layers run on the unpadded tokens only. The
  // unpadded rows and pooled are what the padded computation gives (float32 rounding aside).
  // first_only: only row 0 of each sequence of out is computed (the others are zero): the last
  // layer carries on the first tokens alone, its keys and values still from every token (for heads
  // and poolings that read the first token only; DeBERTa's disentangled and Transformer-XL
  // attention compute every row, then zero the others). pick [batch] (not null): the same for row
  // pick[b] of sequence b instead of row 0 (0 ≤ pick[b] < seq_len; CLIP's end-of-text token, the
  // last token).
  void forward(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids, long batch,
               long seq_len, float* out, float* pooled, const EncoderMemory* memory = nullptr,
               bool skip_padding = false, bool first_only = false, const long* pick = nullptr) const;

  // Bytes of the scratch space kept for the next call (models/kept_memory.h).
  std::size_t kept_memory_bytes() const {
    std::lock_guard<std::mutex> lock(workspace_mutex_);
    return workspace_.capacity_bytes();
  }

  // The stack on given input embeddings [batch, seq_len, embedding_width()] (hidden_size unless the
  // config has a narrower embedding_size) instead of token ids: no word, position or token type
  // embedding is added, the rest runs as in forward (embedding norm when configured, embed.project,
  // the layers with their RoPE or relative bias, final norm, pooler). attention_mask [batch,
  // seq_len] (null: every position is attended). Not for Transformer-XL attention. Vision
  // transformers (ViT, CLIP's vision tower) enter here with their patch embeddings.
  void forward_embeddings(const float* embeddings, const int64_t* attention_mask, long batch, long seq_len, float* out,
                          float* pooled, bool skip_padding = false, bool first_only = false) const;

 private:
  struct Workspace {
    BlockWorkspace block;
    ScratchBuffer key_mask;
    ScratchBuffer embeddings;        // [B·T, E] before embed.project
    ScratchBuffer relative_bias;     // [B or 1, heads, T, T] (relative_bias)
    ScratchBuffer rope, local_rope;  // cos | sin [B·T, head_dim]
    DisentangledWorkspace disentangled;
    ScratchBuffer sinusoids;  // [K + T - 1, hidden] (Transformer-XL)
    RelativeAttentionXLWorkspace relative_xl;
    ScratchBuffer packed;                           // [tokens, hidden]: the unpadded rows (skip_padding)
    ScratchBuffer packed_rope, packed_local_rope;  // cos | sin [tokens, head_dim] of those rows
    UnpaddedLayout unpadded;                       // the unpadded tokens' entries and rows
    ScratchBuffer picked;                          // [batch, hidden]: the last layer's picked rows
    std::vector<long> pick_at;                     // each sequence's picked position for the block
    std::size_t capacity_bytes() const {
      return block.capacity_bytes() + disentangled.capacity_bytes() + relative_xl.capacity_bytes() +
             (key_mask.capacity() + embeddings.capacity() + relative_bias.capacity() + rope.capacity() +
              local_rope.capacity() + sinusoids.capacity() + packed.capacity() + packed_rope.capacity() +
              packed_local_rope.capacity() + picked.capacity()) *
                 sizeof(float) +
             unpadded.entries.capacity() * sizeof(RaggedEntry) +
             (unpadded.token_row.capacity() + pick_at.capacity()) * sizeof(long);
    }
  };

  // Fills ws.unpadded from the mask and says whether the layers can run on the unpadded tokens
  // alone (see forward). first_rows: the pooler reads each row 0.
  bool unpadded_layout(const int64_t* attention_mask, long batch, long seq_len, bool first_rows, Workspace& ws) const;

  // cos | sin [batch, seq_len, head_dim] of positions t with `inv_freq`, into `buffer`.
  const float* rope_table(const std::vector<float>& inv_freq, long batch, long seq_len, ScratchBuffer& buffer) const;
  void embed(const int64_t* input_ids, const int64_t* token_type_ids, long batch, long seq_len, float* h,
             Workspace& ws) const;
  // embeddings (not null): the input embeddings instead of input_ids' (forward_embeddings).
  void run(const int64_t* input_ids, const float* embeddings, const int64_t* attention_mask,
           const int64_t* token_type_ids, long batch, long seq_len, float* out, float* pooled,
           const EncoderMemory* memory, bool skip_padding, bool first_only, const long* pick, Workspace& ws) const;

  TransformerConfig config_;
  EmbeddingTable word_embeddings_;
  const float* position_embeddings_;
  const float* token_type_embeddings_;
  std::vector<float> rope_inv_freq_, rope_local_inv_freq_;  // [head_dim / 2] (RoPE; local: windowed layers)
  NormWeights embedding_norm_, final_norm_;
  bool has_embed_project_ = false;
  Linear embed_project_;              // [hidden, E] (has_embed_project_)
  std::vector<float> relative_bias_;  // [num_buckets, heads] (config.relative_bias)
  std::vector<TransformerBlock> layers_;
  std::vector<float> relative_embeddings_;                // normed [2·span, hidden], until the last layer
  std::vector<DisentangledAttention> disentangled_;  // per layer (disentangled attention)
  std::vector<RelativeAttentionXL> relative_xl_;     // per layer (Transformer-XL attention)
  bool has_pooler_ = false;
  Linear pooler_;

  // The shared workspace, kept for the next call up to kept_memory_limit() bytes
  // (models/kept_memory.h), freed after a call that grew it beyond.
  void keep_or_free(Workspace& ws) const;
  mutable std::mutex workspace_mutex_;
  mutable Workspace workspace_;  // used by whichever call holds workspace_mutex_
};

}  // namespace cpuformer
