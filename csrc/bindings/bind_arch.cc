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

// A weight format (weights.graph_format's dict: dtype, head_dtype, group_size, zero_point,
// embedding_dtype) into `c`.
void read_format(const py::object& format, TransformerConfig& c) {
  const py::dict d = format.cast<py::dict>();
  c.weight_type = parse_config_choice<WeightType>(d["dtype"].cast<std::string>(), "dtype");
  c.head_dtype = parse_config_choice<WeightType>(d["head_dtype"].cast<std::string>(), "head_dtype");
  c.group_size = d["group_size"].cast<long>();
  c.zero_point = d["zero_point"].cast<bool>();
  c.embedding_dtype = parse_config_choice<WeightType>(d["embedding_dtype"].cast<std::string>(), "embedding_dtype");
}

// Manifest tensor entries for Python: as to_python, but each computed entry's "values" as a
// float32 array of the entry's shape (a table of positions can hold a million values).
py::object entries_python(const Json& v) {
  if (v.type() == Json::Type::kArray) {
    py::list out;
    for (const Json& item : v.array()) out.append(entries_python(item));
    return std::move(out);
  }
  py::dict out;
  for (const auto& item : v.object()) {
    const Json& entry = item.second;
    const Json* values = entry.type() == Json::Type::kObject ? entry.find("values") : nullptr;
    if (entry.type() != Json::Type::kObject || entry.find("shape") == nullptr) {
      out[py::str(item.first)] = entries_python(entry);  // a stack's layers
      continue;
    }
    py::dict e;  // (computed values straight into an array, not through a list)
    for (const auto& field : entry.object()) {
      if (field.first != "values") e[py::str(field.first)] = to_python(field.second);
    }
    if (values) {
      std::vector<long> shape;
      for (const Json& d : entry.at("shape").array()) shape.push_back(d.integer());
      py::array_t<float> a(shape);
      float* data = a.mutable_data();
      for (std::size_t i = 0; i < values->array().size(); ++i)
        data[i] = static_cast<float>(values->array()[i].number());
      e["values"] = std::move(a);
    }
    out[py::str(item.first)] = std::move(e);
  }
  return std::move(out);
}

// A Python declaration (python/cpuformer/arch/spec.py: Tensor) as the C++ one.
arch::TensorDecl tensor_decl(py::handle t) {
  arch::TensorDecl d(t.attr("name").cast<std::string>());
  d.transpose = t.attr("transpose").cast<bool>();
  const py::object rows = t.attr("rows");
  if (!rows.is_none()) {
    const auto r = rows.cast<std::pair<long, long>>();
    d.rows(r.first, r.second);
  }
  d.plus_one = t.attr("plus_one").cast<bool>();
  d.optional = t.attr("optional").cast<bool>();
  d.root = t.attr("root").cast<bool>();
  d.as_row = t.attr("as_row").cast<bool>();
  d.fallbacks = t.attr("fallbacks").cast<std::vector<std::string>>();
  d.rows_key = t.attr("rows_key").cast<std::string>();
  const py::object stored_shape = t.attr("stored_shape");
  if (!stored_shape.is_none()) d.stored_shape = stored_shape.cast<std::vector<long>>();
  return d;
}

// {canonical: Tensor or computed array} as Sources.
arch::Sources python_sources(const py::dict& sources) {
  arch::Sources out;
  for (auto item : sources) {
    const std::string canonical = py::str(item.first).cast<std::string>();
    if (py::isinstance<py::array>(item.second)) {
      const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(item.second);
      std::vector<long> shape(a.shape(), a.shape() + a.ndim());
      out.add(canonical, shape, std::vector<float>(a.data(), a.data() + a.size()));
    } else {
      out.add(canonical, tensor_decl(item.second));
    }
  }
  return out;
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
      "checkpoint_tensors",
      [](const std::string& directory, const py::object& config, const py::object& format) {
        TransformerConfig converted;
        if (!format.is_none()) read_format(format, converted);
        const arch::CheckpointTensors plain =
            arch::checkpoint_tensors(directory, config_json(config), format.is_none() ? nullptr : &converted);
        py::dict out;
        out["prefix"] = plain.prefix;
        out["head_ignored"] = plain.head_ignored;
        out["tensors"] = entries_python(plain.tensors);
        return out;
      },
      py::arg("directory"), py::arg("config"), py::arg("format") = py::none(),
      "How the C++ registry reads the checkpoint in `directory` with config.json `config` (models/arch/"
      "checkpoint.h: checkpoint_tensors): {'prefix', 'head_ignored', 'tensors'}, the tensors as a graph manifest's "
      "entries, computed ones ('values') as float32 arrays of their shape. `format`: a converted directory's "
      "weight format (weights.graph_format: dtype, head_dtype, group_size, zero_point, embedding_dtype), None for a "
      "plain checkpoint.");
  m.def(
      "declared_tensors",
      [](const std::string& directory, const py::dict& spec, const py::object& format) {
        arch::Declared d;
        d.family.title = spec["title"].cast<std::string>();
        d.family.prefixes = spec["prefixes"].cast<std::vector<std::string>>();
        d.family.ignored = spec["ignored"].cast<std::vector<std::string>>();
        d.family.tied_copies = spec["tied_copies"].cast<std::vector<std::pair<std::string, std::string>>>();
        d.hp = partial_transformer_config(spec["hparams"].cast<py::dict>());
        for (auto item : spec["shapes"].cast<py::dict>())
          d.shapes[py::str(item.first).cast<std::string>()] = item.second.cast<std::vector<long>>();
        for (py::handle group : spec["groups"]) d.groups.push_back(python_sources(group.cast<py::dict>()));
        d.account = spec["account"].cast<bool>();
        TransformerConfig converted;
        if (!format.is_none()) read_format(format, converted);
        const arch::DeclaredTensors read =
            arch::declared_tensors(directory, std::move(d), format.is_none() ? nullptr : &converted);
        py::list groups;
        for (const Json& g : read.groups) groups.append(entries_python(g));
        py::dict out;
        out["groups"] = groups;
        out["prefix"] = read.prefix;
        out["head_ignored"] = read.head_ignored;
        return out;
      },
      py::arg("directory"), py::arg("spec"), py::arg("format") = py::none(),
      "checkpoint_tensors' procedure over declarations given here (models/arch/checkpoint.h: declared_tensors): "
      "spec = {'title', 'prefixes', 'ignored', 'tied_copies', 'hparams', 'shapes', 'groups': [{canonical: Tensor or "
      "array}], 'account'}; returns {'groups': [entries], 'prefix', 'head_ignored'}.");
  m.def(
      "generation_defaults",
      [](const std::string& directory, const py::object& config, const py::object& generation_config) {
        const arch::GenerationDefaults d =
            arch::generation_defaults(directory, config_json(config), config_json(generation_config));
        py::dict out = to_python(d.options);
        out["eos_source"] = d.eos_source;
        return out;
      },
      py::arg("directory"), py::arg("config"), py::arg("generation_config"),
      "The options a plain generate() passes (models/arch/checkpoint.h: generation_defaults) for the model in "
      "`directory` with these config.json and generation_config.json ({} when absent) contents, plus "
      "'eos_source': the file the EOS ids come from.");
  m.def(
      "checkpoint_manifest",
      [](const std::string& directory, const py::object& config, const py::object& generation_config,
         const py::object& format, bool converted) {
        TransformerConfig c;
        read_format(format, c);
        const Json generation = generation_config.is_none() ? Json() : config_json(generation_config);
        return to_python(arch::checkpoint_manifest(directory, config_json(config), generation, c, converted));
      },
      py::arg("directory"), py::arg("config"), py::arg("generation_config"), py::arg("format"), py::arg("converted"),
      "The graph manifest of the checkpoint in `directory` (models/arch/checkpoint.h: checkpoint_manifest) in weight "
      "format `format` (as checkpoint_tensors'); `converted`: its matrix weights are stored in that format.");
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
      "matrix_weights", [] { return py::tuple(py::cast(arch::matrix_weights())); },
      "The canonical weights the model multiplies with (models/arch/checkpoint.h: matrix_weights).");
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
