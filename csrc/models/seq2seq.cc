#include "models/seq2seq.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/attention/attention.h"
#include "kernels/norm/norm.h"
#include "models/relative_position.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

NormWeights copy_norm(const float* weight, const float* bias, long n, float eps) {
  NormWeights norm;
  if (weight) norm.weight.assign(weight, weight + n);
  if (bias) norm.bias.assign(bias, bias + n);
  norm.eps = eps;
  return norm;
}

// Attention with q in rows of a [tokens, q_row] buffer, k/v in rows of a [tokens, kv_row]
// buffer (or a KV cache, set by the caller), output [tokens, inner].
AttentionArgs attention_args(const Seq2SeqConfig& c, long batch, long q_len, long kv_len) {
  AttentionArgs a;
  a.batch = batch;
  a.heads = c.heads;
  a.kv_heads = c.heads;
  a.q_len = q_len;
  a.kv_len = kv_len;
  a.head_dim = c.head_dim;
  a.q_stride_h = a.k_stride_h = a.v_stride_h = a.out_stride_h = c.head_dim;
  a.scale = c.attention_scale;
  return a;
}

}  // namespace

Seq2SeqModel::Seq2SeqModel(const Seq2SeqConfig& config, const Seq2SeqEmbeddingTensors& e)
    : config_(config),
      word_embeddings_(e.word_embeddings),
      encoder_positions_(config.position_table ? e.encoder_positions : nullptr),
      decoder_positions_(config.position_table ? e.decoder_positions : nullptr) {
  const Seq2SeqConfig& c = config_;
  if (c.vocab_size <= 0 || c.d_model <= 0 || c.heads <= 0 || c.head_dim <= 0 || c.ffn_dim <= 0) {
    throw std::invalid_argument("invalid seq2seq config: sizes must be positive");
  }
  if (c.position_table && (!encoder_positions_ || !decoder_positions_)) {
    throw std::invalid_argument("position tables missing");
  }
  const long d = c.d_model;
  // The widths the graphs multiply by the token count, checked once here.
  const long inner = checked_multiply(c.heads, c.head_dim, "heads × head_dim");
  checked_multiply(3, inner, "the fused q, k, v width (3 × heads × head_dim)");
  checked_multiply(2, c.ffn_dim, "the fused gate and up width (2 × ffn_dim)");
  require_in_features(c.weight_type, {{"d_model", d}, {"heads × head_dim", inner}, {"ffn_dim", c.ffn_dim}});
  if (c.relative_attention) {
    encoder_relative_bias_.assign(e.encoder_relative_bias, e.encoder_relative_bias + c.num_buckets * c.heads);
    decoder_relative_bias_.assign(e.decoder_relative_bias, e.decoder_relative_bias + c.num_buckets * c.heads);
  }
  if (c.embedding_norm) {
    encoder_embedding_norm_ = copy_norm(e.encoder_norm_weight, e.encoder_norm_bias, d, c.norm_eps);
    decoder_embedding_norm_ = copy_norm(e.decoder_norm_weight, e.decoder_norm_bias, d, c.norm_eps);
  }
  encoder_layers_.reserve(c.encoder_layers);
  decoder_layers_.reserve(c.decoder_layers);
}

bool Seq2SeqModel::complete() const {
  return has_head_ && static_cast<long>(encoder_layers_.size()) == config_.encoder_layers &&
         static_cast<long>(decoder_layers_.size()) == config_.decoder_layers;
}

Seq2SeqModel::Layer Seq2SeqModel::make_layer(const Seq2SeqLayerTensors& t, bool decoder) const {
  const Seq2SeqConfig& c = config_;
  const long d = c.d_model, inner = inner_dim(), F = c.ffn_dim;
  Layer layer;
  layer.qkv = Linear({{t.q_weight, t.q_bias, inner}, {t.k_weight, t.k_bias, inner}, {t.v_weight, t.v_bias, inner}}, d, c.weight_type);
  layer.out = Linear({{t.o_weight, t.o_bias, d}}, inner, c.weight_type);
  layer.self_norm = copy_norm(t.self_norm_weight, t.self_norm_bias, d, c.norm_eps);
  if (decoder) {
    layer.cross_q = Linear({{t.cross_q_weight, t.cross_q_bias, inner}}, d, c.weight_type);
    layer.cross_kv = Linear({{t.cross_k_weight, t.cross_k_bias, inner}, {t.cross_v_weight, t.cross_v_bias, inner}}, d, c.weight_type);
    layer.cross_out = Linear({{t.cross_o_weight, t.cross_o_bias, d}}, inner, c.weight_type);
    layer.cross_norm = copy_norm(t.cross_norm_weight, t.cross_norm_bias, d, c.norm_eps);
  }
  if (c.gated_ffn) {
    layer.up = Linear({{t.gate_weight, nullptr, F}, {t.up_weight, nullptr, F}}, d, c.weight_type);
  } else {
    layer.up = Linear({{t.up_weight, t.up_bias, F}}, d, c.weight_type);
  }
  layer.down = Linear({{t.down_weight, t.down_bias, d}}, F, c.weight_type);
  layer.ffn_norm = copy_norm(t.ffn_norm_weight, t.ffn_norm_bias, d, c.norm_eps);
  return layer;
}

void Seq2SeqModel::add_encoder_layer(const Seq2SeqLayerTensors& t) {
  if (static_cast<long>(encoder_layers_.size()) >= config_.encoder_layers) {
    throw std::logic_error("the encoder already has all its layers");
  }
  encoder_layers_.push_back(make_layer(t, false));
}

void Seq2SeqModel::add_decoder_layer(const Seq2SeqLayerTensors& t) {
  if (static_cast<long>(decoder_layers_.size()) >= config_.decoder_layers) {
    throw std::logic_error("the decoder already has all its layers");
  }
  decoder_layers_.push_back(make_layer(t, true));
}

void Seq2SeqModel::set_head(const Seq2SeqHeadTensors& t) {
  const Seq2SeqConfig& c = config_;
  if (c.final_norm) {
    encoder_final_norm_ = copy_norm(t.encoder_norm_weight, t.encoder_norm_bias, c.d_model, c.norm_eps);
    decoder_final_norm_ = copy_norm(t.decoder_norm_weight, t.decoder_norm_bias, c.d_model, c.norm_eps);
  }
  lm_head_ = Linear({{t.lm_head ? t.lm_head : word_embeddings_, t.final_logits_bias, c.vocab_size}}, c.d_model,
                    c.weight_type);
  has_head_ = true;
}

void Seq2SeqModel::norm(const NormWeights& w, const float* x, float* y, long rows) const {
  const long d = config_.d_model;
  if (config_.rms_norm) {
    rms_norm(x, nullptr, nullptr, w.weight.data(), w.eps, y, rows, d);
  } else {
    layer_norm(x, nullptr, nullptr, w.weight.data(), w.bias.empty() ? nullptr : w.bias.data(), w.eps, y, rows, d);
  }
}

void Seq2SeqModel::embed(const int64_t* ids, const float* positions, const NormWeights& emb_norm, long rows,
                         long len, long start, float* h) const {
  const long d = config_.d_model;
  const float scale = config_.embed_scale;
  const long offset = config_.position_offset;
  parallel_ranges(rows * len, 64, [&](long n0, long n1) {
    for (long n = n0; n < n1; ++n) {
      const float* word = word_embeddings_ + ids[n] * d;
      float* out = h + n * d;
      if (positions) {
        const float* pos = positions + (offset + start + n % len) * d;
        for (long j = 0; j < d; ++j) out[j] = word[j] * scale + pos[j];
      } else {
        for (long j = 0; j < d; ++j) out[j] = word[j] * scale;
      }
    }
  });
  if (config_.embedding_norm) norm(emb_norm, h, h, rows * len);
}

const float* Seq2SeqModel::block_input(const NormWeights& w, const float* h, float* x, long rows) const {
  if (!config_.pre_norm) return h;
  norm(w, h, x, rows);
  return x;
}

void Seq2SeqModel::residual_out(const Linear& out, const NormWeights& w, const float* inner, float* h, long rows,
                                Workspace& ws) const {
  const long d = config_.d_model;
  if (config_.pre_norm) {
    out.apply(inner, rows, out.in_features(), h, d, Activation::kNone, h, d);
  } else {
    float* sum = ws.sum.reserve({rows, d});
    out.apply(inner, rows, out.in_features(), sum, d, Activation::kNone, h, d);
    norm(w, sum, h, rows);
  }
}

void Seq2SeqModel::ffn_block(const Layer& layer, float* h, long rows, Workspace& ws) const {
  const Seq2SeqConfig& c = config_;
  const long d = c.d_model, F = c.ffn_dim;
  const float* x = block_input(layer.ffn_norm, h, ws.x.reserve({rows, d}), rows);
  if (c.gated_ffn) {
    float* f = ws.ffn.reserve({rows, 2, F});  // [rows, gate | up]
    layer.up.apply(x, rows, d, f, 2 * F);
    const ActivationKernels& ak = activation_kernels();
    parallel_ranges(rows, 4, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        float* gate = f + n * 2 * F;
        const float* up = gate + F;
        if (c.activation == Activation::kSilu) {
          ak.silu_mul(gate, up, gate, F);
        } else {
          ak.apply(c.activation, gate, gate, F);
          for (long j = 0; j < F; ++j) gate[j] *= up[j];
        }
      }
    });
    // The gated products sit in the first F columns of each 2F-wide row: a strided GEMM input.
    float* sum = c.pre_norm ? h : ws.sum.reserve({rows, d});
    layer.down.apply(f, rows, 2 * F, sum, d, Activation::kNone, h, d);
    if (!c.pre_norm) norm(layer.ffn_norm, sum, h, rows);
  } else {
    float* f = ws.ffn.reserve({rows, F});
    layer.up.apply(x, rows, d, f, F, c.activation);
    residual_out(layer.down, layer.ffn_norm, f, h, rows, ws);
  }
}

void Seq2SeqModel::run_encoder(const int64_t* src, const int64_t* src_mask, long batch, long src_len, float* h,
                               Workspace& ws) const {
  const Seq2SeqConfig& c = config_;
  const long d = c.d_model, inner = inner_dim(), T = src_len;
  const long N = checked_multiply(batch, src_len, "the source tokens (batch × source length)");
  embed(src, encoder_positions_, encoder_embedding_norm_, batch, src_len, 0, h);
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
  // T5: bias [B or 1, heads, T, T] = relative bias (+ the row's key mask).
  float* bias = nullptr;
  if (c.relative_attention) {
    const long per = static_cast<long>(checked_count({c.heads, T, T}, "the relative position bias"));
    bias = ws.bias.reserve({key_mask ? batch + 1 : 1, per});
    relative_position_bias(encoder_relative_bias_.data(), c.heads, c.num_buckets, c.max_distance, true, 0, T, T,
                           bias);
    if (key_mask) {
      for (long b = 0; b < batch; ++b) {
        float* out = bias + (b + 1) * per;
        for (long i = 0; i < c.heads * T; ++i) {
          for (long j = 0; j < T; ++j) out[i * T + j] = bias[i * T + j] + key_mask[b * T + j];
        }
      }
      bias += per;
    }
  }
  float* qkv = ws.qkv.reserve({N, 3, inner});
  float* context = ws.context.reserve({N, inner});
  float* x = ws.x.reserve({N, d});
  AttentionArgs a = attention_args(c, batch, T, T);
  a.q = qkv;
  a.k = qkv + inner;
  a.v = qkv + 2 * inner;
  a.q_stride_b = a.k_stride_b = a.v_stride_b = T * 3 * inner;
  a.q_stride_t = a.k_stride_t = a.v_stride_t = 3 * inner;
  a.out = context;
  a.out_stride_b = T * inner;
  a.out_stride_t = inner;
  if (bias) {
    a.mask = bias;
    a.mask_stride_b = key_mask ? c.heads * T * T : 0;
    a.mask_stride_h = T * T;
    a.mask_stride_q = T;
    a.mask_stride_k = 1;
  } else if (key_mask) {
    a.mask = key_mask;
    a.mask_stride_b = T;
    a.mask_stride_k = 1;
  }
  for (const Layer& layer : encoder_layers_) {
    const float* in = block_input(layer.self_norm, h, x, N);
    layer.qkv.apply(in, N, d, qkv, 3 * inner);
    attention(a);
    residual_out(layer.out, layer.self_norm, context, h, N, ws);
    ffn_block(layer, h, N, ws);
  }
  if (c.final_norm) norm(encoder_final_norm_, h, h, N);
}

void Seq2SeqModel::prepare_cross(const float* encoded, const int64_t* src_mask, long sources, long src_len,
                                 CrossState& cross) const {
  const long inner = inner_dim(), N = sources * src_len, L = config_.decoder_layers;
  cross.sources = sources;
  cross.src_len = src_len;
  cross.kv.resize(checked_bytes({L, N, 2, inner}, sizeof(float), "the cross-attention keys and values") /
                  sizeof(float));
  for (long l = 0; l < L; ++l) {
    decoder_layers_[l].cross_kv.apply(encoded, N, config_.d_model, cross.kv.data() + l * N * 2 * inner, 2 * inner);
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
  const Seq2SeqConfig& c = config_;
  const long d = c.d_model, inner = inner_dim(), D = c.head_dim;
  const long N = checked_multiply(rows, t_new, "the target tokens (rows × new positions)");
  const long start = cache.length(), kv_len = start + t_new, Ts = cross.src_len;
  if (kv_len > cache.max_len()) throw std::logic_error("the KV cache is full");
  float* h = ws.h.reserve({N, d});
  float* x = ws.x.reserve({N, d});
  float* qkv = ws.qkv.reserve({N, 3, inner});
  float* q = ws.q.reserve({N, inner});
  float* context = ws.context.reserve({N, inner});
  embed(ids, decoder_positions_, decoder_embedding_norm_, rows, t_new, start, h);

  AttentionArgs self = attention_args(c, rows, t_new, kv_len);
  self.q = qkv;
  self.q_stride_b = t_new * 3 * inner;
  self.q_stride_t = 3 * inner;
  self.k_stride_b = self.v_stride_b = cache.stride_row();
  self.k_stride_h = self.v_stride_h = cache.stride_head();
  self.k_stride_t = self.v_stride_t = D;
  self.out = context;
  self.out_stride_b = t_new * inner;
  self.out_stride_t = inner;
  self.causal = true;
  self.causal_offset = start;
  if (c.relative_attention) {
    // [1, heads, t_new, kv_len]: every row shares the decoder positions.
    float* bias = ws.bias.reserve({c.heads, t_new, kv_len});
    relative_position_bias(decoder_relative_bias_.data(), c.heads, c.num_buckets, c.max_distance, false, start,
                           t_new, kv_len, bias);
    self.mask = bias;
    self.mask_stride_h = t_new * kv_len;
    self.mask_stride_q = kv_len;
    self.mask_stride_k = 1;
  }
  // Cross-attention: one batch entry per source whose queries are its rows' tokens, in order.
  AttentionArgs crossa = attention_args(c, cross.sources, copies * t_new, Ts);
  crossa.q = q;
  crossa.q_stride_b = copies * t_new * inner;
  crossa.q_stride_t = inner;
  crossa.k_stride_b = crossa.v_stride_b = Ts * 2 * inner;
  crossa.k_stride_t = crossa.v_stride_t = 2 * inner;
  crossa.out = context;
  crossa.out_stride_b = copies * t_new * inner;
  crossa.out_stride_t = inner;
  if (!cross.key_mask.empty()) {
    crossa.mask = cross.key_mask.data();
    crossa.mask_stride_b = Ts;
    crossa.mask_stride_k = 1;
  }

  for (long l = 0; l < static_cast<long>(decoder_layers_.size()); ++l) {
    const Layer& layer = decoder_layers_[l];
    const float* in = block_input(layer.self_norm, h, x, N);
    layer.qkv.apply(in, N, d, qkv, 3 * inner);
    float* k_cache = cache.k(l);
    float* v_cache = cache.v(l);
    // A few kilobytes per token: threads only pay off for long prefixes (teacher forcing).
    parallel_ranges(N, 64, [&](long n0, long n1) {
      for (long n = n0; n < n1; ++n) {
        const float* k = qkv + n * 3 * inner + inner;
        const float* v = k + inner;
        const long r = n / t_new, slot = start + n % t_new;
        for (long i = 0; i < c.heads; ++i) {
          const long offset = r * cache.stride_row() + i * cache.stride_head() + slot * D;
          std::memcpy(k_cache + offset, k + i * D, D * sizeof(float));
          std::memcpy(v_cache + offset, v + i * D, D * sizeof(float));
        }
      }
    });
    self.k = k_cache;
    self.v = v_cache;
    attention(self);
    residual_out(layer.out, layer.self_norm, context, h, N, ws);

    in = block_input(layer.cross_norm, h, x, N);
    layer.cross_q.apply(in, N, d, q, inner);
    const float* kv = cross.kv.data() + l * cross.sources * Ts * 2 * inner;
    crossa.k = kv;
    crossa.v = kv + inner;
    attention(crossa);
    residual_out(layer.cross_out, layer.cross_norm, context, h, N, ws);

    ffn_block(layer, h, N, ws);
  }
  cache.set_length(kv_len);

  // Final norm and head scale on the rows that need logits, gathered into x.
  const long out_rows = all_positions ? N : rows;
  for (long r = 0; r < out_rows; ++r) {
    const float* src = all_positions ? h + r * d : h + (r * t_new + t_new - 1) * d;
    if (c.final_norm) {
      norm(decoder_final_norm_, src, x + r * d, 1);
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
  Workspace ws;
  run_encoder(src, src_mask, batch, src_len, out, ws);
}

void Seq2SeqModel::logits(const int64_t* src, const int64_t* src_mask, long batch, long src_len, const int64_t* tgt,
                          long tgt_len, float* out) const {
  if (!complete()) throw std::logic_error("the seq2seq model is missing layers or its head");
  Workspace ws;
  std::vector<float> encoded(checked_bytes({batch, src_len, config_.d_model}, sizeof(float), "the encoder output") /
                             sizeof(float));
  run_encoder(src, src_mask, batch, src_len, encoded.data(), ws);
  CrossState cross;
  prepare_cross(encoded.data(), src_mask, batch, src_len, cross);
  KvCache cache;
  cache.reset(config_.decoder_layers, batch, config_.heads, tgt_len, config_.head_dim);
  run_decoder(cache, cross, 1, tgt, batch, tgt_len, true, out, ws);
}

void Seq2SeqSession::reserve(long rows, long /*T*/, long max_new) {
  const Seq2SeqConfig& c = model_.config_;
  cache_.reset(c.decoder_layers, rows, c.heads, checked_add(1, max_new, "1 decoder start token + max_new_tokens"),
               c.head_dim);
}

void Seq2SeqSession::prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
                             float* logits) {
  const Seq2SeqModel& m = model_;
  const Seq2SeqConfig& c = m.config_;
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
  std::vector<float> encoded(checked_bytes({sources, Ts, c.d_model}, sizeof(float), "the encoder output") /
                             sizeof(float));
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
  first.reset(c.decoder_layers, sources, c.heads, 1, c.head_dim);
  const long V = c.vocab_size, D = c.head_dim;
  std::vector<float> first_logits(checked_bytes({sources, V}, sizeof(float), "the logits") /
                                  sizeof(float));
  std::vector<int64_t> start(sources, start_token_);
  m.run_decoder(first, cross_, 1, start.data(), sources, 1, false, first_logits.data(), ws_);
  for (long l = 0; l < c.decoder_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const float* from = which == 0 ? first.k(l) : first.v(l);
      float* to = which == 0 ? cache_.k(l) : cache_.v(l);
      for (long r = 0; r < rows; ++r) {
        for (long i = 0; i < c.heads; ++i) {
          std::memcpy(to + r * cache_.stride_row() + i * cache_.stride_head(),
                      from + (r / copies_) * first.stride_row() + i * first.stride_head(), D * sizeof(float));
        }
      }
    }
  }
  cache_.set_length(1);
  for (long r = 0; r < rows; ++r) {
    std::memcpy(logits + r * V, first_logits.data() + (r / copies_) * V, V * sizeof(float));
  }
}

void Seq2SeqSession::step(const int64_t* tokens, float* logits) {
  model_.run_decoder(cache_, cross_, copies_, tokens, cache_.rows(), 1, false, logits, ws_);
}

}  // namespace cpuformer
