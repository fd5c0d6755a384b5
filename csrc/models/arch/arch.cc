#include "models/arch/arch.h"

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
    register_decoders(out);
    register_seq2seq(out);
    return out;
  }();
  return archs;
}

const Arch& family(const std::string& name) {
  for (const auto& a : registry())
    if (a->family == name) return *a;
  throw std::invalid_argument("unknown architecture family '" + name + "'");
}

}  // namespace arch
}  // namespace cpuformer
