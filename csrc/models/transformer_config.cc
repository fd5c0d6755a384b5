#include "models/transformer_config.h"

#include <stdexcept>
#include <string>

#include "layers/linear.h"
#include "runtime/checked_size.h"

namespace cpuformer {
namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("invalid model config: " + message);
}

void at_least(long value, long minimum, const char* name) {
  require(value >= minimum,
          std::string(name) + " must be >= " + std::to_string(minimum) + ", got " + std::to_string(value));
}

}  // namespace

void TransformerConfig::validate() const {
  at_least(vocab_size, 1, "vocab_size");
  at_least(hidden_size, 1, "hidden_size");
  at_least(num_layers, 0, "num_layers");
  at_least(num_decoder_layers, 0, "num_decoder_layers");
  at_least(num_heads, 1, "num_heads");
  at_least(num_kv_heads, 1, "num_kv_heads");
  at_least(head_dim, 1, "head_dim");
  at_least(intermediate_size, 1, "intermediate_size");
  at_least(max_positions, 0, "max_positions");
  at_least(position_offset, 0, "position_offset");
  at_least(pad_token_id, 0, "pad_token_id");
  at_least(type_vocab_size, 0, "type_vocab_size");
  at_least(sliding_window, 0, "sliding_window");
  at_least(embedding_size, 0, "embedding_size");
  at_least(global_attention_every, 0, "global_attention_every");
  at_least(layer_groups, 0, "layer_groups");
  if (layer_groups > 0) {
    require(kind == ModelKind::kEncoder, "layer_groups (shared layers) is implemented for encoders only");
    require(num_layers % layer_groups == 0, "num_layers (" + std::to_string(num_layers) +
                                                ") must be a multiple of layer_groups (" +
                                                std::to_string(layer_groups) + ")");
  }
  if (global_attention_every > 0) {
    require(kind == ModelKind::kEncoder && sliding_window > 0,
            "global_attention_every needs an encoder with a sliding_window");
  }
  require(num_heads % num_kv_heads == 0, "num_heads (" + std::to_string(num_heads) +
                                             ") must be a multiple of num_kv_heads (" + std::to_string(num_kv_heads) +
                                             ")");
  if (kind == ModelKind::kSeq2Seq) require(num_kv_heads == num_heads, "seq2seq models need num_kv_heads == num_heads");
  if (has_position_table()) at_least(max_positions, 1, "max_positions (a position table)");
  if (positions == Positions::kRope)
    require(head_dim % 2 == 0, "RoPE needs an even head_dim, got " + std::to_string(head_dim));
  if (kind != ModelKind::kEncoder) {
    require(embedding_width() == hidden_size, "embedding_size must equal hidden_size outside encoders");
    require(!relative_bias, "relative_bias (with learned positions) is implemented for encoders only");
  }
  if (relative_bias) require(has_position_table(), "relative_bias needs a position table");
  if (has_relative_bias()) {
    at_least(num_buckets, 2, "num_buckets");
    at_least(max_distance, 2, "max_distance");
  }
  if (disentangled_attention()) {
    require(kind == ModelKind::kEncoder, "disentangled attention is an encoder's");
    at_least(max_relative_positions, 1, "max_relative_positions");
    if (position_buckets > 0) {
      // make_log_bucket_position divides by log((max_relative_positions - 1) / (position_buckets / 2)).
      at_least(position_buckets, 2, "position_buckets");
      require(max_relative_positions - 1 > position_buckets / 2,
              "max_relative_positions - 1 must exceed position_buckets / 2 for log buckets");
    }
    checked_multiply(2 * relative_span(), q_width(), "the relative position projections (2 × span × heads × head_dim)");
  }
  at_least(relative_clamp, 0, "relative_clamp");
  if (transformer_xl_attention) {
    require(kind == ModelKind::kEncoder, "Transformer-XL attention is an encoder's");
    require(hidden_size % 2 == 0, "Transformer-XL attention needs an even hidden_size (sin | cos halves), got " +
                                      std::to_string(hidden_size));
    require(positions == Positions::kNone && !disentangled_attention() && !relative_bias && !pre_norm &&
                type_vocab_size == 0 && num_kv_heads == num_heads,
            "Transformer-XL attention needs positions 'none', no other relative scheme, post-norm layers, no "
            "token-type table and num_kv_heads == num_heads");
  }
  if (causal) {
    require(kind == ModelKind::kEncoder && !disentangled_attention() && !transformer_xl_attention,
            "causal (a causal mask in an encoder stack) needs an encoder without disentangled or Transformer-XL "
            "attention");
  }
  if (kind == ModelKind::kEncoder) {
    require(pad_token_id < vocab_size, "pad_token_id must be < vocab_size");
    require(max_seq_len() >= 1, "max_positions leaves no positions after the padding id");
  }
  // The widths the graphs multiply by a token count, checked once here.
  const long q = checked_multiply(num_heads, head_dim, "num_heads × head_dim");
  const long kv = checked_multiply(num_kv_heads, head_dim, "num_kv_heads × head_dim");
  checked_add(q, checked_multiply(2, kv, "the key and value width"), "the fused q, k, v width");
  checked_multiply(2, intermediate_size, "the fused gate and up width (2 × intermediate_size)");
  if (weight_type == WeightType::kInt4 || head_dtype == WeightType::kInt4) {
    require(valid_int4_group_size(group_size), "group_size must be 32, 64 or 128, got " + std::to_string(group_size));
  }
  require(embedding_dtype == WeightType::kFloat32 || embedding_dtype == WeightType::kInt8,
          "embedding_dtype must be 'float32' or 'int8'");
  require_in_features(head_dtype, {{"hidden_size", hidden_size}});
  require_in_features(weight_type, {{"hidden_size", hidden_size},
                                    {"num_heads × head_dim", q},
                                    {"intermediate_size", intermediate_size},
                                    {"embedding_size", embedding_width()}});
}

}  // namespace cpuformer
