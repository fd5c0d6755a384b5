#include "bindings/arrays.h"

namespace cpuformer {
namespace bindings {

std::string shape_string(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  return s + "]";
}

std::string type_name(py::handle obj) {
  const py::handle type = py::type::handle_of(obj);
  const std::string module = py::str(type.attr("__module__"));
  const std::string name = py::str(type.attr("__qualname__"));
  return module == "builtins" ? name : module + "." + name;
}

FloatArray as_float32(py::handle obj, const char* name) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(std::string(name) + " must be a numpy.ndarray of float32, got " + type_name(obj));
  }
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  if (!arr.dtype().is(py::dtype::of<float>())) {
    throw py::type_error(std::string(name) + " must have dtype float32, got " + std::string(py::str(arr.dtype())));
  }
  return FloatArray::ensure(arr);  // copies only when not C-contiguous
}

IdArray as_ids(py::handle obj, const char* name) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(std::string(name) + " must be a numpy.ndarray of int64, got " + type_name(obj));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<int64_t>())) {
    throw py::type_error(std::string(name) + " must have dtype int64, got " + std::string(py::str(a.dtype())));
  }
  require_ndim(a, 2, name, "[batch, seq_len]");
  return IdArray::ensure(a);
}

void require_ndim(const py::array& a, py::ssize_t ndim, const char* name, const char* expected) {
  if (a.ndim() != ndim) {
    throw py::value_error(std::string(name) + " must have " + std::to_string(ndim) + " dimensions " + expected +
                          ", got shape " + shape_string(a));
  }
}

void require_nonempty(const py::array& a, const char* name) {
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) == 0)
      throw py::value_error(std::string(name) + " must not have an empty dimension, got shape " + shape_string(a));
  }
}

void check_op_threads(int num_threads) {
  if (num_threads < 0)
    throw py::value_error("num_threads must be >= 1 (or 0 for the default), got " + std::to_string(num_threads));
}

Activation activation_from_name(const std::string& s, const char* none_text) {
  if (s == "none") return Activation::kNone;
  if (s == "relu") return Activation::kRelu;
  if (s == "gelu") return Activation::kGeluErf;
  if (s == "gelu_tanh") return Activation::kGeluTanh;
  if (s == "silu") return Activation::kSilu;
  if (s == "quick_gelu") return Activation::kQuickGelu;
  throw py::value_error(std::string("activation must be one of ") + none_text +
                        ", 'relu', 'gelu', 'gelu_tanh', 'silu', 'quick_gelu', got '" + s + "'");
}

WeightType weight_type_from_name(const std::string& s) {
  if (s == "float32") return WeightType::kFloat32;
  if (s == "float16") return WeightType::kFloat16;
  if (s == "bfloat16") return WeightType::kBFloat16;
  if (s == "int8") return WeightType::kInt8;
  if (s == "int4") return WeightType::kInt4;
  throw py::value_error("dtype must be 'float32', 'float16', 'bfloat16', 'int8' or 'int4', got '" + s + "'");
}

}  // namespace bindings

}  // namespace cpuformer
