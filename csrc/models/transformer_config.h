// The hyperparameters of every model, in one struct: the encoder, the decoder and the seq2seq
// graph are all built from a TransformerConfig.
//
// Each field is declared once, in fields(): the binding builds the struct from a Python dict by
// visiting it (bindings/config.h), and _core.transformer_config_fields() lists the names, which
// the tests hold equal to the Python mirror (python/cpuformer/arch/spec.py, Hparams).
#pragma once

#include <cmath>
#include <string>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"

namespace cpuformer {

enum class ModelKind : int { kEncoder = 0, kDecoder = 1, kSeq2Seq = 2 };
enum class NormKind : int { kLayer = 0, kRms = 1 };  // LayerNorm (with bias), or RMSNorm
enum class Positions : int {
  kLearned = 0,     // a learned table per stack (BERT, GPT-2, BART)
  kSinusoidal = 1,  // a fixed table per stack, computed by the loader (Marian)
  kRope = 2,        // rotary embeddings of q and k (Llama family); inverse frequencies from the loader
  kRelative = 3,    // T5's bucketed relative position bias, one table per stack
  kNone = 4,        // no position in the embeddings (DeBERTa-v3: positions enter through disentangled attention)
};
enum class PositionIds : int {
  kArange = 0,         // position = t
  kPaddingCumsum = 1,  // RoBERTa: pad + running count of non-pad tokens; pad tokens get pad
};

struct TransformerConfig {
  ModelKind kind = ModelKind::kEncoder;
  long vocab_size = 0, hidden_size = 0;
  long num_layers = 0;          // the encoder's, or the decoder's of a decoder-only model
  long num_decoder_layers = 0;  // seq2seq
  long num_heads = 0, num_kv_heads = 0, head_dim = 0, intermediate_size = 0;
  NormKind norm = NormKind::kLayer;
  float norm_eps = 1e-5f;
  bool pre_norm = false;  // h = h + f(norm(h)); otherwise h = norm(h + f(h))
  Activation activation = Activation::kGeluErf;
  bool gated_ffn = false;  // down(act(gate(x)) ⊙ up(x)); otherwise down(act(up(x)))
  Positions positions = Positions::kLearned;
  long max_positions = 0;    // rows of a position table (0: no limit, relative positions)
  long position_offset = 0;  // rows reserved at the start of a learned table (BART: 2)
  PositionIds position_ids = PositionIds::kArange;
  long pad_token_id = 0;
  long type_vocab_size = 0;      // 0: no token-type table
  bool embedding_norm = false;   // a norm over the embeddings (BERT, BART)
  bool final_norm = false;       // a norm after the last layer of each stack
  float embed_scale = 1.0f;      // embeddings are multiplied by it (√hidden: Marian, Gemma)
  float attention_scale = 0.0f;  // multiplies q·kᵀ; 0: 1/√head_dim
  // Keys within sliding_window - 1 positions: the last sliding_window keys of a causal stack
  // (Mistral), both sides in an encoder (ModernBERT's local layers). 0: no window.
  long sliding_window = 0;
  bool qk_norm = false;          // RMSNorm over each q and k head (Qwen3)
  long num_buckets = 32, max_distance = 128;  // relative positions
  bool tie_word_embeddings = true;
  float head_scale = 1.0f;  // logits = lm_head(head_scale · h) (T5 with a tied head)
  // Encoders with a sliding_window: layer l with l % global_attention_every == 0 attends to every
  // key (and uses rope.inv_freq), the others to the window (and rope.local_inv_freq) — ModernBERT.
  // 0: every layer uses the window.
  long global_attention_every = 0;
  // Storage of every projection weight and of the LM head; embeddings, norms and biases stay
  // float32 (docs/precision.md, "Which tensors are quantized").
  WeightType weight_type = WeightType::kFloat32;
  // Width of the embedding tables and of the embedding norm (0: hidden_size). Encoders whose tables
  // are narrower (ELECTRA, ALBERT) map the normed embeddings into hidden_size with embed.project.
  long embedding_size = 0;
  // Learned positions plus a bidirectional bucketed relative bias (num_buckets, max_distance), one
  // table per stack added to every layer's attention scores (MPNet; encoders only).
  bool relative_bias = false;
  // Encoders whose consecutive layers share weights (ALBERT's num_hidden_groups): layer_groups
  // distinct layers, each run num_layers / layer_groups times in a row. 0: every layer its own.
  long layer_groups = 0;
  // DeBERTa's disentangled attention (layers/disentangled_attention.h): scores gain the
  // content-to-position and/or position-to-content terms over relative position embeddings
  // [2·relative_span(), hidden] (a stack tensor), optionally LayerNormed; the position projections
  // are the layer's own q and k (share_attention_key) or separate attn.position_q / position_k.
  bool content_to_position = false;
  bool position_to_content = false;
  long position_buckets = 0;        // > 0: log-bucketed relative positions (make_log_bucket_position)
  long max_relative_positions = 0;  // the log buckets' largest position; the span without buckets
  bool relative_embedding_norm = false;
  bool share_attention_key = true;
  // Transformer-XL relative attention (XLNet; layers/relative_attention_xl.h): sinusoidal relative
  // positions projected per layer, content / position / segment biases, token types compared for
  // equality (no token-type table), keys and values optionally extended by a memory of earlier
  // hidden states. relative_clamp > 0 clamps the relative distances to ±relative_clamp.
  bool transformer_xl_attention = false;
  long relative_clamp = 0;
  // int4 weights (weight_type or head_dtype kInt4): inputs per group (32, 64, 128) and whether
  // each group has a zero point (gemm.h, Int4GemmKernels).
  long group_size = kInt4DefaultGroupSize;
  bool zero_point = false;
  // Storage of the LM head. The loader's policy (python/cpuformer/weights.py) keeps it at int8 when
  // the projections are int4, as quantization error in the logits costs more than elsewhere.
  WeightType head_dtype = WeightType::kFloat32;
  // Storage of the token-embedding table: float32, or int8 rows (layers/embedding_table.h; the
  // loader's policy picks int8 when the projections are int4).
  WeightType embedding_dtype = WeightType::kFloat32;
  // Encoders whose tokens see only the keys up to their own position, on top of the padding mask
  // (CLIP's text tower). Decoders are causal anyway.
  bool causal = false;

  // Every field once: v(name, field). The Python names (Hparams) with "dtype" for weight_type.
  template <class Visitor>
  void fields(Visitor&& v) {
    v("kind", kind);
    v("vocab_size", vocab_size);
    v("hidden_size", hidden_size);
    v("num_layers", num_layers);
    v("num_decoder_layers", num_decoder_layers);
    v("num_heads", num_heads);
    v("num_kv_heads", num_kv_heads);
    v("head_dim", head_dim);
    v("intermediate_size", intermediate_size);
    v("norm", norm);
    v("norm_eps", norm_eps);
    v("pre_norm", pre_norm);
    v("activation", activation);
    v("gated_ffn", gated_ffn);
    v("positions", positions);
    v("max_positions", max_positions);
    v("position_offset", position_offset);
    v("position_ids", position_ids);
    v("pad_token_id", pad_token_id);
    v("type_vocab_size", type_vocab_size);
    v("embedding_norm", embedding_norm);
    v("final_norm", final_norm);
    v("embed_scale", embed_scale);
    v("attention_scale", attention_scale);
    v("sliding_window", sliding_window);
    v("qk_norm", qk_norm);
    v("num_buckets", num_buckets);
    v("max_distance", max_distance);
    v("tie_word_embeddings", tie_word_embeddings);
    v("head_scale", head_scale);
    v("global_attention_every", global_attention_every);
    v("dtype", weight_type);
    v("embedding_size", embedding_size);
    v("relative_bias", relative_bias);
    v("layer_groups", layer_groups);
    v("content_to_position", content_to_position);
    v("position_to_content", position_to_content);
    v("position_buckets", position_buckets);
    v("max_relative_positions", max_relative_positions);
    v("relative_embedding_norm", relative_embedding_norm);
    v("share_attention_key", share_attention_key);
    v("transformer_xl_attention", transformer_xl_attention);
    v("relative_clamp", relative_clamp);
    v("group_size", group_size);
    v("zero_point", zero_point);
    v("head_dtype", head_dtype);
    v("embedding_dtype", embedding_dtype);
    v("causal", causal);
  }

  // The storage of the projections (and the pooler) and of the LM head.
  WeightFormat matmul_format() const { return {weight_type, group_size, zero_point}; }
  WeightFormat head_format() const { return {head_dtype, group_size, zero_point}; }

  long q_width() const { return num_heads * head_dim; }
  long kv_width() const { return num_kv_heads * head_dim; }
  long qkv_width() const { return q_width() + 2 * kv_width(); }
  long embedding_width() const { return embedding_size > 0 ? embedding_size : hidden_size; }
  bool has_relative_bias() const { return positions == Positions::kRelative || relative_bias; }
  bool has_position_table() const { return positions == Positions::kLearned || positions == Positions::kSinusoidal; }
  bool disentangled_attention() const { return content_to_position || position_to_content; }
  // Rows of each half of the relative embedding table: relative positions are clamped to
  // [-span, span - 1] (after bucketing).
  long relative_span() const { return position_buckets > 0 ? position_buckets : max_relative_positions; }
  float scale() const {
    return attention_scale != 0.0f ? attention_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  // Whether encoder layer `layer` attends through the sliding window (otherwise to every key).
  bool windowed_layer(long layer) const {
    return sliding_window > 0 && (global_attention_every == 0 || layer % global_attention_every != 0);
  }
  // The layers with weights of their own: layer l runs distinct layer l / (num_layers / distinct_layers()).
  long distinct_layers() const { return layer_groups > 0 ? layer_groups : num_layers; }
  // Longest sequence a position table covers (RoBERTa-style ids reserve pad + 1 rows).
  long max_seq_len() const {
    return position_ids == PositionIds::kArange ? max_positions : max_positions - pad_token_id - 1;
  }

  // std::invalid_argument naming the first inconsistent field; every width the graphs multiply by
  // a token count is checked for overflow here, and every K against the int8 GEMM's limit.
  void validate() const;
};

}  // namespace cpuformer
