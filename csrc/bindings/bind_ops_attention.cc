// cpuformer._core.attention: fused attention over NumPy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <limits>
#include <string>

#include "bindings/arrays.h"
#include "kernels/attention/attention.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

// Turns a boolean mask (True = attend) into an additive float mask of the same shape.
FloatArray additive_from_bool(const py::array& mask) {
  py::array_t<bool, py::array::c_style | py::array::forcecast> keep(mask);
  FloatArray out(std::vector<py::ssize_t>(mask.shape(), mask.shape() + mask.ndim()));
  const bool* src = keep.data();
  float* dst = out.mutable_data();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (py::ssize_t i = 0; i < out.size(); ++i) dst[i] = src[i] ? 0.0f : neg_inf;
  return out;
}

py::array_t<float> attention_op(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, bool causal,
                                const py::object& mask_obj, const py::object& scale_obj) {
  FloatArray q = as_float32(q_obj, "q"), k = as_float32(k_obj, "k"), v = as_float32(v_obj, "v");
  require_ndim(q, 4, "q", "[B, H, Tq, D]");
  require_ndim(k, 4, "k", "[B, Hkv, Tk, D]");
  require_ndim(v, 4, "v", "[B, Hkv, Tk, D]");
  require_nonempty(q, "q");
  require_nonempty(k, "k");
  const long B = q.shape(0), H = q.shape(1), Tq = q.shape(2), D = q.shape(3);
  const long Hkv = k.shape(1), Tk = k.shape(2);
  if (k.shape(0) != B || k.shape(3) != D) {
    throw py::value_error("k must have shape [" + std::to_string(B) + ", Hkv, Tk, " + std::to_string(D) +
                          "] (B and D of q), got " + shape_string(k));
  }
  if (v.shape(0) != k.shape(0) || v.shape(1) != k.shape(1) || v.shape(2) != k.shape(2) || v.shape(3) != k.shape(3)) {
    throw py::value_error("v must have the shape of k " + shape_string(k) + ", got " + shape_string(v));
  }
  if (H % Hkv != 0) {
    throw py::value_error("the number of query heads (" + std::to_string(H) +
                          ") must be a multiple of the number of key/value heads (" + std::to_string(Hkv) + ")");
  }
  AttentionArgs a;
  a.batch = B; a.heads = H; a.kv_heads = Hkv; a.q_len = Tq; a.kv_len = Tk; a.head_dim = D;
  a.q = q.data(); a.q_stride_b = H * Tq * D; a.q_stride_h = Tq * D; a.q_stride_t = D;
  a.k = k.data(); a.k_stride_b = Hkv * Tk * D; a.k_stride_h = Tk * D; a.k_stride_t = D;
  a.v = v.data(); a.v_stride_b = Hkv * Tk * D; a.v_stride_h = Tk * D; a.v_stride_t = D;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (!scale_obj.is_none()) {
    // cast<float>() would raise RuntimeError for a str; a TypeError is the documented failure.
    const double s = PyFloat_AsDouble(scale_obj.ptr());
    if (s == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw py::type_error("scale must be a real number or None, got " + type_name(scale_obj));
    }
    a.scale = static_cast<float>(s);
  }
  a.causal = causal;
  a.causal_offset = Tk - Tq;  // aligned to the end: the last query sees every key (decode)

  FloatArray mask;
  if (!mask_obj.is_none()) {
    if (!py::isinstance<py::array>(mask_obj)) {
      throw py::type_error("mask must be a numpy.ndarray of float32 (additive) or bool, got " +
                           std::string(py::str(py::type::of(mask_obj).attr("__name__"))));
    }
    py::array m = py::reinterpret_borrow<py::array>(mask_obj);
    mask = m.dtype().is(py::dtype::of<bool>()) ? additive_from_bool(m) : as_float32(m, "mask");
    if (mask.ndim() < 1 || mask.ndim() > 4) {
      throw py::value_error("mask must be broadcastable to [B, 1|H, Tq, Tk], got shape " + shape_string(mask));
    }
    // Right-align the mask's dimensions with [B, H, Tq, Tk]; size-1 dimensions broadcast (stride 0).
    const long full[4] = {B, H, Tq, Tk};
    long strides[4] = {0, 0, 0, 0};
    long stride = 1;
    for (int d = 3, md = static_cast<int>(mask.ndim()) - 1; md >= 0; --d, --md) {
      const long size = mask.shape(md);
      if (size != 1 && size != full[d]) {
        throw py::value_error("mask must be broadcastable to [B, 1|H, Tq, Tk] = [" + std::to_string(B) + ", " +
                              std::to_string(H) + ", " + std::to_string(Tq) + ", " + std::to_string(Tk) +
                              "], got shape " + shape_string(mask));
      }
      strides[d] = size == 1 ? 0 : stride;
      stride *= size;
    }
    a.mask = mask.data();
    a.mask_stride_b = strides[0]; a.mask_stride_h = strides[1]; a.mask_stride_q = strides[2]; a.mask_stride_k = strides[3];
  }

  py::array_t<float> out({B, H, Tq, D});
  a.out = out.mutable_data();
  a.out_stride_b = H * Tq * D; a.out_stride_h = Tq * D; a.out_stride_t = D;
  {
    py::gil_scoped_release release;
    ComputeSlots slots(current_num_threads());
    attention(a);
  }
  return out;
}

}  // namespace

void register_ops_attention(py::module_& m) {
  m.def("attention", &attention_op, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
        py::arg("mask") = py::none(), py::arg("scale") = py::none());
}

}  // namespace bindings
}  // namespace cpuformer
