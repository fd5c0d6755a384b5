// The transformer block every stack of every model is made of.
//
//   self-attention   h = h + o(attn(q, k, v))         pre-norm: q, k, v from attn_norm(h)
//                                                     (from h when the layer has no attn_norm)
//                    h = attn_norm(h + o(attn(...)))  post-norm: q, k, v from h
//   cross-attention  the same with q from h and k, v from the encoder output (seq2seq decoders)
//   feed-forward     down(act(up(x)))  or gated  down(act(gate(x)) ⊙ up(x)),  x = ffn_norm(h) or h
//
// Queries and keys can get a per-head RMSNorm (qk_norm) and rotary positions; keys and values go
// to a KV cache (causal stacks) or are read in place from the fused projection (encoders). The
// output projection adds the residual in the GEMM epilogue. What differs between model kinds
// (embeddings, masks, position biases, the head) stays in the model; the block only needs the
// attention arguments the model fills in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "layers/kv_cache.h"
#include "layers/linear.h"
#include "layers/norm.h"
#include "layers/workspace.h"
#include "models/transformer_config.h"

namespace cpuformer {

// Borrowed tensors of one linear layer: weight [out, in] (float32 or stored in the model's dtype)
// and bias [out] or null.
struct LinearTensors {
  WeightRef weight;
  const float* bias = nullptr;
};

// Borrowed tensors of one norm: weight [n] and bias [n] or null.
struct NormTensors {
  const float* weight = nullptr;
  const float* bias = nullptr;
};

// The canonical weights of one layer (docs/architecture.md): self-attention, optional q/k norms,
// cross-attention (seq2seq decoders), feed-forward. Unused members stay empty.
struct BlockTensors {
  LinearTensors q, k, v, o;
  NormTensors attn_norm;
  const float* q_norm = nullptr;  // [head_dim] (qk_norm)
  const float* k_norm = nullptr;
  LinearTensors cross_q, cross_k, cross_v, cross_o;
  NormTensors cross_norm;
  LinearTensors gate, up, down;  // gate: gated_ffn only
  NormTensors ffn_norm;
  // Disentangled attention without share_attention_key: the relative embeddings' own projections.
  // Transformer-XL attention: position_k is Wr, the projection of the relative sinusoids.
  LinearTensors position_q, position_k;
  // Transformer-XL attention (layers/relative_attention_xl.h): the content, position and segment
  // biases [heads·head_dim] (r_w_bias, r_r_bias, r_s_bias) and the segment embeddings [2, heads·head_dim].
  const float* content_bias = nullptr;
  const float* position_bias = nullptr;
  const float* segment_bias = nullptr;
  const float* segment_embed = nullptr;
  // Where the layer's packed projections may come from (qkv, o, cross_q, cross_kv, cross_o, up,
  // down under "<packed_prefix><name>"); no store: packed here.
  PackedWeightsStore* packed = nullptr;
  std::string packed_prefix;  // "decoder.layers.3."
};

// Runs self-attention in place of the plain fused kernel, for mathematics that needs the projected
// queries and keys before the scores (DeBERTa's disentangled attention adds a bias computed from
// them). `args` is complete as the block would pass it to attention(); the hook may change its
// mask and scale, split the batch, and must write args.out.
class AttentionHook {
 public:
  virtual void attend(AttentionArgs& args) = 0;

 protected:
  ~AttentionHook() = default;
};

// Scratch space of the blocks of one call (buffers only grow).
struct BlockWorkspace {
  ScratchBuffer x, sum, qkv, q, context, ffn;
  std::vector<AttentionArgs> calls;  // a ragged batch's attention calls, one per sequence
  std::size_t capacity_bytes() const {
    return (x.capacity() + sum.capacity() + qkv.capacity() + q.capacity() + context.capacity() + ffn.capacity()) *
               sizeof(float) +
           calls.capacity() * sizeof(AttentionArgs);
  }
};

// One sequence of a ragged batch (continuous batching, models/batch_decoder.h): its `count` new
// tokens are the packed tokens [offset, offset + count) of the pass; their keys and values go to
// cache row `row` at slots [start, start + count), and they attend causally to that row's slots
// [0, start + count). Each sequence starts at slot 0 (no padding, no key mask).
struct RaggedEntry {
  long row = 0, start = 0, count = 0, offset = 0;
};

// packed [rows.size(), width] ← rows `rows` of padded [·, width]
void gather_rows(const std::vector<long>& rows, const float* padded, long width, float* packed);
// padded [padded_rows, width] ← packed row n at row rows[n], zero elsewhere
void scatter_rows(const std::vector<long>& rows, const float* packed, long width, long padded_rows, float* padded);

// The unpadded tokens of a padded batch as a ragged batch without a KV cache (padding removal):
// mask [batch, seq_len] (nonzero: a token). Fills one entry per sequence with tokens (offsets in
// packed order) and token_row [tokens] (each token's row in the padded [batch·seq_len] layout).
// False, when a sequence's tokens are not contiguous (a gap: positions and windows would change)
// or, with first_rows, a sequence's row 0 is padding.
struct UnpaddedLayout {
  std::vector<RaggedEntry> entries;
  std::vector<long> token_row;
  bool build(const int64_t* mask, long batch, long seq_len, bool first_rows);
  long tokens() const { return static_cast<long>(token_row.size()); }
};

// Where self-attention keys and values come from, and how positions enter.
struct SelfAttentionInput {
  // Filled by the model: batch (rows), q_len (new tokens per row), kv_len, scale, causal,
  // causal_offset, window and the additive mask. The block sets q, k, v, out and their strides.
  AttentionArgs args;
  KvCache* cache = nullptr;      // keys/values appended at slots [start, start + q_len) of `layer`; null:
  long layer = 0, start = 0;     // read in place from the fused projection
  const float* rope = nullptr;   // cos | sin [tokens, head_dim] (rope_angles) or null
  AttentionHook* hook = nullptr;  // runs the attention instead of attention(args) when set
  // A ragged batch (without a hook): args.batch = 1 and args.q_len = all packed tokens; entries
  // [num_entries] and, with a cache, token_entry [tokens] (each token's entry) replace the uniform
  // rows × q_len layout, `start` and the mask. The block runs one attention per entry. With a cache, each entry
  // attends causally to its cache row; without one (an encoder batch with its padding removed,
  // args.mask null), to its own tokens [offset, offset + count) only (row and start unused; causal
  // and window as args has them, counted from the entry's first token).
  const RaggedEntry* entries = nullptr;
  long num_entries = 0;
  const long* token_entry = nullptr;
  // Not null (no hook): the last layer of a stack whose output is read at one token per sequence
  // (per entry) only — its first (pick_last false: an encoder read at its first token) or its last
  // (a decoder's prompt pass, whose logits are read at its last token). Keys and values still come
  // from every token (and go to the cache), the queries and everything after attention from the
  // picked tokens only; picked [sequences, hidden] receives their rows of the layer's output and h
  // is left as it was.
  // pick_at [sequences] (no KV cache): each sequence's own position of the token to carry on
  // (within its entry for a ragged batch) instead of the first or last (CLIP's end-of-text token).
  float* picked = nullptr;
  bool pick_last = false;
  const long* pick_at = nullptr;
};

class TransformerBlock {
 public:
  TransformerBlock() = default;
  // Packs the projections (in c.weight_type) and copies the norms; cross: a seq2seq decoder layer.
  TransformerBlock(const TransformerConfig& c, const BlockTensors& t, bool cross);

  // h [rows·q_len, hidden] ← h + self-attention (or its post-norm form); with in.picked, only
  // the picked token of each sequence is carried on, into in.picked (see SelfAttentionInput).
  void self_attention(const TransformerConfig& c, float* h, SelfAttentionInput& in, BlockWorkspace& ws) const;
  // h ← h + cross-attention over keys/values the model projected with cross_kv(); `args` holds
  // the batch (one entry per source), q_len (the queries of a source), kv_len, k, v and their
  // strides and the mask; the block sets q and out.
  void cross_attention(const TransformerConfig& c, float* h, long tokens, AttentionArgs args, BlockWorkspace& ws) const;
  // h ← h + feed-forward (or its post-norm form).
  void ffn(const TransformerConfig& c, float* h, long tokens, BlockWorkspace& ws) const;

  // The fused [k | v] projection of cross-attention, applied by the model to the encoder output.
  const Linear& cross_kv() const { return cross_kv_; }
  // The fused [q | k | v] self-attention projection (Transformer-XL projects its memory with it).
  const Linear& qkv() const { return qkv_; }

 private:
  // norm(h) into x (pre-norm), or h itself.
  const float* input(const TransformerConfig& c, const NormWeights& norm, const float* h, BlockWorkspace& ws,
                     long rows) const;
  // h = h + out(inner) (pre-norm) or h = norm(h + out(inner)) (post-norm).
  void residual(const TransformerConfig& c, const Linear& out, const NormWeights& norm, const float* inner, float* h,
                long rows, BlockWorkspace& ws) const;

  Linear qkv_, out_, cross_q_, cross_kv_, cross_out_, up_, down_;  // up_: [gate | up] when gated
  NormWeights attn_norm_, cross_norm_, ffn_norm_;
  std::vector<float> q_norm_, k_norm_;
};

}  // namespace cpuformer
