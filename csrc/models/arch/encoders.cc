// The encoder families declared in C++: BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ELECTRA and
// ALBERT (post-norm encoders with learned positions). Task-head checkpoints (...ForSequenceClassification and the
// others) hold the encoder under a prefix ("bert.", "roberta.", "distilbert.") and the head at the
// root; head() declares the heads of sequence and token classification, question answering and
// masked LM (python/cpuformer/arch/heads.py has the step semantics).
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
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    // A table the config does not describe would be read with the wrong row count.
    TensorDecl types("embeddings.token_type_embeddings.weight");
    types.optional = hp.type_vocab_size == 0;
    types.rows_key = "type_vocab_size";
    s.add("embed.token_types", types);
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
    s.weight_and_bias("attn.q", p + "attention.self.query");
    s.weight_and_bias("attn.k", p + "attention.self.key");
    s.weight_and_bias("attn.v", p + "attention.self.value");
    s.weight_and_bias("attn.o", p + "attention.output.dense");
    s.weight_and_bias("attn_norm", p + "attention.output.LayerNorm");
    s.weight_and_bias("ffn.up", p + "intermediate.dense");
    s.weight_and_bias("ffn.down", p + "output.dense");
    s.weight_and_bias("ffn_norm", p + "output.LayerNorm");
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
    s.weight_and_bias("attn.q", p + "attention.q_lin");
    s.weight_and_bias("attn.k", p + "attention.k_lin");
    s.weight_and_bias("attn.v", p + "attention.v_lin");
    s.weight_and_bias("attn.o", p + "attention.out_lin");
    s.weight_and_bias("attn_norm", p + "sa_layer_norm");
    s.weight_and_bias("ffn.up", p + "ffn.lin1");
    s.weight_and_bias("ffn.down", p + "ffn.lin2");
    s.weight_and_bias("ffn_norm", p + "output_layer_norm");
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
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    TensorDecl types("embeddings.token_type_embeddings.weight");
    types.optional = hp.type_vocab_size == 0;
    types.rows_key = "type_vocab_size";
    s.add("embed.token_types", types);
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
    s.add("embed.tokens", TensorDecl("embeddings.word_embeddings.weight"));
    TensorDecl types("embeddings.token_type_embeddings.weight");
    types.optional = hp.type_vocab_size == 0;
    types.rows_key = "type_vocab_size";
    s.add("embed.token_types", types);
    s.weight_and_bias("embed.project", "encoder.embedding_hidden_mapping_in");
    s.weight_and_bias("pooler", "pooler", Sources::kRequired, TensorDecl().may_be_absent());
    return s;
  }

  Sources layer_tensors(const TransformerConfig&, const std::string&, long layer) const override {
    // layer: the group (its weights run num_hidden_layers / num_hidden_groups times)
    const std::string p = "encoder.albert_layer_groups." + std::to_string(layer) + ".albert_layers.0.";
    Sources s;
    s.weight_and_bias("attn.q", p + "attention.query");
    s.weight_and_bias("attn.k", p + "attention.key");
    s.weight_and_bias("attn.v", p + "attention.value");
    s.weight_and_bias("attn.o", p + "attention.dense");
    s.weight_and_bias("attn_norm", p + "attention.LayerNorm");
    s.weight_and_bias("ffn.up", p + "ffn");
    s.weight_and_bias("ffn.down", p + "ffn_output");
    s.weight_and_bias("ffn_norm", p + "full_layer_layer_norm");
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
    s.weight_and_bias("attn.q", p + "attention.attn.q");
    s.weight_and_bias("attn.k", p + "attention.attn.k");
    s.weight_and_bias("attn.v", p + "attention.attn.v");
    s.weight_and_bias("attn.o", p + "attention.attn.o");
    s.weight_and_bias("attn_norm", p + "attention.LayerNorm");
    s.weight_and_bias("ffn.up", p + "intermediate.dense");
    s.weight_and_bias("ffn.down", p + "output.dense");
    s.weight_and_bias("ffn_norm", p + "output.LayerNorm");
    return s;
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
}

}  // namespace arch
}  // namespace cpuformer
