// cpuformer._core.SwinBlock, SwinScratch, swin_patch_merge: Swin Transformer's blocks and patch
// merging (layers/window_attention.h) over NumPy arrays, for models/swin.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/gil.h"
#include "layers/window_attention.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

// A float32 array of exactly `shape` (copied to C order when needed), named in errors.
FloatArray float_tensor(const py::handle& obj, const std::string& name, const std::vector<long>& shape) {
  FloatArray a = as_float32(obj, name.c_str());
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = a.shape(d) == shape[d];
  if (!ok) {
    std::string want = "[";
    for (size_t d = 0; d < shape.size(); ++d) want += (d ? ", " : "") + std::to_string(shape[d]);
    throw py::value_error(name + " must have shape " + want + "], got " + shape_string(a));
  }
  return a;
}

// A 1-D C-contiguous int64 array (no conversion: the layout comes from models/swin.py).
py::array_t<int64_t> index_array(const py::object& obj, const char* name) {
  if (!py::isinstance<py::array_t<int64_t>>(obj))
    throw py::type_error(std::string(name) + " must be an int64 numpy.ndarray");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<int64_t>()) || a.ndim() != 1 || !(a.flags() & py::array::c_style)) {
    throw py::type_error(std::string(name) + " must be a 1-D C-contiguous int64 numpy.ndarray");
  }
  require_nonempty(a, name);
  return py::reinterpret_borrow<py::array_t<int64_t>>(a);
}

class PySwinScratch {
 public:
  PySwinScratch() : pool_(std::make_shared<SwinScratchPool>()) {}
  const std::shared_ptr<SwinScratchPool>& pool() const { return pool_; }
  std::size_t idle_bytes() const { return pool_->idle_floats() * sizeof(float); }

 private:
  std::shared_ptr<SwinScratchPool> pool_;
};

class PySwinBlock {
 public:
  PySwinBlock(const py::dict& tensors, long heads, float eps, const std::string& activation, const std::string& dtype,
              long group_size, bool zero_point, const PySwinScratch& scratch)
      : pool_(scratch.pool()) {
    static const std::set<std::string> known = {"norm1", "norm1.bias", "q",    "q.bias",   "k",     "k.bias",
                                                "v",     "v.bias",     "o",    "o.bias",   "norm2", "norm2.bias",
                                                "up",    "up.bias",    "down", "down.bias"};
    for (const auto& item : tensors) {
      const std::string key = py::str(item.first);
      if (!known.count(key)) throw py::value_error("SwinBlock: unknown tensor '" + key + "'");
    }
    const auto need = [&](const char* key) -> py::object {
      if (!tensors.contains(key)) throw py::value_error(std::string("SwinBlock: tensor '") + key + "' is missing");
      return tensors[key];
    };
    if (!(eps >= 0.0f)) throw py::value_error("eps must be >= 0, got " + std::to_string(eps));
    const Activation act = activation_from_name(activation, "'none'");
    const WeightType type = weight_type_from_name(dtype);
    FloatArray norm1 = as_float32(need("norm1"), "norm1");
    require_ndim(norm1, 1, "norm1", "[C]");
    require_nonempty(norm1, "norm1");
    const long C = norm1.shape(0);
    if (heads < 1 || C % heads) {
      throw py::value_error("heads must be >= 1 and divide the width " + std::to_string(C) + ", got " +
                            std::to_string(heads));
    }
    FloatArray up = as_float32(need("up"), "up");
    require_ndim(up, 2, "up", "[mlp, C]");
    require_nonempty(up, "up");
    const long mlp = up.shape(0);
    std::vector<FloatArray> keep;  // alive until the weights are packed
    const auto tensor = [&](const char* key, const std::vector<long>& shape, bool optional) -> const float* {
      if (optional && !tensors.contains(key)) return nullptr;
      keep.push_back(float_tensor(need(key), key, shape));
      return keep.back().data();
    };
    SwinBlockWeights w;
    w.norm1 = tensor("norm1", {C}, false);
    w.norm1_bias = tensor("norm1.bias", {C}, true);
    w.q = tensor("q", {C, C}, false);
    w.q_bias = tensor("q.bias", {C}, true);
    w.k = tensor("k", {C, C}, false);
    w.k_bias = tensor("k.bias", {C}, true);
    w.v = tensor("v", {C, C}, false);
    w.v_bias = tensor("v.bias", {C}, true);
    w.o = tensor("o", {C, C}, false);
    w.o_bias = tensor("o.bias", {C}, true);
    w.norm2 = tensor("norm2", {C}, false);
    w.norm2_bias = tensor("norm2.bias", {C}, true);
    w.up = tensor("up", {mlp, C}, false);
    w.up_bias = tensor("up.bias", {mlp}, true);
    w.down = tensor("down", {C, mlp}, false);
    w.down_bias = tensor("down.bias", {C}, true);
    try {
      GilReleased release;
      block_ = std::make_unique<SwinBlock>(w, C, heads, mlp, eps, act, WeightFormat(type, group_size, zero_point));
    } catch (const std::invalid_argument& error) {
      throw py::value_error(std::string("SwinBlock: ") + error.what());
    }
  }

  // x [batch · tokens, C] float32, C-contiguous and writeable: updated in place.
  void call(const py::object& x_obj, long batch, const py::object& source_obj, const py::object& inverse_obj,
            const py::object& mask_obj, int num_threads) {
    check_op_threads(num_threads);
    const long C = block_->dim(), heads = block_->heads();
    const std::string x_expect =
        "x must be a writeable C-contiguous float32 numpy.ndarray [batch · tokens, " + std::to_string(C) + "]";
    if (!py::isinstance<py::array>(x_obj)) throw py::type_error(x_expect);
    py::array x = py::reinterpret_borrow<py::array>(x_obj);
    if (!x.dtype().is(py::dtype::of<float>()) || !(x.flags() & py::array::c_style) || !x.writeable()) {
      throw py::type_error(x_expect);
    }
    if (x.ndim() != 2 || x.shape(1) != C) throw py::value_error(x_expect + ", got shape " + shape_string(x));
    if (batch < 1) throw py::value_error("batch must be >= 1, got " + std::to_string(batch));
    py::array_t<int64_t> source = index_array(source_obj, "source"), inverse = index_array(inverse_obj, "inverse");
    FloatArray mask = as_float32(mask_obj, "mask");
    require_ndim(mask, 4, "mask", "[1 | windows, heads, area, area]");
    require_nonempty(mask, "mask");
    const long area = mask.shape(2), windows = static_cast<long>(source.size()) / area;
    const long tokens = static_cast<long>(inverse.size());
    if (mask.shape(1) != heads || mask.shape(3) != area || source.size() % area ||
        (mask.shape(0) != 1 && mask.shape(0) != windows)) {
      throw py::value_error("mask must have shape [1 | windows, " + std::to_string(heads) +
                            ", area, area] with source of windows · area rows, got mask " + shape_string(mask) +
                            " and source of " + std::to_string(source.size()) + " rows");
    }
    if (x.shape(0) != batch * tokens) {
      throw py::value_error("x has " + std::to_string(x.shape(0)) + " rows; batch " + std::to_string(batch) + " x " +
                            std::to_string(tokens) + " tokens (the size of inverse) needs " +
                            std::to_string(batch * tokens));
    }
    const int64_t* src = source.data();
    const int64_t* inv = inverse.data();
    for (long r = 0; r < windows * area; ++r) {
      if (src[r] < -1 || src[r] >= tokens) {
        throw py::value_error("source[" + std::to_string(r) + "] = " + std::to_string(src[r]) + " is not in [-1, " +
                              std::to_string(tokens) + ")");
      }
    }
    for (long t = 0; t < tokens; ++t) {
      if (inv[t] < 0 || inv[t] >= windows * area) {
        throw py::value_error("inverse[" + std::to_string(t) + "] = " + std::to_string(inv[t]) + " is not in [0, " +
                              std::to_string(windows * area) + ")");
      }
    }
    SwinWindowLayout layout;
    layout.tokens = tokens;
    layout.windows = windows;
    layout.area = area;
    layout.source = src;
    layout.inverse = inv;
    layout.mask = mask.data();
    layout.mask_windows = mask.shape(0);
    float* xp = static_cast<float*>(x.mutable_data());
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());
      SwinScratchPool::Lease scratch = pool_->take();
      block_->forward(xp, batch, layout, *scratch);
    }
  }

  long dim() const { return block_->dim(); }
  long heads() const { return block_->heads(); }

 private:
  std::shared_ptr<SwinScratchPool> pool_;
  std::unique_ptr<SwinBlock> block_;
};

py::array_t<float> patch_merge(const py::object& x_obj, long batch, long height, long width, const py::object& weight,
                               const py::object& bias, float eps, int num_threads) {
  check_op_threads(num_threads);
  if (!(eps >= 0.0f)) throw py::value_error("eps must be >= 0, got " + std::to_string(eps));
  FloatArray x = as_float32(x_obj, "x");
  require_ndim(x, 2, "x", "[batch · height · width, C]");
  require_nonempty(x, "x");
  if (batch < 1 || height < 1 || width < 1 || x.shape(0) != batch * height * width) {
    throw py::value_error("x must have batch · height · width = " + std::to_string(batch) + " · " +
                          std::to_string(height) + " · " + std::to_string(width) + " rows, got shape " +
                          shape_string(x));
  }
  const long C = x.shape(1);
  FloatArray w = float_tensor(weight, "weight", {4 * C});
  FloatArray b;
  if (!bias.is_none()) b = float_tensor(bias, "bias", {4 * C});
  const long rows = batch * ((height + 1) / 2) * ((width + 1) / 2);
  py::array_t<float> y({rows, 4 * C});
  const float* xp = x.data();
  const float* wp = w.data();
  const float* bp = bias.is_none() ? nullptr : b.data();
  float* yp = y.mutable_data();
  {
    GilReleased release;
    ScopedNumThreads threads(num_threads);
    ComputeSlots slots(current_num_threads());
    swin_patch_merge(xp, batch, height, width, C, wp, bp, eps, yp);
  }
  return y;
}

}  // namespace

void register_models_swin(py::module_& m) {
  py::class_<PySwinScratch>(m, "SwinScratch")
      .def(py::init<>())
      .def_property_readonly("idle_bytes", &PySwinScratch::idle_bytes);
  py::class_<PySwinBlock>(m, "SwinBlock")
      .def(py::init<const py::dict&, long, float, const std::string&, const std::string&, long, bool,
                    const PySwinScratch&>(),
           py::arg("tensors"), py::arg("heads"), py::arg("eps"), py::arg("activation"), py::arg("dtype"),
           py::arg("group_size"), py::arg("zero_point"), py::arg("scratch"))
      .def("__call__", &PySwinBlock::call, py::arg("x"), py::arg("batch"), py::arg("source"), py::arg("inverse"),
           py::arg("mask"), py::arg("num_threads") = 0)
      .def_property_readonly("dim", &PySwinBlock::dim)
      .def_property_readonly("heads", &PySwinBlock::heads);
  m.def("swin_patch_merge", &patch_merge, py::arg("x"), py::arg("batch"), py::arg("height"), py::arg("width"),
        py::arg("weight"), py::arg("bias"), py::arg("eps"), py::arg("num_threads") = 0);
}

}  // namespace bindings
}  // namespace cpuformer
