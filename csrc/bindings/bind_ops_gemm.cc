// cpuformer._core.Linear: a weight matrix packed once, applied to activations.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "kernels/gemm/gemm.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

Activation parse_activation(const py::object& name) {
  if (name.is_none()) return Activation::kNone;
  const std::string s = py::str(name);
  if (s == "none") return Activation::kNone;
  if (s == "relu") return Activation::kRelu;
  if (s == "gelu") return Activation::kGeluErf;
  if (s == "gelu_tanh") return Activation::kGeluTanh;
  if (s == "silu") return Activation::kSilu;
  throw py::value_error("activation must be one of None, 'relu', 'gelu', 'gelu_tanh', 'silu', got '" + s + "'");
}

class Linear {
 public:
  Linear(const py::object& weight, const py::object& bias, const py::object& activation)
      : activation_(parse_activation(activation)) {
    FloatArray w = as_float32(weight, "w");
    require_ndim(w, 2, "w", "[N, K]");
    require_nonempty(w, "w");
    n_ = w.shape(0);
    k_ = w.shape(1);
    if (!bias.is_none()) {
      FloatArray b = as_float32(bias, "bias");
      if (b.ndim() != 1 || b.shape(0) != n_) {
        throw py::value_error("bias must have shape [" + std::to_string(n_) + "] (N of w), got " + shape_string(b));
      }
      bias_.assign(b.data(), b.data() + n_);
    }
    const float* wp = w.data();
    py::gil_scoped_release release;
    packed_ = pack_weights_f32(wp, n_, k_, k_);
  }

  // x [..., K] -> [..., N]; residual [..., N] (optional) is added after the activation. The output
  // starts as a copy of the residual and the GEMM accumulates into it in place, the way the models
  // use it.
  py::array_t<float> operator()(const py::object& input, const py::object& residual) const {
    FloatArray x = as_float32(input, "x");
    if (x.ndim() < 1 || x.shape(x.ndim() - 1) != k_) {
      throw py::value_error("x must have shape [..., " + std::to_string(k_) + "] (K of w), got " + shape_string(x));
    }
    require_nonempty(x, "x");
    std::vector<py::ssize_t> out_shape(x.shape(), x.shape() + x.ndim());
    out_shape.back() = n_;
    py::array_t<float> out(out_shape);
    const long m = static_cast<long>(x.size() / k_);
    const float* xp = x.data();
    float* op = out.mutable_data();
    GemmEpilogue epilogue;
    epilogue.bias = bias_.empty() ? nullptr : bias_.data();
    epilogue.activation = activation_;
    if (!residual.is_none()) {
      FloatArray r = as_float32(residual, "residual");
      const bool same_shape =
          r.ndim() == out.ndim() && std::equal(out_shape.begin(), out_shape.end(), r.shape());
      if (!same_shape) {
        throw py::value_error("residual must have the output's shape " + shape_string(out) + ", got " + shape_string(r));
      }
      std::memcpy(op, r.data(), sizeof(float) * m * n_);
      epilogue.residual = op;
      epilogue.ldr = n_;
    }
    {
      py::gil_scoped_release release;
      ComputeSlots slots(current_num_threads());
      gemm(xp, m, k_, packed_, op, n_, epilogue);
    }
    return out;
  }

  long n() const { return n_; }
  long k() const { return k_; }

 private:
  long n_ = 0, k_ = 0;
  Activation activation_;
  std::vector<float> bias_;
  PackedWeights packed_;
};

}  // namespace

void register_ops_gemm(py::module_& m) {
  py::class_<Linear>(m, "Linear")
      .def(py::init<const py::object&, const py::object&, const py::object&>(), py::arg("w"),
           py::arg("bias") = py::none(), py::arg("activation") = py::none())
      .def("__call__", &Linear::operator(), py::arg("x"), py::arg("residual") = py::none())
      .def_property_readonly("out_features", &Linear::n)
      .def_property_readonly("in_features", &Linear::k);
}

}  // namespace bindings
}  // namespace cpuformer
