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

#include "layers/embedding_table.h"
#include "layers/kv_cache.h"
#include "layers/norm.h"
#include "layers/transformer_block.h"
#include "models/generation.h"
#include "models/kept_memory.h"
#include "models/model_tensors.h"
#include "models/transformer_config.h"

namespace cpuformer {

class Seq2SeqSession;

class Seq2SeqModel {
 public:
  // The tables in `tensors` are read by pointer (the binding keeps them alive); the head is packed here.
  Seq2SeqModel(const TransformerConfig& config, const GlobalTensors& tensors);
  void add_encoder_layer(const BlockTensors& layer);
  void add_decoder_layer(const BlockTensors& layer);

  const TransformerConfig& config() const { return config_; }
  bool complete() const;
  long inner_dim() const { return config_.q_width(); }

  // Inputs validated by the caller (ids in range, lengths within max_positions, mask 0/1 with
  // every row starting with a token: sources are right-padded). mask may be null (all ones).
  // src [B, Ts] → out [B, Ts, d].
  void encode(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* out) const;
  // Teacher-forced decoder logits: src [B, Ts], tgt [B, Tt] → out [B, Tt, V].
  void logits(const int64_t* src, const int64_t* src_mask, long batch, long src_len, const int64_t* tgt, long tgt_len,
              float* out) const;

  // Bytes of the memory kept for the next generation run, encode() or logits() call
  // (models/kept_memory.h).
  std::size_t kept_memory_bytes() const { return kept_.bytes(); }

 private:
  friend class Seq2SeqSession;
  struct Workspace {
    BlockWorkspace block;
    ScratchBuffer h, x, bias, key_mask;
    ScratchBuffer packed;      // [tokens, d]: the encoder's unpadded rows (padding removal)
    UnpaddedLayout unpadded;   // their entries and rows
  };
  // The encoder output's cross-attention keys/values and key mask for one run.
  struct CrossState {
    long sources = 0, src_len = 0;
    std::vector<float> kv;          // [decoder_layers][sources·Ts, 2·inner]: per token k heads | v heads
    std::vector<float> key_mask;    // [sources, Ts] additive; empty when nothing is padded
  };
  // The memory of a generation run or a logits() call, kept for the next (models/kept_memory.h).
  struct RunMemory {
    KvCache cache;
    CrossState cross;
    Workspace ws;
    std::vector<float> encoded;  // [sources, Ts, hidden]: the encoder output
    std::size_t capacity_bytes() const {
      return cache.capacity_bytes() + ws.block.capacity_bytes() +
             (ws.h.capacity() + ws.x.capacity() + ws.bias.capacity() + ws.key_mask.capacity() + ws.packed.capacity() +
              cross.kv.capacity() + cross.key_mask.capacity() + encoded.capacity()) *
                 sizeof(float) +
             (ws.unpadded.entries.capacity() * sizeof(RaggedEntry) + ws.unpadded.token_row.capacity() * sizeof(long));
    }
  };
  struct Stack {
    const float* positions = nullptr;   // [offset + P, d] (position tables)
    std::vector<float> relative_bias;   // [num_buckets, heads] (relative positions)
    NormWeights embedding_norm, final_norm;
    std::vector<TransformerBlock> layers;
  };

  void embed(const int64_t* ids, const Stack& stack, long rows, long len, long start, float* h) const;
  void run_encoder(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* h,
                   Workspace& ws) const;
  void prepare_cross(const float* encoded, const int64_t* src_mask, long sources, long src_len,
                     CrossState& cross) const;
  // `t_new` tokens per row (ids [rows, t_new]) at positions [cache.length(), + t_new), rows in
  // groups of `copies` per source. logits of each row's last position [rows, V] or of every
  // position [rows, t_new, V].
  void run_decoder(KvCache& cache, const CrossState& cross, long copies, const int64_t* ids, long rows, long t_new,
                   bool all_positions, float* logits, Workspace& ws) const;

  TransformerConfig config_;
  EmbeddingTable word_embeddings_;
  Stack encoder_, decoder_;
  Linear lm_head_;
  KeptMemory<RunMemory> kept_;
};

// One generation run: the encoder output's cross keys/values and the decoder's self-attention
// KV cache. The decoder of every row starts from decoder_start_token_id.
class Seq2SeqSession : public StepModel {
 public:
  // kv_type: the element type of the decoder's self-attention cache.
  Seq2SeqSession(const Seq2SeqModel& model, int64_t decoder_start_token_id, KvType kv_type = KvType::kFloat32)
      : model_(model),
        start_token_(decoder_start_token_id),
        kv_type_(kv_type),
        memory_(model.kept_),
        cache_(memory_->cache),
        cross_(memory_->cross),
        ws_(memory_->ws) {}
  long vocab_size() const override { return model_.config_.vocab_size; }
  // ids/mask: the sources, left-padded by the loop; re-packed right-padded for the encoder.
  void reserve(long rows, long T, long max_new) override;
  void prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
               float* logits) override;
  void step(const int64_t* tokens, float* logits) override;
  void reorder(const long* source) override { cache_.reorder(source); }
  bool can_extend() const override { return true; }
  void extend(const int64_t* tokens, long count, float* logits) override;
  void rollback(long count) override;

 private:
  const Seq2SeqModel& model_;
  int64_t start_token_;
  KvType kv_type_;
  long copies_ = 1;
  BorrowedMemory<Seq2SeqModel::RunMemory> memory_;  // the model's kept memory, or new
  KvCache& cache_;
  Seq2SeqModel::CrossState& cross_;
  Seq2SeqModel::Workspace& ws_;
};

}  // namespace cpuformer
