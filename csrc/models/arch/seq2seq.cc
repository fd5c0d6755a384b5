// The encoder-decoder families: BART, mBART, Marian, M2M100 / NLLB, T5 and mT5.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "models/arch/arch.h"
#include "models/config_reader.h"
#include "models/request_checks.h"

namespace cpuformer {
namespace arch {
namespace {

// Hugging Face activation names -> cpuformer's (the seq2seq families accept all of them).
const std::vector<std::pair<std::string, std::string>>& activations() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"relu", "relu"},           {"gelu", "gelu"},  {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"},
      {"gelu_fast", "gelu_tanh"}, {"swish", "silu"}, {"silu", "silu"}};
  return table;
}

const std::string* activation_of(const std::string& name) {
  for (const auto& entry : activations())
    if (entry.first == name) return &entry.second;
  return nullptr;
}

std::string sorted_activation_names() {
  std::vector<std::string> names;
  for (const auto& entry : activations()) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// config.get(key, fallback) as Python reads it: the member when present (null included), else the
// fallback; then its truthiness.
bool get_truthy(const Config& config, const std::string& key, bool fallback) {
  const Json* v = config.raw(key);
  return v ? truthy(v) : fallback;
}

// ---- BART, mBART, Marian -------------------------------------------------------------------------
// Encoder-decoders with learned positions (the first two rows reserved), a norm over the
// embeddings and, for mBART, pre-norm layers with a final norm per stack. Marian is the same
// network with sinusoidal positions, no norm over the embeddings and scaled embeddings.

class Bart : public Arch {
 public:
  Bart() {
    kind = "seq2seq";
    family = "bart";
    title = "BART";
    architectures = {"BartForConditionalGeneration"};
    model_types = {"bart"};
    prefixes = {"model.", ""};
    // The encoder's and decoder's embed_tokens are the shared table (tied copies).
    ignored = {R"((model\.)?(encoder|decoder)\.embed_tokens\.weight)"};
    tied_copies = {{"encoder.embed_tokens.weight", "shared.weight"}, {"decoder.embed_tokens.weight", "shared.weight"}};
    example = "{}";
  }

  bool pre_norm = false;

  // Family-specific refusals.
  virtual void check(const Config&) const {}

  TransformerConfig hparams(const Config& config) const override {
    // (aliases: transformers' Marian/Bart/MBartConfig.attribute_map)
    const long d = config_int(config, "d_model", IntRule().otherwise(1024).alias("hidden_size"));
    const long heads =
        config_int(config, "encoder_attention_heads", IntRule().otherwise(16).alias("num_attention_heads"));
    not_supported(config_int(config, "decoder_attention_heads", IntRule().otherwise(heads)) != heads,
                  "encoder_attention_heads != decoder_attention_heads is not supported");
    const long ffn = config_int(config, "encoder_ffn_dim", IntRule().otherwise(4096));
    not_supported(config_int(config, "decoder_ffn_dim", IntRule().otherwise(ffn)) != ffn,
                  "encoder_ffn_dim != decoder_ffn_dim is not supported");
    if (d % heads) {
      throw std::invalid_argument("config.json: d_model " + std::to_string(d) +
                                  " is not a multiple of encoder_attention_heads " + std::to_string(heads));
    }
    const Json* act = config.raw("activation_function");
    const Json gelu = Json::make_string("gelu");
    if (!act) act = &gelu;
    const std::string* activation = act->type() == Json::Type::kString ? activation_of(act->string()) : nullptr;
    not_supported(!activation, "activation_function " + describe(*act) + " is not supported; use one of " +
                                   sorted_activation_names());
    check(config);
    const bool marian = family == "marian";
    TransformerConfig c;
    c.kind = ModelKind::kSeq2Seq;
    c.vocab_size = config_int(config, "vocab_size");
    c.hidden_size = d;
    c.num_layers = config_int(config, "encoder_layers", IntRule().otherwise(12).alias("num_hidden_layers"));
    c.num_decoder_layers = config_int(config, "decoder_layers", IntRule().otherwise(12));
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = d / heads;
    c.intermediate_size = ffn;
    c.norm = NormKind::kLayer;
    c.norm_eps = 1e-5f;
    c.pre_norm = pre_norm;
    c.activation = parse_config_choice<Activation>(*activation, "activation");
    c.gated_ffn = false;
    c.positions = marian ? Positions::kSinusoidal : Positions::kLearned;
    c.max_positions = config_int(config, "max_position_embeddings", IntRule().otherwise(1024));
    c.position_offset = marian ? 0 : 2;
    c.embedding_norm = !marian;
    c.final_norm = pre_norm;
    c.embed_scale =
        get_truthy(config, "scale_embedding", marian) ? static_cast<float>(std::sqrt(static_cast<double>(d))) : 1.0f;
    c.attention_scale = static_cast<float>(std::pow(static_cast<double>(d / heads), -0.5));
    c.tie_word_embeddings = !config.is_false("tie_word_embeddings");
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    TensorDecl tokens("shared.weight");
    tokens.fallbacks = {"encoder.embed_tokens.weight"};
    s.add("embed.tokens", tokens);
    s.add("lm_head", TensorDecl("lm_head.weight").from_root().may_be_absent());
    TensorDecl bias("final_logits_bias");
    bias.root = bias.optional = bias.as_row = true;
    s.add("lm_head.bias", bias);
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig& hp, const std::string& stack) const override {
    Sources s;
    s.add("embed.positions", TensorDecl(stack + ".embed_positions.weight"));
    s.weight_and_bias("embed.norm", stack + ".layernorm_embedding");
    if (hp.final_norm) s.weight_and_bias("final_norm", stack + ".layer_norm");
    return s;
  }

  Sources layer_tensors(const TransformerConfig&, const std::string& stack, long layer) const override {
    const std::string p = stack + ".layers." + std::to_string(layer) + ".";
    Sources s;
    std::vector<std::pair<std::string, std::string>> attentions = {{"attn", "self_attn"}};
    if (stack == "decoder") attentions.push_back({"cross", "encoder_attn"});
    for (const auto& a : attentions) {
      for (const auto& proj :
           {std::pair<const char*, const char*>{"q", "q_proj"}, {"k", "k_proj"}, {"v", "v_proj"}, {"o", "out_proj"}})
        s.weight_and_bias(a.first + "." + proj.first, p + a.second + "." + proj.second, Sources::kOptional);
      s.weight_and_bias(a.first + "_norm", p + a.second + "_layer_norm");
    }
    s.weight_and_bias("ffn.up", p + "fc1", Sources::kOptional);
    s.weight_and_bias("ffn.down", p + "fc2", Sources::kOptional);
    s.weight_and_bias("ffn_norm", p + "final_layer_norm");
    return s;
  }
};

class MBart : public Bart {
 public:
  MBart() {
    family = "mbart";
    title = "mBART";
    architectures = {"MBartForConditionalGeneration"};
    model_types = {"mbart"};
    pre_norm = true;
  }
};

// Marian's position table [n_pos, dim]: sin of pos / 10000^(2·(j//2)/dim) over the even j in the
// first half, cos over the odd j in the second (not interleaved); float64, rounded once.
std::vector<float> sinusoidal_positions(long n_pos, long dim) {
  std::vector<float> out(static_cast<std::size_t>(n_pos * dim));
  const long sentinel = dim % 2 == 0 ? dim / 2 : dim / 2 + 1;
  for (long pos = 0; pos < n_pos; ++pos) {
    for (long c = 0; c < dim; ++c) {
      const long j = c < sentinel ? 2 * c : 2 * (c - sentinel) + 1;
      const double angle = static_cast<double>(pos) / std::pow(10000.0, static_cast<double>(2 * (j / 2)) / dim);
      out[pos * dim + c] = static_cast<float>(c < sentinel ? std::sin(angle) : std::cos(angle));
    }
  }
  return out;
}

class Marian : public Bart {
 public:
  Marian() {
    family = "marian";
    title = "Marian";
    architectures = {"MarianMTModel"};
    model_types = {"marian"};
    // embed_positions: the sinusoidal table some checkpoints save (computed from the config here).
    ignored.push_back(R"((model\.)?(encoder|decoder)\.embed_positions\.weight)");
    example = R"({"activation_function": "swish", "scale_embedding": true, )"
              R"("share_encoder_decoder_embeddings": true, "tie_word_embeddings": true})";
  }
  void check(const Config& config) const override {
    not_supported(config.is_false("share_encoder_decoder_embeddings"),
                  "share_encoder_decoder_embeddings=false (separate source and target vocabularies) is not supported");
  }
  Sources stack_tensors(const Config&, const TransformerConfig& hp, const std::string&) const override {
    Sources s;
    s.add("embed.positions", {hp.max_positions, hp.hidden_size},
          sinusoidal_positions(hp.max_positions, hp.hidden_size));
    return s;
  }
};

// fairseq's (tensor2tensor's) sinusoidal table [n_pos, dim], as transformers'
// M2M100SinusoidalPositionalEmbedding.get_embedding computes it in float32: sin of
// pos · exp(-j · ln(10000) / (half - 1)) over the first half, cos over the second, a zero column
// when dim is odd, and row padding_idx zero. exp, sin and cos are rounded once from float64.
std::vector<float> fairseq_positions(long n_pos, long dim, long padding_idx) {
  const long half = dim / 2;
  if (half < 2) {
    throw std::invalid_argument("config.json: d_model " + std::to_string(dim) +
                                " is too small for sinusoidal positions (at least 4)");
  }
  const double step = std::log(10000.0) / static_cast<double>(half - 1);
  const float neg_step = static_cast<float>(-step);
  std::vector<float> freq(static_cast<std::size_t>(half));
  for (long j = 0; j < half; ++j) {
    const float e = static_cast<float>(j) * neg_step;
    freq[j] = static_cast<float>(std::exp(static_cast<double>(e)));
  }
  std::vector<float> out(static_cast<std::size_t>(n_pos * dim), 0.0f);
  for (long pos = 0; pos < n_pos; ++pos) {
    if (pos == padding_idx) continue;
    for (long j = 0; j < half; ++j) {
      const double angle = static_cast<double>(static_cast<float>(pos) * freq[j]);
      out[pos * dim + j] = static_cast<float>(std::sin(angle));
      out[pos * dim + half + j] = static_cast<float>(std::cos(angle));
    }
  }
  return out;
}

// M2M100 and NLLB: mBART's pre-norm network without a norm over the embeddings, with fairseq's
// sinusoidal positions (never stored) and ReLU. transformers numbers the positions from the input
// ids (row pad_token_id + 1 + t for the t-th non-pad token): position_offset = pad_token_id + 1.
class M2M100 : public MBart {
 public:
  M2M100() {
    family = "m2m100";
    title = "M2M100 / NLLB";
    architectures = {"M2M100ForConditionalGeneration"};
    model_types = {"m2m_100"};
    // embed_positions: the sinusoidal table (a buffer some converted checkpoints saved).
    ignored.push_back(R"((model\.)?(encoder|decoder)\.embed_positions\..*)");
    example = R"({"activation_function": "relu", "scale_embedding": true, "pad_token_id": 1, "bos_token_id": 0, )"
              R"("eos_token_id": 2, "decoder_start_token_id": 2})";
  }
  TransformerConfig hparams(const Config& config) const override {
    // transformers 5 unties the encoder's and decoder's embed_tokens from the shared table too when
    // tie_word_embeddings is false (released M2M100 / NLLB checkpoints are all tied).
    not_supported(config.is_false("tie_word_embeddings"),
                  "tie_word_embeddings=false (separate encoder, decoder and output embedding tables) is not "
                  "supported");
    // transformers' M2M100Config defaults: relu, scale_embedding, pad 1, a tied head.
    Json::Object members = {{"activation_function", Json::make_string("relu")},
                            {"scale_embedding", Json::make_bool(true)}};
    for (const auto& item : config.json.object())
      if (!item.second.is_null()) members.push_back(item);
    const Json merged = Json::make_object(std::move(members));
    TransformerConfig c = MBart::hparams(Config{merged, config.source});
    const long pad = config_int(config, "pad_token_id", IntRule().otherwise(1));
    c.positions = Positions::kSinusoidal;
    c.position_offset = pad + 1;
    c.pad_token_id = pad;
    c.embedding_norm = false;
    c.embed_scale = get_truthy(config, "scale_embedding", true)
                        ? static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)))
                        : 1.0f;
    return c;
  }
  Sources model_tensors(const Config& config, const TransformerConfig& hp) const override {
    Sources all = MBart::model_tensors(config, hp), s;
    for (const auto& item : all.items())  // no final_logits_bias
      if (item.first != "lm_head.bias") s.add(item.first, item.second.tensor);
    return s;
  }
  Sources stack_tensors(const Config&, const TransformerConfig& hp, const std::string& stack) const override {
    Sources s;
    const long rows = hp.max_positions + hp.position_offset;
    s.add("embed.positions", {rows, hp.hidden_size}, fairseq_positions(rows, hp.hidden_size, hp.pad_token_id));
    s.weight_and_bias("final_norm", stack + ".layer_norm");
    return s;
  }
};

// ---- T5 and mT5 ----------------------------------------------------------------------------------
// Pre-norm RMSNorm encoder-decoders with a bucketed relative position bias (one table per stack,
// in its first layer), unscaled attention, a ReLU (v1.0) or gated-GELU (v1.1, flan-T5, mT5)
// feed-forward, and a tied head scaled by d_model^-0.5 or an untied head.

class T5 : public Arch {
 public:
  T5() {
    kind = "seq2seq";
    family = "t5";
    title = "T5";
    architectures = {"T5ForConditionalGeneration"};
    model_types = {"t5"};
    // The encoder's and decoder's embed_tokens are the shared table (tied copies).
    ignored = {R"((encoder|decoder)\.embed_tokens\.weight)"};
    start_from_pad = true;
    example = "{}";
  }

  // T5's feed_forward_proj ("relu", "gated-gelu", ...) as (activation, gated).
  static std::pair<Activation, bool> feed_forward(const Config& config) {
    const Json* proj_value = config.raw("feed_forward_proj");
    const Json relu = Json::make_string("relu");
    if (!proj_value) proj_value = &relu;
    if (proj_value->type() != Json::Type::kString) {
      throw std::invalid_argument("config.json: feed_forward_proj must be a string, got " + describe(*proj_value));
    }
    const std::string& proj = proj_value->string();
    std::vector<std::string> parts;
    std::size_t start = 0;
    for (std::size_t dash; (dash = proj.find('-', start)) != std::string::npos; start = dash + 1)
      parts.push_back(proj.substr(start, dash - start));
    parts.push_back(proj.substr(start));
    const bool gated = parts.size() == 2 && parts[0] == "gated";
    std::string act = parts.back();
    if (parts.size() > 2 || (parts.size() == 2 && !gated) || !activation_of(act)) {
      throw NotSupported("config.json: feed_forward_proj " + python_string(proj) +
                         " is not supported; use 'relu', 'gated-gelu' or '[gated-]<activation>' with an activation "
                         "among " +
                         sorted_activation_names());
    }
    if (proj == "gated-gelu") act = "gelu_new";  // transformers maps T5's "gated-gelu" to the tanh approximation
    return {parse_config_choice<Activation>(*activation_of(act), "activation"), gated};
  }

  TransformerConfig hparams(const Config& config) const override {
    // (aliases: transformers' T5Config.attribute_map)
    const long d = config_int(config, "d_model", IntRule().otherwise(512).alias("hidden_size"));
    const long heads = config_int(config, "num_heads", IntRule().otherwise(8).alias("num_attention_heads"));
    const auto [activation, gated] = feed_forward(config);
    const long num_layers = config_int(config, "num_layers", IntRule().otherwise(6).alias("num_hidden_layers"));
    // The bucket formula (transformers' T5Attention._relative_position_bucket,
    // csrc/layers/relative_position.cc) gives distances below max_exact their own bucket and larger
    // ones max_exact + log(distance / max_exact) / log(max_distance / max_exact) * (buckets -
    // max_exact), with buckets and max_exact = buckets // 2 halved for the encoder's bidirectional
    // attention (num_buckets // 2, num_buckets // 4) and not for the decoder's causal one.
    // max_exact = 0 divides by zero (a NaN bucket); max_distance <= max_exact makes the
    // denominator zero or negative (NaN or negative buckets, reads before the table). Hence
    // num_buckets >= 4 and max_distance > num_buckets // 2.
    IntRule buckets_rule = IntRule().otherwise(32).at_least(4);
    buckets_rule.note = " (the encoder's bidirectional buckets need num_buckets // 4 >= 1)";
    const long num_buckets = config_int(config, "relative_attention_num_buckets", buckets_rule);
    IntRule distance_rule = IntRule().otherwise(128).at_least(num_buckets / 2 + 1);
    distance_rule.note = " (more than relative_attention_num_buckets // 2 = " + std::to_string(num_buckets / 2) +
                         ", the decoder's exactly bucketed distances)";
    const long max_distance = config_int(config, "relative_attention_max_distance", distance_rule);
    const bool has_decoder_layers = config.get("num_decoder_layers") != nullptr;
    const bool tied = !config.is_false("tie_word_embeddings");
    // transformers 5 records the d_model^-0.5 output scaling of tied (v1.0) heads as
    // scale_decoder_outputs; older configs imply it by tie_word_embeddings. mT5 never scales.
    const Json* scale_value = config.raw("scale_decoder_outputs");
    const bool scale_setting =
        scale_value ? !(scale_value->type() == Json::Type::kBool && !scale_value->boolean()) : tied;
    const bool scaled = family == "t5" && scale_setting;
    TransformerConfig c;
    c.kind = ModelKind::kSeq2Seq;
    c.vocab_size = config_int(config, "vocab_size", IntRule().otherwise(32128));
    c.hidden_size = d;
    c.num_layers = num_layers;
    c.num_decoder_layers = has_decoder_layers ? config_int(config, "num_decoder_layers") : num_layers;
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = config_int(config, "d_kv", IntRule().otherwise(64).alias("head_dim"));
    c.intermediate_size = config_int(config, "d_ff", IntRule().otherwise(2048));
    c.norm = NormKind::kRms;
    c.norm_eps =
        static_cast<float>(config_float(config, "layer_norm_epsilon", FloatRule().otherwise(1e-6).at_least(0.0)));
    c.pre_norm = true;
    c.activation = activation;
    c.gated_ffn = gated;
    c.positions = Positions::kRelative;
    c.max_positions = 0;
    c.final_norm = true;
    c.attention_scale = 1.0f;
    c.num_buckets = num_buckets;
    c.max_distance = max_distance;
    c.tie_word_embeddings = tied;
    c.head_scale = scaled ? static_cast<float>(std::pow(static_cast<double>(d), -0.5)) : 1.0f;
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    TensorDecl tokens("shared.weight");
    tokens.fallbacks = {"encoder.embed_tokens.weight"};
    s.add("embed.tokens", tokens);
    s.add("lm_head", TensorDecl("lm_head.weight").may_be_absent());
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig&, const std::string& stack) const override {
    Sources s;
    s.add("relative_bias", TensorDecl(stack + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight"));
    s.add("final_norm", TensorDecl(stack + ".final_layer_norm.weight"));
    return s;
  }

  Sources layer_tensors(const TransformerConfig& hp, const std::string& stack, long layer) const override {
    const std::string p = stack + ".block." + std::to_string(layer) + ".layer.";
    Sources s;
    for (const char* key : {"q", "k", "v", "o"})
      s.add(std::string("attn.") + key, TensorDecl(p + "0.SelfAttention." + key + ".weight"));
    s.add("attn_norm", TensorDecl(p + "0.layer_norm.weight"));
    int ffn = 1;
    if (stack == "decoder") {
      for (const char* key : {"q", "k", "v", "o"})
        s.add(std::string("cross.") + key, TensorDecl(p + "1.EncDecAttention." + key + ".weight"));
      s.add("cross_norm", TensorDecl(p + "1.layer_norm.weight"));
      ffn = 2;
    }
    const std::string dense = p + std::to_string(ffn) + ".DenseReluDense.";
    if (hp.gated_ffn) {
      s.add("ffn.gate", TensorDecl(dense + "wi_0.weight"));
      s.add("ffn.up", TensorDecl(dense + "wi_1.weight"));
    } else {
      s.add("ffn.up", TensorDecl(dense + "wi.weight"));
    }
    s.add("ffn.down", TensorDecl(dense + "wo.weight"));
    s.add("ffn_norm", TensorDecl(p + std::to_string(ffn) + ".layer_norm.weight"));
    return s;
  }
};

class MT5 : public T5 {
 public:
  MT5() {
    family = "mt5";
    title = "mT5";
    architectures = {"MT5ForConditionalGeneration"};
    model_types = {"mt5"};
  }
};

}  // namespace

void register_seq2seq(std::vector<std::unique_ptr<Arch>>& out) {
  out.push_back(std::make_unique<Marian>());
  out.push_back(std::make_unique<Bart>());
  out.push_back(std::make_unique<MBart>());
  out.push_back(std::make_unique<M2M100>());
  out.push_back(std::make_unique<T5>());
  out.push_back(std::make_unique<MT5>());
}

}  // namespace arch
}  // namespace cpuformer
