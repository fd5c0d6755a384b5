// cpuformer._core.Linear: a weight matrix packed once, applied to activations.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/gil.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_peak.h"
#include "runtime/checked_size.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

Activation parse_activation(const py::object& name) {
  return name.is_none() ? Activation::kNone : activation_from_name(py::str(name), "None");
}

// group_size of an int4 weight: 32, 64 or 128.
void check_group_size(long group_size) {
  if (!valid_int4_group_size(group_size)) {
    throw py::value_error("group_size must be 32, 64 or 128, got " + std::to_string(group_size));
  }
}

// ValueError naming the first non-finite weight. The check is a max over |x|'s bits (NaN and ±inf
// lie above the largest finite value), which vectorizes; a loop of isfinite with an early exit did
// not, and took ~30 % of quantize_int4's time.
void require_finite_weights(const float* w, py::ssize_t size, const char* dtype) {
  uint32_t top = 0;
  for (py::ssize_t i = 0; i < size; ++i) {
    uint32_t bits;
    std::memcpy(&bits, w + i, 4);
    bits &= 0x7FFFFFFFu;
    top = bits > top ? bits : top;
  }
  if (top <= 0x7F7FFFFFu) return;
  for (py::ssize_t i = 0; i < size; ++i) {
    if (!std::isfinite(w[i]))
      throw py::value_error("w has a non-finite value at flat index " + std::to_string(i) + "; " + dtype +
                            " needs finite weights");
  }
}

// w float32 [N, K] -> (q int8 [N, K], scales float32 [N]): the load-time int8 quantization.
py::tuple quantize_int8(const py::object& weight) {
  FloatArray w = as_float32(weight, "w");
  require_ndim(w, 2, "w", "[N, K]");
  const long n = w.shape(0), k = w.shape(1);
  py::array_t<int8_t> q({n, k});
  py::array_t<float> scales(n);
  const float* wp = w.data();
  require_finite_weights(wp, w.size(), "int8");
  int8_t* qp = q.mutable_data();
  float* sp = scales.mutable_data();
  {
    GilReleased release;
    quantize_weights_s8(wp, n, k, k, qp, sp);
  }
  return py::make_tuple(q, scales);
}

// w float32 [N, K] -> (u uint8 [N, Kp / 2], scales float16 [N, groups], zeros uint8 [N, groups] or
// None): the load-time int4 quantization (quantize_weights_s4).
py::tuple quantize_int4(const py::object& weight, long group_size, bool zero_point) {
  check_group_size(group_size);
  FloatArray w = as_float32(weight, "w");
  require_ndim(w, 2, "w", "[N, K]");
  const long n = w.shape(0), k = w.shape(1), groups = int4_groups(k, group_size);
  const float* wp = w.data();
  require_finite_weights(wp, w.size(), "int4");
  py::array_t<uint8_t> u({n, groups * group_size / 2});
  py::array scales(py::dtype("float16"), {n, groups});
  py::array_t<uint8_t> zeros(zero_point ? std::vector<py::ssize_t>{n, groups} : std::vector<py::ssize_t>{0, 0});
  {
    GilReleased release;
    quantize_weights_s4(wp, n, k, k, group_size, zero_point, u.mutable_data(),
                        static_cast<uint16_t*>(scales.mutable_data()), zero_point ? zeros.mutable_data() : nullptr);
  }
  return py::make_tuple(u, scales, zero_point ? py::object(zeros) : py::object(py::none()));
}

// float32 array (any shape) -> uint16 bit patterns of float16 or bfloat16, rounded to nearest even.
py::array_t<uint16_t> to_16bit(const py::object& input, bool half) {
  FloatArray x = as_float32(input, "x");
  py::array_t<uint16_t> out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  const float* xp = x.data();
  uint16_t* op = out.mutable_data();
  for (py::ssize_t i = 0; i < x.size(); ++i) op[i] = half ? float_to_half(xp[i]) : float_to_bfloat16(xp[i]);
  return out;
}

class Linear {
 public:
  Linear(const py::object& weight, const py::object& bias, const py::object& activation, const std::string& dtype,
         long group_size, bool zero_point)
      : activation_(parse_activation(activation)) {
    const WeightType type = weight_type_from_name(dtype);
    if (type == WeightType::kInt4) check_group_size(group_size);
    FloatArray w = as_float32(weight, "w");
    require_ndim(w, 2, "w", "[N, K]");
    require_nonempty(w, "w");
    n_ = w.shape(0);
    k_ = w.shape(1);
    if (type == WeightType::kInt8 && k_ > kInt8GemmMaxK) {
      throw py::value_error("w has K = " + std::to_string(k_) + " input features; dtype 'int8' supports at most " +
                            std::to_string(kInt8GemmMaxK) +
                            " (2^17: the int8 GEMM sums K products in int32); use float32, float16 or bfloat16");
    }
    if (!bias.is_none()) {
      FloatArray b = as_float32(bias, "bias");
      if (b.ndim() != 1 || b.shape(0) != n_) {
        throw py::value_error("bias must have shape [" + std::to_string(n_) + "] (N of w), got " + shape_string(b));
      }
      bias_.assign(b.data(), b.data() + n_);
    }
    const float* wp = w.data();
    if (type == WeightType::kInt8 || type == WeightType::kInt4) {
      for (py::ssize_t i = 0; i < w.size(); ++i) {
        if (!std::isfinite(wp[i]))
          throw py::value_error("w has a non-finite value at flat index " + std::to_string(i) + "; " + dtype +
                                " needs finite weights");
      }
    }
    try {
      GilReleased release;
      packed_ = pack_weights(wp, WeightFormat(type, group_size, zero_point), n_, k_, k_);
    } catch (const std::invalid_argument& error) {  // an int4 scale out of float16's range
      throw py::value_error(std::string("w: ") + error.what());
    }
  }

  // x [..., K] -> [..., N]; residual [..., N] (optional) is added after the activation. The output
  // starts as a copy of the residual and the GEMM accumulates into it in place, the way the models
  // use it.
  py::array_t<float> operator()(const py::object& input, const py::object& residual, int num_threads) const {
    check_op_threads(num_threads);
    FloatArray x = as_float32(input, "x");
    if (x.ndim() < 1 || x.shape(x.ndim() - 1) != k_) {
      throw py::value_error("x must have shape [..., " + std::to_string(k_) + "] (K of w), got " + shape_string(x));
    }
    require_nonempty(x, "x");
    std::vector<py::ssize_t> out_shape(x.shape(), x.shape() + x.ndim());
    out_shape.back() = n_;
    const long m = static_cast<long>(x.size() / k_);
    with_size_context([&] { return "x of shape " + shape_string(x); },
                      [&] { return checked_bytes({m, n_}, sizeof(float), "the output"); });
    py::array_t<float> out(out_shape);
    const float* xp = x.data();
    float* op = out.mutable_data();
    GemmEpilogue epilogue;
    epilogue.bias = bias_.empty() ? nullptr : bias_.data();
    epilogue.activation = activation_;
    if (!residual.is_none()) {
      FloatArray r = as_float32(residual, "residual");
      const bool same_shape = r.ndim() == out.ndim() && std::equal(out_shape.begin(), out_shape.end(), r.shape());
      if (!same_shape) {
        throw py::value_error("residual must have the output's shape " + shape_string(out) + ", got " +
                              shape_string(r));
      }
      std::memcpy(op, r.data(), sizeof(float) * m * n_);
      epilogue.residual = op;
      epilogue.ldr = n_;
    }
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());
      gemm(xp, m, k_, packed_, op, n_, epilogue);
    }
    return out;
  }

  long n() const { return n_; }
  long k() const { return k_; }
  long group_size() const { return packed_.type == WeightType::kInt4 ? packed_.group_size : 0; }
  bool zero_point() const { return packed_.zero_point; }
  std::string dtype() const { return weight_type_name(packed_.type); }

 private:
  long n_ = 0, k_ = 0;
  Activation activation_;
  std::vector<float> bias_;
  PackedWeights packed_;
};

// Operations per second (a multiply-add is 2) of the matmul instruction for weights `dtype`, on
// the current thread count: the compute peak of gemm_peak.h.
double peak_gops(const std::string& dtype, double seconds) {
  const WeightType type = weight_type_from_name(dtype);
  if (!std::isfinite(seconds) || seconds <= 0.0 || seconds > 60.0) {
    throw py::value_error("seconds must be in (0, 60], got " + py::str(py::float_(seconds)).cast<std::string>());
  }
  GilReleased release;
  ComputeSlots slots(current_num_threads());
  return 2.0 * gemm_peak_macs(type, seconds) * 1e-9;
}

}  // namespace

void register_ops_gemm(py::module_& m) {
  py::class_<Linear>(m, "Linear")
      .def(py::init<const py::object&, const py::object&, const py::object&, const std::string&, long, bool>(),
           py::arg("w"), py::arg("bias") = py::none(), py::arg("activation") = py::none(), py::arg("dtype") = "float32",
           py::arg("group_size") = kInt4DefaultGroupSize, py::arg("zero_point") = false)
      .def("__call__", &Linear::operator(), py::arg("x"), py::arg("residual") = py::none(), py::arg("num_threads") = 0)
      .def_property_readonly("out_features", &Linear::n)
      .def_property_readonly("in_features", &Linear::k)
      .def_property_readonly("dtype", &Linear::dtype)
      .def_property_readonly("group_size", &Linear::group_size)
      .def_property_readonly("zero_point", &Linear::zero_point);
  m.def("quantize_int8", &quantize_int8, py::arg("w"));
  m.def("quantize_int4", &quantize_int4, py::arg("w"), py::arg("group_size") = kInt4DefaultGroupSize,
        py::arg("zero_point") = false);
  m.def("peak_gops", &peak_gops, py::arg("dtype") = "float32", py::arg("seconds") = 0.3);
  m.def("float32_to_float16_bits", [](const py::object& x) { return to_16bit(x, true); }, py::arg("x"));
  m.def("float32_to_bfloat16_bits", [](const py::object& x) { return to_16bit(x, false); }, py::arg("x"));
}

}  // namespace bindings
}  // namespace cpuformer
