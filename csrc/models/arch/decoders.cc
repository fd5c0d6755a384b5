// The decoder families: GPT-2 and the Llama family (Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3).
#include <cmath>
#include <stdexcept>

#include "models/arch/arch.h"
#include "models/config_reader.h"

namespace cpuformer {
namespace arch {
namespace {

TransformerConfig decoder_config() {
  TransformerConfig c;
  c.kind = ModelKind::kDecoder;
  return c;
}

// ---- GPT-2 ---------------------------------------------------------------------------------
// A pre-norm decoder with learned positions and Conv1D projections (weights stored [in, out],
// transposed once at load) whose query, key and value share one fused tensor.

class GPT2 : public Arch {
 public:
  GPT2() {
    kind = "decoder";
    family = "gpt2";
    title = "GPT-2";
    architectures = {"GPT2LMHeadModel", "GPT2Model"};
    model_types = {"gpt2"};
    prefixes = {"transformer.", ""};
    // attn.bias / attn.masked_bias: the causal-mask buffers older checkpoints saved.
    ignored = {R"((transformer\.)?h\.\d+\.attn\.(masked_)?bias)"};
    example = R"({"activation_function": "gelu_new", "layer_norm_epsilon": 1e-05})";
  }

  TransformerConfig hparams(const Config& config) const override {
    // (aliases: transformers' GPT2Config.attribute_map)
    const long hidden = config_int(config, "n_embd", IntRule().otherwise(768).alias("hidden_size"));
    const std::string activation = mapped(config, "activation_function", "gelu_new",
                                          {{"gelu_new", "gelu_tanh"},
                                           {"gelu_pytorch_tanh", "gelu_tanh"},
                                           {"gelu", "gelu"},
                                           {"relu", "relu"},
                                           {"gelu_fast", "gelu_tanh"}});
    for (const char* flag : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
      not_supported(config.truthy(flag), std::string(flag) + "=true is not supported");
    not_supported(config.is_false("scale_attn_weights"), "scale_attn_weights=false is not supported");
    const long heads = config_int(config, "n_head", IntRule().otherwise(12).alias("num_attention_heads"));
    if (hidden % heads) {
      throw std::invalid_argument("config.json: n_embd " + std::to_string(hidden) + " is not a multiple of n_head " +
                                  std::to_string(heads));
    }
    TransformerConfig c = decoder_config();
    c.vocab_size = config_int(config, "vocab_size", IntRule().otherwise(50257));
    c.hidden_size = hidden;
    c.num_layers = config_int(config, "n_layer", IntRule().otherwise(12).alias("num_hidden_layers"));
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = hidden / heads;
    c.intermediate_size = config.get("n_inner") ? config_int(config, "n_inner") : 4 * hidden;
    c.norm = NormKind::kLayer;
    c.norm_eps =
        static_cast<float>(config_float(config, "layer_norm_epsilon", FloatRule().otherwise(1e-5).at_least(0.0)));
    c.pre_norm = true;
    c.activation = parse_config_choice<Activation>(activation, "activation");
    c.gated_ffn = false;
    c.positions = Positions::kLearned;
    c.max_positions = config_int(config, "n_positions", IntRule().otherwise(1024).alias("max_position_embeddings"));
    c.final_norm = true;
    c.tie_word_embeddings = !config.is_false("tie_word_embeddings");
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("wte.weight"));
    s.add("lm_head", TensorDecl("lm_head.weight").from_root().may_be_absent());
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig&, const std::string&) const override {
    Sources s;
    s.add("embed.positions", TensorDecl("wpe.weight"));
    s.weight_and_bias("final_norm", "ln_f");
    return s;
  }

  Sources layer_tensors(const TransformerConfig& hp, const std::string&, long layer) const override {
    const std::string p = "h." + std::to_string(layer) + ".";
    const long H = hp.hidden_size;
    Sources s;
    const char* qkv[] = {"attn.q", "attn.k", "attn.v"};
    for (long i = 0; i < 3; ++i)  // row blocks of the fused c_attn
      s.weight_and_bias(qkv[i], p + "attn.c_attn", Sources::kRequired,
                        TensorDecl().transposed().rows(i * H, (i + 1) * H));
    s.weight_and_bias("attn.o", p + "attn.c_proj", Sources::kRequired, TensorDecl().transposed());
    s.weight_and_bias("ffn.up", p + "mlp.c_fc", Sources::kRequired, TensorDecl().transposed());
    s.weight_and_bias("ffn.down", p + "mlp.c_proj", Sources::kRequired, TensorDecl().transposed());
    s.weight_and_bias("attn_norm", p + "ln_1");
    s.weight_and_bias("ffn_norm", p + "ln_2");
    return s;
  }
};

// ---- the Llama family ------------------------------------------------------------------------
// Pre-norm RMSNorm decoders with rotary positions, grouped-query attention and a SwiGLU
// feed-forward: Llama, Mistral (sliding window), Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm).

class Llama : public Arch {
 public:
  Llama() {
    kind = "decoder";
    family = "llama";
    title = "Llama";
    architectures = {"LlamaForCausalLM"};
    model_types = {"llama"};
    // rotary_emb.inv_freq: a buffer older checkpoints saved (recomputed from the config here).
    ignored = {R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)"};
    example = "{}";
  }

  // What the families built on this layout change (Gemma, Phi-3, ...).
  long default_max_positions = 2048;
  bool qk_norm = false;

  virtual long window(const Config&) const { return 0; }
  virtual Activation activation(const Config& config) const {
    const Json* act = config.raw("hidden_act");
    if (act && !(act->type() == Json::Type::kString && act->string() == "silu")) {
      throw std::invalid_argument("config.json: hidden_act " + describe(*act) +
                                  " is not supported; the Llama family uses 'silu'");
    }
    return Activation::kSilu;
  }
  virtual long default_head_dim(long hidden, long heads) const { return hidden / heads; }
  virtual float embed_scale(long) const { return 1.0f; }
  virtual bool tied(const Config& config) const { return config.truthy("tie_word_embeddings"); }
  // Family-specific refusals.
  virtual void check(const Config& config) const {
    not_supported(config.truthy("mlp_bias"), "MLP biases (mlp_bias=true) are not supported");
  }
  virtual bool plus_one_norms() const { return false; }

  TransformerConfig hparams(const Config& config) const override {
    check(config);
    const long hidden = config_int(config, "hidden_size");
    const long heads = config_int(config, "num_attention_heads");
    const long kv_heads = config_int(config, "num_key_value_heads", IntRule().otherwise(heads));
    const long head_dim = config.get("head_dim") ? config_int(config, "head_dim") : default_head_dim(hidden, heads);
    if (heads % kv_heads) {
      throw std::invalid_argument("config.json: num_attention_heads " + std::to_string(heads) +
                                  " is not a multiple of num_key_value_heads " + std::to_string(kv_heads));
    }
    if (head_dim % 2) {
      throw std::invalid_argument("config.json: RoPE needs an even head_dim, got " + std::to_string(head_dim));
    }
    TransformerConfig c = decoder_config();
    c.vocab_size = config_int(config, "vocab_size");
    c.hidden_size = hidden;
    c.num_layers = config_int(config, "num_hidden_layers");
    c.num_heads = heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.intermediate_size = config_int(config, "intermediate_size");
    c.norm = NormKind::kRms;
    c.norm_eps = static_cast<float>(config_float(config, "rms_norm_eps", FloatRule().otherwise(1e-6).at_least(0.0)));
    c.pre_norm = true;
    c.activation = activation(config);
    c.gated_ffn = true;
    c.positions = Positions::kRope;
    c.max_positions = config_int(config, "max_position_embeddings", IntRule().otherwise(default_max_positions));
    c.final_norm = true;
    c.embed_scale = embed_scale(hidden);
    c.sliding_window = window(config);
    c.qk_norm = qk_norm;
    c.tie_word_embeddings = tied(config);
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("model.embed_tokens.weight"));
    s.add("lm_head", TensorDecl("lm_head.weight").may_be_absent());
    return s;
  }

  Sources stack_tensors(const Config& config, const TransformerConfig& hp, const std::string&) const override {
    Sources s;
    s.add("rope.inv_freq", {hp.head_dim / 2}, rope_inv_freq(config, hp.head_dim));
    TensorDecl norm("model.norm.weight");
    norm.plus_one = plus_one_norms();
    s.add("final_norm", norm);
    return s;
  }

  Sources layer_tensors(const TransformerConfig& hp, const std::string&, long layer) const override {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    Sources s;
    const char* names[][2] = {{"attn.q", "q_proj"}, {"attn.k", "k_proj"}, {"attn.v", "v_proj"}, {"attn.o", "o_proj"}};
    for (const auto& n : names) s.weight_and_bias(n[0], p + "self_attn." + n[1], Sources::kOptional);
    // No MLP biases: the family has them only with mlp_bias, which hparams refuses, so a stray
    // up_proj.bias is named as unused rather than silently dropped by the gated feed-forward.
    s.add("ffn.gate", TensorDecl(p + "mlp.gate_proj.weight"));
    s.add("ffn.up", TensorDecl(p + "mlp.up_proj.weight"));
    s.add("ffn.down", TensorDecl(p + "mlp.down_proj.weight"));
    add_norms(s, p);
    if (hp.qk_norm) {
      s.add("attn.q_norm", TensorDecl(p + "self_attn.q_norm.weight"));
      s.add("attn.k_norm", TensorDecl(p + "self_attn.k_norm.weight"));
    }
    return s;
  }

 protected:
  void add_norms(Sources& s, const std::string& p) const {
    TensorDecl attn(p + "input_layernorm.weight"), ffn(p + "post_attention_layernorm.weight");
    attn.plus_one = ffn.plus_one = plus_one_norms();
    s.add("attn_norm", attn);
    s.add("ffn_norm", ffn);
  }
};

class Mistral : public Llama {
 public:
  Mistral() {
    family = "mistral";
    title = "Mistral";
    architectures = {"MistralForCausalLM"};
    model_types = {"mistral"};
  }
  long window(const Config& config) const override {
    return config.get("sliding_window") ? config_int(config, "sliding_window") : 0;
  }
};

class Qwen2 : public Llama {
 public:
  Qwen2() {
    family = "qwen2";
    title = "Qwen2";
    architectures = {"Qwen2ForCausalLM"};
    model_types = {"qwen2"};
  }
  long window(const Config& config) const override {
    not_supported(config.truthy("use_sliding_window") && config.truthy("sliding_window"),
                  "use_sliding_window=true (per-layer sliding windows) is not supported");
    return 0;
  }
};

class Qwen3 : public Qwen2 {
 public:
  Qwen3() {
    family = "qwen3";
    title = "Qwen3";
    architectures = {"Qwen3ForCausalLM"};
    model_types = {"qwen3"};
    qk_norm = true;
  }
};

// Gemma: the Llama layout with the embeddings multiplied by √hidden_size, a GeGLU feed-forward
// (tanh-approximated GELU) and RMSNorms that multiply by 1 + w (the checkpoint stores w). The head
// is tied by default, and head_dim is a config key of its own (256 by default).
class Gemma : public Llama {
 public:
  Gemma() {
    family = "gemma";
    title = "Gemma";
    architectures = {"GemmaForCausalLM"};
    model_types = {"gemma"};
    default_max_positions = 8192;  // GemmaConfig's defaults, like head_dim's
  }
  void check(const Config& config) const override {
    Llama::check(config);
    not_supported(config.truthy("use_bidirectional_attention"),
                  "use_bidirectional_attention=true (Gemma as a bidirectional encoder) is not supported");
  }
  Activation activation(const Config& config) const override {
    // transformers 5 runs hidden_act and reads "gelu" as the tanh approximation (the legacy value
    // of the official releases, meant as tanh); transformers 4 ran hidden_activation when present.
    mapped(config, "hidden_act", "gelu_pytorch_tanh",
           {{"gelu_pytorch_tanh", "gelu_tanh"}, {"gelu_new", "gelu_tanh"}, {"gelu", "gelu_tanh"}}, " by Gemma");
    if (config.get("hidden_activation")) {
      mapped(config, "hidden_activation", "", {{"gelu_pytorch_tanh", "gelu_tanh"}, {"gelu_new", "gelu_tanh"}},
             " by Gemma");
    }
    return Activation::kGeluTanh;
  }
  long default_head_dim(long, long) const override { return 256; }
  // transformers multiplies by torch.tensor(hidden_size ** 0.5): the float32 rounding of √hidden.
  float embed_scale(long hidden) const override { return static_cast<float>(std::sqrt(static_cast<double>(hidden))); }
  bool tied(const Config& config) const override { return !config.is_false("tie_word_embeddings"); }
  bool plus_one_norms() const override { return true; }
};

// Phi-3: the Llama mathematics with fused checkpoint tensors. qkv_proj holds the query, key and
// value rows one after the other ([num_heads·D | num_kv_heads·D | num_kv_heads·D]) and gate_up_proj
// the gate and up rows ([I | I]). Attention uses config.sliding_window as Mistral does. Only the
// short-context models are supported: their RoPE is the default one.
class Phi3 : public Mistral {
 public:
  Phi3() {
    family = "phi3";
    title = "Phi-3";
    architectures = {"Phi3ForCausalLM"};
    model_types = {"phi3"};
  }
  void check(const Config& config) const override {
    Mistral::check(config);
    const std::string key = config.truthy("rope_parameters") ? "rope_parameters" : "rope_scaling";
    const Json empty = Json::make_object({});
    const Json* params = config.get(key);
    if (!truthy(params)) params = &empty;
    if (params->type() != Json::Type::kObject) {
      throw std::invalid_argument("config.json: " + key + " must be an object, got " + describe(*params));
    }
    const Config p{*params, "config.json " + key};
    const Json default_type = Json::make_string("default");
    const Json* type = p.raw("rope_type") ? p.raw("rope_type") : p.raw("type") ? p.raw("type") : &default_type;
    const bool is_string = type->type() == Json::Type::kString;
    const bool long_rope =
        is_string && (type->string() == "longrope" || type->string() == "su" || type->string() == "yarn");
    not_supported(long_rope, key + " type " + describe(*type) +
                                 " (Phi-3's long-context RoPE with long_factor / short_factor) is not supported; the "
                                 "short-context Phi-3 models (rope_scaling null) are");
    if (!is_string || type->string() != "default") {  // as transformers' Phi3Config.validate_rope
      throw std::invalid_argument("config.json: " + key + " type " + describe(*type) +
                                  " is not a Phi-3 RoPE type; use 'default'");
    }
    for (const Config* values : {&config, &p}) {
      const double factor = config_float(*values, "partial_rotary_factor", FloatRule().otherwise(1.0).at_least(0.0));
      not_supported(factor != 1.0,
                    "partial_rotary_factor " + python_float(factor) + " (RoPE on part of each head) is not supported");
    }
  }
  Sources layer_tensors(const TransformerConfig& hp, const std::string&, long layer) const override {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const long q = hp.num_heads * hp.head_dim, kv = hp.num_kv_heads * hp.head_dim, inner = hp.intermediate_size;
    const std::string qkv = p + "self_attn.qkv_proj.weight", gate_up = p + "mlp.gate_up_proj.weight";
    Sources s;
    s.add("attn.q", TensorDecl(qkv).rows(0, q));
    s.add("attn.k", TensorDecl(qkv).rows(q, q + kv));
    s.add("attn.v", TensorDecl(qkv).rows(q + kv, q + 2 * kv));
    s.add("attn.o", TensorDecl(p + "self_attn.o_proj.weight"));
    s.add("ffn.gate", TensorDecl(gate_up).rows(0, inner));
    s.add("ffn.up", TensorDecl(gate_up).rows(inner, 2 * inner));
    s.add("ffn.down", TensorDecl(p + "mlp.down_proj.weight"));
    add_norms(s, p);
    return s;
  }
};

}  // namespace

std::vector<float> rope_inv_freq(const Config& config, long head_dim) {
  const Json empty = Json::make_object({});
  const Json* params = config.truthy("rope_parameters") ? config.get("rope_parameters")
                       : config.truthy("rope_scaling")  ? config.get("rope_scaling")
                                                        : &empty;
  if (params->type() != Json::Type::kObject) {
    throw std::invalid_argument("config.json: rope_scaling must be an object, got " + describe(*params));
  }
  const Config p{*params, "config.json rope_scaling"};
  // theta: rope_parameters' own, else the config's, else 10000.
  const Json default_theta = Json::make_number(10000.0, "10000.0");
  const Json* theta_value = p.raw("rope_theta")        ? p.raw("rope_theta")
                            : config.raw("rope_theta") ? config.raw("rope_theta")
                                                       : &default_theta;
  const Json theta_object = Json::make_object({{"rope_theta", *theta_value}});
  const double theta = config_float(Config{theta_object}, "rope_theta", FloatRule().at_least(1e-9));
  const Json default_type = Json::make_string("default");
  const Json* type = p.raw("rope_type") ? p.raw("rope_type") : p.raw("type") ? p.raw("type") : &default_type;
  const std::string rope_type = type->type() == Json::Type::kString ? type->string() : "";
  if (rope_type != "default" && rope_type != "linear" && rope_type != "llama3") {
    throw std::invalid_argument("config.json: unknown rope_scaling type " + describe(*type) +
                                "; supported: default, linear, llama3");
  }
  const long n = head_dim / 2 + head_dim % 2;  // numpy.arange(0, head_dim, 2)
  std::vector<float> inv(static_cast<std::size_t>(n));
  for (long i = 0; i < n; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(exponent)));
  }
  if (rope_type == "linear") {
    const float factor = static_cast<float>(config_float(p, "factor", FloatRule().at_least(1e-9)));
    for (float& f : inv) f = f / factor;
  } else if (rope_type == "llama3") {
    const double factor = config_float(p, "factor", FloatRule().at_least(1e-9));
    const double low = config_float(p, "low_freq_factor", FloatRule().at_least(1e-9));
    const double high = config_float(p, "high_freq_factor", FloatRule().at_least(1e-9));
    const double old = config_float(p, "original_max_position_embeddings", FloatRule().at_least(1, true));
    if (high <= low) {
      throw std::invalid_argument("config.json rope_scaling: high_freq_factor (" + python_float(high) +
                                  ") must exceed low_freq_factor (" + python_float(low) + ")");
    }
    // float32 arithmetic, in the order transformers' (NumPy-checked) computation takes.
    const float low_wavelen = static_cast<float>(old / low), high_wavelen = static_cast<float>(old / high);
    const float two_pi = static_cast<float>(2 * M_PI), factor32 = static_cast<float>(factor);
    const float old32 = static_cast<float>(old), low32 = static_cast<float>(low);
    const float span = static_cast<float>(high - low);
    for (float& f : inv) {
      const float wavelen = two_pi / f;
      const float scaled = wavelen > low_wavelen ? f / factor32 : f;
      const float smooth = (old32 / wavelen - low32) / span;
      const float a = (1.0f - smooth) * scaled;
      const float b = a / factor32;
      const float c = smooth * scaled;
      const float smoothed = b + c;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  return inv;
}

void register_decoders(std::vector<std::unique_ptr<Arch>>& out) {
  out.push_back(std::make_unique<GPT2>());
  out.push_back(std::make_unique<Llama>());
  out.push_back(std::make_unique<Mistral>());
  out.push_back(std::make_unique<Qwen2>());
  out.push_back(std::make_unique<Qwen3>());
  out.push_back(std::make_unique<Gemma>());
  out.push_back(std::make_unique<Phi3>());
}

}  // namespace arch
}  // namespace cpuformer
