#include "models/decoder.h"

#include <cstring>
#include <limits>
#include <stdexcept>

#include "layers/rope.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Hugging Face's generate(): position = cumsum(mask) - 1; padding gets position 0 (its value is
// irrelevant: padded slots are masked out as keys). Returns each row's count of tokens.
void positions_from_mask(const int64_t* mask, long rows, long T, long* positions, long* counts) {
  for (long r = 0; r < rows; ++r) {
    long count = 0;
    for (long t = 0; t < T; ++t) {
      const bool token = mask == nullptr || mask[r * T + t] != 0;
      positions[r * T + t] = token ? count : 0;
      if (token) ++count;
    }
    if (counts) counts[r] = count;
  }
}

}  // namespace

DecoderModel::DecoderModel(const TransformerConfig& config, const GlobalTensors& t)
    : config_(config), position_embeddings_(t.decoder.positions) {
  const TransformerConfig& c = config_;
  c.validate();
  if (c.positions == Positions::kRope) {
    if (t.decoder.rope_inv_freq == nullptr) throw std::invalid_argument("RoPE needs its inverse frequencies");
    rope_inv_freq_.assign(t.decoder.rope_inv_freq, t.decoder.rope_inv_freq + c.head_dim / 2);
  } else if (c.positions != Positions::kLearned || position_embeddings_ == nullptr) {
    throw std::invalid_argument("a decoder needs a learned position table or RoPE");
  }
  if (c.final_norm) final_norm_ = NormWeights(c, t.decoder.final_norm.weight, t.decoder.final_norm.bias, c.hidden_size);
  lm_head_ = Linear({{t.lm_head.weight ? t.lm_head.weight : WeightRef(t.tokens), t.lm_head.bias, c.vocab_size}},
                    c.hidden_size, c.head_format(), PackedSlot{t.packed, "lm_head"});
  // After the tied head is packed from the float32 rows: an int8 table is quantized from them.
  word_embeddings_ = EmbeddingTable(t.tokens, c.vocab_size, c.hidden_size, c.embedding_dtype);
  layers_.reserve(c.num_layers);
}

void DecoderModel::add_layer(const BlockTensors& t) {
  if (complete()) throw std::logic_error("the decoder already has all its layers");
  layers_.emplace_back(config_, t, /*cross=*/false);
}

const float* DecoderModel::embed(Workspace& ws, const int64_t* ids, const long* positions, long N, float* h) const {
  const TransformerConfig& c = config_;
  const long H = c.hidden_size, D = c.head_dim;
  const float scale = c.embed_scale;
  parallel_ranges(N, 16, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      float* out = h + n * H;
      const float* word = word_embeddings_.row(ids[n], out);
      if (position_embeddings_) {
        const float* pos = position_embeddings_ + (c.position_offset + positions[n]) * H;
        if (scale != 1.0f) {
          for (long j = 0; j < H; ++j) out[j] = word[j] * scale + pos[j];
        } else {
          for (long j = 0; j < H; ++j) out[j] = word[j] + pos[j];
        }
      } else if (scale != 1.0f) {
        for (long j = 0; j < H; ++j) out[j] = word[j] * scale;
      } else if (word != out) {
        std::memcpy(out, word, H * sizeof(float));
      }
    }
  });
  if (c.positions == Positions::kRope) {
    float* cos_sin = ws.rope.reserve({N, D});
    const long half = D / 2;
    parallel_ranges(N, 16, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) rope_angles(rope_inv_freq_.data(), half, positions[n], cos_sin + n * D);
    });
    return cos_sin;
  }
  return nullptr;
}

void DecoderModel::forward(KvCache& cache, Workspace& ws, const int64_t* ids, const long* positions, long rows,
                           long t_new, bool all_positions, float* logits) const {
  const TransformerConfig& c = config_;
  const long N = checked_multiply(rows, t_new, "the tokens of a forward pass (rows × new positions)");
  const long start = cache.length();
  if (start + t_new > cache.max_len()) throw std::logic_error("the KV cache is full");
  float* h = ws.h.reserve({N, c.hidden_size});

  SelfAttentionInput in;
  in.rope = embed(ws, ids, positions, N, h);
  AttentionArgs& a = in.args;
  a.batch = rows;
  a.q_len = t_new;
  a.kv_len = start + t_new;
  a.scale = c.scale();
  a.causal = true;
  a.causal_offset = start;
  a.window = c.sliding_window;
  a.mask = cache.key_mask();
  a.mask_stride_b = cache.max_len();
  a.mask_stride_h = 0;
  a.mask_stride_q = 0;
  a.mask_stride_k = 1;
  in.cache = &cache;
  in.start = start;
  const long L = static_cast<long>(layers_.size());
  // Only the last position of each row is read: the last layer carries on those alone.
  const bool pick_last = !all_positions && t_new > 1;
  for (long l = 0; l < L; ++l) {
    in.layer = l;
    if (pick_last && l == L - 1) {
      h = last_layer_picked(in, h, rows, ws);
      break;
    }
    layers_[l].self_attention(c, h, in, ws.block);
    layers_[l].ffn(c, h, N, ws.block);
  }
  cache.set_length(start + t_new);

  // The final norm and the head on the positions that need logits.
  if (all_positions || pick_last) {
    head(h, nullptr, all_positions ? N : rows, ws, logits);
    return;
  }
  std::vector<long>& last = ws.picked;
  last.resize(rows);
  for (long r = 0; r < rows; ++r) last[r] = r * t_new + t_new - 1;
  head(h, last.data(), rows, ws, logits);
}

float* DecoderModel::last_layer_picked(SelfAttentionInput& in, float* h, long sequences, Workspace& ws) const {
  const TransformerConfig& c = config_;
  float* last = ws.last.reserve({sequences, c.hidden_size});
  in.picked = last;
  in.pick_last = true;
  layers_.back().self_attention(c, h, in, ws.block);
  layers_.back().ffn(c, last, sequences, ws.block);
  return last;
}

void DecoderModel::head(const float* h, const long* rows, long count, Workspace& ws, float* logits) const {
  const TransformerConfig& c = config_;
  const long H = c.hidden_size;
  float* x = ws.x.reserve({count, H});
  if (rows == nullptr && c.final_norm) {
    final_norm_.apply(c, h, x, count);
  } else if (rows == nullptr) {
    std::memcpy(x, h, count * H * sizeof(float));
  } else {
    for (long i = 0; i < count; ++i) {
      const float* src = h + rows[i] * H;
      if (c.final_norm) {
        final_norm_.apply(c, src, x + i * H, 1);
      } else {
        std::memcpy(x + i * H, src, H * sizeof(float));
      }
    }
  }
  if (c.head_scale != 1.0f) {
    for (long i = 0; i < count * H; ++i) x[i] *= c.head_scale;
  }
  lm_head_.apply(x, count, H, logits, c.vocab_size);
}

void DecoderModel::forward_ragged(KvCache& cache, Workspace& ws, const int64_t* ids, const long* positions, long N,
                                  const RaggedEntry* entries, long E, const long* token_entry, const long* logit_tokens,
                                  long count, float* logits) const {
  const TransformerConfig& c = config_;
  for (long e = 0; e < E; ++e) {
    if (entries[e].start + entries[e].count > cache.max_len()) throw std::logic_error("the KV cache is full");
  }
  float* h = ws.h.reserve({N, c.hidden_size});
  SelfAttentionInput in;
  in.rope = embed(ws, ids, positions, N, h);
  AttentionArgs& a = in.args;
  a.batch = 1;
  a.q_len = N;
  a.scale = c.scale();
  a.window = c.sliding_window;
  in.cache = &cache;
  in.entries = entries;
  in.num_entries = E;
  in.token_entry = token_entry;
  const long L = static_cast<long>(layers_.size());
  // Logits read at entries' last tokens only (the usual case): the last layer carries on one token
  // per entry (unless every entry is one token already). A logit token inside an entry (a
  // prompt's log-probabilities) needs the whole last layer.
  bool pick_last = N > E;
  for (long i = 0; i < count && pick_last; ++i) {
    const RaggedEntry& e = entries[token_entry[logit_tokens[i]]];
    pick_last = logit_tokens[i] == e.offset + e.count - 1;
  }
  for (long l = 0; l < L; ++l) {
    in.layer = l;
    if (pick_last && l == L - 1) {
      const float* last = last_layer_picked(in, h, E, ws);
      std::vector<long>& rows = ws.picked;  // each logit token's entry: its row of `last`
      rows.resize(count);
      for (long i = 0; i < count; ++i) rows[i] = token_entry[logit_tokens[i]];
      head(last, rows.data(), count, ws, logits);
      return;
    }
    layers_[l].self_attention(c, h, in, ws.block);
    layers_[l].ffn(c, h, N, ws.block);
  }
  head(h, logit_tokens, count, ws, logits);
}

void DecoderModel::logits(const int64_t* ids, const int64_t* mask, long batch, long seq_len, float* out) const {
  if (!complete()) throw std::logic_error("the decoder is missing layers or its head");
  BorrowedMemory<RunMemory> memory(kept_);
  KvCache& cache = memory->cache;
  Workspace& ws = memory->ws;
  cache.reset(config_.num_layers, batch, config_.num_kv_heads, seq_len, config_.head_dim);
  float* key_mask = cache.key_mask();
  for (long i = 0; i < batch * seq_len; ++i) key_mask[i] = (mask == nullptr || mask[i] != 0) ? 0.0f : kNegInf;
  std::vector<long> positions(checked_count({batch, seq_len}, "the positions"));
  positions_from_mask(mask, batch, seq_len, positions.data(), nullptr);
  forward(cache, ws, ids, positions.data(), batch, seq_len, true, out);
}

void DecoderSession::reserve(long rows, long T, long max_new) {
  const TransformerConfig& c = model_.config_;
  cache_.reset(c.num_layers, rows, c.num_kv_heads, checked_add(T, max_new, "prompt length + max_new_tokens"),
               c.head_dim, kv_type_);
}

void DecoderSession::prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long /*copies*/, long max_new,
                             float* logits) {
  if (!model_.complete()) throw std::logic_error("the decoder is missing layers or its head");
  reserve(rows, T, max_new);  // (allocates nothing when reserve() ran with these sizes)
  float* key_mask = cache_.key_mask();
  const long max_len = cache_.max_len();
  for (long r = 0; r < rows; ++r) {
    for (long t = 0; t < T; ++t) key_mask[r * max_len + t] = mask[r * T + t] != 0 ? 0.0f : kNegInf;
  }
  positions_.resize(checked_count({rows, T}, "the positions"));
  next_position_.resize(rows);
  positions_from_mask(mask, rows, T, positions_.data(), next_position_.data());
  model_.forward(cache_, ws_, ids, positions_.data(), rows, T, false, logits);
}

void DecoderSession::step(const int64_t* tokens, float* logits) {
  const long rows = cache_.rows(), slot = cache_.length(), max_len = cache_.max_len();
  if (slot >= max_len) throw std::logic_error("the KV cache is full");
  positions_.resize(rows);
  for (long r = 0; r < rows; ++r) {
    cache_.key_mask()[r * max_len + slot] = 0.0f;
    positions_[r] = next_position_[r]++;
  }
  model_.forward(cache_, ws_, tokens, positions_.data(), rows, 1, false, logits);
}

void DecoderSession::extend(const int64_t* tokens, long count, float* logits) {
  const long slot = cache_.length(), max_len = cache_.max_len();
  if (cache_.rows() != 1) throw std::logic_error("extend() runs one row");
  if (count < 1 || count > max_len - slot) throw std::logic_error("the KV cache is full");
  positions_.resize(count);
  for (long t = 0; t < count; ++t) {
    cache_.key_mask()[slot + t] = 0.0f;
    positions_[t] = next_position_[0]++;
  }
  model_.forward(cache_, ws_, tokens, positions_.data(), 1, count, true, logits);
}

void DecoderSession::rollback(long count) {
  if (count < 0 || count > cache_.length()) throw std::logic_error("rollback() past the start of the cache");
  cache_.set_length(cache_.length() - count);
  next_position_[0] -= count;
}

void DecoderSession::reorder(const long* source) {
  cache_.reorder(source);
  std::vector<long> old(next_position_);
  for (long r = 0; r < cache_.rows(); ++r) next_position_[r] = old[source[r]];
}

}  // namespace cpuformer
