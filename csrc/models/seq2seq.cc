#include "models/seq2seq.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "layers/relative_position.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace { constexpr float kNegInf = -std::numeric_limits<float>::infinity(); }

Seq2SeqModel::Seq2SeqModel(const TransformerConfig& config, const GlobalTensors& t) : config_(config) {
  const TransformerConfig& c = config_;
  c.validate();
  const long d = c.hidden_size;
  for (Stack* stack : {&encoder_, &decoder_}) {
    const StackTensors& s = stack == &encoder_ ? t.encoder : t.decoder;
    if (c.has_position_table()) {
      if (s.positions == nullptr) throw std::invalid_argument("position tables missing");
      stack->positions = s.positions;
    }
    if (c.positions == Positions::kRelative) {
      stack->relative_bias.assign(s.relative_bias, s.relative_bias + c.num_buckets * c.num_heads);
    }
    if (c.embedding_norm) stack->embedding_norm = NormWeights(c, s.embed_norm.weight, s.embed_norm.bias, d);
    if (c.final_norm) stack->final_norm = NormWeights(c, s.final_norm.weight, s.final_norm.bias, d);
  }
  encoder_.layers.reserve(c.num_layers);
  decoder_.layers.reserve(c.num_decoder_layers);
  lm_head_ = Linear({{t.lm_head.weight ? t.lm_head.weight : WeightRef(t.tokens), t.lm_head.bias, c.vocab_size}}, d,
                    c.head_format(), PackedSlot{t.packed, "lm_head"});
  // After the tied head is packed from the float32 rows: an int8 table is quantized from them.
  word_embeddings_ = EmbeddingTable(t.tokens, c.vocab_size, d, c.embedding_dtype);
}

bool Seq2SeqModel::complete() const {
  return static_cast<long>(encoder_.layers.size()) == config_.num_layers &&
         static_cast<long>(decoder_.layers.size()) == config_.num_decoder_layers;
}

void Seq2SeqModel::add_encoder_layer(const BlockTensors& t) {
  if (static_cast<long>(encoder_.layers.size()) >= config_.num_layers) {
    throw std::logic_error("the encoder already has all its layers");
  }
  encoder_.layers.emplace_back(config_, t, /*cross=*/false);
}

void Seq2SeqModel::add_decoder_layer(const BlockTensors& t) {
  if (static_cast<long>(decoder_.layers.size()) >= config_.num_decoder_layers) {
    throw std::logic_error("the decoder already has all its layers");
  }
  decoder_.layers.emplace_back(config_, t, /*cross=*/true);
}

void Seq2SeqModel::embed(const int64_t* ids, const Stack& stack, long rows, long len, long start, float* h) const {
  const long d = config_.hidden_size;
  const float scale = config_.embed_scale;
  const long offset = config_.position_offset;
  const float* positions = stack.positions;
  parallel_ranges(rows * len, 64, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      float* out = h + n * d;
      const float* word = word_embeddings_.row(ids[n], out);
      if (positions) {
        const float* pos = positions + (offset + start + n % len) * d;
        for (long j = 0; j < d; ++j) out[j] = word[j] * scale + pos[j];
      } else {
        for (long j = 0; j < d; ++j) out[j] = word[j] * scale;
      }
    }
  });
  if (config_.embedding_norm) stack.embedding_norm.apply(config_, h, h, rows * len);
}

void Seq2SeqModel::run_encoder(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* h,
                               Workspace& ws) const {
  const TransformerConfig& c = config_;
  const long T = src_len;
  const long N = checked_multiply(batch, src_len, "the source tokens (batch × source length)");
  embed(src, encoder_, batch, src_len, 0, h);
  const float* key_mask = nullptr;  // [B, T]
  if (src_mask) {
    float* m = ws.key_mask.reserve({N});
    bool any = false;
    for (long i = 0; i < N; ++i) {
      m[i] = src_mask[i] ? 0.0f : kNegInf;
      any = any || !src_mask[i];
    }
    if (any) key_mask = m;
  }
  SelfAttentionInput in;
  AttentionArgs& a = in.args;
  a.batch = batch;
  a.q_len = a.kv_len = T;
  a.scale = c.scale();
  if (c.positions == Positions::kRelative) {
    // T5: bias [B or 1, heads, T, T] = relative bias (+ the row's key mask).
    set_bidirectional_relative_mask(encoder_.relative_bias.data(), c.num_heads, c.num_buckets, c.max_distance, key_mask,
                                    batch, T, ws.bias, a);
  } else if (key_mask) {
    a.mask = key_mask;
    a.mask_stride_b = T;
    a.mask_stride_k = 1;
  }
  // Padding removal: the layers run on the unpadded tokens only, one attention per source; the
  // padded rows of the output are zero (cross-attention masks them as keys). T5's relative bias
  // reads the padded layout and stays on it.
  float* x = h;
  long tokens = N;
  const bool unpad = key_mask && c.positions != Positions::kRelative && ws.unpadded.build(src_mask, batch, T, false);
  if (unpad) {
    tokens = ws.unpadded.tokens();
    x = ws.packed.reserve({tokens, c.hidden_size});
    gather_rows(ws.unpadded.token_row, h, c.hidden_size, x);
    a.batch = 1;
    a.q_len = a.kv_len = tokens;
    a.mask = nullptr;
    in.entries = ws.unpadded.entries.data();
    in.num_entries = static_cast<long>(ws.unpadded.entries.size());
  }
  for (const TransformerBlock& layer : encoder_.layers) {
    layer.self_attention(c, x, in, ws.block);
    layer.ffn(c, x, tokens, ws.block);
  }
  if (c.final_norm) encoder_.final_norm.apply(c, x, x, tokens);
  if (unpad) scatter_rows(ws.unpadded.token_row, x, c.hidden_size, N, h);
}

void Seq2SeqModel::prepare_cross(const float* encoded, const int64_t* src_mask, long sources, long src_len,
                                 CrossState& cross) const {
  const long inner = inner_dim(), N = sources * src_len, L = config_.num_decoder_layers;
  cross.sources = sources;
  cross.src_len = src_len;
  cross.kv.resize(checked_bytes({L, N, 2, inner}, sizeof(float), "the cross-attention keys and values") /
                  sizeof(float));
  // Padded source rows are masked keys: only the unpadded rows are projected (the others stay zero).
  std::vector<long> kept;
  if (src_mask) {
    for (long i = 0; i < N; ++i)
      if (src_mask[i]) kept.push_back(i);
  }
  const long d = config_.hidden_size, tokens = static_cast<long>(kept.size());
  if (src_mask && tokens < N) {
    std::vector<float> packed(static_cast<std::size_t>(tokens * d)), kv(static_cast<std::size_t>(tokens * 2 * inner));
    gather_rows(kept, encoded, d, packed.data());
    for (long l = 0; l < L; ++l) {
      decoder_.layers[l].cross_kv().apply(packed.data(), tokens, d, kv.data(), 2 * inner);
      scatter_rows(kept, kv.data(), 2 * inner, N, cross.kv.data() + l * N * 2 * inner);
    }
  } else {
    for (long l = 0; l < L; ++l)
      decoder_.layers[l].cross_kv().apply(encoded, N, d, cross.kv.data() + l * N * 2 * inner, 2 * inner);
  }
  cross.key_mask.clear();
  if (src_mask) {
    bool any = false;
    for (long i = 0; i < N; ++i) any = any || !src_mask[i];
    if (any) {
      cross.key_mask.resize(N);
      for (long i = 0; i < N; ++i) cross.key_mask[i] = src_mask[i] ? 0.0f : kNegInf;
    }
  }
}

void Seq2SeqModel::run_decoder(KvCache& cache, const CrossState& cross, long copies, const int64_t* ids, long rows,
                               long t_new, bool all_positions, float* logits, Workspace& ws) const {
  const TransformerConfig& c = config_;
  const long d = c.hidden_size, inner = inner_dim();
  const long N = checked_multiply(rows, t_new, "the target tokens (rows × new positions)");
  const long start = cache.length(), kv_len = start + t_new, Ts = cross.src_len;
  if (kv_len > cache.max_len()) throw std::logic_error("the KV cache is full");
  float* h = ws.h.reserve({N, d});
  float* x = ws.x.reserve({N, d});
  embed(ids, decoder_, rows, t_new, start, h);

  SelfAttentionInput in;
  AttentionArgs& self = in.args;
  self.batch = rows;
  self.q_len = t_new;
  self.kv_len = kv_len;
  self.scale = c.scale();
  self.causal = true;
  self.causal_offset = start;
  if (c.positions == Positions::kRelative) {
    // [1, heads, t_new, kv_len]: every row shares the decoder positions.
    float* bias = ws.bias.reserve({c.num_heads, t_new, kv_len});
    relative_position_bias(decoder_.relative_bias.data(), c.num_heads, c.num_buckets, c.max_distance, false, start,
                           t_new, kv_len, bias);
    self.mask = bias;
    self.mask_stride_h = t_new * kv_len;
    self.mask_stride_q = kv_len;
    self.mask_stride_k = 1;
  }
  in.cache = &cache;
  in.start = start;
  // Cross-attention: one batch entry per source whose queries are its rows' tokens, in order.
  AttentionArgs crossa;
  crossa.batch = cross.sources;
  crossa.q_len = copies * t_new;
  crossa.kv_len = Ts;
  crossa.scale = c.scale();
  crossa.k_stride_b = crossa.v_stride_b = Ts * 2 * inner;
  crossa.k_stride_h = crossa.v_stride_h = c.head_dim;
  crossa.k_stride_t = crossa.v_stride_t = 2 * inner;
  if (!cross.key_mask.empty()) {
    crossa.mask = cross.key_mask.data();
    crossa.mask_stride_b = Ts;
    crossa.mask_stride_k = 1;
  }

  for (long l = 0; l < static_cast<long>(decoder_.layers.size()); ++l) {
    const TransformerBlock& layer = decoder_.layers[l];
    in.layer = l;
    layer.self_attention(c, h, in, ws.block);
    const float* kv = cross.kv.data() + l * cross.sources * Ts * 2 * inner;
    crossa.k = kv;
    crossa.v = kv + inner;
    layer.cross_attention(c, h, N, crossa, ws.block);
    layer.ffn(c, h, N, ws.block);
  }
  cache.set_length(kv_len);

  // Final norm and head scale on the rows that need logits, gathered into x.
  const long out_rows = all_positions ? N : rows;
  for (long r = 0; r < out_rows; ++r) {
    const float* src = all_positions ? h + r * d : h + (r * t_new + t_new - 1) * d;
    if (c.final_norm) {
      decoder_.final_norm.apply(c, src, x + r * d, 1);
    } else if (src != x + r * d) {
      std::memcpy(x + r * d, src, d * sizeof(float));
    }
  }
  if (c.head_scale != 1.0f) {
    for (long i = 0; i < out_rows * d; ++i) x[i] *= c.head_scale;
  }
  lm_head_.apply(x, out_rows, d, logits, c.vocab_size);
}

void Seq2SeqModel::encode(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* out) const {
  if (!complete()) throw std::logic_error("the seq2seq model is missing layers or its head");
  BorrowedMemory<RunMemory> memory(kept_);
  run_encoder(src, src_mask, batch, src_len, out, memory->ws);
}

void Seq2SeqModel::logits(const int64_t* src, const int64_t* src_mask, long batch, long src_len, const int64_t* tgt,
                          long tgt_len, float* out) const {
  if (!complete()) throw std::logic_error("the seq2seq model is missing layers or its head");
  BorrowedMemory<RunMemory> memory(kept_);
  Workspace& ws = memory->ws;
  std::vector<float>& encoded = memory->encoded;
  encoded.resize(checked_bytes({batch, src_len, config_.hidden_size}, sizeof(float), "the encoder output") /
                 sizeof(float));
  run_encoder(src, src_mask, batch, src_len, encoded.data(), ws);
  CrossState& cross = memory->cross;
  prepare_cross(encoded.data(), src_mask, batch, src_len, cross);
  KvCache& cache = memory->cache;
  cache.reset(config_.num_decoder_layers, batch, config_.num_heads, tgt_len, config_.head_dim);
  run_decoder(cache, cross, 1, tgt, batch, tgt_len, true, out, ws);
}

void Seq2SeqSession::reserve(long rows, long /*T*/, long max_new) {
  const TransformerConfig& c = model_.config_;
  cache_.reset(c.num_decoder_layers, rows, c.num_heads,
               checked_add(1, max_new, "1 decoder start token + max_new_tokens"), c.head_dim, kv_type_);
}

void Seq2SeqSession::prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
                             float* logits) {
  const Seq2SeqModel& m = model_;
  const TransformerConfig& c = m.config_;
  if (!m.complete()) throw std::logic_error("the seq2seq model is missing layers or its head");
  if (copies < 1 || rows % copies != 0) throw std::logic_error("rows must come in groups of copies");
  copies_ = copies;
  const long sources = rows / copies;
  reserve(rows, T, max_new);  // before the encoder pass (allocates nothing when reserve() ran already)
  // The loop left-pads; the encoder wants each source from position 0 (right-padded).
  long Ts = 0;
  for (long s = 0; s < sources; ++s) {
    long n = 0;
    for (long t = 0; t < T; ++t) n += mask[s * copies * T + t] != 0;
    Ts = std::max(Ts, n);
  }
  std::vector<int64_t> src(sources * Ts, 0), src_mask(sources * Ts, 0);
  for (long s = 0; s < sources; ++s) {
    long j = 0;
    for (long t = 0; t < T; ++t) {
      const long i = s * copies * T + t;
      if (mask[i] == 0) continue;
      src[s * Ts + j] = ids[i];
      src_mask[s * Ts + j] = 1;
      ++j;
    }
  }
  std::vector<float>& encoded = memory_->encoded;
  encoded.resize(checked_bytes({sources, Ts, c.hidden_size}, sizeof(float), "the encoder output") / sizeof(float));
  m.run_encoder(src.data(), src_mask.data(), sources, Ts, encoded.data(), ws_);
  m.prepare_cross(encoded.data(), src_mask.data(), sources, Ts, cross_);
  if (copies_ == 1) {
    std::vector<int64_t> start(rows, start_token_);
    m.run_decoder(cache_, cross_, 1, start.data(), rows, 1, false, logits, ws_);
    return;
  }
  // Every copy of a source starts from the same token: run the first step once per source, then
  // give each copy the source's first key/value slot and logits.
  KvCache first;
  first.reset(c.num_decoder_layers, sources, c.num_heads, 1, c.head_dim, cache_.type());
  const long V = c.vocab_size;
  std::vector<float> first_logits(checked_bytes({sources, V}, sizeof(float), "the logits") / sizeof(float));
  std::vector<int64_t> start(sources, start_token_);
  m.run_decoder(first, cross_, 1, start.data(), sources, 1, false, first_logits.data(), ws_);
  for (long r = 0; r < rows; ++r) cache_.copy_slot(first, r / copies_, r, 0);
  cache_.set_length(1);
  for (long r = 0; r < rows; ++r) {
    std::memcpy(logits + r * V, first_logits.data() + (r / copies_) * V, V * sizeof(float));
  }
}

void Seq2SeqSession::step(const int64_t* tokens, float* logits) {
  model_.run_decoder(cache_, cross_, copies_, tokens, cache_.rows(), 1, false, logits, ws_);
}

void Seq2SeqSession::extend(const int64_t* tokens, long count, float* logits) {
  if (cache_.rows() != 1) throw std::logic_error("extend() runs one row");
  model_.run_decoder(cache_, cross_, copies_, tokens, 1, count, true, logits, ws_);
}

void Seq2SeqSession::rollback(long count) {
  if (count < 0 || count > cache_.length()) throw std::logic_error("rollback() past the start of the cache");
  cache_.set_length(cache_.length() - count);
}

}  // namespace cpuformer
