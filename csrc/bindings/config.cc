#include "bindings/config.h"

#include <pybind11/stl.h>

#include <set>
#include <stdexcept>

#include "models/config_reader.h"
#include "models/model_builder.h"

namespace cpuformer {
namespace bindings {
namespace py = pybind11;

namespace {

// The Python dict as a ConfigReader source (models/config_reader.h).
struct DictValues {
  const py::dict& dict;

  bool has(const char* name) const { return dict.contains(name); }
  py::handle value(const char* name) const { return dict[py::str(name)]; }
  std::string string(const char* name) const { return value(name).cast<std::string>(); }
  long integer(const char* name) const { return value(name).cast<long>(); }
  double number(const char* name) const { return value(name).cast<double>(); }
  bool boolean(const char* name) const { return value(name).cast<bool>(); }
};

// Reads the options present in the dict (and records every option name).
struct OptionReader {
  const py::dict& dict;
  std::set<std::string>& names;

  template <class T>
  void operator()(const char* name, T& field) {
    names.insert(name);
    if (dict.contains(name)) field = dict[py::str(name)].cast<T>();
  }
};

}  // namespace

GenerationOptions generation_options(const py::dict& options, const std::vector<std::string>& extra) {
  GenerationOptions o;
  std::set<std::string> names(extra.begin(), extra.end());
  o.fields(OptionReader{options, names});
  for (const auto& item : options) {
    const std::string key = item.first.cast<std::string>();
    if (!names.count(key)) throw py::value_error("generation options: unknown option '" + key + "'");
  }
  return o;
}

std::vector<std::string> transformer_config_fields() {
  std::vector<std::string> names;
  TransformerConfig c;
  c.fields([&](const char* name, auto&) { names.emplace_back(name); });
  return names;
}

TransformerConfig transformer_config(const py::dict& config) {
  TransformerConfig c;
  std::set<std::string> seen;
  DictValues values{config};
  c.fields(ConfigReader<DictValues>{values, seen});
  for (const auto& item : config) {
    const std::string key = item.first.cast<std::string>();
    if (!seen.count(key)) throw py::value_error("model config: unknown field '" + key + "'");
  }
  c.validate();  // std::invalid_argument: a ValueError in Python
  return c;
}

TransformerConfig partial_transformer_config(const py::dict& fields) {
  TransformerConfig c;
  std::set<std::string> seen;
  DictValues values{fields};
  ConfigReader<DictValues> reader{values, seen};
  c.fields([&](const char* name, auto& field) {
    if (values.has(name)) reader(name, field);
  });
  return c;
}

void register_config(py::module_& m) {
  m.def("transformer_config_fields", &transformer_config_fields,
        "The fields of the model config every model binding takes, in declaration order (TransformerConfig).");
}

const char* kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::kEncoder: return "encoder";
    case ModelKind::kDecoder: return "decoder";
    case ModelKind::kSeq2Seq: return "seq2seq";
  }
  return "?";
}

KvType kv_cache_type(const GenerationOptions& options) {
  if (options.kv_cache_dtype < 0 || options.kv_cache_dtype > 3) {
    throw py::value_error("kv_cache_dtype must be a KvType code 0..3, got " + std::to_string(options.kv_cache_dtype));
  }
  return static_cast<KvType>(options.kv_cache_dtype);
}

pybind11::object speculation_stats(const GenerationResult& result, bool speculative) {
  if (!speculative) return pybind11::none();
  pybind11::dict stats;
  stats["target_passes"] = result.target_passes;
  stats["draft_tokens"] = result.draft_tokens;
  stats["accepted_tokens"] = result.accepted_tokens;
  return std::move(stats);
}

pybind11::tuple generation_output(const GenerationResult& result, const GenerationOptions& options, bool speculative) {
  pybind11::object log_probs = pybind11::none(), scores = pybind11::none();
  if (options.return_log_probs) log_probs = pybind11::cast(result.log_probs);
  if (!result.scores.empty()) scores = pybind11::cast(result.scores);
  pybind11::list reasons;
  for (FinishReason r : result.finish_reasons) {
    reasons.append(r == FinishReason::kEos ? "eos" : r == FinishReason::kStop ? "stop" : "length");
  }
  return pybind11::make_tuple(pybind11::cast(result.tokens), log_probs, speculation_stats(result, speculative), reasons,
                              scores);
}

}  // namespace bindings
}  // namespace cpuformer
