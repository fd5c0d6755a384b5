// Argument checks shared by the bindings: every public entry point validates here, at the
// boundary, so the kernels can assume well-formed input.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace bindings {

namespace py = pybind11;
using FloatArray = py::array_t<float, py::array::c_style>;
using IdArray = py::array_t<int64_t, py::array::c_style>;

// "list", "numpy.float32", ...: the type of obj as a user would write it.
std::string type_name(py::handle obj);

// Describes a shape as "[2, 3, 4]".
std::string shape_string(const py::array& a);

// A C-contiguous float32 view of `obj`. Raises TypeError naming `name` unless obj is a NumPy
// array of dtype float32; non-contiguous arrays are copied (documented behaviour).
FloatArray as_float32(py::handle obj, const char* name);

// Token ids: a 2-D int64 [batch, seq_len] array (made C-contiguous); anything else is rejected
// (the Python layer converts lists). TypeError / ValueError naming `name`.
IdArray as_ids(py::handle obj, const char* name);

// Raises ValueError "<name> must have <ndim> dimensions <expected>, got shape [..]".
void require_ndim(const py::array& a, py::ssize_t ndim, const char* name, const char* expected);

// Raises ValueError if any dimension is zero.
void require_nonempty(const py::array& a, const char* name);

// The activation an op's `activation` argument names ("none", "relu", "gelu", "gelu_tanh", "silu",
// "quick_gelu"); ValueError listing them, with no activation spelled `none_text` ("None" where the
// argument takes None, "'none'" where it takes the string).
Activation activation_from_name(const std::string& s, const char* none_text);

// The weight type an op's `dtype` argument names; ValueError listing them.
WeightType weight_type_from_name(const std::string& s);

// The num_threads argument of an op: >= 1, or 0 for the calling thread's count (ValueError otherwise).
void check_op_threads(int num_threads);

}  // namespace bindings
}  // namespace cpuformer
