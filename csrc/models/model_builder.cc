#include "models/model_builder.h"

#include <stdexcept>

namespace cpuformer {

std::string shape_string(const std::vector<long>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorView ModelBuilder::checked(const TensorSource& tensors, const std::string& key,
                                 const std::vector<long>& shape) const {
  TensorView a = tensors.get(key, name(key));
  if (a.shape != shape) {
    throw std::invalid_argument(name(key) + " must have shape " + shape_string(shape) + ", got " +
                                shape_string(a.shape));
  }
  if (!a.contiguous) throw std::invalid_argument(name(key) + " must be C-contiguous");
  return a;
}

const float* ModelBuilder::get(const TensorSource& tensors, const std::string& key, const std::vector<long>& shape,
                               bool copy) {
  if (!tensors.contains(key)) throw std::invalid_argument("missing " + name(key));
  const TensorView view = tensors.get(key, name(key));
  if (view.type != ElementType::kFloat32)
    throw TypeError(name(key) + " must have dtype float32, got " + view.type_name);
  const TensorView a = checked(tensors, key, shape);
  const auto* data = static_cast<const float*>(a.data);
  if (!copy || a.size() == 0) return data;  // an empty table is never read
  AlignedBuffer<float> owned(static_cast<std::size_t>(a.size()));  // large: an anonymous mapping
  tensors.copy(owned.data(), data, static_cast<std::size_t>(a.size()) * sizeof(float));
  owned_.push_back(std::move(owned));  // moving keeps the data pointer
  return owned_.back().data();
}

WeightRef ModelBuilder::int4_weight(const TensorSource& tensors, const std::string& key, long n, long k,
                                    const WeightFormat& format) const {
  const long groups = int4_groups(k, format.group_size);
  const TensorView u = checked(tensors, key, {n, groups * format.group_size / 2});
  auto part = [&](const std::string& suffix) {
    const std::string part_key = key + suffix;
    if (!tensors.contains(part_key)) throw std::invalid_argument("missing " + name(part_key));
    return checked(tensors, part_key, {n, groups});
  };
  const TensorView s = part("_scale");
  if (s.type != ElementType::kFloat16 && s.type != ElementType::kUInt16) {
    throw TypeError(name(key + "_scale") + " must have dtype float16, got " + s.type_name);
  }
  const auto* scales = static_cast<const uint16_t*>(s.data);
  for (long i = 0; i < n * groups; ++i) {
    if ((scales[i] & 0x7FFFu) == 0x7C00u) {
      throw std::invalid_argument(name(key + "_scale") + " holds an infinite scale at flat index " + std::to_string(i) +
                                  "; the file is damaged");
    }
  }
  const uint8_t* zeros = nullptr;
  if (format.zero_point) {
    const TensorView z = part("_zero");
    if (z.type != ElementType::kUInt8)
      throw TypeError(name(key + "_zero") + " must have dtype uint8, got " + z.type_name);
    zeros = static_cast<const uint8_t*>(z.data);
    for (long i = 0; i < n * groups; ++i) {
      if (zeros[i] > 15) {
        throw std::invalid_argument(name(key + "_zero") + " holds " + std::to_string(zeros[i]) + " at flat index " +
                                    std::to_string(i) + "; int4 zero points are 0..15");
      }
    }
  } else if (tensors.contains(key + "_zero")) {
    throw std::invalid_argument(name(key + "_zero") + " is given but the model's int4 weights are symmetric");
  }
  return WeightRef(static_cast<const uint8_t*>(u.data), scales, zeros);
}

WeightRef ModelBuilder::matmul(const TensorSource& tensors, const std::string& key, long n, long k,
                               const WeightFormat& format) const {
  const WeightType type = format.type;
  if (!tensors.contains(key)) throw std::invalid_argument("missing " + name(key));
  if (tensors.get(key, name(key)).type == ElementType::kUInt8) {
    if (type != WeightType::kInt4) {
      throw TypeError(name(key) + " holds int4 nibbles but its dtype here is " + weight_type_name(type));
    }
    return int4_weight(tensors, key, n, k, format);
  }
  const TensorView a = checked(tensors, key, {n, k});
  switch (a.type) {
    case ElementType::kFloat32: return WeightRef(static_cast<const float*>(a.data));
    case ElementType::kInt8: {
      if (type != WeightType::kInt8) {
        throw TypeError(name(key) + " is int8 but the model's dtype is " + weight_type_name(type));
      }
      const std::string scale_key = key + "_scale";
      if (!tensors.contains(scale_key)) throw std::invalid_argument("missing " + name(scale_key));
      const TensorView s = checked(tensors, scale_key, {n});
      if (s.type != ElementType::kFloat32) {
        throw TypeError(name(scale_key) + " must have dtype float32, got " + s.type_name);
      }
      return WeightRef(a.data, WeightType::kInt8, static_cast<const float*>(s.data));
    }
    case ElementType::kUInt16:
      if (type != WeightType::kFloat16 && type != WeightType::kBFloat16) {
        throw TypeError(name(key) + " holds 16-bit words but the model's dtype is " + weight_type_name(type));
      }
      return WeightRef(a.data, type);
    default:
      throw TypeError(name(key) + " must have dtype float32, int8 (with a scale), uint8 (int4) or uint16, got " +
                      a.type_name);
  }
}

const float* ModelBuilder::vector(const TensorSource& tensors, const std::string& key, const std::vector<long>& shape,
                                  bool required, std::set<std::string>& used, bool copy) {
  used.insert(key);
  if (!required && !tensors.has(key)) return nullptr;
  return get(tensors, key, shape, copy);
}

LinearTensors ModelBuilder::linear(const TensorSource& tensors, const std::string& key, long n, long k, bool required,
                                   const TransformerConfig& c, std::set<std::string>& used) {
  LinearTensors out;
  used.insert(key);
  used.insert(key + "_scale");
  used.insert(key + "_zero");
  used.insert(key + ".bias");
  // (a bias without its weight: the LM head bias of a head tied to the embeddings)
  out.bias = tensors.has(key + ".bias") ? get(tensors, key + ".bias", {n}, false) : nullptr;
  const WeightFormat format = key == "lm_head" ? c.head_format() : c.matmul_format();
  if (required || tensors.has(key)) out.weight = matmul(tensors, key, n, k, format);
  return out;
}

NormTensors ModelBuilder::norm(const TensorSource& tensors, const std::string& key, long n, bool required,
                               std::set<std::string>& used) {
  NormTensors out;
  out.weight = vector(tensors, key, {n}, required, used);
  out.bias = vector(tensors, key + ".bias", {n}, false, used);
  return out;
}

void ModelBuilder::reject_unused(const TensorSource& tensors, const std::set<std::string>& used,
                                 const char* what) const {
  for (const std::string& key : tensors.keys()) {
    if (!used.count(key)) throw std::invalid_argument("unknown " + what_ + " " + what + " tensor '" + key + "'");
  }
}

StackTensors ModelBuilder::stack_tensors(const TensorSource& tensors, const TransformerConfig& c,
                                         const std::string& stack, std::set<std::string>& used) {
  const long H = c.hidden_size, E = c.embedding_width();
  const std::string p = stack + ".";
  StackTensors s;
  if (c.has_position_table()) {
    s.positions = vector(tensors, p + "embed.positions", {c.position_offset + c.max_positions, E}, true, used, true);
  }
  if (c.embedding_norm) s.embed_norm = norm(tensors, p + "embed.norm", E, true, used);
  if (c.final_norm) s.final_norm = norm(tensors, p + "final_norm", H, true, used);
  if (c.has_relative_bias()) {
    s.relative_bias = vector(tensors, p + "relative_bias", {c.num_buckets, c.num_heads}, true, used);
  }
  if (c.positions == Positions::kRope)
    s.rope_inv_freq = vector(tensors, p + "rope.inv_freq", {c.head_dim / 2}, true, used);
  if (c.positions == Positions::kRope && c.global_attention_every > 0)
    s.rope_local_inv_freq = vector(tensors, p + "rope.local_inv_freq", {c.head_dim / 2}, true, used);
  if (c.disentangled_attention()) {
    s.relative_embeddings = vector(tensors, p + "relative_embeddings", {2 * c.relative_span(), H}, true, used);
    if (c.relative_embedding_norm) s.relative_norm = norm(tensors, p + "relative_norm", H, true, used);
  }
  return s;
}

GlobalTensors ModelBuilder::global_tensors(const TensorSource& tensors, const TransformerConfig& c) {
  const long H = c.hidden_size, V = c.vocab_size, E = c.embedding_width();
  std::set<std::string> used;
  GlobalTensors g;
  // An int8 table is quantized from the source's rows while the model is built: no float32 copy.
  g.tokens = vector(tensors, "embed.tokens", {V, E}, true, used, c.embedding_dtype == WeightType::kFloat32);
  if (c.type_vocab_size > 0) {
    g.token_types = vector(tensors, "embed.token_types", {c.type_vocab_size, E}, true, used, true);
  }
  if (c.kind == ModelKind::kEncoder) {
    // required when the tables are narrower than the hidden size; optional otherwise (ALBERT has one either way)
    g.embed_project = linear(tensors, "embed.project", H, E, E != H, c, used);
    g.pooler = linear(tensors, "pooler", H, H, false, c, used);
    g.encoder = stack_tensors(tensors, c, "encoder", used);
  } else {
    // null weight: the head is tied to the token embeddings
    g.lm_head = linear(tensors, "lm_head", V, H, false, c, used);
    if (c.kind == ModelKind::kSeq2Seq) g.encoder = stack_tensors(tensors, c, "encoder", used);
    g.decoder = stack_tensors(tensors, c, "decoder", used);
  }
  reject_unused(tensors, used, "model");
  g.packed = packed_.get();
  return g;
}

BlockTensors ModelBuilder::block_tensors(const TensorSource& tensors, const TransformerConfig& c, bool cross,
                                         const std::string& layer) {
  const long H = c.hidden_size, I = c.intermediate_size, qw = c.q_width(), kvw = c.kv_width();
  std::set<std::string> used;
  BlockTensors b;
  b.q = linear(tensors, "attn.q", qw, H, true, c, used);
  b.k = linear(tensors, "attn.k", kvw, H, true, c, used);
  b.v = linear(tensors, "attn.v", kvw, H, true, c, used);
  b.o = linear(tensors, "attn.o", H, qw, true, c, used);
  // A pre-norm layer may have no attention norm (ModernBERT's first layer: the embedding norm
  // precedes it); its attention then reads h itself.
  b.attn_norm = norm(tensors, "attn_norm", H, !c.pre_norm, used);
  if (c.qk_norm) {
    b.q_norm = vector(tensors, "attn.q_norm", {c.head_dim}, true, used);
    b.k_norm = vector(tensors, "attn.k_norm", {c.head_dim}, true, used);
  }
  if (cross) {
    b.cross_q = linear(tensors, "cross.q", qw, H, true, c, used);
    b.cross_k = linear(tensors, "cross.k", kvw, H, true, c, used);
    b.cross_v = linear(tensors, "cross.v", kvw, H, true, c, used);
    b.cross_o = linear(tensors, "cross.o", H, qw, true, c, used);
    b.cross_norm = norm(tensors, "cross_norm", H, true, used);
  }
  if (c.gated_ffn) b.gate = linear(tensors, "ffn.gate", I, H, true, c, used);
  b.up = linear(tensors, "ffn.up", I, H, true, c, used);
  if (c.gated_ffn && (b.gate.bias || b.up.bias)) {
    // The gated feed-forward's fused [gate | up] projection has no bias (no family has one).
    throw std::invalid_argument(what_ +
                                " layer tensors 'ffn.gate.bias' / 'ffn.up.bias': a gated feed-forward has no bias");
  }
  b.down = linear(tensors, "ffn.down", H, I, true, c, used);
  b.ffn_norm = norm(tensors, "ffn_norm", H, true, used);
  if (c.disentangled_attention() && !c.share_attention_key) {
    if (c.position_to_content) b.position_q = linear(tensors, "attn.position_q", qw, H, true, c, used);
    if (c.content_to_position) b.position_k = linear(tensors, "attn.position_k", qw, H, true, c, used);
  }
  if (c.transformer_xl_attention) {
    b.position_k = linear(tensors, "attn.position_k", qw, H, true, c, used);
    b.content_bias = vector(tensors, "attn.content_bias", {qw}, true, used);
    b.position_bias = vector(tensors, "attn.position_bias", {qw}, true, used);
    b.segment_bias = vector(tensors, "attn.segment_bias", {qw}, true, used);
    b.segment_embed = vector(tensors, "attn.segment_embed", {2, qw}, true, used);
  }
  reject_unused(tensors, used, "layer");
  if (packed_ && !layer.empty()) {
    b.packed = packed_.get();
    b.packed_prefix = layer + ".";
  }
  return b;
}

}  // namespace cpuformer
