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
#include <type_traits>
#include <utility>
#include <vector>

#include "models/transformer_config.h"

namespace cpuformer {

// The names of each enum field's values, as the Python layer and the graph manifest spell them.
template <class Enum>
using ConfigChoices = std::vector<std::pair<const char*, Enum>>;

inline const ConfigChoices<ModelKind>& config_choices(ModelKind*) {
  static const ConfigChoices<ModelKind> choices = {
      {"encoder", ModelKind::kEncoder}, {"decoder", ModelKind::kDecoder}, {"seq2seq", ModelKind::kSeq2Seq}};
  return choices;
}
inline const ConfigChoices<NormKind>& config_choices(NormKind*) {
  static const ConfigChoices<NormKind> choices = {{"layer", NormKind::kLayer}, {"rms", NormKind::kRms}};
  return choices;
}
inline const ConfigChoices<Positions>& config_choices(Positions*) {
  static const ConfigChoices<Positions> choices = {{"learned", Positions::kLearned},
                                                   {"sinusoidal", Positions::kSinusoidal},
                                                   {"rope", Positions::kRope},
                                                   {"relative", Positions::kRelative},
                                                   {"none", Positions::kNone}};
  return choices;
}
inline const ConfigChoices<PositionIds>& config_choices(PositionIds*) {
  static const ConfigChoices<PositionIds> choices = {{"arange", PositionIds::kArange},
                                                     {"padding_cumsum", PositionIds::kPaddingCumsum}};
  return choices;
}
inline const ConfigChoices<Activation>& config_choices(Activation*) {
  static const ConfigChoices<Activation> choices = {{"gelu", Activation::kGeluErf},
                                                    {"gelu_tanh", Activation::kGeluTanh},
                                                    {"relu", Activation::kRelu},
                                                    {"silu", Activation::kSilu},
                                                    {"quick_gelu", Activation::kQuickGelu}};
  return choices;
}
inline const ConfigChoices<WeightType>& config_choices(WeightType*) {
  static const ConfigChoices<WeightType> choices = {{"float32", WeightType::kFloat32},
                                                    {"float16", WeightType::kFloat16},
                                                    {"bfloat16", WeightType::kBFloat16},
                                                    {"int8", WeightType::kInt8},
                                                    {"int4", WeightType::kInt4}};
  return choices;
}

template <class Enum>
Enum parse_config_choice(const std::string& s, const char* name) {
  std::string names;
  for (const auto& choice : config_choices(static_cast<Enum*>(nullptr))) {
    if (s == choice.first) return choice.second;
    names += (names.empty() ? "'" : ", '") + std::string(choice.first) + "'";
  }
  throw std::invalid_argument(std::string("model config: ") + name + " must be one of " + names + ", got '" + s + "'");
}

// The name of an enum field's value ("rms").
template <class Enum>
const char* config_choice_name(Enum value) {
  for (const auto& choice : config_choices(static_cast<Enum*>(nullptr)))
    if (choice.second == value) return choice.first;
  return "?";
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
  template <class Enum, class = std::enable_if_t<std::is_enum<Enum>::value>>
  void operator()(const char* name, Enum& field) {
    need(name);
    field = parse_config_choice<Enum>(source.string(name), name);
  }
};

}  // namespace cpuformer
