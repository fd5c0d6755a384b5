// Decoder-only causal LM graph (GPT-2, the Llama family, and any decoder the registry declares):
//
//   h = word[ids] · embed_scale (+ position[pos] for learned positions)          h: [N, hidden]
//   per layer: a TransformerBlock (causal self-attention over the KV cache with the sliding
//              window, RoPE and q/k norms the config asks for; feed-forward)
//   logits = final_norm(h) · Wlmᵀ              (tied head: Wlm = word embeddings)
// Positions come from the attention mask like Hugging Face's generate(): cumsum(mask) - 1.
#pragma once

#include <cstdint>
#include <vector>

#include "layers/embedding_table.h"
#include "layers/kv_cache.h"
#include "layers/norm.h"
#include "layers/transformer_block.h"
#include "models/generation.h"
#include "models/kept_memory.h"
#include "models/model_tensors.h"
#include "models/transformer_config.h"

namespace cpuformer {

class DecoderSession;

class DecoderModel {
 public:
  // The tables in `tensors` are read by pointer (the binding keeps them alive); the head is packed here.
  DecoderModel(const TransformerConfig& config, const GlobalTensors& tensors);
  void add_layer(const BlockTensors& layer);

  const TransformerConfig& config() const { return config_; }
  bool complete() const { return static_cast<long>(layers_.size()) == config_.num_layers; }
  long num_layers_added() const { return static_cast<long>(layers_.size()); }

  // Logits of every position: ids/mask [B, T] (mask may be null = all ones) → logits [B, T, V].
  void logits(const int64_t* ids, const int64_t* mask, long batch, long seq_len, float* out) const;

  // Bytes of the memory kept for the next generation run or logits() call (models/kept_memory.h).
  std::size_t kept_memory_bytes() const { return kept_.bytes(); }

 private:
  friend class DecoderSession;
  friend class BatchDecoder;
  struct Workspace {
    BlockWorkspace block;
    ScratchBuffer h, x, rope;
    ScratchBuffer last;        // [sequences, hidden]: the last layer's rows of the last tokens
    std::vector<long> picked;  // the positions whose logits a pass returns
  };
  // The memory of a generation run or a logits() call, kept for the next (models/kept_memory.h).
  struct RunMemory {
    KvCache cache;
    Workspace ws;
    std::size_t capacity_bytes() const {
      return cache.capacity_bytes() + ws.block.capacity_bytes() +
             (ws.h.capacity() + ws.x.capacity() + ws.rope.capacity() + ws.last.capacity()) * sizeof(float) +
             ws.picked.capacity() * sizeof(long);
    }
  };

  // h [N, hidden] = the embeddings of ids at positions (RoPE: cos | sin into ws.rope, returned).
  const float* embed(Workspace& ws, const int64_t* ids, const long* positions, long N, float* h) const;
  // final_norm(h[rows[i]]) · head_scale into x [count, hidden] (rows null: h's first count rows),
  // then the LM head into logits [count, V].
  void head(const float* h, const long* rows, long count, Workspace& ws, float* logits) const;
  // The last layer for the last token of each of `sequences` sequences (entries) alone
  // (SelfAttentionInput::picked; `in` as for the other layers): their rows [sequences, hidden].
  float* last_layer_picked(SelfAttentionInput& in, float* h, long sequences, Workspace& ws) const;

  // Runs `t_new` new tokens per row (ids/positions [rows, t_new]) through the layers, writing K/V
  // at cache slots [length, length + t_new) and advancing the length. Logits of the last
  // position of each row [rows, V] (the last layer then runs for those positions alone, its keys
  // and values from every token), or of every position [rows, t_new, V] if all_positions.
  void forward(KvCache& cache, Workspace& ws, const int64_t* ids, const long* positions, long rows, long t_new,
               bool all_positions, float* logits) const;
  // A ragged batch (layers/transformer_block.h, RaggedEntry): the packed tokens ids/positions [N]
  // of entries [E] (token_entry [N]: each token's entry) through the layers; logits [count, V] of
  // the packed tokens logit_tokens [count] (the last token of each entry that needs one, and any
  // others). When every logit token is its entry's last, the last layer runs for those alone.
  void forward_ragged(KvCache& cache, Workspace& ws, const int64_t* ids, const long* positions, long N,
                      const RaggedEntry* entries, long E, const long* token_entry, const long* logit_tokens, long count,
                      float* logits) const;

  TransformerConfig config_;
  EmbeddingTable word_embeddings_;
  const float* position_embeddings_;
  std::vector<float> rope_inv_freq_;  // [head_dim / 2] (RoPE)
  std::vector<TransformerBlock> layers_;
  NormWeights final_norm_;
  Linear lm_head_;
  KeptMemory<RunMemory> kept_;
};

// One generation run's state: the KV cache, the key mask and each row's next position.
class DecoderSession : public StepModel {
 public:
  // kv_type: the element type of the KV cache.
  explicit DecoderSession(const DecoderModel& model, KvType kv_type = KvType::kFloat32)
      : model_(model), kv_type_(kv_type), memory_(model.kept_), cache_(memory_->cache), ws_(memory_->ws) {}
  long vocab_size() const override { return model_.config_.vocab_size; }
  void reserve(long rows, long T, long max_new) override;
  void prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
               float* logits) override;
  void step(const int64_t* tokens, float* logits) override;
  void reorder(const long* source) override;
  bool can_extend() const override { return true; }
  void extend(const int64_t* tokens, long count, float* logits) override;
  void rollback(long count) override;

 private:
  const DecoderModel& model_;
  KvType kv_type_;
  BorrowedMemory<DecoderModel::RunMemory> memory_;  // the model's kept memory, or new
  KvCache& cache_;
  DecoderModel::Workspace& ws_;
  std::vector<long> next_position_;  // [rows]
  std::vector<long> positions_;      // scratch [rows, T]
};

}  // namespace cpuformer
