// cpuformer._core norms and element-wise activations over NumPy arrays (last dimension).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>

#include "bindings/arrays.h"
#include "bindings/gil.h"
#include "kernels/activation/activation.h"
#include "kernels/norm/norm.h"
#include "kernels/vector_math/vector_math.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

FloatArray new_like(const FloatArray& x) {
  return FloatArray(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
}

// Shared checks of the normalisations: x [..., n], weight/bias [n], residual like x.
struct NormInputs {
  FloatArray x, weight, bias, residual;  // bias and residual are meaningful only when has_*
  bool has_bias = false, has_residual = false;
  long n = 0, rows = 0;
};

NormInputs norm_inputs(const py::object& x_obj, const py::object& weight_obj, const py::object* bias_obj,
                       const py::object& residual_obj) {
  NormInputs in;
  in.x = as_float32(x_obj, "x");
  if (in.x.ndim() < 1) throw py::value_error("x must have at least 1 dimension [..., N], got a scalar");
  require_nonempty(in.x, "x");
  in.n = in.x.shape(in.x.ndim() - 1);
  in.rows = static_cast<long>(in.x.size() / in.n);
  const std::string expect = "[" + std::to_string(in.n) + "] (the last dimension of x)";
  in.weight = as_float32(weight_obj, "weight");
  if (in.weight.ndim() != 1 || in.weight.shape(0) != in.n)
    throw py::value_error("weight must have shape " + expect + ", got " + shape_string(in.weight));
  if (bias_obj && !bias_obj->is_none()) {
    in.bias = as_float32(*bias_obj, "bias");
    in.has_bias = true;
    if (in.bias.ndim() != 1 || in.bias.shape(0) != in.n)
      throw py::value_error("bias must have shape " + expect + ", got " + shape_string(in.bias));
  }
  if (!residual_obj.is_none()) {
    in.residual = as_float32(residual_obj, "residual");
    in.has_residual = true;
    if (in.residual.ndim() != in.x.ndim() || !std::equal(in.x.shape(), in.x.shape() + in.x.ndim(), in.residual.shape()))
      throw py::value_error("residual must have the shape of x " + shape_string(in.x) + ", got " +
                            shape_string(in.residual));
  }
  return in;
}

void check_eps(float eps) {
  if (!(eps >= 0.0f)) throw py::value_error("eps must be >= 0, got " + std::to_string(eps));
}

py::array_t<float> layer_norm_op(const py::object& x, const py::object& weight, const py::object& bias, float eps,
                                 const py::object& residual, int num_threads) {
  check_eps(eps);
  check_op_threads(num_threads);
  NormInputs in = norm_inputs(x, weight, &bias, residual);
  FloatArray y = new_like(in.x);
  const float* r = in.has_residual ? in.residual.data() : nullptr;
  const float* b = in.has_bias ? in.bias.data() : nullptr;
  const float *xp = in.x.data(), *wp = in.weight.data();
  float* yp = y.mutable_data();
  {
    GilReleased release;  // scoped: returning y converts it, which needs the GIL
    ScopedNumThreads threads(num_threads);
    ComputeSlots slots(current_num_threads());
    layer_norm(xp, r, nullptr, wp, b, eps, yp, in.rows, in.n);
  }
  return y;
}

py::array_t<float> rms_norm_op(const py::object& x, const py::object& weight, float eps, const py::object& residual) {
  check_eps(eps);
  NormInputs in = norm_inputs(x, weight, nullptr, residual);
  FloatArray y = new_like(in.x);
  const float* r = in.has_residual ? in.residual.data() : nullptr;
  const float *xp = in.x.data(), *wp = in.weight.data();
  float* yp = y.mutable_data();
  {
    GilReleased release;  // scoped: returning y converts it, which needs the GIL
    ComputeSlots slots(current_num_threads());
    rms_norm(xp, r, nullptr, wp, eps, yp, in.rows, in.n);
  }
  return y;
}

py::array_t<float> activation_op(const py::object& x_obj, Activation act) {
  FloatArray x = as_float32(x_obj, "x");
  FloatArray y = new_like(x);
  const float* xp = x.data();
  float* yp = y.mutable_data();
  const long n = static_cast<long>(x.size());
  {
    GilReleased release;  // scoped: returning y converts it, which needs the GIL
    ComputeSlots slots(current_num_threads());
    apply_activation(act, xp, yp, n);
  }
  return y;
}

py::array_t<float> gelu_op(const py::object& x, const std::string& approximate) {
  if (approximate == "none") return activation_op(x, Activation::kGeluErf);
  if (approximate == "tanh") return activation_op(x, Activation::kGeluTanh);
  throw py::value_error("approximate must be 'none' or 'tanh', got '" + approximate + "'");
}

py::array_t<float> softmax_op(const py::object& x_obj) {
  FloatArray x = as_float32(x_obj, "x");
  if (x.ndim() < 1) throw py::value_error("x must have at least 1 dimension [..., N], got a scalar");
  require_nonempty(x, "x");
  FloatArray y = new_like(x);
  const long n = x.shape(x.ndim() - 1), rows = static_cast<long>(x.size() / n);
  const float* xp = x.data();
  float* yp = y.mutable_data();
  {
    GilReleased release;  // scoped: returning y converts it, which needs the GIL
    ComputeSlots slots(current_num_threads());
    softmax_rows(xp, yp, rows, n);
  }
  return y;
}

py::array_t<float> silu_mul_op(const py::object& gate_obj, const py::object& up_obj) {
  FloatArray gate = as_float32(gate_obj, "gate"), up = as_float32(up_obj, "up");
  if (gate.ndim() != up.ndim() || !std::equal(gate.shape(), gate.shape() + gate.ndim(), up.shape()))
    throw py::value_error("up must have the shape of gate " + shape_string(gate) + ", got " + shape_string(up));
  FloatArray y = new_like(gate);
  const float *g = gate.data(), *u = up.data();
  float* yp = y.mutable_data();
  const long n = static_cast<long>(gate.size());
  {
    GilReleased release;  // scoped: returning y converts it, which needs the GIL
    ComputeSlots slots(current_num_threads());
    silu_mul(g, u, yp, n);
  }
  return y;
}

// Test hook: the fused residual form of the norms with sum_out and the aliasing norm.h allows,
// which the public ops (fresh output arrays, no sum_out) never reach. `aliasing` says where y and
// sum_out point: separate buffers, or into the (copied) x or residual. Returns (y, sum_out).
py::tuple norm_fused_op(const std::string& kind, const py::object& x_obj, const py::object& weight_obj,
                        const py::object& bias_obj, float eps, const py::object& residual_obj,
                        const std::string& aliasing) {
  if (kind != "layer_norm" && kind != "rms_norm")
    throw py::value_error("kind must be 'layer_norm' or 'rms_norm', got '" + kind + "'");
  static const char* const kAliasings[] = {
      "none", "y=x", "y=residual", "sum=x", "sum=residual", "sum=x,y=residual", "sum=residual,y=x"};
  bool known = false;
  std::string names;
  for (const char* a : kAliasings) {
    known = known || aliasing == a;
    names += names.empty() ? std::string(a) : std::string(", ") + a;
  }
  if (!known) throw py::value_error("aliasing must be one of " + names + ", got '" + aliasing + "'");
  check_eps(eps);
  NormInputs in = norm_inputs(x_obj, weight_obj, kind == "layer_norm" ? &bias_obj : nullptr, residual_obj);
  if (!in.has_residual && aliasing.find("residual") != std::string::npos)
    throw py::value_error("aliasing '" + aliasing + "' needs a residual");
  // Private copies, so that writing through an alias never touches the caller's arrays.
  FloatArray x = new_like(in.x), residual = new_like(in.x), y = new_like(in.x), sum = new_like(in.x);
  std::copy(in.x.data(), in.x.data() + in.x.size(), x.mutable_data());
  if (in.has_residual) std::copy(in.residual.data(), in.residual.data() + in.x.size(), residual.mutable_data());
  float* xp = x.mutable_data();
  float* rp = in.has_residual ? residual.mutable_data() : nullptr;
  float* yp = y.mutable_data();
  float* sp = sum.mutable_data();
  FloatArray y_result = y, sum_result = sum;
  if (aliasing.find("y=x") != std::string::npos) yp = xp, y_result = x;
  if (aliasing.find("y=residual") != std::string::npos) yp = rp, y_result = residual;
  if (aliasing.find("sum=x") != std::string::npos) sp = xp, sum_result = x;
  if (aliasing.find("sum=residual") != std::string::npos) sp = rp, sum_result = residual;
  const float* b = in.has_bias ? in.bias.data() : nullptr;
  const float* wp = in.weight.data();
  {
    GilReleased release;
    ComputeSlots slots(current_num_threads());
    if (kind == "layer_norm") layer_norm(xp, rp, sp, wp, b, eps, yp, in.rows, in.n);
    else rms_norm(xp, rp, sp, wp, eps, yp, in.rows, in.n);
  }
  return py::make_tuple(y_result, sum_result);
}

// Test hook: one vector function (vector_math.h) of the active ISA over a float32 array.
py::array_t<float> vector_math_op(const std::string& function, const py::object& x_obj) {
  static const struct {
    const char* name;
    VectorFunction f;
  } kFunctions[] = {{"exp", VectorFunction::kExp},
                    {"exp_nan_propagating", VectorFunction::kExpNanPropagating},
                    {"erf", VectorFunction::kErf},
                    {"tanh", VectorFunction::kTanh},
                    {"sigmoid", VectorFunction::kSigmoid}};
  std::string names;
  for (const auto& entry : kFunctions) {
    if (function != entry.name) {
      names += names.empty() ? entry.name : std::string(", ") + entry.name;
      continue;
    }
    FloatArray x = as_float32(x_obj, "x");
    FloatArray y = new_like(x);
    const float* xp = x.data();
    float* yp = y.mutable_data();
    const long n = static_cast<long>(x.size());
    {
      GilReleased release;  // scoped: returning y converts it, which needs the GIL
      ComputeSlots slots(current_num_threads());
      vector_math_kernels().apply(entry.f, xp, yp, n);
    }
    return y;
  }
  throw py::value_error("function must be one of " + names + ", got '" + function + "'");
}

// Test hook for the row reductions of beam search: (max_value(x), sum_exp(x, shift),
// find_greater(x, offset, threshold)) at the active ISA level.
py::tuple row_reductions_op(const py::object& x_obj, float shift, float offset, float threshold) {
  FloatArray x = as_float32(x_obj, "x");
  const float* xp = x.data();
  const long n = static_cast<long>(x.size());
  const VectorMathKernels& vm = vector_math_kernels();
  float max_value;
  double sum;
  long index;
  {
    GilReleased release;
    max_value = vm.max_value(xp, n);
    sum = vm.sum_exp(xp, n, shift);
    index = vm.find_greater(xp, n, offset, threshold);
  }
  return py::make_tuple(max_value, sum, index);
}

}  // namespace

void register_ops_norm(py::module_& m) {
  m.def("layer_norm", &layer_norm_op, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
        py::arg("eps") = 1e-5f, py::arg("residual") = py::none(), py::arg("num_threads") = 0);
  m.def("rms_norm", &rms_norm_op, py::arg("x"), py::arg("weight"), py::arg("eps") = 1e-6f,
        py::arg("residual") = py::none());
  m.def("gelu", &gelu_op, py::arg("x"), py::arg("approximate") = "none");
  m.def("silu", [](const py::object& x) { return activation_op(x, Activation::kSilu); }, py::arg("x"));
  m.def("relu", [](const py::object& x) { return activation_op(x, Activation::kRelu); }, py::arg("x"));
  m.def("quick_gelu", [](const py::object& x) { return activation_op(x, Activation::kQuickGelu); }, py::arg("x"));
  m.def("softmax", &softmax_op, py::arg("x"));
  m.def("silu_mul", &silu_mul_op, py::arg("gate"), py::arg("up"));
  m.def("_norm_fused", &norm_fused_op, py::arg("kind"), py::arg("x"), py::arg("weight"), py::arg("bias"),
        py::arg("eps"), py::arg("residual"), py::arg("aliasing"),
        "Test hook: layer_norm/rms_norm with sum_out and in-place aliasing; returns (y, sum_out).");
  m.def("_vector_math", &vector_math_op, py::arg("function"), py::arg("x"),
        "Test hook: a vectorised elementary function of the active ISA (exp, exp_nan_propagating, erf, tanh, "
        "sigmoid).");
  m.def("_row_reductions", &row_reductions_op, py::arg("x"), py::arg("shift"), py::arg("offset"), py::arg("threshold"),
        "Test hook: (max ignoring NaN, sum of exp(x - shift) in double, first index with x + offset > threshold) "
        "at the active ISA.");
}

}  // namespace bindings
}  // namespace cpuformer
