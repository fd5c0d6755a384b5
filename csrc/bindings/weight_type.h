// What the model bindings share: the dtype of a model config as a WeightType, the activation
// names, and the checked float32 / matmul weight tensors of a model's tensor dicts.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/gil.h"
#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "layers/linear.h"
#include "runtime/aligned_buffer.h"

namespace cpuformer {
namespace bindings {

// config["dtype"] when present, float32 otherwise; ValueError listing the valid names.
inline WeightType config_weight_type(const pybind11::dict& config) {
  if (!config.contains("dtype") || config["dtype"].is_none()) return WeightType::kFloat32;
  const std::string s = config["dtype"].cast<std::string>();
  if (s == "float32") return WeightType::kFloat32;
  if (s == "float16") return WeightType::kFloat16;
  if (s == "bfloat16") return WeightType::kBFloat16;
  if (s == "int8") return WeightType::kInt8;
  if (s == "int4") return WeightType::kInt4;
  throw pybind11::value_error("dtype must be one of 'float32', 'float16', 'bfloat16', 'int8', 'int4', got '" + s + "'");
}

inline const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kFloat32: return "float32";
    case WeightType::kFloat16: return "float16";
    case WeightType::kBFloat16: return "bfloat16";
    case WeightType::kInt8: return "int8";
    case WeightType::kInt4: return "int4";
  }
  return "?";
}

// A C-contiguous array `obj` of shape `shape`, named `what` in errors.
inline pybind11::array checked_array(const pybind11::object& obj, const std::string& what,
                                     const std::vector<long>& shape) {
  if (!pybind11::isinstance<pybind11::array>(obj)) throw pybind11::type_error(what + " must be a numpy.ndarray");
  pybind11::array a = pybind11::reinterpret_borrow<pybind11::array>(obj);
  bool ok = a.ndim() == static_cast<pybind11::ssize_t>(shape.size());
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = a.shape(d) == shape[d];
  if (!ok) {
    std::string want = "[";
    for (size_t d = 0; d < shape.size(); ++d) want += (d ? ", " : "") + std::to_string(shape[d]);
    throw pybind11::value_error(what + " must have shape " + want + "], got " + shape_string(a));
  }
  if (!(a.flags() & pybind11::array::c_style)) throw pybind11::value_error(what + " must be C-contiguous");
  return a;
}

// An int4 weight already converted: tensors[key] uint8 nibble pairs [n, Kp / 2], key + "_scale"
// float16 (or its uint16 bits) [n, groups] and, with zero points, key + "_zero" uint8 [n, groups]
// holding values ≤ 15. A scale of ±inf or a zero point above 15 is refused (a damaged file would
// give wrong numbers); a NaN scale is what a non-finite group quantizes to.
inline WeightRef int4_weight(const pybind11::dict& tensors, const std::string& key, long n, long k,
                             const WeightFormat& format, const std::string& what) {
  namespace py = pybind11;
  const long groups = int4_groups(k, format.group_size);
  py::array u =
      checked_array(tensors[py::str(key)], what + " tensor '" + key + "'", {n, groups * format.group_size / 2});
  auto part = [&](const std::string& suffix) {
    const std::string part_key = key + suffix;
    if (!tensors.contains(part_key)) throw py::value_error("missing " + what + " tensor '" + part_key + "'");
    return checked_array(tensors[py::str(part_key)], what + " tensor '" + part_key + "'", {n, groups});
  };
  py::array s = part("_scale");
  if (!s.dtype().is(py::dtype("float16")) && !s.dtype().is(py::dtype::of<uint16_t>())) {
    throw py::type_error(what + " tensor '" + key + "_scale' must have dtype float16, got " +
                         std::string(py::str(s.dtype())));
  }
  const auto* scales = static_cast<const uint16_t*>(s.data());
  for (long i = 0; i < n * groups; ++i) {
    if ((scales[i] & 0x7FFFu) == 0x7C00u) {
      throw py::value_error(what + " tensor '" + key + "_scale' holds an infinite scale at flat index " +
                            std::to_string(i) + "; the file is damaged");
    }
  }
  const uint8_t* zeros = nullptr;
  if (format.zero_point) {
    py::array z = part("_zero");
    if (!z.dtype().is(py::dtype::of<uint8_t>())) {
      throw py::type_error(what + " tensor '" + key + "_zero' must have dtype uint8, got " +
                           std::string(py::str(z.dtype())));
    }
    zeros = static_cast<const uint8_t*>(z.data());
    for (long i = 0; i < n * groups; ++i) {
      if (zeros[i] > 15) {
        throw py::value_error(what + " tensor '" + key + "_zero' holds " + std::to_string(zeros[i]) +
                              " at flat index " + std::to_string(i) + "; int4 zero points are 0..15");
      }
    }
  } else if (tensors.contains(key + "_zero")) {
    throw py::value_error(what + " tensor '" + key + "_zero' is given but the model's int4 weights are symmetric");
  }
  return WeightRef(static_cast<const uint8_t*>(u.data()), scales, zeros);
}

// The projection weight tensors[key] [n, k] for a model whose weights are stored in `format`:
// float32 (rounded or quantized while packing), or already converted — int8 (then
// tensors[key + "_scale"] is its float32 [n] per-row scale; the format must be int8), int4 nibble
// pairs (int4_weight) or uint16 bit patterns (float16 / bfloat16).
// Valid while `tensors` holds the arrays. `what` names the model kind in errors ("encoder").
inline WeightRef matmul_weight(const pybind11::dict& tensors, const std::string& key, long n, long k,
                               const WeightFormat& format, const std::string& what) {
  namespace py = pybind11;
  const WeightType type = format.type;
  if (!tensors.contains(key)) throw py::value_error("missing " + what + " tensor '" + key + "'");
  const std::string name = what + " tensor '" + key + "'";
  const py::object obj = tensors[py::str(key)];
  if (py::isinstance<py::array>(obj) && py::reinterpret_borrow<py::array>(obj).dtype().is(py::dtype::of<uint8_t>())) {
    if (type != WeightType::kInt4) {
      throw py::type_error(name + " holds int4 nibbles but its dtype here is " + weight_type_name(type));
    }
    return int4_weight(tensors, key, n, k, format, what);
  }
  py::array a = checked_array(obj, name, {n, k});
  if (a.dtype().is(py::dtype::of<float>())) return WeightRef(static_cast<const float*>(a.data()));
  if (a.dtype().is(py::dtype::of<int8_t>())) {
    if (type != WeightType::kInt8) {
      throw py::type_error(name + " is int8 but the model's dtype is " + weight_type_name(type));
    }
    const std::string scale_key = key + "_scale";
    if (!tensors.contains(scale_key)) throw py::value_error("missing " + what + " tensor '" + scale_key + "'");
    py::array s = checked_array(tensors[py::str(scale_key)], what + " tensor '" + scale_key + "'", {n});
    if (!s.dtype().is(py::dtype::of<float>())) {
      throw py::type_error(what + " tensor '" + scale_key + "' must have dtype float32, got " +
                           std::string(py::str(s.dtype())));
    }
    return WeightRef(a.data(), WeightType::kInt8, static_cast<const float*>(s.data()));
  }
  if (a.dtype().is(py::dtype::of<uint16_t>())) {
    if (type != WeightType::kFloat16 && type != WeightType::kBFloat16) {
      throw py::type_error(name + " holds 16-bit words but the model's dtype is " + weight_type_name(type));
    }
    return WeightRef(a.data(), type);
  }
  throw py::type_error(name + " must have dtype float32, int8 (with a scale), uint8 (int4) or uint16, got " +
                       std::string(py::str(a.dtype())));
}

// config["activation"] of a decoder or seq2seq model.
inline Activation parse_activation(const std::string& s) {
  if (s == "gelu_tanh") return Activation::kGeluTanh;
  if (s == "gelu") return Activation::kGeluErf;
  if (s == "relu") return Activation::kRelu;
  if (s == "silu") return Activation::kSilu;
  if (s == "quick_gelu") return Activation::kQuickGelu;
  throw pybind11::value_error("activation must be 'gelu_tanh', 'gelu', 'relu', 'silu' or 'quick_gelu', got '" + s +
                              "'");
}

// The float32 tensors of a model's dicts, named "<what> tensor '<key>'" in errors (what =
// "encoder", "decoder", "seq2seq"). A model binding derives from it privately: the tables it
// owns then outlive the C++ model, which is a member of the derived class.
//
// After load nothing the model computes with refers to the checkpoint file: projection weights
// are packed, small vectors copied by the model, and the tables it reads by pointer (embeddings,
// position tables) are copied here. A file truncated, overwritten or deleted while the model
// lives can therefore neither crash it (SIGBUS on a mapped page past the new end of the file) nor
// change its results (pages of a MAP_SHARED mapping show what is written to the file).
class ModelTensors {
 protected:
  explicit ModelTensors(std::string what) : what_(std::move(what)) {}

  // The float32 C-contiguous array tensors[key] of shape `shape`. With `copy`, the data is copied
  // into memory the model owns for its lifetime (tables the model reads by pointer) and the copy
  // is returned; otherwise the model copies or packs it before its constructor / add_layer returns
  // and the dict's reference suffices.
  const float* get(const pybind11::dict& tensors, const std::string& key, const std::vector<long>& shape,
                   bool copy = false) {
    namespace py = pybind11;
    if (!tensors.contains(key)) throw py::value_error("missing " + what_ + " tensor '" + key + "'");
    const std::string name = what_ + " tensor '" + key + "'";
    py::object obj = tensors[py::str(key)];
    if (!py::isinstance<py::array>(obj)) throw py::type_error(name + " must be a numpy.ndarray");
    if (!py::reinterpret_borrow<py::array>(obj).dtype().is(py::dtype::of<float>())) {
      throw py::type_error(name + " must have dtype float32, got " +
                           std::string(py::str(py::reinterpret_borrow<py::array>(obj).dtype())));
    }
    py::array a = checked_array(obj, name, shape);
    const auto* data = static_cast<const float*>(a.data());
    if (!copy || a.size() == 0) return data;  // an empty table is never read
    AlignedBuffer<float> owned(static_cast<std::size_t>(a.size()));  // large: an anonymous mapping
    {
      GilReleased release;  // reading a mapped file may wait for the disk
      std::memcpy(owned.data(), data, static_cast<std::size_t>(a.nbytes()));
    }
    owned_.push_back(std::move(owned));  // moving keeps the data pointer
    return owned_.back().data();
  }

  // As get, or null when the key is missing or None.
  const float* optional(const pybind11::dict& tensors, const std::string& key, const std::vector<long>& shape) {
    if (!tensors.contains(key) || tensors[pybind11::str(key)].is_none()) return nullptr;
    return get(tensors, key, shape);
  }

  // A projection weight [n, k] of a model whose weights are `type` (matmul_weight).
  WeightRef matmul(const pybind11::dict& tensors, const std::string& key, long n, long k,
                   const WeightFormat& format) const {
    return matmul_weight(tensors, key, n, k, format, what_);
  }

 private:
  std::string what_;
  std::vector<AlignedBuffer<float>> owned_;  // the tables copied by get(..., copy=true)
};

}  // namespace bindings
}  // namespace cpuformer
