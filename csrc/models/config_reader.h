// TransformerConfig from any keyed source of values, by visiting TransformerConfig::fields(): the one
// config parser of every front end (the Python dict in bindings/config.cc, the graph manifest's
// JSON in models/graph_loader.cc). `Source` provides has(name), string(name), integer(name),
// number(name) and boolean(name); the source must hold exactly the fields (a missing one is an
// error here, an unknown one the caller's check, with the names this reader records).
#pragma once

#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "models/transformer_config.h"

namespace cpuformer {

template <class Enum>
Enum parse_config_choice(const std::string& s, const char* name,
                         std::initializer_list<std::pair<const char*, Enum>> choices) {
  std::string names;
  for (const auto& choice : choices) {
    if (s == choice.first) return choice.second;
    names += (names.empty() ? "'" : ", '") + std::string(choice.first) + "'";
  }
  throw std::invalid_argument(std::string("model config: ") + name + " must be one of " + names + ", got '" + s + "'");
}

template <class Source>
struct ConfigReader {
  Source& source;
  std::set<std::string>& seen;

  void need(const char* name) {
    seen.insert(name);
    if (!source.has(name)) throw std::invalid_argument(std::string("model config: missing '") + name + "'");
  }
  void operator()(const char* name, long& field) {
    need(name);
    field = source.integer(name);
  }
  void operator()(const char* name, float& field) {
    need(name);
    field = static_cast<float>(source.number(name));
  }
  void operator()(const char* name, bool& field) {
    need(name);
    field = source.boolean(name);
  }
  void operator()(const char* name, ModelKind& field) {
    need(name);
    field = parse_config_choice<ModelKind>(
        source.string(name), name,
        {{"encoder", ModelKind::kEncoder}, {"decoder", ModelKind::kDecoder}, {"seq2seq", ModelKind::kSeq2Seq}});
  }
  void operator()(const char* name, NormKind& field) {
    need(name);
    field = parse_config_choice<NormKind>(source.string(name), name,
                                          {{"layer", NormKind::kLayer}, {"rms", NormKind::kRms}});
  }
  void operator()(const char* name, Positions& field) {
    need(name);
    field = parse_config_choice<Positions>(source.string(name), name,
                                           {{"learned", Positions::kLearned},
                                            {"sinusoidal", Positions::kSinusoidal},
                                            {"rope", Positions::kRope},
                                            {"relative", Positions::kRelative},
                                            {"none", Positions::kNone}});
  }
  void operator()(const char* name, PositionIds& field) {
    need(name);
    field = parse_config_choice<PositionIds>(
        source.string(name), name, {{"arange", PositionIds::kArange}, {"padding_cumsum", PositionIds::kPaddingCumsum}});
  }
  void operator()(const char* name, Activation& field) {
    need(name);
    field = parse_config_choice<Activation>(source.string(name), name,
                                            {{"gelu", Activation::kGeluErf},
                                             {"gelu_tanh", Activation::kGeluTanh},
                                             {"relu", Activation::kRelu},
                                             {"silu", Activation::kSilu},
                                             {"quick_gelu", Activation::kQuickGelu}});
  }
  void operator()(const char* name, WeightType& field) {
    need(name);
    field = parse_config_choice<WeightType>(source.string(name), name,
                                            {{"float32", WeightType::kFloat32},
                                             {"float16", WeightType::kFloat16},
                                             {"bfloat16", WeightType::kBFloat16},
                                             {"int8", WeightType::kInt8},
                                             {"int4", WeightType::kInt4}});
  }
};

}  // namespace cpuformer
