// DeBERTa's disentangled self-attention (transformers' DisentangledSelfAttention, DeBERTa v2/v3).
//
// Besides content·content, a query attends to keys through the relative position δ(i, j) of the
// key seen from the query, embedded in a learned table R [2·span, hidden] (LayerNormed when
// relative_embedding_norm). With Pq = R·Wqᵀ + bq and Pk = R·Wkᵀ + bk (the layer's own query and
// key projections when share_attention_key, else separate position projections), per head:
//
//   score[i, j] = scale · (q_i·k_j + q_i·Pk[δ(i, j)] + k_j·Pq[δ(i, j)])
//                          content   content→position  position→content
//   δ(i, j) = clamp(span + bucket(i - j), 0, 2·span - 1),  scale = 1 / √(head_dim · (1 + terms))
//
// where terms counts the position terms the config enables (pos_att_type: c2p, p2c) and
// bucket() is make_log_bucket_position (below) or the identity without position buckets.
// transformers gathers p2c at clamp(span - bucket(j - i)), the same index because the buckets are
// odd in the relative position.
//
// Pq and Pk depend only on the weights: they are computed once at load, per head
// ([heads, 2·span, head_dim]). Per call, the two position terms are two GEMMs per head over the
// window of table rows the sequence length can reach ([tokens, window]); a gather by δ turns them
// into an additive [heads, T, T] bias per sequence (with the caller's key mask folded in), and the
// fused attention kernel runs with that bias as its mask. Sequences are processed in chunks so the
// scratch space stays near kDisentangledScratchFloats.
#pragma once

#include <cstddef>
#include <vector>

#include "layers/transformer_block.h"
#include "layers/workspace.h"
#include "models/transformer_config.h"

namespace cpuformer {

// transformers' make_log_bucket_position for one relative position: distances up to
// position_buckets / 2 keep their value, longer ones share logarithmically wider buckets up to
// max_position, computed in float32 as transformers does:
//   sign(r) · (ceil(log(|r| / mid) / log((max_position - 1) / mid) · (mid - 1)) + mid),  mid = buckets / 2
// The identity when position_buckets ≤ 0.
long disentangled_relative_position(long relative, long position_buckets, long max_position);

// Scratch space of the calls of one thread (buffers only grow).
struct DisentangledWorkspace {
  ScratchBuffer content_to_position, position_to_content, bias;  // [heads, rows, window] ×2, [seqs, heads, T, T]
  std::vector<long> index;                                       // δ per i - j + T - 1
  std::size_t capacity_bytes() const {
    return (content_to_position.capacity() + position_to_content.capacity() + bias.capacity()) * sizeof(float) +
           index.capacity() * sizeof(long);
  }
};

// The position projections of one layer.
class DisentangledAttention {
 public:
  DisentangledAttention() = default;
  // relative: the (normed) relative embeddings [2·span, hidden]; query / key: the projections of
  // the position→content / content→position terms (weight [heads·head_dim, hidden] + bias), packed
  // in c.weight_type for this computation only.
  DisentangledAttention(const TransformerConfig& c, const float* relative, const LinearTensors& query,
                        const LinearTensors& key);

  // `args` as TransformerBlock::self_attention fills it (q_len == kv_len, the fused projection's
  // layout: q_stride_b == q_len · q_stride_t, the same for k); an existing args.mask (the key
  // padding mask) is added to the bias. Writes args.out.
  void attend(const TransformerConfig& c, const AttentionArgs& args, DisentangledWorkspace& ws) const;

 private:
  long span_ = 0, head_dim_ = 0;
  std::vector<float> position_query_;  // Pq [heads, 2·span, head_dim] (position→content) or empty
  std::vector<float> position_key_;    // Pk [heads, 2·span, head_dim] (content→position) or empty
};

// The hook one layer's self-attention calls (TransformerBlock): a layer's projections, the model's
// config and the call's scratch space.
class DisentangledAttentionCall final : public AttentionHook {
 public:
  DisentangledAttentionCall(const TransformerConfig& c, const DisentangledAttention& layer, DisentangledWorkspace& ws)
      : config_(c), layer_(layer), workspace_(ws) {}
  void attend(AttentionArgs& args) override { layer_.attend(config_, args, workspace_); }

 private:
  const TransformerConfig& config_;
  const DisentangledAttention& layer_;
  DisentangledWorkspace& workspace_;
};

// Bias floats (plus the two position-term buffers) one chunk of sequences may use; a single
// sequence may use more.
constexpr long kDisentangledScratchFloats = 1L << 23;

}  // namespace cpuformer
