// cpuformer._core.attention: fused attention over NumPy arrays.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/gil.h"
#include "kernels/attention/attention.h"
#include "layers/kv_cache.h"
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

// The kernel compares key positions as int32 lanes (kernels/attention/attention.h, "Limits").
void require_attention_keys(long keys, const char* name) {
  if (keys > kAttentionMaxKeys) {
    throw py::value_error(std::string(name) + " has " + std::to_string(keys) +
                          " keys (Tk); attention supports at most " + std::to_string(kAttentionMaxKeys) +
                          " (2^31 - 1)");
  }
}

// Whether a is a 4-D float32 array the kernel can read where it lies: float-aligned data, strides of
// whole elements (a dimension of size 1 may have any: NumPy gives those any stride) and, when
// contiguous_last, a contiguous last dimension.
bool kernel_layout(const py::array& a, bool contiguous_last) {
  if (!a.dtype().is(py::dtype::of<float>()) || a.ndim() != 4 ||
      reinterpret_cast<std::uintptr_t>(a.data()) % alignof(float) != 0)
    return false;
  for (int d = 0; d < 4; ++d) {
    if (a.shape(d) != 1 && a.strides(d) % static_cast<py::ssize_t>(sizeof(float)) != 0) return false;
  }
  return !contiguous_last || a.shape(3) == 1 || a.strides(3) == static_cast<py::ssize_t>(sizeof(float));
}

// q, k or v of ops.attention: an array in kernel_layout with a contiguous last dimension is read
// where it lies (slices and transposes: q from a fused projection [B, T, H, D] transposed, k and v
// from a preallocated cache [B, Hkv, Tmax, D] sliced to Tk); anything else is read from a
// C-contiguous copy (as_float32: its type errors).
py::array attention_operand(const py::object& obj, const char* name) {
  if (py::isinstance<py::array>(obj)) {
    const py::array a = py::reinterpret_borrow<py::array>(obj);
    if (kernel_layout(a, true)) return a;
  }
  return as_float32(obj, name);
}

// Element stride of dimension d of a 4-D operand (0 for a dimension of size 1: NumPy may give
// those any stride).
long element_stride(const py::array& a, int d) {
  return a.shape(d) == 1 ? 0 : static_cast<long>(a.strides(d) / static_cast<py::ssize_t>(sizeof(float)));
}

// Attention arguments for q [B, H, Tq, D] (an attention_operand) over Tk keys of Hkv heads: shapes and q.
AttentionArgs dense_query(const py::array& q, long Hkv, long Tk) {
  const long B = q.shape(0), H = q.shape(1), Tq = q.shape(2), D = q.shape(3);
  AttentionArgs a;
  a.batch = B;
  a.heads = H;
  a.kv_heads = Hkv;
  a.q_len = Tq;
  a.kv_len = Tk;
  a.head_dim = D;
  a.q = static_cast<const float*>(q.data());
  a.q_stride_b = element_stride(q, 0);
  a.q_stride_h = element_stride(q, 1);
  a.q_stride_t = element_stride(q, 2);
  return a;
}

py::array_t<float> attention_op(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, bool causal,
                                const py::object& mask_obj, const py::object& scale_obj, int num_threads) {
  check_op_threads(num_threads);
  // Before as_float32, which would copy a broadcast (zero-stride) view of that many keys.
  for (const py::object* kv : {&k_obj, &v_obj}) {
    if (py::isinstance<py::array>(*kv)) {
      const py::array a = py::reinterpret_borrow<py::array>(*kv);
      if (a.ndim() == 4) require_attention_keys(static_cast<long>(a.shape(2)), kv == &k_obj ? "k" : "v");
    }
  }
  const py::array q = attention_operand(q_obj, "q"), k = attention_operand(k_obj, "k"),
                  v = attention_operand(v_obj, "v");
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
  AttentionArgs a = dense_query(q, Hkv, Tk);
  a.k = static_cast<const float*>(k.data());
  a.k_stride_b = element_stride(k, 0);
  a.k_stride_h = element_stride(k, 1);
  a.k_stride_t = element_stride(k, 2);
  a.v = static_cast<const float*>(v.data());
  a.v_stride_b = element_stride(v, 0);
  a.v_stride_h = element_stride(v, 1);
  a.v_stride_t = element_stride(v, 2);
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (!scale_obj.is_none()) {
    // cast<float>() would raise RuntimeError for a str; a TypeError is the documented failure.
    const double s = PyFloat_AsDouble(scale_obj.ptr());
    if (s == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw py::type_error("scale must be a real number or None, got " + type_name(scale_obj));
    }
    // A NaN or infinite scale (or one beyond float32) would make every score NaN or ±inf.
    if (!std::isfinite(static_cast<float>(s)))
      throw py::value_error("scale must be finite, got " + std::string(py::str(scale_obj)));
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
    a.mask_stride_b = strides[0];
    a.mask_stride_h = strides[1];
    a.mask_stride_q = strides[2];
    a.mask_stride_k = strides[3];
  }

  py::array_t<float> out({B, H, Tq, D});
  a.out = out.mutable_data();
  a.out_stride_b = H * Tq * D;
  a.out_stride_h = Tq * D;
  a.out_stride_t = D;
  {
    GilReleased release;
    ScopedNumThreads threads(num_threads);
    ComputeSlots slots(current_num_threads());
    attention(a);
  }
  return out;
}

// Element strides of a float32 array whose last dimension is contiguous: the layout the kernel
// takes. Used by the testing hook below, which hands NumPy views to the kernel without copying.
struct View {
  py::array array;
  long shape[4], stride[4];
};

// The mask may have any strides (0 broadcasts); q, k, v and out need a contiguous last dimension.
View as_view(const py::object& obj, const char* name, bool contiguous_last = true) {
  const std::string expected = std::string(name) + " must be a 4-D float32 numpy.ndarray with " +
                               (contiguous_last ? "a contiguous last dimension and " : "") +
                               "strides that are whole elements, float-aligned";
  if (!py::isinstance<py::array>(obj)) throw py::type_error(expected);
  View view{py::reinterpret_borrow<py::array>(obj), {}, {}};
  const py::array& a = view.array;
  if (!kernel_layout(a, contiguous_last)) throw py::type_error(expected);
  for (int d = 0; d < 4; ++d) {
    view.shape[d] = a.shape(d);
    view.stride[d] = element_stride(a, d);
    if (view.shape[d] == 0) throw py::value_error(std::string(name) + " must not have an empty dimension");
  }
  return view;
}

// Testing hook: runs the kernel on NumPy views as they are (arbitrary strides, a mask given as a
// full [B, H, Tq, Tk] view whose broadcast dimensions have stride 0, e.g. from
// numpy.broadcast_to), writing into `out`, with every AttentionArgs option exposed. The models
// call the kernel this way from C++; ops.attention copies instead.
AttentionArgs views_args(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                         const py::object& out_obj, bool causal, long causal_offset, long window,
                         const py::object& mask_obj, float scale, bool bf16_products) {
  const View q = as_view(q_obj, "q"), k = as_view(k_obj, "k"), v = as_view(v_obj, "v");
  View out = as_view(out_obj, "out");
  const long B = q.shape[0], H = q.shape[1], Tq = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Tk = k.shape[2];
  bool consistent = k.shape[0] == B && k.shape[3] == D && H % Hkv == 0;
  for (int d = 0; d < 4; ++d) consistent = consistent && v.shape[d] == k.shape[d] && out.shape[d] == q.shape[d];
  View mask{};
  if (!mask_obj.is_none()) {
    mask = as_view(mask_obj, "mask", false);
    const long full[4] = {B, H, Tq, Tk};
    for (int d = 0; d < 4; ++d) consistent = consistent && mask.shape[d] == full[d];
  }
  if (!consistent) {
    throw py::value_error(
        "shapes must be q, out [B, H, Tq, D]; k, v [B, Hkv, Tk, D] with Hkv dividing H; "
        "mask [B, H, Tq, Tk]");
  }
  require_attention_keys(Tk, "k");
  if (!out.array.writeable()) throw py::value_error("out must be writeable");
  AttentionArgs a;
  a.batch = B;
  a.heads = H;
  a.kv_heads = Hkv;
  a.q_len = Tq;
  a.kv_len = Tk;
  a.head_dim = D;
  a.q = static_cast<const float*>(q.array.data());
  a.q_stride_b = q.stride[0];
  a.q_stride_h = q.stride[1];
  a.q_stride_t = q.stride[2];
  a.k = static_cast<const float*>(k.array.data());
  a.k_stride_b = k.stride[0];
  a.k_stride_h = k.stride[1];
  a.k_stride_t = k.stride[2];
  a.v = static_cast<const float*>(v.array.data());
  a.v_stride_b = v.stride[0];
  a.v_stride_h = v.stride[1];
  a.v_stride_t = v.stride[2];
  a.out = static_cast<float*>(out.array.mutable_data());
  a.out_stride_b = out.stride[0];
  a.out_stride_h = out.stride[1];
  a.out_stride_t = out.stride[2];
  a.scale = scale;
  a.causal = causal;
  a.causal_offset = causal_offset;
  a.window = window;
  a.bf16_products = bf16_products;
  if (!mask_obj.is_none()) {
    a.mask = static_cast<const float*>(mask.array.data());
    a.mask_stride_b = mask.stride[0];
    a.mask_stride_h = mask.stride[1];
    a.mask_stride_q = mask.stride[2];
    a.mask_stride_k = mask.stride[3];
  }
  return a;
}

void attention_views(const py::object& q, const py::object& k, const py::object& v, const py::object& out, bool causal,
                     long causal_offset, long window, const py::object& mask, float scale, bool bf16_products) {
  const AttentionArgs a = views_args(q, k, v, out, causal, causal_offset, window, mask, scale, bf16_products);
  GilReleased release;
  attention(a);
}

// attention_many over calls given as _attention_views' arguments (q, k, v, out, causal,
// causal_offset, window, mask, scale, bf16_products), one tuple each.
void attention_views_many(const py::list& calls) {
  std::vector<AttentionArgs> args;
  for (const py::handle& call : calls) {
    if (!py::isinstance<py::tuple>(call) || py::len(call) != 10)
      throw py::type_error("each call must be a tuple of _attention_views' 10 arguments, got " +
                           std::string(py::str(py::type::handle_of(call).attr("__name__"))));
    const py::tuple t = py::reinterpret_borrow<py::tuple>(call);
    args.push_back(views_args(t[0], t[1], t[2], t[3], t[4].cast<bool>(), t[5].cast<long>(), t[6].cast<long>(), t[7],
                              t[8].cast<float>(), t[9].cast<bool>()));
  }
  GilReleased release;
  attention_many(args.data(), static_cast<long>(args.size()));
}

// Testing hook for reduced-precision KV caches: k and v [B, Hkv, Tk, D] float32 are written into a
// KvCache of `kv_dtype` (0 float32, 1 float16, 2 bfloat16, 3 int8: KvType) one row at a time, as the
// models write them, and q [B, H, Tq, D] attends over it (causal with offset Tk - Tq when asked).
// Returns (out, k as stored, v as stored), the stored rows widened back to float32.
py::tuple attention_kv_cache(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, int kv_dtype,
                             bool causal) {
  FloatArray q = as_float32(q_obj, "q"), k = as_float32(k_obj, "k"), v = as_float32(v_obj, "v");
  require_ndim(q, 4, "q", "[B, H, Tq, D]");
  require_ndim(k, 4, "k", "[B, Hkv, Tk, D]");
  require_ndim(v, 4, "v", "[B, Hkv, Tk, D]");
  require_nonempty(q, "q");
  require_nonempty(k, "k");
  const long B = q.shape(0), H = q.shape(1), Tq = q.shape(2), D = q.shape(3), Hkv = k.shape(1), Tk = k.shape(2);
  for (int d = 0; d < 4; ++d) {
    if (k.shape(d) != v.shape(d)) throw py::value_error("k and v must have the same shape");
  }
  if (k.shape(0) != B || k.shape(3) != D || H % Hkv != 0) throw py::value_error("k must be [B, Hkv, Tk, D] of q's");
  if (kv_dtype < 0 || kv_dtype > 3) throw py::value_error("kv_dtype must be 0..3");
  KvCache cache;
  cache.reset(1, B, Hkv, Tk + 1, D, static_cast<KvType>(kv_dtype));  // one spare slot: strides ≠ the length
  for (long b = 0; b < B; ++b)
    for (long h = 0; h < Hkv; ++h)
      for (long t = 0; t < Tk; ++t) {
        const long at = ((b * Hkv + h) * Tk + t) * D;
        cache.store(0, b, h, t, k.data() + at, v.data() + at);
      }
  cache.set_length(Tk);
  AttentionArgs a = dense_query(q, Hkv, Tk);
  cache.view(0, a);
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.causal = causal;
  a.causal_offset = Tk - Tq;
  FloatArray out({B, H, Tq, D}), k_stored({B, Hkv, Tk, D}), v_stored({B, Hkv, Tk, D});
  a.out = out.mutable_data();
  a.out_stride_b = H * Tq * D;
  a.out_stride_h = Tq * D;
  a.out_stride_t = D;
  for (long b = 0; b < B; ++b)
    for (long h = 0; h < Hkv; ++h)
      for (long t = 0; t < Tk; ++t) {
        const long at = ((b * Hkv + h) * Tk + t) * D;
        widen_kv_row(a, false, b, h, t, k_stored.mutable_data() + at);
        widen_kv_row(a, true, b, h, t, v_stored.mutable_data() + at);
      }
  {
    GilReleased release;
    attention(a);
  }
  return py::make_tuple(out, k_stored, v_stored);
}

}  // namespace

void register_ops_attention(py::module_& m) {
  m.def("_attention_kv_cache", &attention_kv_cache, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kv_dtype"),
        py::arg("causal") = false);
  m.def("attention", &attention_op, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false,
        py::arg("mask") = py::none(), py::arg("scale") = py::none(), py::arg("num_threads") = 0);
  m.def("_attention_views", &attention_views, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("causal"), py::arg("causal_offset"), py::arg("window"), py::arg("mask"), py::arg("scale"),
        py::arg("bf16_products") = false);
  m.def("_attention_views_many", &attention_views_many, py::arg("calls"));
}

}  // namespace bindings
}  // namespace cpuformer
