// Transformer-XL relative attention, as XLNet runs it (transformers' XLNetRelativeAttention with
// attn_type "bi": every query sees every key).
//
// Queries are the q_len current tokens of a sequence; keys and values extend over an optional
// memory of M earlier hidden states followed by the current tokens (K = M + q_len keys), so query
// i sits at key position M + i. Per head, with u = r_w_bias, v = r_r_bias, s = r_s_bias:
//
//   score[i, j] = scale · ( (q_i + u)·k_j                        content
//                         + (q_i + v)·P[M + i - j]                position
//                         + (q_i + s)·S[segment differs(i, j)] )  segment (when token types are given)
//
// P[d] = Wr · e(clamp(d)) is the layer's projection (Wr [heads·head_dim, hidden], no bias) of the
// sinusoid e(d) = [sin(d·f_0) … sin(d·f_{n-1}), cos(d·f_0) … cos(d·f_{n-1})], f_k = 1 / 10000^(2k /
// hidden), n = hidden / 2 (transformers' relative_positional_encoding; a clamp > 0 bounds |d|), and
// S [2, heads·head_dim] the segment embeddings (seg_embed): S[1] when the query's token type
// differs from the key's, S[0] otherwise. Memory keys have token type 0. The key padding mask
// removes padded current keys except the query's own position (transformers' non_tgt_mask: a
// padded query still sees itself); memory keys are never masked.
//
// How it runs: the fused attention kernel computes scale·q·k; the rest is an additive bias per
// (head, query, key): u·k_j per key, v·P[d] per distance, the segment term from two dot products
// per query and head, and q_i·P[d] from one GEMM per head of the queries against the window of P
// rows the tile reaches (the rel_shift of transformers becomes an index: column M + i - j).
// Tiles of whole sequences, or for long ones of query blocks of one sequence, keep the scratch
// space near kRelativeAttentionXLScratchFloats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "layers/linear.h"
#include "layers/transformer_block.h"
#include "layers/workspace.h"
#include "models/transformer_config.h"

namespace cpuformer {

// The sinusoids of every relative distance a call needs: row r holds e(clamp(keys - 1 - r)), for
// r in [0, keys + queries - 1) (distances keys - 1 down to -(queries - 1)); clamp ≤ 0: none.
// out [keys + queries - 1, hidden], hidden even.
void relative_sinusoids(long hidden, long keys, long queries, long clamp, float* out);

// What every layer of one call shares, and the layer's memory.
struct RelativeAttentionXLInput {
  const float* sinusoids = nullptr;       // relative_sinusoids(hidden, K, q_len, clamp)
  const int64_t* token_types = nullptr;   // [batch, q_len] or null: no segment term
  const float* key_mask = nullptr;        // additive [batch, q_len] (0 or -inf) or null: no padding
  const float* memory = nullptr;          // this layer's memory [batch, memory_len, hidden], or null
  long memory_len = 0;
  const Linear* qkv = nullptr;            // the layer's fused q | k | v projection (memory keys and values)
};

// Scratch space of the calls of one thread (buffers only grow).
struct RelativeAttentionXLWorkspace {
  ScratchBuffer projected;   // [rows_p, heads·D]: P = Wr · e
  ScratchBuffer positions;   // [heads, rows_p, D]: P per head
  ScratchBuffer position_bias;  // [heads, rows_p]: v·P
  ScratchBuffer keys;        // [batch, K, q|k|v] with memory
  ScratchBuffer content;     // [batch, heads, K]: u·k
  ScratchBuffer segment;     // [batch·q_len, heads, 2]: (q + s)·S[0], (q + s)·S[1]
  ScratchBuffer scores;      // [heads, tile rows, window]: q·P
  ScratchBuffer bias;        // [tile sequences, heads, tile queries, K]
  std::size_t capacity_bytes() const {
    return (projected.capacity() + positions.capacity() + position_bias.capacity() + keys.capacity() +
            content.capacity() + segment.capacity() + scores.capacity() + bias.capacity()) *
           sizeof(float);
  }
};

// One layer's position projection and biases.
class RelativeAttentionXL {
 public:
  RelativeAttentionXL() = default;
  // t.position_k: Wr (packed in c.weight_type); t.content_bias, t.position_bias, t.segment_bias
  // [heads·head_dim] and t.segment_embed [2, heads·head_dim] are copied.
  RelativeAttentionXL(const TransformerConfig& c, const BlockTensors& t);

  // `args` as TransformerBlock::self_attention fills it (q_len == kv_len, the fused projection's
  // layout); its mask is not read (in.key_mask is). Writes args.out.
  void attend(const TransformerConfig& c, const AttentionArgs& args, const RelativeAttentionXLInput& in,
              RelativeAttentionXLWorkspace& ws) const;

 private:
  Linear position_;                   // Wr [heads·D, hidden]
  std::vector<float> content_bias_;   // u [heads·D]
  std::vector<float> position_bias_;  // v [heads·D]
  std::vector<float> segment_bias_;   // s [heads·D]
  std::vector<float> segment_embed_;  // S [2, heads·D]
};

// The hook one layer's self-attention calls (TransformerBlock).
class RelativeAttentionXLCall final : public AttentionHook {
 public:
  RelativeAttentionXLCall(const TransformerConfig& c, const RelativeAttentionXL& layer,
                          const RelativeAttentionXLInput& input, RelativeAttentionXLWorkspace& ws)
      : config_(c), layer_(layer), input_(input), workspace_(ws) {}
  void attend(AttentionArgs& args) override { layer_.attend(config_, args, input_, workspace_); }

 private:
  const TransformerConfig& config_;
  const RelativeAttentionXL& layer_;
  const RelativeAttentionXLInput& input_;
  RelativeAttentionXLWorkspace& workspace_;
};

// Floats of the bias and position scores one tile may use; a single query row may use more.
constexpr long kRelativeAttentionXLScratchFloats = 1L << 23;

}  // namespace cpuformer
