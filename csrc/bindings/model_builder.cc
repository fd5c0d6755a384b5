#include "bindings/model_builder.h"

namespace cpuformer {
namespace bindings {
namespace py = pybind11;

namespace {

bool present(const py::dict& tensors, const std::string& key) {
  return tensors.contains(key) && !tensors[py::str(key)].is_none();
}

}  // namespace

const float* ModelBuilder::vector(const py::dict& tensors, const std::string& key, const std::vector<long>& shape,
                                  bool required, std::set<std::string>& used, bool copy) {
  used.insert(key);
  if (!required && !present(tensors, key)) return nullptr;
  return get(tensors, key, shape, copy);
}

LinearTensors ModelBuilder::linear(const py::dict& tensors, const std::string& key, long n, long k, bool required,
                                   const TransformerConfig& c, std::set<std::string>& used) {
  LinearTensors out;
  used.insert(key);
  used.insert(key + "_scale");
  used.insert(key + "_zero");
  used.insert(key + ".bias");
  // (a bias without its weight: the LM head bias of a head tied to the embeddings)
  out.bias = present(tensors, key + ".bias") ? get(tensors, key + ".bias", {n}) : nullptr;
  const WeightFormat format = key == "lm_head" ? c.head_format() : c.matmul_format();
  if (required || present(tensors, key)) out.weight = matmul(tensors, key, n, k, format);
  return out;
}

NormTensors ModelBuilder::norm(const py::dict& tensors, const std::string& key, long n, bool required,
                               std::set<std::string>& used) {
  NormTensors out;
  out.weight = vector(tensors, key, {n}, required, used);
  out.bias = vector(tensors, key + ".bias", {n}, false, used);
  return out;
}

void ModelBuilder::reject_unused(const py::dict& tensors, const std::set<std::string>& used, const char* what) const {
  for (const auto& item : tensors) {
    const std::string key = item.first.cast<std::string>();
    if (!used.count(key)) throw py::value_error("unknown " + what_ + " " + what + " tensor '" + key + "'");
  }
}

StackTensors ModelBuilder::stack_tensors(const py::dict& tensors, const TransformerConfig& c, const std::string& stack,
                                         std::set<std::string>& used) {
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

GlobalTensors ModelBuilder::global_tensors(const py::dict& tensors, const TransformerConfig& c) {
  const long H = c.hidden_size, V = c.vocab_size, E = c.embedding_width();
  std::set<std::string> used;
  GlobalTensors g;
  // An int8 table is quantized from the dict's rows while the model is built: no float32 copy.
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
  return g;
}

BlockTensors ModelBuilder::block_tensors(const py::dict& tensors, const TransformerConfig& c, bool cross) {
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
    throw py::value_error(what_ + " layer tensors 'ffn.gate.bias' / 'ffn.up.bias': a gated feed-forward has no bias");
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
  return b;
}

}  // namespace bindings
}  // namespace cpuformer
