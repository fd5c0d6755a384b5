// The architecture registry (models/arch/arch.h) for the Python package: python/cpuformer/arch/
// native.py wraps each family as an arch.Arch. Config dicts are handed over as io::Json values, so
// the registry reads the same values, and names them in its messages, as it does in the C API.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <stdexcept>

#include "bindings/config.h"
#include "models/arch/arch.h"
#include "models/arch/checkpoint.h"
#include "models/config_reader.h"
#include "models/graph_loader.h"

namespace cpuformer {
namespace bindings {
namespace py = pybind11;

namespace {

using io::Json;

Json to_json(py::handle value, int depth = 0) {
  if (depth > 1000) throw py::value_error("config: nested too deeply");
  if (value.is_none()) return Json();
  if (py::isinstance<py::bool_>(value)) return Json::make_bool(value.cast<bool>());
  if (py::isinstance<py::int_>(value)) {
    const std::string text = py::str(value).cast<std::string>();
    double d = PyLong_AsDouble(value.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      d = text[0] == '-' ? -HUGE_VAL : HUGE_VAL;
    }
    return Json::make_number(d, text);
  }
  if (py::isinstance<py::float_>(value)) {
    return Json::make_number(value.cast<double>(), py::repr(value).cast<std::string>());
  }
  if (py::isinstance<py::str>(value)) return Json::make_string(value.cast<std::string>());
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    Json::Array items;
    for (py::handle item : value) items.push_back(to_json(item, depth + 1));
    return Json::make_array(std::move(items));
  }
  if (py::isinstance<py::dict>(value)) {
    Json::Object members;
    for (auto item : value.cast<py::dict>()) {
      members.emplace_back(py::str(item.first).cast<std::string>(), to_json(item.second, depth + 1));
    }
    return Json::make_object(std::move(members));
  }
  throw py::type_error("config: a " + py::type::of(value).attr("__name__").cast<std::string>() +
                       " is not a JSON value");
}

Json config_json(const py::object& config) {
  if (!py::isinstance<py::dict>(config)) {
    throw py::value_error("config.json: must be a JSON object, got " +
                          py::type::of(config).attr("__name__").cast<std::string>());
  }
  return to_json(config);
}

// Every TransformerConfig field by name (enums by their names).
struct DictWriter {
  py::dict& out;
  void operator()(const char* name, long v) { out[name] = v; }
  void operator()(const char* name, float v) { out[name] = static_cast<double>(v); }
  void operator()(const char* name, bool v) { out[name] = v; }
  template <class Enum, class = std::enable_if_t<std::is_enum<Enum>::value>>
  void operator()(const char* name, Enum v) {
    out[name] = config_choice_name(v);
  }
};

py::object source_object(const arch::Source& s) {
  if (s.computed) {
    py::array_t<float> a(s.shape);
    std::copy(s.values.begin(), s.values.end(), a.mutable_data());
    return std::move(a);
  }
  const arch::TensorDecl& t = s.tensor;
  py::dict d;
  d["name"] = t.name;
  d["transpose"] = t.transpose;
  d["rows"] = t.rows_start >= 0 ? py::object(py::make_tuple(t.rows_start, t.rows_stop)) : py::object(py::none());
  d["plus_one"] = t.plus_one;
  d["optional"] = t.optional;
  d["root"] = t.root;
  d["as_row"] = t.as_row;
  d["fallbacks"] = py::tuple(py::cast(t.fallbacks));
  d["rows_key"] = t.rows_key;
  d["stored_shape"] = t.stored_shape.empty() ? py::object(py::none()) : py::object(py::tuple(py::cast(t.stored_shape)));
  return std::move(d);
}

py::dict sources_dict(const arch::Sources& sources) {
  py::dict out;
  for (const auto& item : sources.items()) out[py::str(item.first)] = source_object(item.second);
  return out;
}

py::object head_object(const arch::Head& h) {
  py::list steps;
  for (const arch::HeadStep& step : h.steps) {
    if (step.kind == "dense") {
      steps.append(py::make_tuple(step.kind, step.name));
    } else if (step.kind == "act") {
      steps.append(py::make_tuple(step.kind, step.name));
    } else if (step.kind == "norm") {
      steps.append(py::make_tuple(step.kind, step.name, step.eps));
    } else {
      steps.append(py::make_tuple(step.kind));
    }
  }
  py::dict shapes;
  for (const auto& item : h.shapes) shapes[py::str(item.first)] = py::tuple(py::cast(item.second));
  py::dict out;
  out["task"] = h.task;
  out["steps"] = py::tuple(steps);
  out["tensors"] = sources_dict(h.tensors);
  out["shapes"] = shapes;
  out["labels"] = py::tuple(py::cast(h.labels));
  return std::move(out);
}

py::object to_python(const Json& v) {
  switch (v.type()) {
    case Json::Type::kNull: return py::none();
    case Json::Type::kBool: return py::bool_(v.boolean());
    case Json::Type::kNumber:
      if (v.is_integer_number()) return py::int_(v.integer());
      return py::float_(v.number());
    case Json::Type::kString: return py::str(v.string());
    case Json::Type::kArray: {
      py::list out;
      for (const Json& item : v.array()) out.append(to_python(item));
      return std::move(out);
    }
    case Json::Type::kObject: {
      py::dict out;
      for (const auto& item : v.object()) out[py::str(item.first)] = to_python(item.second);
      return std::move(out);
    }
  }
  return py::none();
}

}  // namespace

void register_arch(py::module_& m) {
  m.def(
      "default_quantization",
      [](const std::string& dtype) {
        TransformerConfig c;
        arch::set_default_format(c, dtype);
        py::dict out;
        out["group_size"] = c.group_size;
        out["zero_point"] = c.zero_point;
        out["lm_head"] = config_choice_name(c.head_dtype);
        out["embeddings"] = config_choice_name(c.embedding_dtype);
        return out;
      },
      py::arg("dtype"),
      "The default quantization settings of a model in `dtype` (models/arch/checkpoint.h: set_default_format): "
      "group_size, zero_point, lm_head (the head's dtype) and embeddings (the token table's).");
  m.def(
      "graph_manifest",
      [](const std::string& directory, const std::string& dtype) {
        std::string where;
        return to_python(directory_manifest(directory, dtype, where));
      },
      py::arg("directory"), py::arg("dtype") = "",
      "The graph manifest the C API follows for `directory` (models/graph_loader.h): its cpuformer_graph.json, or "
      "for a plain Hugging Face directory of a family the C++ registry declares, the one computed in `dtype` "
      "('' : float32).");
  m.def(
      "arch_families",
      [] {
        py::list out;
        for (const auto& a : arch::registry()) {
          py::dict d;
          d["kind"] = a->kind;
          d["family"] = a->family;
          d["title"] = a->title;
          d["architectures"] = py::tuple(py::cast(a->architectures));
          d["model_types"] = py::tuple(py::cast(a->model_types));
          d["prefixes"] = py::tuple(py::cast(a->prefixes));
          d["ignored"] = py::tuple(py::cast(a->ignored));
          d["example"] = a->example;
          py::list copies;
          for (const auto& c : a->tied_copies) copies.append(py::make_tuple(c.first, c.second));
          d["tied_copies"] = py::tuple(copies);
          d["start_from_pad"] = a->start_from_pad;
          out.append(d);
        }
        return out;
      },
      "The architecture families the C++ registry declares (models/arch/arch.h): kind, family, title, "
      "architectures, model_types, prefixes, ignored (regular expressions), example (JSON text).");
  m.def(
      "arch_hparams",
      [](const std::string& family, const py::object& config) {
        const Json json = config_json(config);
        const TransformerConfig c = arch::family(family).hparams(arch::Config{json});
        py::dict out;
        TransformerConfig copy = c;
        copy.fields(DictWriter{out});
        return out;
      },
      py::arg("family"), py::arg("config"),
      "config.json (a dict) -> the TransformerConfig fields of family `family`, by name; ValueError for a bad value, "
      "NotImplementedError for a setting cpuformer does not run.");
  m.def(
      "arch_tensors",
      [](const std::string& family, const std::string& part, const py::object& config, const py::dict& hp,
         const std::string& stack, long layer) {
        const arch::Arch& a = arch::family(family);
        const TransformerConfig c = partial_transformer_config(hp);
        if (part == "layer") return sources_dict(a.layer_tensors(c, stack, layer));
        const Json json = config_json(config);
        if (part == "model") return sources_dict(a.model_tensors(arch::Config{json}, c));
        if (part == "stack") return sources_dict(a.stack_tensors(arch::Config{json}, c, stack));
        throw py::value_error("arch_tensors: part must be 'model', 'stack' or 'layer', got '" + part + "'");
      },
      py::arg("family"), py::arg("part"), py::arg("config"), py::arg("hparams"), py::arg("stack") = "",
      py::arg("layer") = 0,
      "Where each canonical weight of `part` ('model', 'stack' or 'layer') comes from: canonical name -> a dict of "
      "arch.spec.Tensor's fields, or a float32 array computed from the config.");
  m.def(
      "arch_head",
      [](const std::string& family, const py::object& config, const py::dict& hp, const std::string& task) {
        const Json json = config_json(config);
        arch::Head head;
        if (!arch::family(family).head(arch::Config{json}, partial_transformer_config(hp), task, head))
          return py::object(py::none());
        return head_object(head);
      },
      py::arg("family"), py::arg("config"), py::arg("hparams"), py::arg("task"),
      "The task head of `task` for family `family` (task, steps, tensors, shapes, labels: arch.heads.Head's fields), "
      "or None when the family has none.");
  m.def(
      "arch_memory",
      [](const std::string& family, const py::object& config) {
        const Json json = config_json(config);
        long mem_len = 0, reuse_len = 0;
        if (!arch::family(family).memory(arch::Config{json}, mem_len, reuse_len)) return py::object(py::none());
        return py::object(py::make_tuple(mem_len, reuse_len));
      },
      py::arg("family"), py::arg("config"),
      "(mem_len, reuse_len) of a family with a Transformer-XL memory (XLNet), None for the others.");
  m.def(
      "canonical_shape",
      [](const std::string& name, const py::dict& hp) {
        return py::tuple(py::cast(arch::canonical_shape(name, partial_transformer_config(hp))));
      },
      py::arg("name"), py::arg("hparams"),
      "The shape of canonical weight `name` for a model of hyperparameters `hparams` (csrc/models/arch/checkpoint.h).");
  m.def(
      "arch_labels",
      [](const py::object& config) {
        const Json json = config_json(config);
        return py::tuple(py::cast(arch::labels(arch::Config{json})));
      },
      py::arg("config"), "A classification checkpoint's labels in id order (id2label, else LABEL_i for num_labels).");
  m.def(
      "arch_linear_head",
      [](const py::object& config, const std::string& task, long hidden) {
        if (task != "token_classification" && task != "question_answering") {
          throw py::value_error("arch_linear_head: task must be 'token_classification' or 'question_answering'");
        }
        const Json json = config_json(config);
        return head_object(arch::linear_head(arch::Config{json}, task, hidden));
      },
      py::arg("config"), py::arg("task"), py::arg("hidden"),
      "The one-linear-layer head of token classification (classifier) or question answering (qa_outputs).");
  m.def(
      "rope_inv_freq",
      [](const py::object& config, long head_dim) {
        if (head_dim < 1) throw py::value_error("rope_inv_freq: head_dim must be >= 1");
        const Json json = config_json(config);
        const std::vector<float> v = arch::rope_inv_freq(arch::Config{json}, head_dim);
        py::array_t<float> out(static_cast<py::ssize_t>(v.size()));
        std::copy(v.begin(), v.end(), out.mutable_data());
        return out;
      },
      py::arg("config"), py::arg("head_dim"),
      "RoPE inverse frequencies [ceil(head_dim / 2)] float32 as transformers computes them, from config.json's "
      "rope_theta and rope_scaling / rope_parameters (types default, linear, llama3).");
}

}  // namespace bindings
}  // namespace cpuformer
