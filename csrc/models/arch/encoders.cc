// The encoder families declared in C++: BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ELECTRA and
// ALBERT (post-norm encoders with learned positions), DeBERTa-v2/v3, ModernBERT and XLNet. Task-head checkpoints
// (...ForSequenceClassification and the others) hold the encoder under a prefix ("bert.", "roberta.", "distilbert.")
// and the head at the root; head() declares the heads of sequence and token classification, question answering and
// masked LM (python/cpuformer/arch/heads.py has the step semantics).
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "models/arch/arch.h"
#include "models/config_reader.h"
#include "models/request_checks.h"

namespace cpuformer {
namespace arch {
namespace {

const std::vector<std::pair<std::string, std::string>> kActivations = {
    {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"relu", "relu"}};

const char* const kHeads[] = {"Model",
                              "ForMaskedLM",
                              "ForSequenceClassification",
                              "ForTokenClassification",
                              "ForQuestionAnswering",
                              "ForMultipleChoice"};

// The weights (and biases) of a post-norm BERT-style layer: q, k, v, o, the attention norm, up,
// down and the feed-forward norm, from their checkpoint names below `p`, in that order.
void post_norm_layer(Sources& s, const std::string& p, const std::array<const char*, 8>& names) {
  static const char* const canonical[] = {"attn.q",    "attn.k", "attn.v",   "attn.o",
                                          "attn_norm", "ffn.up", "ffn.down", "ffn_norm"};
  for (std::size_t i = 0; i < names.size(); ++i) s.weight_and_bias(canonical[i], p + names[i]);
}

void check(const TransformerConfig& hp) {
  if (hp.hidden_size % hp.num_heads) {
    throw std::invalid_argument("config.json: hidden size " + std::to_string(hp.hidden_size) +
                                " is not a multiple of the number of attention heads " + std::to_string(hp.num_heads));
  }
  if (hp.pad_token_id >= hp.vocab_size) {
    throw std::invalid_argument("config.json: pad_token_id " + std::to_string(hp.pad_token_id) +
                                " must be < vocab_size " + std::to_string(hp.vocab_size));
  }
  if (hp.position_ids == PositionIds::kPaddingCumsum && hp.max_positions <= hp.pad_token_id + 1) {
    throw std::invalid_argument("config.json: max_position_embeddings " + std::to_string(hp.max_positions) +
                                " leaves no positions after padding_idx " + std::to_string(hp.pad_token_id));
  }
}

class Bert : public Arch {
 public:
  explicit Bert(const std::string& prefix = "Bert") {
    kind = "encoder";
    family = "bert";
    title = "BERT";
    for (const char* head : kHeads) architectures.push_back(prefix + head);
    if (prefix == "Bert") {
      architectures.push_back("BertForPreTraining");
      architectures.push_back("BertForNextSentencePrediction");
    }
    model_types = {"bert"};
    prefixes = {"", "bert."};
    ignored = {R"(cls\..*)", R"(classifier\..*)", R"(qa_outputs\..*)", R"((bert\.)?embeddings\.position_ids)"};
    example = R"({"hidden_act": "gelu", "type_vocab_size": 2, "layer_norm_eps": 1e-12, )"
              R"("position_embedding_type": "absolute"})";
  }

  bool padding_positions = false;  // RoBERTa: positions count only real tokens, after pad_token_id + 1
  // The masked-LM head's transform, its norm, its output bias and its decoder (used when the config
  // unties it from the word embeddings), at the checkpoint's root.
  std::string mlm_transform = "cls.predictions.transform.dense", mlm_norm = "cls.predictions.transform.LayerNorm",
              mlm_bias = "cls.predictions.bias", mlm_decoder = "cls.predictions.decoder";

  TransformerConfig hparams(const Config& config) const override {
    const Json* position_type = config.raw("position_embedding_type");
    if (position_type && !position_type->is_null() &&
        !(position_type->type() == Json::Type::kString && position_type->string() == "absolute")) {
      throw NotSupported("config.json: position_embedding_type " + describe(*position_type) +
                         " is not supported; only 'absolute' position embeddings are");
    }
    const long hidden = config_int(config, "hidden_size", IntRule().otherwise(768));
    const long heads = config_int(config, "num_attention_heads", IntRule().otherwise(12));
    TransformerConfig c;
    c.kind = ModelKind::kEncoder;
    c.vocab_size = config_int(config, "vocab_size", IntRule().otherwise(30522));
    c.hidden_size = hidden;
    c.num_layers = config_int(config, "num_hidden_layers", IntRule().otherwise(12));
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = hidden / heads;
    c.intermediate_size = config_int(config, "intermediate_size", IntRule().otherwise(3072));
    c.norm = NormKind::kLayer;
    c.norm_eps = static_cast<float>(config_float(config, "layer_norm_eps", FloatRule().otherwise(1e-12).at_least(0.0)));
    c.pre_norm = false;
    c.activation = parse_config_choice<Activation>(mapped(config, "hidden_act", "gelu", kActivations), "activation");
    c.gated_ffn = false;
    c.positions = Positions::kLearned;
    c.max_positions = config_int(config, "max_position_embeddings", IntRule().otherwise(512));
    c.position_ids = padding_positions ? PositionIds::kPaddingCumsum : PositionIds::kArange;
    c.pad_token_id = config_int(config, "pad_token_id", IntRule().otherwise(padding_positions ? 1 : 0).at_least(0));
    c.type_vocab_size = config_int(config, "type_vocab_size", IntRule().otherwise(2).at_least(0));
    c.embedding_norm = true;
    check(c);
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig& hp) const override {
    Sources s;
    embedding_tables(s, hp);
    s.weight_and_bias("pooler", "pooler.dense", Sources::kRequired, TensorDecl().may_be_absent());
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig&, const std::string&) const override {
    Sources s;
    s.add("embed.positions", TensorDecl("embeddings.position_embeddings.weight"));
    s.weight_and_bias("embed.norm", "embeddings.LayerNorm");
    return s;
  }

  Sources layer_tensors(const TransformerConfig&, const std::string&, long layer) const override {
    const std::string p = "encoder.layer." + std::to_string(layer) + ".";
    Sources s;
    post_norm_layer(s, p,
                    {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                     "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"});
    return s;
  }

  // ---- task heads (transformers' Bert*For* classes) ---------------------------------------------

  bool head(const Config& config, const TransformerConfig& hp, const std::string& task, Head& out) const override {
    const long H = hp.hidden_size;
    if (task == "sequence_classification") {
      const std::vector<std::string> names = labels(config);
      HeadBuilder builder(task, names);
      sequence_head(builder, H, static_cast<long>(names.size()));
      out = builder.build();
      return true;
    }
    if (task == "token_classification" || task == "question_answering") {
      out = linear_head(config, task, H);
      return true;
    }
    if (task == "masked_lm") {
      const long E = hp.embedding_width();  // the transform maps into the word embeddings' width
      HeadBuilder builder(task);
      builder.dense("transform", mlm_transform + ".weight", {E, H});
      builder.act(mlm_activation(hp)).norm("transform_norm", mlm_norm, E, hp.norm_eps);
      // The decoder is the word-embedding table unless the config unties it.
      // (transformers ties the decoder's bias to mlm_bias too; untied, it has its own.)
      if (!config.is_false("tie_word_embeddings")) {
        builder.dense("decoder", "embeddings.word_embeddings.weight", {hp.vocab_size, E}, mlm_bias, true, false,
                      "vocab_size", 1);
      } else {
        builder.dense("decoder", mlm_decoder + ".weight", {hp.vocab_size, E}, "", true, true, "vocab_size");
      }
      out = builder.build();
      return true;
    }
    return false;
  }

  // The word and token-type tables (a token-type table the config does not describe would be read
  // with the wrong row count).
  void embedding_tables(Sources& s, const TransformerConfig& hp) const {
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    TensorDecl types("embeddings.token_type_embeddings.weight");
    types.optional = hp.type_vocab_size == 0;
    types.rows_key = "type_vocab_size";
    s.add("embed.token_types", types);
  }

  // BERT: classifier(pooler output).
  virtual void sequence_head(HeadBuilder& builder, long hidden, long num_labels) const {
    builder.pooler().dense("classifier", "classifier.weight", {num_labels, hidden}, "", true, true, "id2label");
  }

  virtual std::string mlm_activation(const TransformerConfig& hp) const { return config_choice_name(hp.activation); }
};

class Roberta : public Bert {
 public:
  explicit Roberta(const std::string& prefix = "Roberta") : Bert(prefix) {
    family = "roberta";
    title = "RoBERTa";
    model_types = {"roberta"};
    prefixes = {"", "roberta."};
    ignored = {R"(lm_head\..*)", R"(classifier\..*)", R"(qa_outputs\..*)", R"((roberta\.)?embeddings\.position_ids)"};
    padding_positions = true;
    mlm_transform = "lm_head.dense";
    mlm_norm = "lm_head.layer_norm";
    mlm_bias = "lm_head.bias";
    mlm_decoder = "lm_head.decoder";
  }
  // RoBERTa: out_proj(tanh(dense(h[:, 0]))).
  void sequence_head(HeadBuilder& builder, long hidden, long num_labels) const override {
    builder.first().dense("dense", "classifier.dense.weight", {hidden, hidden}).act("tanh");
    builder.dense("out_proj", "classifier.out_proj.weight", {num_labels, hidden}, "", true, true, "id2label");
  }
  // RobertaLMHead applies the erf GELU whatever hidden_act is.
  std::string mlm_activation(const TransformerConfig&) const override { return "gelu"; }
};

class XLMRoberta : public Roberta {
 public:
  XLMRoberta() : Roberta("XLMRoberta") {
    family = "xlm-roberta";
    title = "XLM-RoBERTa";
    model_types = {"xlm-roberta"};
  }
};

class DistilBert : public Bert {
 public:
  DistilBert() : Bert("DistilBert") {
    family = "distilbert";
    title = "DistilBERT";
    model_types = {"distilbert"};
    prefixes = {"", "distilbert."};
    ignored = {R"(vocab_transform\..*)",
               R"(vocab_layer_norm\..*)",
               R"(vocab_projector\..*)",
               R"(pre_classifier\..*)",
               R"(classifier\..*)",
               R"(qa_outputs\..*)",
               R"((distilbert\.)?embeddings\.position_ids)"};
    mlm_transform = "vocab_transform";
    mlm_norm = "vocab_layer_norm";
    mlm_bias = "vocab_projector.bias";
    mlm_decoder = "vocab_projector";
  }

  TransformerConfig hparams(const Config& config) const override {
    // (aliases: transformers' DistilBertConfig.attribute_map)
    const long hidden = config_int(config, "dim", IntRule().otherwise(768).alias("hidden_size"));
    const long heads = config_int(config, "n_heads", IntRule().otherwise(12).alias("num_attention_heads"));
    TransformerConfig c;
    c.kind = ModelKind::kEncoder;
    c.vocab_size = config_int(config, "vocab_size", IntRule().otherwise(30522));
    c.hidden_size = hidden;
    c.num_layers = config_int(config, "n_layers", IntRule().otherwise(6).alias("num_hidden_layers"));
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = hidden / heads;
    c.intermediate_size = config_int(config, "hidden_dim", IntRule().otherwise(4 * hidden));
    c.norm = NormKind::kLayer;
    c.norm_eps = 1e-12f;
    c.pre_norm = false;
    c.activation = parse_config_choice<Activation>(mapped(config, "activation", "gelu", kActivations), "activation");
    c.gated_ffn = false;
    c.positions = Positions::kLearned;
    c.max_positions = config_int(config, "max_position_embeddings", IntRule().otherwise(512));
    c.position_ids = PositionIds::kArange;
    c.pad_token_id = config_int(config, "pad_token_id", IntRule().otherwise(0).at_least(0));
    c.type_vocab_size = 0;
    c.embedding_norm = true;
    check(c);
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    return s;
  }

  // DistilBERT: classifier(relu(pre_classifier(h[:, 0]))).
  void sequence_head(HeadBuilder& builder, long hidden, long num_labels) const override {
    builder.first().dense("pre_classifier", "pre_classifier.weight", {hidden, hidden}).act("relu");
    builder.dense("classifier", "classifier.weight", {num_labels, hidden}, "", true, true, "id2label");
  }

  Sources layer_tensors(const TransformerConfig&, const std::string&, long layer) const override {
    const std::string p = "transformer.layer." + std::to_string(layer) + ".";
    Sources s;
    post_norm_layer(s, p,
                    {"attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "sa_layer_norm",
                     "ffn.lin1", "ffn.lin2", "output_layer_norm"});
    return s;
  }
};

// config with `defaults` for the keys it lacks or sets to null (a family whose transformers config
// class has other defaults than BertConfig's).
Json with_defaults(const Config& config, Json::Object defaults) {
  for (const auto& item : config.json.object())
    if (!item.second.is_null()) defaults.push_back(item);
  return Json::make_object(std::move(defaults));
}

// ELECTRA (the discriminator, and any ElectraModel body): BERT whose embedding tables may be
// narrower than the hidden size; then embeddings_project (embedding_size -> hidden_size) maps the
// normed embeddings into the hidden size (canonical embed.project). The discriminator's
// ElectraForPreTraining head is not run (its encoder opens without it); ElectraForCausalLM is not
// claimed.
class Electra : public Bert {
 public:
  Electra() : Bert("Electra") {
    family = "electra";
    title = "ELECTRA";
    architectures.push_back("ElectraForPreTraining");
    model_types = {"electra"};
    prefixes = {"", "electra."};
    // The task heads' tensors: pre-training (discriminator_predictions), masked LM (the generator's
    // generator_predictions and generator_lm_head), sequence classification, token classification,
    // question answering, multiple choice (sequence_summary); position_ids, token_type_ids: buffers
    // older checkpoints saved.
    ignored = {R"(discriminator_predictions\..*)",
               R"(generator_predictions\..*)",
               R"(generator_lm_head\..*)",
               R"(classifier\..*)",
               R"(qa_outputs\..*)",
               R"(sequence_summary\..*)",
               R"((electra\.)?embeddings\.(position_ids|token_type_ids))"};
    example = R"({"hidden_act": "gelu", "type_vocab_size": 2, "layer_norm_eps": 1e-12, )"
              R"("position_embedding_type": "absolute", "embedding_size": 128})";
    // The generator's masked-LM head (ElectraGeneratorPredictions + generator_lm_head).
    mlm_transform = "generator_predictions.dense";
    mlm_norm = "generator_predictions.LayerNorm";
    mlm_bias = "generator_lm_head.bias";
    mlm_decoder = "generator_lm_head";
  }

  TransformerConfig hparams(const Config& config) const override {
    // ElectraConfig's defaults where they differ from BertConfig's (the size of ELECTRA-small).
    const Json merged = with_defaults(config, {{"embedding_size", number_json(128)},
                                               {"hidden_size", number_json(256)},
                                               {"num_attention_heads", number_json(4)},
                                               {"intermediate_size", number_json(1024)}});
    const Config c{merged, config.source};
    TransformerConfig hp = Bert::hparams(c);
    hp.embedding_size = config_int(c, "embedding_size", IntRule().otherwise(128));
    return hp;
  }

  bool head(const Config& config, const TransformerConfig& hp, const std::string& task, Head& out) const override {
    // ElectraForPreTraining is the discriminator (a per-token real/replaced score), not a masked LM.
    if (task == "masked_lm") {
      if (const Json* names = config.get("architectures")) {
        if (names->type() == Json::Type::kArray) {
          for (const Json& n : names->array())
            if (n.type() == Json::Type::kString && n.string() == "ElectraForPreTraining") return false;
        }
      }
    }
    return Bert::head(config, hp, task, out);
  }

  // ELECTRA: out_proj(gelu(dense(h[:, 0]))).
  void sequence_head(HeadBuilder& builder, long hidden, long num_labels) const override {
    builder.first().dense("dense", "classifier.dense.weight", {hidden, hidden}).act("gelu");
    builder.dense("out_proj", "classifier.out_proj.weight", {num_labels, hidden}, "", true, true, "id2label");
  }
  std::string mlm_activation(const TransformerConfig&) const override { return "gelu"; }

  Sources model_tensors(const Config&, const TransformerConfig& hp) const override {
    Sources s;
    embedding_tables(s, hp);
    if (hp.embedding_width() != hp.hidden_size) s.weight_and_bias("embed.project", "embeddings_project");
    return s;
  }

  static Json number_json(long v) { return Json::make_number(static_cast<double>(v), std::to_string(v)); }
};

// ALBERT: BERT with factorized embeddings (embedding_size -> hidden_size through
// embedding_hidden_mapping_in) and consecutive layers that share weights: num_hidden_groups
// distinct layers, each run num_hidden_layers / num_hidden_groups times (TransformerConfig::layer_groups).
class Albert : public Bert {
 public:
  Albert() : Bert("Albert") {
    family = "albert";
    title = "ALBERT";
    model_types = {"albert"};
    prefixes = {"", "albert."};
    // The task heads' tensors (ignored when the encoder is opened without its head); position_ids,
    // token_type_ids: buffers older checkpoints saved.
    ignored = {R"(predictions\..*)", R"(sop_classifier\..*)", R"(classifier\..*)", R"(qa_outputs\..*)",
               R"((albert\.)?embeddings\.(position_ids|token_type_ids))"};
    example = R"({"hidden_act": "gelu_new", "type_vocab_size": 2, "layer_norm_eps": 1e-12, )"
              R"("position_embedding_type": "absolute", "embedding_size": 128, "num_hidden_groups": 1, )"
              R"("inner_group_num": 1})";
    mlm_transform = "predictions.dense";
    mlm_norm = "predictions.LayerNorm";
    mlm_bias = "predictions.bias";
    mlm_decoder = "predictions.decoder";
  }

  TransformerConfig hparams(const Config& config) const override {
    // AlbertConfig's defaults where they differ from BertConfig's (the size of ALBERT-xxlarge).
    auto n = [](long v) { return Json::make_number(static_cast<double>(v), std::to_string(v)); };
    const Json merged = with_defaults(config, {{"vocab_size", n(30000)},
                                               {"embedding_size", n(128)},
                                               {"hidden_size", n(4096)},
                                               {"num_attention_heads", n(64)},
                                               {"intermediate_size", n(16384)},
                                               {"hidden_act", Json::make_string("gelu_new")}});
    const Config c{merged, config.source};
    const long inner = config_int(c, "inner_group_num", IntRule().otherwise(1));
    not_supported(inner != 1, "inner_group_num " + std::to_string(inner) +
                                  " is not supported; only groups of one layer are (inner_group_num 1, as every "
                                  "released ALBERT)");
    TransformerConfig hp = Bert::hparams(c);
    const long groups = config_int(c, "num_hidden_groups", IntRule().otherwise(1));
    if (hp.num_layers % groups) {
      throw std::invalid_argument("config.json: num_hidden_layers " + std::to_string(hp.num_layers) +
                                  " is not a multiple of num_hidden_groups " + std::to_string(groups));
    }
    hp.embedding_size = config_int(c, "embedding_size", IntRule().otherwise(128));
    hp.layer_groups = groups;
    return hp;
  }

  Sources model_tensors(const Config&, const TransformerConfig& hp) const override {
    Sources s;
    embedding_tables(s, hp);
    s.weight_and_bias("embed.project", "encoder.embedding_hidden_mapping_in");
    s.weight_and_bias("pooler", "pooler", Sources::kRequired, TensorDecl().may_be_absent());
    return s;
  }

  Sources layer_tensors(const TransformerConfig&, const std::string&, long layer) const override {
    // layer: the group (its weights run num_hidden_layers / num_hidden_groups times)
    const std::string p = "encoder.albert_layer_groups." + std::to_string(layer) + ".albert_layers.0.";
    Sources s;
    post_norm_layer(s, p,
                    {"attention.query", "attention.key", "attention.value", "attention.dense", "attention.LayerNorm",
                     "ffn", "ffn_output", "full_layer_layer_norm"});
    return s;
  }
};

// MPNet (all-mpnet-base-v2 and the other MPNet sentence encoders): BERT's post-norm layers with
// RoBERTa's padding positions and heads, no token types, and a T5-style bucketed relative position
// bias that every layer adds to its attention scores. What transformers' modeling_mpnet.py fixes in
// code rather than in the config: position ids count from padding_idx = 1 whatever pad_token_id
// says, and the bias is bucketed with 32 buckets and a max distance of 128 (bidirectional T5
// buckets), so relative_attention_num_buckets only sizes the table.
class MPNet : public Roberta {
 public:
  static constexpr long kBuckets = 32, kMaxDistance = 128, kPaddingIdx = 1;

  MPNet() : Roberta("MPNet") {
    family = "mpnet";
    title = "MPNet";
    model_types = {"mpnet"};
    prefixes = {"", "mpnet."};
    // The task heads' tensors (MaskedLM: lm_head; classification: classifier; question answering:
    // qa_outputs); position_ids: a buffer older checkpoints saved.
    ignored = {R"(lm_head\..*)", R"(classifier\..*)", R"(qa_outputs\..*)", R"((mpnet\.)?embeddings\.position_ids)"};
    example = R"({"hidden_act": "gelu", "layer_norm_eps": 1e-05, "relative_attention_num_buckets": 32, )"
              R"("pad_token_id": 1})";
  }

  TransformerConfig hparams(const Config& config) const override {
    const long buckets = config_int(config, "relative_attention_num_buckets", IntRule().otherwise(kBuckets));
    not_supported(buckets != kBuckets, "relative_attention_num_buckets " + std::to_string(buckets) +
                                           " is not supported; transformers' MPNet always computes 32 relative "
                                           "position buckets, so the table must have 32 rows");
    TransformerConfig hp;
    if (!config.get("vocab_size")) {  // MPNetConfig's default vocabulary, not BERT's
      Json::Object members = config.json.object();
      members.emplace_back("vocab_size", Json::make_number(30527.0, "30527"));
      const Json with_vocab = Json::make_object(std::move(members));
      hp = Roberta::hparams(Config{with_vocab, config.source});
    } else {
      hp = Roberta::hparams(config);
    }
    hp.type_vocab_size = 0;
    hp.pad_token_id = kPaddingIdx;
    hp.relative_bias = true;
    hp.num_buckets = kBuckets;
    hp.max_distance = kMaxDistance;
    check(hp);
    return hp;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    s.weight_and_bias("pooler", "pooler.dense", Sources::kRequired, TensorDecl().may_be_absent());
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig&, const std::string&) const override {
    Sources s;
    s.add("embed.positions", TensorDecl("embeddings.position_embeddings.weight"));
    s.weight_and_bias("embed.norm", "embeddings.LayerNorm");
    s.add("relative_bias", TensorDecl("encoder.relative_attention_bias.weight"));
    return s;
  }

  Sources layer_tensors(const TransformerConfig&, const std::string&, long layer) const override {
    const std::string p = "encoder.layer." + std::to_string(layer) + ".";
    Sources s;
    post_norm_layer(s, p,
                    {"attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                     "attention.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"});
    return s;
  }
};

// ---- DeBERTa-v2 / v3 ------------------------------------------------------------------------------
// A post-norm encoder with disentangled attention over relative positions (transformers'
// modeling_deberta_v2.py): the scores gain a content-to-position (c2p) and a position-to-content
// (p2c) term over log-bucketed relative positions, scaled by 1 / sqrt(head_dim * (1 + number of
// terms)); the mathematics is in csrc/layers/disentangled_attention.h. DeBERTa-v3 adds no position
// to the embeddings (position_biased_input false: positions "none") and has no token types.
// Task-head checkpoints hold the encoder under "deberta."; head() declares the sequence classifier
// (ContextPooler: dense and pooler_hidden_act on the first token, then the classifier), token
// classification, question answering and both masked-LM heads (legacy true: cls.predictions;
// false: lm_predictions.lm_head), each decoded by the word-embedding table.

// A config value transformers reads as a "|"-separated string or a list of names, lowercased.
std::vector<std::string> names_of(const Config& config, const std::string& key, const std::string& fallback) {
  const Json* value = config.get(key);
  std::vector<std::string> raw;
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  if (!value || value->type() == Json::Type::kString) {
    const std::string text = lower(value ? value->string() : fallback);
    std::size_t start = 0;
    for (std::size_t bar; (bar = text.find('|', start)) != std::string::npos; start = bar + 1)
      raw.push_back(text.substr(start, bar - start));
    raw.push_back(text.substr(start));
  } else {
    bool ok = value->type() == Json::Type::kArray;
    for (std::size_t i = 0; ok && i < value->array().size(); ++i) {
      ok = value->array()[i].type() == Json::Type::kString;
      if (ok) raw.push_back(value->array()[i].string());
    }
    if (!ok) {
      throw std::invalid_argument("config.json: " + key + " must be a '|'-separated string or a list of strings, got " +
                                  python_repr(*value));
    }
  }
  std::vector<std::string> out;
  for (const std::string& r : raw) {
    std::size_t b = 0, e = r.size();
    while (b < e && std::isspace(static_cast<unsigned char>(r[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(r[e - 1]))) --e;
    if (b < e) out.push_back(lower(r.substr(b, e - b)));
  }
  return out;
}

// A true/false config value (absent or null: `fallback`).
bool flag(const Config& config, const std::string& key, bool fallback) {
  const Json* value = config.get(key);
  if (!value) return fallback;
  if (value->type() != Json::Type::kBool) {
    throw std::invalid_argument("config.json: " + key + " must be true or false, got " + python_repr(*value));
  }
  return value->boolean();
}

std::string list_repr(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + python_string(items[i]);
  return out + "]";
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

class DebertaV2 : public Arch {
 public:
  DebertaV2() {
    kind = "encoder";
    family = "deberta-v2";
    title = "DeBERTa-v2";
    for (const char* head : kHeads) architectures.push_back(std::string("DebertaV2") + head);
    model_types = {"deberta-v2"};
    prefixes = {"", "deberta."};
    ignored = {// Task heads (read when the model runs its head, see head()): ContextPooler, classifiers, MLM.
               R"(pooler\..*)", R"(classifier\..*)", R"(qa_outputs\..*)", R"(lm_predictions\..*)", R"(cls\..*)",
               R"((deberta\.)?embeddings\.position_ids)",
               // transformers ignores a saved position table when position_biased_input is false.
               R"((deberta\.)?embeddings\.position_embeddings\.weight)",
               // Relative embeddings of relative_attention without c2p or p2c: transformers adds nothing.
               R"((deberta\.)?encoder\.rel_embeddings\.weight)", R"((deberta\.)?encoder\.LayerNorm\.(weight|bias))"};
    // microsoft/deberta-v3-base's entries besides its sizes.
    example = R"({"hidden_act": "gelu", "type_vocab_size": 0, "layer_norm_eps": 1e-07, "relative_attention": true, )"
              R"("max_relative_positions": -1, "position_buckets": 256, "norm_rel_ebd": "layer_norm", )"
              R"("share_att_key": true, "pos_att_type": "p2c|c2p", "position_biased_input": false, )"
              R"("max_position_embeddings": 512, "pad_token_id": 0})";
  }

  TransformerConfig hparams(const Config& config) const override {
    const long hidden = config_int(config, "hidden_size", IntRule().otherwise(1536));
    const long heads = config_int(config, "num_attention_heads", IntRule().otherwise(24));
    if (hidden % heads) {
      throw std::invalid_argument("config.json: hidden size " + std::to_string(hidden) +
                                  " is not a multiple of the number of attention heads " + std::to_string(heads));
    }
    const long head_dim = hidden / heads;
    if (const Json* size = config.get("attention_head_size")) {
      const bool same = size->type() == Json::Type::kNumber && size->number() == static_cast<double>(head_dim);
      not_supported(!same, "attention_head_size " + python_repr(*size) +
                               " is not supported; only hidden_size / num_attention_heads is");
    }
    not_supported(config_int(config, "conv_kernel_size", IntRule().otherwise(0).at_least(0)) > 0,
                  "conv_kernel_size > 0 (the convolution layer of DeBERTa-v2 xlarge/xxlarge) is not supported");
    if (config_int(config, "embedding_size", IntRule().otherwise(hidden)) != hidden) {
      throw NotSupported("config.json: embedding_size " + python_repr(*config.get("embedding_size")) +
                         " != hidden_size " + std::to_string(hidden) + " (a projected embedding) is not supported");
    }
    const std::vector<std::string> terms = names_of(config, "pos_att_type", "");
    std::vector<std::string> unknown;
    for (const std::string& t : terms)
      if (t != "c2p" && t != "p2c") unknown.push_back(t);
    not_supported(!unknown.empty(),
                  "pos_att_type " + list_repr(unknown) + " is not supported; only 'c2p' and 'p2c' are");
    const std::vector<std::string> norms = names_of(config, "norm_rel_ebd", "none");
    for (const std::string& n : norms) {
      const Json* given = config.get("norm_rel_ebd");
      not_supported(n != "none" && n != "layer_norm", "norm_rel_ebd " +
                                                          (given ? python_repr(*given) : std::string("None")) +
                                                          " is not supported; use 'layer_norm' or 'none'");
    }
    const long max_positions = config_int(config, "max_position_embeddings", IntRule().otherwise(512));
    const bool relative = flag(config, "relative_attention", false);
    const long buckets = config_int(config, "position_buckets", IntRule().otherwise(-1).unbounded_below());
    long max_relative = config_int(config, "max_relative_positions", IntRule().otherwise(-1).unbounded_below());
    if (max_relative < 1) max_relative = max_positions;
    if (relative && buckets > 0) {
      if (buckets < 2) {
        throw std::invalid_argument("config.json: position_buckets must be >= 2 (or <= 0: none), got " +
                                    std::to_string(buckets));
      }
      if (max_relative - 1 <= buckets / 2) {
        throw std::invalid_argument(
            "config.json: max_relative_positions " + std::to_string(max_relative) +
            " (max_position_embeddings when < 1) must exceed position_buckets / 2 + 1 = " +
            std::to_string(buckets / 2 + 1) +
            ": the log buckets divide by log((max_relative_positions - 1) / (position_buckets / 2))");
      }
    }
    // transformers scales q·kᵀ by 1 / sqrt(head_dim * scale_factor) in float32, with one factor per
    // position term the config names, whether or not relative_attention is on.
    const long factor = 1 + (contains(terms, "c2p") ? 1 : 0) + (contains(terms, "p2c") ? 1 : 0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim) * static_cast<float>(factor));
    TransformerConfig c;
    c.kind = ModelKind::kEncoder;
    c.vocab_size = config_int(config, "vocab_size", IntRule().otherwise(128100));
    c.hidden_size = hidden;
    c.num_layers = config_int(config, "num_hidden_layers", IntRule().otherwise(24));
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = head_dim;
    c.intermediate_size = config_int(config, "intermediate_size", IntRule().otherwise(6144));
    c.norm = NormKind::kLayer;
    c.norm_eps = static_cast<float>(config_float(config, "layer_norm_eps", FloatRule().otherwise(1e-7).at_least(0.0)));
    c.pre_norm = false;
    c.activation = parse_config_choice<Activation>(mapped(config, "hidden_act", "gelu", kActivations), "activation");
    c.gated_ffn = false;
    c.positions = flag(config, "position_biased_input", true) ? Positions::kLearned : Positions::kNone;
    c.max_positions = max_positions;
    c.position_ids = PositionIds::kArange;
    IntRule pad_rule = IntRule().otherwise(0).at_least(0);
    pad_rule.has_maximum = false;
    c.pad_token_id = config_int(config, "pad_token_id", pad_rule);
    c.type_vocab_size = config_int(config, "type_vocab_size", IntRule().otherwise(0).at_least(0));
    c.embedding_norm = true;
    c.attention_scale = scale;
    c.content_to_position = relative && contains(terms, "c2p");
    c.position_to_content = relative && contains(terms, "p2c");
    c.position_buckets = std::max(buckets, 0L);
    c.max_relative_positions = max_relative;
    c.relative_embedding_norm = contains(norms, "layer_norm");
    c.share_attention_key = flag(config, "share_att_key", false);
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig& hp) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    if (hp.type_vocab_size) {
      TensorDecl types("embeddings.token_type_embeddings.weight");
      types.rows_key = "type_vocab_size";
      s.add("embed.token_types", types);
    }
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig& hp, const std::string&) const override {
    Sources s;
    s.weight_and_bias("embed.norm", "embeddings.LayerNorm");
    if (hp.positions == Positions::kLearned)
      s.add("embed.positions", TensorDecl("embeddings.position_embeddings.weight"));
    if (hp.content_to_position || hp.position_to_content) {
      s.add("relative_embeddings", TensorDecl("encoder.rel_embeddings.weight"));
      if (hp.relative_embedding_norm) s.weight_and_bias("relative_norm", "encoder.LayerNorm");
    }
    return s;
  }

  Sources layer_tensors(const TransformerConfig& hp, const std::string&, long layer) const override {
    const std::string p = "encoder.layer." + std::to_string(layer) + ".";
    Sources s;
    post_norm_layer(
        s, p,
        {"attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj", "attention.output.dense",
         "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm"});
    if (!hp.share_attention_key) {
      if (hp.position_to_content) s.weight_and_bias("attn.position_q", p + "attention.self.pos_query_proj");
      if (hp.content_to_position) s.weight_and_bias("attn.position_k", p + "attention.self.pos_key_proj");
    }
    return s;
  }

  bool head(const Config& config, const TransformerConfig& hp, const std::string& task, Head& out) const override {
    const long H = hp.hidden_size;
    if (task == "sequence_classification") {
      const std::vector<std::string> names = labels(config);
      const long pooled = config_int(config, "pooler_hidden_size", IntRule().otherwise(H));
      std::vector<std::pair<std::string, std::string>> activations = kActivations;
      activations.push_back({"tanh", "tanh"});
      const std::string activation = mapped(config, "pooler_hidden_act", "gelu", activations, "", true);
      HeadBuilder builder(task, names);
      builder.first().dense("pooler", "pooler.dense.weight", {pooled, H}).act(activation);
      builder.dense("classifier", "classifier.weight", {static_cast<long>(names.size()), pooled}, "", true, true,
                    "id2label");
      out = builder.build();
      return true;
    }
    if (task == "token_classification" || task == "question_answering") {
      out = linear_head(config, task, H);
      return true;
    }
    if (task == "masked_lm") {
      // legacy (the default): cls.predictions (its decoder tied to the word embeddings); otherwise
      // lm_predictions.lm_head, which multiplies by the word embeddings itself.
      const Json* legacy_value = config.raw("legacy");
      const bool legacy = legacy_value ? truthy(legacy_value) : true;
      const std::string prefix = legacy ? "cls.predictions.transform." : "lm_predictions.lm_head.";
      const std::string bias = legacy ? "cls.predictions.bias" : "lm_predictions.lm_head.bias";
      HeadBuilder builder(task);
      builder.dense("transform", prefix + "dense.weight", {H, H});
      builder.act(mapped(config, "hidden_act", "gelu", kActivations))
          .norm("transform_norm", prefix + "LayerNorm", H, hp.norm_eps);
      builder.dense("decoder", "embeddings.word_embeddings.weight", {hp.vocab_size, H}, bias, true, false, "vocab_size",
                    1);
      out = builder.build();
      return true;
    }
    return false;
  }
};

// ---- ModernBERT -----------------------------------------------------------------------------------
// A pre-norm encoder with bias-free LayerNorms, rotary positions, a GeGLU feed-forward (fused Wi:
// its first half gets the activation) and alternating global / local (sliding window) attention:
// layer l is global iff l % global_attn_every_n_layers == 0, with its own RoPE theta per layer type.

const char* const kLayerTypes[] = {"full_attention", "sliding_attention"};

const std::vector<std::pair<std::string, std::string>>& modernbert_activations() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"},
      {"relu", "relu"}, {"silu", "silu"},          {"swish", "silu"}};
  return table;
}

// n such that layer l is global iff l % n == 0: global_attn_every_n_layers (default 3), or the
// pattern of an explicit layer_types list (transformers 5 saves one), which must be of that form.
long layer_pattern(const Config& config, long layers) {
  const std::string every_key = "global_attn_every_n_layers";
  const Json* types = config.get("layer_types");
  if (!types) return config_int(config, every_key, IntRule().otherwise(3));
  bool ok = types->type() == Json::Type::kArray && static_cast<long>(types->array().size()) == layers;
  for (std::size_t i = 0; ok && i < types->array().size(); ++i) {
    const Json& t = types->array()[i];
    ok = t.type() == Json::Type::kString && (t.string() == kLayerTypes[0] || t.string() == kLayerTypes[1]);
  }
  if (!ok) {
    throw std::invalid_argument("config.json: layer_types must list " + std::to_string(layers) +
                                " entries (num_hidden_layers) of 'full_attention' or 'sliding_attention', got " +
                                python_repr(*types));
  }
  long every = std::max(layers, 1L);
  if (config.get(every_key)) {
    every = config_int(config, every_key);
  } else {  // the first global layer after layer 0, or none
    for (long l = 1; l < layers; ++l) {
      if (types->array()[l].string() == kLayerTypes[0]) {
        every = l;
        break;
      }
    }
  }
  bool expected = true;
  for (long l = 0; l < layers; ++l)
    expected = expected && types->array()[l].string() == (l % every == 0 ? kLayerTypes[0] : kLayerTypes[1]);
  not_supported(!expected, "layer_types " + python_repr(*types) +
                               " is not supported; cpuformer runs ModernBERT's pattern of a global (full_attention) "
                               "layer every " +
                               std::to_string(every) + " layers starting with layer 0");
  return every;
}

// The RoPE theta of one layer type: rope_parameters[layer_type] (transformers 5), else
// global_rope_theta / local_rope_theta (a null local_rope_theta means the global one, as in
// transformers 4); only the default RoPE.
double rope_theta(const Config& config, const std::string& layer_type) {
  const Json empty = Json::make_object({});
  const Json* params = config.truthy("rope_parameters") ? config.get("rope_parameters") : &empty;
  if (params->type() != Json::Type::kObject) {
    throw std::invalid_argument("config.json: rope_parameters must be an object, got " + python_repr(*params));
  }
  std::vector<std::string> unknown;
  for (const auto& item : params->object())
    if (item.first != kLayerTypes[0] && item.first != kLayerTypes[1]) unknown.push_back(item.first);
  if (!unknown.empty()) {
    std::sort(unknown.begin(), unknown.end());
    std::string listed;
    for (const std::string& u : unknown) listed += (listed.empty() ? "" : ", ") + u;
    throw std::invalid_argument(
        "config.json: rope_parameters must map the layer types full_attention, sliding_attention to their RoPE "
        "parameters, got the keys " +
        listed);
  }
  const Json* own = params->find(layer_type);
  if (!truthy(own)) own = &empty;
  const Json* scaling = config.truthy("rope_scaling") ? config.get("rope_scaling") : &empty;
  const std::string own_key = "rope_parameters[" + python_string(layer_type) + "]";
  for (const auto& [key, values] : {std::pair<std::string, const Json*>{own_key, own}, {"rope_scaling", scaling}}) {
    if (values->type() != Json::Type::kObject) {
      throw std::invalid_argument("config.json: " + key + " must be an object, got " + python_repr(*values));
    }
    const Json default_type = Json::make_string("default");
    const Json* type = values->find("rope_type") ? values->find("rope_type")
                       : values->find("type")    ? values->find("type")
                                                 : &default_type;
    not_supported(!(type->type() == Json::Type::kString && type->string() == "default"),
                  key + " type " + python_repr(*type) + " is not supported; only the default RoPE is");
  }
  const Config own_config{*own, "config.json " + own_key};
  if (own_config.get("rope_theta")) return config_float(own_config, "rope_theta", FloatRule().at_least(1e-9));
  const double global = config_float(config, "global_rope_theta", FloatRule().otherwise(160000.0).at_least(1e-9));
  if (layer_type == kLayerTypes[0]) return global;
  const Json* local = config.raw("local_rope_theta");
  if (local && local->is_null()) return global;
  return config_float(config, "local_rope_theta", FloatRule().otherwise(10000.0).at_least(1e-9));
}

std::vector<float> inv_freq_for_theta(double theta, long head_dim) {
  const Json object = Json::make_object({{"rope_theta", Json::make_number(theta, python_float(theta))}});
  return rope_inv_freq(Config{object}, head_dim);
}

class ModernBert : public Arch {
 public:
  ModernBert() {
    kind = "encoder";
    family = "modernbert";
    title = "ModernBERT";
    for (const char* head : kHeads) architectures.push_back(std::string("ModernBert") + head);
    model_types = {"modernbert"};
    prefixes = {"", "model."};
    // Task heads (head: dense + norm of the classification and MLM heads; classifier; the MLM
    // decoder, tied to the embeddings) are not run.
    ignored = {R"(head\..*)", R"(classifier\..*)", R"(decoder\..*)"};
    example = R"({"hidden_activation": "gelu", "global_attn_every_n_layers": 3, "local_attention": 128, )"
              R"("global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "norm_eps": 1e-05, )"
              R"("norm_bias": false, "pad_token_id": 0})";
  }

  TransformerConfig hparams(const Config& config) const override {
    not_supported(config.truthy("mlp_bias"), "mlp_bias=true (biases of the gated Wi projection) is not supported");
    const long hidden = config_int(config, "hidden_size", IntRule().otherwise(768));
    const long heads = config_int(config, "num_attention_heads", IntRule().otherwise(12));
    if (hidden % heads) {
      throw std::invalid_argument("config.json: hidden size " + std::to_string(hidden) +
                                  " is not a multiple of the number of attention heads " + std::to_string(heads));
    }
    const long head_dim = hidden / heads;
    // transformers' RoPE reads head_dim when set; its attention always uses hidden / heads.
    if (const Json* given = config.get("head_dim")) {
      const bool same = given->type() == Json::Type::kNumber && given->number() == static_cast<double>(head_dim);
      not_supported(!same, "head_dim " + python_repr(*given) + " other than hidden_size / num_attention_heads (" +
                               std::to_string(head_dim) + ") is not supported");
    }
    if (head_dim % 2) {
      throw std::invalid_argument(
          "config.json: RoPE needs an even head dimension (hidden_size / num_attention_heads), got " +
          std::to_string(head_dim));
    }
    const long layers = config_int(config, "num_hidden_layers", IntRule().otherwise(22));
    const long vocab = config_int(config, "vocab_size", IntRule().otherwise(50368));
    const long pad = config_int(config, "pad_token_id", IntRule().otherwise(50283).at_least(0));
    if (pad >= vocab) {
      throw std::invalid_argument("config.json: pad_token_id " + std::to_string(pad) + " must be < vocab_size " +
                                  std::to_string(vocab));
    }
    const long local_attention = config_int(config, "local_attention", IntRule().otherwise(128).at_least(0));
    for (const char* layer_type : kLayerTypes) rope_theta(config, layer_type);  // (refused before any read)
    TransformerConfig c;
    c.kind = ModelKind::kEncoder;
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.num_layers = layers;
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = head_dim;
    c.intermediate_size = config_int(config, "intermediate_size", IntRule().otherwise(1152));
    c.norm = NormKind::kLayer;
    c.norm_eps = static_cast<float>(config_float(config, "norm_eps", FloatRule().otherwise(1e-5).at_least(0.0)));
    c.pre_norm = true;
    c.activation = parse_config_choice<Activation>(
        mapped(config, "hidden_activation", "gelu", modernbert_activations(), "", true), "activation");
    c.gated_ffn = true;
    c.positions = Positions::kRope;
    c.max_positions = config_int(config, "max_position_embeddings", IntRule().otherwise(8192));
    c.pad_token_id = pad;
    c.embedding_norm = true;
    c.final_norm = true;
    c.sliding_window = local_attention / 2 + 1;
    c.global_attention_every = layer_pattern(config, layers);
    return c;
  }

  // Biases (attention_bias, norm_bias; false in the released checkpoints) are read when the
  // checkpoint has them: layer_tensors does not see the config.
  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("embeddings.tok_embeddings.weight"));
    return s;
  }

  Sources stack_tensors(const Config& config, const TransformerConfig& hp, const std::string&) const override {
    Sources s;
    s.weight_and_bias("embed.norm", "embeddings.norm", Sources::kOptional);
    s.weight_and_bias("final_norm", "final_norm", Sources::kOptional);
    s.add("rope.inv_freq", {hp.head_dim / 2}, inv_freq_for_theta(rope_theta(config, kLayerTypes[0]), hp.head_dim));
    s.add("rope.local_inv_freq", {hp.head_dim / 2},
          inv_freq_for_theta(rope_theta(config, kLayerTypes[1]), hp.head_dim));
    return s;
  }

  Sources layer_tensors(const TransformerConfig& hp, const std::string&, long layer) const override {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const long H = hp.hidden_size, F = hp.intermediate_size;
    const std::string qkv = p + "attn.Wqkv";
    Sources s;
    s.weight_and_bias("attn.q", qkv, Sources::kOptional, TensorDecl().rows(0, H));
    s.weight_and_bias("attn.k", qkv, Sources::kOptional, TensorDecl().rows(H, 2 * H));
    s.weight_and_bias("attn.v", qkv, Sources::kOptional, TensorDecl().rows(2 * H, 3 * H));
    s.weight_and_bias("attn.o", p + "attn.Wo", Sources::kOptional);
    // Wi's first half gets the activation (act(input) * gate): cpuformer's gate.
    s.add("ffn.gate", TensorDecl(p + "mlp.Wi.weight").rows(0, F));
    s.add("ffn.up", TensorDecl(p + "mlp.Wi.weight").rows(F, 2 * F));
    // (no MLP biases: mlp_bias is refused, so a stray mlp.Wo.bias is named as unused)
    s.add("ffn.down", TensorDecl(p + "mlp.Wo.weight"));
    s.weight_and_bias("ffn_norm", p + "mlp_norm", Sources::kOptional);
    if (layer > 0) s.weight_and_bias("attn_norm", p + "attn_norm", Sources::kOptional);  // layer 0's: nn.Identity
    return s;
  }

  // ---- task heads: ModernBertPredictionHead (dense, activation, norm), then the task's layer ------
  bool head(const Config& config, const TransformerConfig& hp, const std::string& task, Head& out) const override {
    const long H = hp.hidden_size;
    const bool classification = task.find("classification") != std::string::npos;
    const std::vector<std::string> names = classification ? labels(config) : std::vector<std::string>{};
    HeadBuilder builder(task, names);
    if (task == "sequence_classification") {
      const std::string pooling = mapped(config, "classifier_pooling", "cls", {{"cls", "cls"}, {"mean", "mean"}});
      if (pooling == "cls") {
        builder.first();
      } else {
        builder.mean();
      }
    }
    builder.dense("dense", "head.dense.weight", {H, H}, "", config.truthy("classifier_bias"));
    std::vector<std::pair<std::string, std::string>> head_activations = modernbert_activations();
    head_activations.push_back({"tanh", "tanh"});
    builder.act(mapped(config, "classifier_activation", "gelu", head_activations, "", true));
    const Json* norm_bias = config.raw("norm_bias");
    builder.norm("norm", "head.norm", H, hp.norm_eps, norm_bias ? truthy(norm_bias) : false);
    if (classification) {
      builder.dense("classifier", "classifier.weight", {static_cast<long>(names.size()), H}, "", true, true,
                    "id2label");
    } else if (task == "question_answering") {
      builder.dense("classifier", "classifier.weight", {2, H});
    } else if (task == "masked_lm") {
      const Json* decoder_bias = config.raw("decoder_bias");
      const bool has_bias = decoder_bias ? truthy(decoder_bias) : true;
      if (!config.is_false("tie_word_embeddings")) {
        builder.dense("decoder", "embeddings.tok_embeddings.weight", {hp.vocab_size, H}, "decoder.bias", has_bias,
                      false, "vocab_size", 1);
      } else {
        builder.dense("decoder", "decoder.weight", {hp.vocab_size, H}, "decoder.bias", has_bias, true, "vocab_size");
      }
    } else {
      return false;
    }
    out = builder.build();
    return true;
  }
};

// ---- XLNet ----------------------------------------------------------------------------------------
// A post-norm encoder with Transformer-XL relative attention (csrc/layers/relative_attention_xl.h):
// no position table, relative sinusoids projected by attn.position_k, content / position / segment
// biases and segment embeddings; its q/k/v/o/r projections are stored [d_model, n_head, d_head]
// (the stored_shape edit). A memory of earlier segments carries over between calls
// (Encoder.encode_with_memory, memory()). Heads: the sequence summary + logits_proj, token
// classification, XLNetForQuestionAnsweringSimple.

// The longest segment cpuformer runs in one call. XLNet has no position table, so transformers sets
// no limit; the attention costs grow with segment x (memory + segment), and longer texts are meant
// to be read in segments that carry their memory.
constexpr long kMaxSegment = 4096;

const std::vector<std::pair<std::string, std::string>>& xlnet_activations() {
  static const std::vector<std::pair<std::string, std::string>> table = {
      {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"},
      {"relu", "relu"}, {"silu", "silu"},          {"swish", "silu"}};
  return table;
}

class XLNet : public Arch {
 public:
  XLNet() {
    kind = "encoder";
    family = "xlnet";
    title = "XLNet";
    architectures = {"XLNetModel",
                     "XLNetLMHeadModel",
                     "XLNetForSequenceClassification",
                     "XLNetForTokenClassification",
                     "XLNetForQuestionAnsweringSimple",
                     "XLNetForQuestionAnswering",
                     "XLNetForMultipleChoice"};
    model_types = {"xlnet"};
    prefixes = {"", "transformer."};
    ignored = {// The query stream's embedding of two-stream (pretraining) attention.
               R"((transformer\.)?mask_emb)",
               // Task heads (read when the model runs its head; the others are refused when the head is
               // asked for): sequence summary, classifiers, question answering (the simple head and the
               // beam-search one), the permutation-LM head of XLNetLMHeadModel.
               R"(sequence_summary\..*)", R"(logits_proj\..*)", R"(classifier\..*)", R"(qa_outputs\..*)",
               R"(start_logits\..*)", R"(end_logits\..*)", R"(answer_class\..*)", R"(lm_loss\..*)"};
    // xlnet-base-cased's entries besides its sizes.
    example = R"({"ff_activation": "gelu", "attn_type": "bi", "bi_data": false, "clamp_len": -1, )"
              R"("layer_norm_eps": 1e-12, "mem_len": null, "reuse_len": null, "untie_r": true, "pad_token_id": 5})";
  }

  bool memory(const Config& config, long& mem_len, long& reuse_len) const override {
    IntRule rule = IntRule().otherwise(0).at_least(0);
    rule.has_maximum = false;
    mem_len = config_int(config, "mem_len", rule);
    reuse_len = config_int(config, "reuse_len", rule);
    return true;
  }

  TransformerConfig hparams(const Config& config) const override {
    const long hidden = config_int(config, "d_model", IntRule().otherwise(1024));
    const long heads = config_int(config, "n_head", IntRule().otherwise(16));
    if (hidden % heads) {
      throw std::invalid_argument("config.json: d_model " + std::to_string(hidden) + " is not a multiple of n_head " +
                                  std::to_string(heads));
    }
    const long head_dim = hidden / heads;
    if (config.get("d_head") && config_int(config, "d_head") != head_dim) {
      throw std::invalid_argument("config.json: d_head " + python_repr(*config.get("d_head")) +
                                  " must be d_model / n_head = " + std::to_string(head_dim));
    }
    if (hidden % 2) {
      throw std::invalid_argument("config.json: d_model " + std::to_string(hidden) +
                                  " must be even (the relative position encoding is sin and cos halves)");
    }
    const Json* attention = config.raw("attn_type");
    if (attention && !(attention->type() == Json::Type::kString && attention->string() == "bi")) {
      throw NotSupported("config.json: attn_type " + python_repr(*attention) +
                         " is not supported; only 'bi' (bidirectional) is");
    }
    const Json* bi_data = config.raw("bi_data");
    not_supported(bi_data && !(bi_data->type() == Json::Type::kBool && !bi_data->boolean()),
                  "bi_data (forward and backward position encodings in one batch, a pretraining setting) is not "
                  "supported");
    const long clamp = config_int(config, "clamp_len", IntRule().otherwise(-1).unbounded_below());
    long mem_len = 0, reuse_len = 0;
    memory(config, mem_len, reuse_len);  // its errors at load, not at the first call
    TransformerConfig c;
    c.kind = ModelKind::kEncoder;
    c.vocab_size = config_int(config, "vocab_size", IntRule().otherwise(32000));
    c.hidden_size = hidden;
    c.num_layers = config_int(config, "n_layer", IntRule().otherwise(24));
    c.num_heads = c.num_kv_heads = heads;
    c.head_dim = head_dim;
    c.intermediate_size = config_int(config, "d_inner", IntRule().otherwise(4096));
    c.norm = NormKind::kLayer;
    c.norm_eps = static_cast<float>(config_float(config, "layer_norm_eps", FloatRule().otherwise(1e-12).at_least(0.0)));
    c.pre_norm = false;
    c.activation = parse_config_choice<Activation>(
        mapped(config, "ff_activation", "gelu", xlnet_activations(), "", true), "activation");
    c.gated_ffn = false;
    c.positions = Positions::kNone;
    c.max_positions = kMaxSegment;
    c.position_ids = PositionIds::kArange;
    IntRule pad_rule = IntRule().otherwise(5).at_least(0);
    pad_rule.has_maximum = false;
    c.pad_token_id = config_int(config, "pad_token_id", pad_rule);
    c.type_vocab_size = 0;
    c.transformer_xl_attention = true;
    c.relative_clamp = std::max(clamp, 0L);
    return c;
  }

  Sources model_tensors(const Config&, const TransformerConfig&) const override {
    Sources s;
    s.add("embed.tokens", TensorDecl("word_embedding.weight"));
    return s;
  }

  Sources stack_tensors(const Config&, const TransformerConfig&, const std::string&) const override {
    return Sources();
  }

  Sources layer_tensors(const TransformerConfig& hp, const std::string&, long layer) const override {
    const std::string p = "layer." + std::to_string(layer) + ".";
    const std::vector<long> split = {hp.hidden_size, hp.num_heads, hp.head_dim};  // [d_model, n_head, d_head]
    const std::vector<long> per_head = {hp.num_heads, hp.head_dim};
    Sources s;
    for (const auto& [name, stored] : std::vector<std::pair<const char*, const char*>>{
             {"attn.q", "q"}, {"attn.k", "k"}, {"attn.v", "v"}, {"attn.position_k", "r"}}) {
      TensorDecl t(p + "rel_attn." + stored);
      t.transpose = true;
      t.stored_shape = split;
      s.add(name, t);
    }
    auto shaped = [](std::string name, std::vector<long> shape) {
      TensorDecl t(std::move(name));
      t.stored_shape = std::move(shape);
      return t;
    };
    s.add("attn.o", shaped(p + "rel_attn.o", split));  // o[h, n, d]: [out, in] already
    s.add("attn.content_bias", shaped(p + "rel_attn.r_w_bias", per_head));
    s.add("attn.position_bias", shaped(p + "rel_attn.r_r_bias", per_head));
    s.add("attn.segment_bias", shaped(p + "rel_attn.r_s_bias", per_head));
    s.add("attn.segment_embed", shaped(p + "rel_attn.seg_embed", {2, hp.num_heads, hp.head_dim}));
    s.weight_and_bias("attn_norm", p + "rel_attn.layer_norm");
    s.weight_and_bias("ffn.up", p + "ff.layer_1");
    s.weight_and_bias("ffn.down", p + "ff.layer_2");
    s.weight_and_bias("ffn_norm", p + "ff.layer_norm");
    return s;
  }

  // ---- task heads (transformers' XLNetFor* classes) ---------------------------------------------
  bool head(const Config& config, const TransformerConfig& hp, const std::string& task, Head& out) const override {
    const long H = hp.hidden_size;
    if (task == "sequence_classification") {
      // XLNetSequenceSummary (summary_type, summary_use_proj, summary_activation with XLNetConfig's
      // defaults), then logits_proj.
      const std::vector<std::string> names = labels(config);
      HeadBuilder builder(task, names);
      const Json* summary = config.raw("summary_type");
      const std::string kind_of = !summary ? "last" : summary->type() == Json::Type::kString ? summary->string() : "";
      if (kind_of == "last" || kind_of == "cls_index") {  // (cls_index without an index: the last token)
        builder.last();
      } else if (kind_of == "first") {
        builder.first();
      } else {
        throw NotSupported("config.json: summary_type " + python_repr(*summary) +
                           " is not supported; use 'last', 'first' or 'cls_index'");
      }
      not_supported(config.truthy("summary_proj_to_labels"),
                    "summary_proj_to_labels true (a summary projected to the labels before logits_proj) is not "
                    "supported");
      const Json* use_proj = config.raw("summary_use_proj");
      if (use_proj ? truthy(use_proj) : true) builder.dense("summary", "sequence_summary.summary.weight", {H, H});
      const Json* activation = config.raw("summary_activation");
      const bool none =
          activation && (activation->is_null() || (activation->type() == Json::Type::kString &&
                                                   (activation->string().empty() || activation->string() == "linear")));
      if (!none) {
        std::vector<std::pair<std::string, std::string>> table = xlnet_activations();
        table.push_back({"tanh", "tanh"});
        builder.act(mapped(config, "summary_activation", "tanh", table, "", true));
      }
      builder.dense("logits_proj", "logits_proj.weight", {static_cast<long>(names.size()), H}, "", true, true,
                    "id2label");
      out = builder.build();
      return true;
    }
    if (task == "token_classification") {
      out = linear_head(config, task, H);
      return true;
    }
    if (task == "question_answering") {
      // XLNetForQuestionAnsweringSimple (qa_outputs); XLNetForQuestionAnswering's beam-search head
      // (start_n_top / end_n_top) is refused.
      bool simple = false;
      if (const Json* names = config.get("architectures")) {
        if (names->type() == Json::Type::kArray) {
          for (const Json& n : names->array())
            simple = simple || (n.type() == Json::Type::kString && n.string() == "XLNetForQuestionAnsweringSimple");
        }
      }
      if (!simple) return false;
      out = linear_head(config, task, H);
      return true;
    }
    return false;
  }
};

}  // namespace

void register_encoders(std::vector<std::unique_ptr<Arch>>& out) {
  out.push_back(std::make_unique<Bert>());
  out.push_back(std::make_unique<Roberta>());
  out.push_back(std::make_unique<XLMRoberta>());
  out.push_back(std::make_unique<DistilBert>());
  out.push_back(std::make_unique<MPNet>());
  out.push_back(std::make_unique<Electra>());
  out.push_back(std::make_unique<Albert>());
  out.push_back(std::make_unique<DebertaV2>());
  out.push_back(std::make_unique<ModernBert>());
  out.push_back(std::make_unique<XLNet>());
}

}  // namespace arch
}  // namespace cpuformer
