// Where a model's canonical tensors come from while it is built (models/model_builder.h): a
// NumPy dict in the Python extension (bindings/model_builder.h), a converted directory's mapped
// safetensors in the C API (models/graph_loader.h). The builder checks names, shapes and element
// types itself, so every front end loads a model identically and reports the same errors.
#pragma once

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace cpuformer {

// The element types a model tensor can have (kOther: anything else, named by TensorView::type_name).
enum class ElementType { kFloat32, kFloat16, kUInt16, kInt8, kUInt8, kOther };

// One tensor, borrowed from its source for as long as the source lives.
struct TensorView {
  const void* data = nullptr;
  ElementType type = ElementType::kOther;
  std::string type_name;  // "float32", "float16", "uint16", "int8", "uint8", ... (for errors)
  std::vector<long> shape;
  bool contiguous = true;  // C-contiguous

  long size() const {
    long n = 1;
    for (long d : shape) n *= d;
    return n;
  }
};

// A wrong element type or a value that is not a tensor: TypeError in Python (bindings/module.cc),
// CF_ERROR_INVALID_MODEL in the C API. Other bad tensors are std::invalid_argument (ValueError).
class TypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// "[2, 3]".
std::string shape_string(const std::vector<long>& shape);

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The key is present (a Python None value counts as present, see has()).
  virtual bool contains(const std::string& key) const = 0;
  // The key is present with a tensor (not None).
  virtual bool has(const std::string& key) const { return contains(key); }
  // The tensor under a present key; `name` names it in errors (TypeError when it is not a tensor).
  virtual TensorView get(const std::string& key, const std::string& name) const = 0;
  // Every key, for the unknown-key check.
  virtual std::vector<std::string> keys() const = 0;
  // Copies tensor data into model-owned memory (the Python source lets other threads run meanwhile:
  // reading a mapped file may wait for the disk).
  virtual void copy(void* dst, const void* src, std::size_t bytes) const { std::memcpy(dst, src, bytes); }
};

}  // namespace cpuformer
