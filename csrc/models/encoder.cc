#include "models/encoder.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "layers/relative_position.h"
#include "layers/rope.h"
#include "models/kept_memory.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {

EncoderModel::EncoderModel(const TransformerConfig& config, const GlobalTensors& t)
    : config_(config),
      word_embeddings_(t.tokens, config.vocab_size, config.embedding_width(), config.embedding_dtype),
      position_embeddings_(t.encoder.positions),
      token_type_embeddings_(config.type_vocab_size > 0 ? t.token_types : nullptr) {
  config_.validate();
  const long H = config_.hidden_size, E = config_.embedding_width();
  const long half = config_.head_dim / 2;
  if (config_.positions == Positions::kRope) {
    if (t.encoder.rope_inv_freq == nullptr) throw std::invalid_argument("RoPE needs its inverse frequencies");
    rope_inv_freq_.assign(t.encoder.rope_inv_freq, t.encoder.rope_inv_freq + half);
    if (config_.global_attention_every > 0) {
      if (t.encoder.rope_local_inv_freq == nullptr)
        throw std::invalid_argument("the windowed layers need their RoPE inverse frequencies");
      rope_local_inv_freq_.assign(t.encoder.rope_local_inv_freq, t.encoder.rope_local_inv_freq + half);
    }
    position_embeddings_ = nullptr;
  } else if (config_.positions != Positions::kNone &&
             (!config_.has_position_table() || position_embeddings_ == nullptr)) {
    throw std::invalid_argument("an encoder needs a position table, RoPE or positions 'none'");
  }
  if (config_.disentangled_attention()) {
    if (t.encoder.relative_embeddings == nullptr) throw std::invalid_argument("disentangled attention needs its table");
    const long rows = 2 * config_.relative_span();
    relative_embeddings_.assign(t.encoder.relative_embeddings, t.encoder.relative_embeddings + rows * H);
    if (config_.relative_embedding_norm) {
      NormWeights(config_, t.encoder.relative_norm.weight, t.encoder.relative_norm.bias, H)
          .apply(config_, relative_embeddings_.data(), relative_embeddings_.data(), rows);
    }
    disentangled_.reserve(config_.num_layers);
  }
  if (config_.transformer_xl_attention) relative_xl_.reserve(config_.distinct_layers());
  if (config_.embedding_norm)
    embedding_norm_ = NormWeights(config_, t.encoder.embed_norm.weight, t.encoder.embed_norm.bias, E);
  if (t.embed_project.weight) {
    embed_project_ = Linear({{t.embed_project.weight, t.embed_project.bias, H}}, E, config_.matmul_format(),
                            PackedSlot{t.packed, "embed.project"});
    has_embed_project_ = true;
  } else if (E != H || t.embed_project.bias) {
    throw std::invalid_argument("embedding_size != hidden_size needs the embed.project weight");
  }
  if (config_.relative_bias) {
    if (t.encoder.relative_bias == nullptr) throw std::invalid_argument("relative_bias needs its table");
    relative_bias_.assign(t.encoder.relative_bias, t.encoder.relative_bias + config_.num_buckets * config_.num_heads);
  }
  if (config_.final_norm) final_norm_ = NormWeights(config_, t.encoder.final_norm.weight, t.encoder.final_norm.bias, H);
  if (t.pooler.weight) {
    pooler_ = Linear({{t.pooler.weight, t.pooler.bias, H}}, H, config_.matmul_format(), PackedSlot{t.packed, "pooler"});
    has_pooler_ = true;
  }
  layers_.reserve(config_.distinct_layers());
}

void EncoderModel::add_layer(const BlockTensors& t) {
  if (complete()) throw std::logic_error("the encoder already has all its layers");
  if (config_.disentangled_attention()) {
    const bool shared = config_.share_attention_key;
    disentangled_.emplace_back(config_, relative_embeddings_.data(), shared ? t.q : t.position_q,
                               shared ? t.k : t.position_k);
  }
  if (config_.transformer_xl_attention) relative_xl_.emplace_back(config_, t);
  layers_.emplace_back(config_, t, /*cross=*/false);
  if (complete()) std::vector<float>().swap(relative_embeddings_);  // projected into every layer
}

void EncoderModel::embed(const int64_t* input_ids, const int64_t* token_type_ids, long batch, long seq_len, float* h,
                         Workspace& ws) const {
  const long E = config_.embedding_width();  // the width of the tables (and of h until projected)
  const long rows = batch * seq_len;
  float* const hidden = h;
  if (has_embed_project_) h = ws.embeddings.reserve({rows, E});
  const long pad = config_.pad_token_id;
  const bool cumsum = config_.position_ids == PositionIds::kPaddingCumsum;
  const float scale = config_.embed_scale;
  parallel_ranges(batch, 1, [&](long b0, long b1) {
    for (long b = b0; b < b1; ++b) {
      long count = 0;
      for (long t = 0; t < seq_len; ++t) {
        const long r = b * seq_len + t;
        const int64_t id = input_ids[r];
        long position = t;
        if (cumsum) {
          if (id != pad) ++count;
          position = id != pad ? pad + count : pad;
        }
        float* row = h + r * E;
        const float* word = word_embeddings_.row(id, row);
        if (position_embeddings_ == nullptr && scale != 1.0f) {  // RoPE: positions enter in the attention
          for (long j = 0; j < E; ++j) row[j] = word[j] * scale;
        } else if (position_embeddings_ == nullptr) {
          if (word != row) std::memcpy(row, word, E * sizeof(float));
        } else {
          const float* pos = position_embeddings_ + (config_.position_offset + position) * E;
          if (scale != 1.0f) {
            for (long j = 0; j < E; ++j) row[j] = word[j] * scale + pos[j];
          } else {
            for (long j = 0; j < E; ++j) row[j] = word[j] + pos[j];
          }
        }
        if (token_type_embeddings_) {
          const float* type = token_type_embeddings_ + (token_type_ids ? token_type_ids[r] : 0) * E;
          for (long j = 0; j < E; ++j) row[j] += type[j];
        }
      }
    }
  });
  if (config_.embedding_norm) embedding_norm_.apply(config_, h, h, rows);
  if (has_embed_project_) embed_project_.apply(h, rows, E, hidden, config_.hidden_size);
}

const float* EncoderModel::rope_table(const std::vector<float>& inv_freq, long batch, long seq_len,
                                      ScratchBuffer& buffer) const {
  const long D = config_.head_dim;
  float* cos_sin = buffer.reserve({batch, seq_len, D});
  parallel_ranges(seq_len, 16, [&](long t0, long t1) {
    for (long t = t0; t < t1; ++t) rope_angles(inv_freq.data(), D / 2, t, cos_sin + t * D);
  });
  // Every sequence has positions 0..T-1 (padding included, as transformers' position_ids).
  for (long b = 1; b < batch; ++b) std::memcpy(cos_sin + b * seq_len * D, cos_sin, seq_len * D * sizeof(float));
  return cos_sin;
}

void EncoderModel::keep_or_free(Workspace& ws) const {
  if (ws.capacity_bytes() > kept_memory_limit()) ws = Workspace();
}

void EncoderModel::forward(const int64_t* input_ids, const int64_t* attention_mask, const int64_t* token_type_ids,
                           long batch, long seq_len, float* out, float* pooled, const EncoderMemory* memory,
                           bool skip_padding, bool first_only, const long* pick) const {
  if (!complete()) throw std::logic_error("the encoder is missing layers");
  if (memory && !config_.transformer_xl_attention) throw std::logic_error("only Transformer-XL attention has memory");
  if (pooled && !has_pooler_) throw std::logic_error("this encoder has no pooler");
  std::unique_lock<std::mutex> lock(workspace_mutex_, std::try_to_lock);
  if (lock.owns_lock()) {
    run(input_ids, nullptr, attention_mask, token_type_ids, batch, seq_len, out, pooled, memory, skip_padding,
        first_only, pick, workspace_);
    keep_or_free(workspace_);
  } else {
    Workspace own;  // another thread is using the shared scratch space
    run(input_ids, nullptr, attention_mask, token_type_ids, batch, seq_len, out, pooled, memory, skip_padding,
        first_only, pick, own);
  }
}

void EncoderModel::forward_embeddings(const float* embeddings, const int64_t* attention_mask, long batch, long seq_len,
                                      float* out, float* pooled, bool skip_padding, bool first_only) const {
  if (!complete()) throw std::logic_error("the encoder is missing layers");
  if (embeddings == nullptr) throw std::invalid_argument("forward_embeddings needs its input embeddings");
  if (config_.transformer_xl_attention) throw std::logic_error("Transformer-XL attention needs token ids");
  if (pooled && !has_pooler_) throw std::logic_error("this encoder has no pooler");
  std::unique_lock<std::mutex> lock(workspace_mutex_, std::try_to_lock);
  if (lock.owns_lock()) {
    run(nullptr, embeddings, attention_mask, nullptr, batch, seq_len, out, pooled, nullptr, skip_padding, first_only,
        nullptr, workspace_);
    keep_or_free(workspace_);
  } else {
    Workspace own;  // another thread is using the shared scratch space
    run(nullptr, embeddings, attention_mask, nullptr, batch, seq_len, out, pooled, nullptr, skip_padding, first_only,
        nullptr, own);
  }
}

bool EncoderModel::unpadded_layout(const int64_t* attention_mask, long batch, long seq_len, bool first_rows,
                                   Workspace& ws) const {
  // Mathematics that reads the padded layout stays on it: relative position biases, disentangled
  // and Transformer-XL attention.
  if (config_.relative_bias || config_.disentangled_attention() || config_.transformer_xl_attention) return false;
  return ws.unpadded.build(attention_mask, batch, seq_len, first_rows);
}

void EncoderModel::run(const int64_t* input_ids, const float* embeddings, const int64_t* attention_mask,
                       const int64_t* token_type_ids, long batch, long seq_len, float* out, float* pooled,
                       const EncoderMemory* memory, bool skip_padding, bool first_only, const long* pick,
                       Workspace& ws) const {
  const long H = config_.hidden_size;
  const long rows = checked_multiply(batch, seq_len, "the tokens of a batch (batch × seq_len)");
  float* h = out;  // the hidden state lives in the output array from the start

  const float* key_mask = nullptr;  // additive [B, T]
  if (attention_mask) {
    float* m = ws.key_mask.reserve({rows});
    const float neg_inf = -std::numeric_limits<float>::infinity();
    bool any_masked = false;
    for (long r = 0; r < rows; ++r) {
      m[r] = attention_mask[r] ? 0.0f : neg_inf;
      any_masked = any_masked || !attention_mask[r];
    }
    if (any_masked) key_mask = m;
  }

  if (embeddings) {
    const long E = config_.embedding_width();
    float* e = has_embed_project_ ? ws.embeddings.reserve({rows, E}) : h;
    if (e != embeddings) std::memcpy(e, embeddings, rows * E * sizeof(float));
    if (config_.embedding_norm) embedding_norm_.apply(config_, e, e, rows);
    if (has_embed_project_) embed_project_.apply(e, rows, E, h, H);
  } else {
    embed(input_ids, token_type_ids, batch, seq_len, h, ws);
  }
  SelfAttentionInput in;
  in.args.batch = batch;
  in.args.q_len = in.args.kv_len = seq_len;
  in.args.scale = config_.scale();
  in.args.causal = config_.causal;  // (CLIP's text tower; with the key mask below)
  // int8 / int4 weights quantize every GEMM's input rows to int8: the attention's products may then
  // round their operands to bfloat16, far below that error (docs/precision.md).
  in.args.bf16_products = config_.weight_type == WeightType::kInt8 || config_.weight_type == WeightType::kInt4;
  if (config_.relative_bias) {
    // [B or 1, heads, T, T]: the bias of every (query, key) pair per head (+ each row's key mask)
    set_bidirectional_relative_mask(relative_bias_.data(), config_.num_heads, config_.num_buckets, config_.max_distance,
                                    key_mask, batch, seq_len, ws.relative_bias, in.args);
  } else if (key_mask && !config_.transformer_xl_attention) {  // (Transformer-XL masks in its hook)
    // [B, 1, 1, T]: one row of key biases per sequence, broadcast over heads and queries.
    in.args.mask = key_mask;
    in.args.mask_stride_b = seq_len;
    in.args.mask_stride_h = 0;
    in.args.mask_stride_q = 0;
    in.args.mask_stride_k = 1;
  }
  const float* rope = nullptr;  // cos | sin of every token's position t, per table
  const float* local_rope = nullptr;
  if (config_.positions == Positions::kRope) {
    rope = rope_table(rope_inv_freq_, batch, seq_len, ws.rope);
    local_rope = rope_local_inv_freq_.empty() ? rope : rope_table(rope_local_inv_freq_, batch, seq_len, ws.local_rope);
  }
  // Padding removed (skip_padding): the layers run on the unpadded tokens only, packed [tokens, H],
  // one attention per sequence over its own tokens; the padded rows of out end up zero.
  long tokens = rows;
  if (pick && pooled) throw std::logic_error("the pooler reads row 0: it cannot go with picked rows");
  const bool one_row = first_only || pick;  // the last layer for one row per sequence
  bool unpad = skip_padding && key_mask &&
               unpadded_layout(attention_mask, batch, seq_len, pooled != nullptr || (first_only && !pick), ws);
  if (unpad && pick) {  // every sequence needs its entry, and its picked row must be one of its tokens
    unpad = static_cast<long>(ws.unpadded.entries.size()) == batch;
    for (long b = 0; b < batch && unpad; ++b) unpad = attention_mask[b * seq_len + pick[b]] != 0;
  }
  if (unpad) {
    const UnpaddedLayout& layout = ws.unpadded;
    tokens = layout.tokens();
    float* packed = ws.packed.reserve({tokens, H});
    gather_rows(layout.token_row, h, H, packed);
    h = packed;
    in.args.batch = 1;
    in.args.q_len = in.args.kv_len = tokens;
    in.args.mask = nullptr;
    in.entries = layout.entries.data();
    in.num_entries = static_cast<long>(layout.entries.size());
    if (rope) {
      const long D = config_.head_dim;
      const bool shared = local_rope == rope;
      float* gathered = ws.packed_rope.reserve({tokens, D});
      gather_rows(layout.token_row, rope, D, gathered);
      rope = gathered;
      if (shared) {
        local_rope = rope;
      } else {
        float* local = ws.packed_local_rope.reserve({tokens, D});
        gather_rows(layout.token_row, local_rope, D, local);
        local_rope = local;
      }
    }
  }
  RelativeAttentionXLInput relative_xl;  // Transformer-XL: what every layer of the call shares
  const long memory_len = memory ? memory->length : 0;
  if (config_.transformer_xl_attention) {
    const long keys = memory_len + seq_len;
    float* sinusoids = ws.sinusoids.reserve({keys + seq_len - 1, H});
    relative_sinusoids(H, keys, seq_len, config_.relative_clamp, sinusoids);
    relative_xl.sinusoids = sinusoids;
    relative_xl.token_types = token_type_ids;
    relative_xl.key_mask = key_mask;
    relative_xl.memory_len = memory_len;
  }
  const long repeats = config_.num_layers / config_.distinct_layers();  // > 1: shared layers (ALBERT)
  // first_only / pick: the last layer carries on one token per sequence alone (plain attention only:
  // the disentangled and Transformer-XL hooks score every query).
  const bool picked_rows = one_row && disentangled_.empty() && !config_.transformer_xl_attention;
  auto picked_row = [&](long b) { return b * seq_len + (pick ? pick[b] : 0); };  // in out
  for (long l = 0; l < config_.num_layers; ++l) {
    const bool windowed = config_.windowed_layer(l);
    in.args.window = windowed ? config_.sliding_window : 0;
    in.rope = windowed ? local_rope : rope;
    const TransformerBlock& layer = layers_[l / repeats];
    if (picked_rows && l == config_.num_layers - 1) {
      float* picked = ws.picked.reserve({batch, H});  // one entry per sequence when unpadded
      in.picked = picked;
      if (pick) {  // positions within each sequence, or within its entry when unpadded
        ws.pick_at.resize(batch);
        for (long b = 0; b < batch; ++b) {
          const long start = unpad ? ws.unpadded.token_row[ws.unpadded.entries[b].offset] - b * seq_len : 0;
          ws.pick_at[b] = pick[b] - start;
        }
        in.pick_at = ws.pick_at.data();
      }
      layer.self_attention(config_, h, in, ws.block);
      layer.ffn(config_, picked, batch, ws.block);
      if (config_.final_norm) final_norm_.apply(config_, picked, picked, batch);
      std::memset(out, 0, rows * H * sizeof(float));  // (h may be out: read for the last time above)
      for (long b = 0; b < batch; ++b) std::memcpy(out + picked_row(b) * H, picked + b * H, H * sizeof(float));
      h = nullptr;
      break;
    }
    if (!disentangled_.empty()) {
      DisentangledAttentionCall hook(config_, disentangled_[l / repeats], ws.disentangled);
      in.hook = &hook;
      layer.self_attention(config_, h, in, ws.block);
      in.hook = nullptr;
    } else if (config_.transformer_xl_attention) {
      if (memory && memory->layer_inputs) {  // what the next call's memory is made of
        std::memcpy(memory->layer_inputs + l * rows * H, h, rows * H * sizeof(float));
      }
      relative_xl.memory = memory_len > 0 ? memory->layers[l] : nullptr;
      relative_xl.qkv = &layer.qkv();
      RelativeAttentionXLCall hook(config_, relative_xl_[l / repeats], relative_xl, ws.relative_xl);
      in.hook = &hook;
      layer.self_attention(config_, h, in, ws.block);
      in.hook = nullptr;
    } else {
      layer.self_attention(config_, h, in, ws.block);
    }
    layer.ffn(config_, h, tokens, ws.block);
  }
  if (h == nullptr) {  // one row per sequence: out holds them already
    h = out;
  } else if (config_.final_norm) {
    final_norm_.apply(config_, h, h, tokens);
  }
  if (unpad && h != out) {
    scatter_rows(ws.unpadded.token_row, h, H, rows, out);
    h = out;
  }

  if (pooled) {
    pooler_.apply(h, batch, seq_len * H, pooled, H);
    for (long i = 0; i < batch * H; ++i) pooled[i] = std::tanh(pooled[i]);
  }
  if (one_row && !picked_rows) {  // every row computed (attention hooks): only the picked ones kept
    for (long r = 0; r < rows; ++r)
      if (r != picked_row(r / seq_len)) std::memset(out + r * H, 0, H * sizeof(float));
  }
  if (skip_padding && key_mask && !unpad) {  // not removable here: computed, then zeroed all the same
    for (long r = 0; r < rows; ++r)
      if (!attention_mask[r]) std::memset(out + r * H, 0, H * sizeof(float));
  }
}

}  // namespace cpuformer
