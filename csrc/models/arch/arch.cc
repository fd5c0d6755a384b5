#include "models/arch/arch.h"

#include <cctype>
#include <map>
#include <stdexcept>

namespace cpuformer {
namespace arch {

void Sources::add(const std::string& canonical, TensorDecl tensor) {
  Source s;
  s.tensor = std::move(tensor);
  if (Source* existing = find(canonical)) {
    *existing = std::move(s);
  } else {
    items_.emplace_back(canonical, std::move(s));
  }
}

void Sources::add(const std::string& canonical, std::vector<long> shape, std::vector<float> values) {
  Source s;
  s.computed = true;
  s.shape = std::move(shape);
  s.values = std::move(values);
  if (Source* existing = find(canonical)) {
    *existing = std::move(s);
  } else {
    items_.emplace_back(canonical, std::move(s));
  }
}

void Sources::weight_and_bias(const std::string& canonical, const std::string& checkpoint, Bias bias,
                              TensorDecl edits) {
  TensorDecl weight = edits;
  weight.name = checkpoint + ".weight";
  add(canonical, weight);
  if (bias == kNone) return;
  TensorDecl b(checkpoint + ".bias");
  b.rows_start = edits.rows_start;
  b.rows_stop = edits.rows_stop;
  b.root = edits.root;
  b.optional = bias == kOptional;
  add(canonical + ".bias", b);
}

Source* Sources::find(const std::string& canonical) {
  for (auto& item : items_)
    if (item.first == canonical) return &item.second;
  return nullptr;
}

const std::vector<std::unique_ptr<Arch>>& registry() {
  static const std::vector<std::unique_ptr<Arch>> archs = [] {
    std::vector<std::unique_ptr<Arch>> out;
    register_encoders(out);
    register_decoders(out);
    register_seq2seq(out);
    return out;
  }();
  return archs;
}

HeadBuilder::HeadBuilder(std::string task, std::vector<std::string> labels) {
  head_.task = std::move(task);
  head_.labels = std::move(labels);
}

HeadBuilder& HeadBuilder::step(const char* kind) {
  head_.steps.push_back({kind, "", 0.0});
  return *this;
}

HeadBuilder& HeadBuilder::dense(const std::string& name, const std::string& weight, std::vector<long> shape,
                                const std::string& bias, bool has_bias, bool root, const std::string& rows_key,
                                int bias_root) {
  const std::string canonical = "head." + name;
  TensorDecl w(weight);
  w.root = root;
  w.rows_key = rows_key;
  head_.tensors.add(canonical, w);
  head_.shapes.emplace_back(canonical, shape);
  if (has_bias) {
    TensorDecl b(bias.empty() ? weight.substr(0, weight.size() - 6) + "bias" : bias);
    b.root = bias_root < 0 ? root : bias_root != 0;
    b.rows_key = rows_key;
    head_.tensors.add(canonical + ".bias", b);
    head_.shapes.emplace_back(canonical + ".bias", std::vector<long>{shape[0]});
  }
  head_.steps.push_back({"dense", canonical, 0.0});
  return *this;
}

HeadBuilder& HeadBuilder::act(const std::string& activation) {
  head_.steps.push_back({"act", activation, 0.0});
  return *this;
}

HeadBuilder& HeadBuilder::norm(const std::string& name, const std::string& checkpoint, long size, double eps, bool bias,
                               bool root) {
  const std::string canonical = "head." + name;
  TensorDecl w(checkpoint + ".weight");
  w.root = root;
  head_.tensors.add(canonical, w);
  head_.shapes.emplace_back(canonical, std::vector<long>{size});
  if (bias) {
    TensorDecl b(checkpoint + ".bias");
    b.root = root;
    head_.tensors.add(canonical + ".bias", b);
    head_.shapes.emplace_back(canonical + ".bias", std::vector<long>{size});
  }
  head_.steps.push_back({"norm", canonical, eps});
  return *this;
}

namespace {

// Python's int(text) for an id2label key: surrounding whitespace, a sign, digits with single
// underscores between them.
bool parse_python_int(const std::string& text, long& out) {
  std::size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  bool negative = false;
  if (b < e && (text[b] == '+' || text[b] == '-')) negative = text[b++] == '-';
  if (b == e || !std::isdigit(static_cast<unsigned char>(text[b]))) return false;
  long value = 0;
  for (std::size_t i = b; i < e; ++i) {
    const char c = text[i];
    if (c == '_') {
      if (i + 1 == e || !std::isdigit(static_cast<unsigned char>(text[i + 1]))) return false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    if (value > (1L << 40)) return false;  // (far beyond any label count)
    value = value * 10 + (c - '0');
  }
  out = negative ? -value : value;
  return true;
}

}  // namespace

std::vector<std::string> labels(const Config& config) {
  const Json* id2label = config.get("id2label");
  const Json* num_labels = config.get("num_labels");
  long count = 2;
  if (num_labels) {
    bool ok = num_labels->is_integer_number();
    if (ok) {
      try {
        count = num_labels->integer();
      } catch (const std::invalid_argument&) {
        ok = false;
      }
    }
    if (!ok || count < 1) {
      throw std::invalid_argument("config.json: num_labels must be an integer >= 1, got " + python_repr(*num_labels));
    }
  }
  std::vector<std::string> out;
  if (!id2label) {
    for (long i = 0; i < count; ++i) out.push_back("LABEL_" + std::to_string(i));
    return out;
  }
  if (id2label->type() != Json::Type::kObject || id2label->object().empty()) {
    throw std::invalid_argument("config.json: id2label must be a non-empty object of id -> label, got " +
                                python_repr(*id2label));
  }
  std::map<long, std::string> by_id;
  for (const auto& item : id2label->object()) {
    long index = 0;
    if (!parse_python_int(item.first, index)) {
      throw std::invalid_argument("config.json: id2label keys must be integers, got " + python_string(item.first));
    }
    by_id[index] = item.second.type() == Json::Type::kString ? item.second.string() : python_repr(item.second);
  }
  const long n = static_cast<long>(by_id.size());
  if (by_id.begin()->first != 0 || by_id.rbegin()->first != n - 1) {
    std::string got = "[";
    for (const auto& item : by_id) got += (got.size() > 1 ? ", " : "") + std::to_string(item.first);
    throw std::invalid_argument("config.json: id2label keys must be 0.." + std::to_string(n - 1) + ", got " + got +
                                "]");
  }
  if (num_labels && count != n) {
    throw std::invalid_argument("config.json: num_labels is " + std::to_string(count) + " but id2label has " +
                                std::to_string(n) + " labels");
  }
  for (const auto& item : by_id) out.push_back(item.second);
  return out;
}

Head linear_head(const Config& config, const std::string& task, long hidden) {
  if (task == "token_classification") {
    const std::vector<std::string> names = labels(config);
    return HeadBuilder(task, names)
        .dense("classifier", "classifier.weight", {static_cast<long>(names.size()), hidden}, "", true, true, "id2label")
        .build();
  }
  return HeadBuilder(task).dense("qa_outputs", "qa_outputs.weight", {2, hidden}).build();
}

const Arch& family(const std::string& name) {
  for (const auto& a : registry())
    if (a->family == name) return *a;
  throw std::invalid_argument("unknown architecture family '" + name + "'");
}

}  // namespace arch
}  // namespace cpuformer
