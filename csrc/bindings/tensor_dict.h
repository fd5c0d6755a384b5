// The model bindings' tensor dicts as a TensorSource (models/tensor_source.h): the Python layer
// hands each model its canonical tensors as a dict of NumPy arrays (models/_graph.py), which the
// core ModelBuilder (models/model_builder.h) reads and checks like any other source.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "bindings/gil.h"
#include "models/model_builder.h"
#include "models/tensor_source.h"

namespace cpuformer {
namespace bindings {

class PyDictSource : public TensorSource {
 public:
  explicit PyDictSource(const pybind11::dict& dict) : dict_(dict) {}

  bool contains(const std::string& key) const override { return dict_.contains(key); }
  bool has(const std::string& key) const override {
    return dict_.contains(key) && !dict_[pybind11::str(key)].is_none();
  }
  TensorView get(const std::string& key, const std::string& name) const override {
    namespace py = pybind11;
    const py::object obj = dict_[py::str(key)];
    if (!py::isinstance<py::array>(obj)) throw TypeError(name + " must be a numpy.ndarray");
    const py::array a = py::reinterpret_borrow<py::array>(obj);
    TensorView v;
    v.data = a.data();
    for (py::ssize_t d = 0; d < a.ndim(); ++d) v.shape.push_back(static_cast<long>(a.shape(d)));
    v.contiguous = (a.flags() & py::array::c_style) != 0;
    v.type_name = py::str(a.dtype());
    if (a.dtype().is(py::dtype::of<float>())) {
      v.type = ElementType::kFloat32;
    } else if (a.dtype().is(py::dtype("float16"))) {
      v.type = ElementType::kFloat16;
    } else if (a.dtype().is(py::dtype::of<uint16_t>())) {
      v.type = ElementType::kUInt16;
    } else if (a.dtype().is(py::dtype::of<int8_t>())) {
      v.type = ElementType::kInt8;
    } else if (a.dtype().is(py::dtype::of<uint8_t>())) {
      v.type = ElementType::kUInt8;
    }
    return v;
  }
  std::vector<std::string> keys() const override {
    std::vector<std::string> out;
    for (const auto& item : dict_) out.push_back(item.first.cast<std::string>());
    return out;
  }
  void copy(void* dst, const void* src, std::size_t bytes) const override {
    GilReleased release;  // reading a mapped file may wait for the disk
    std::memcpy(dst, src, bytes);
  }

 private:
  const pybind11::dict& dict_;
};

}  // namespace bindings
}  // namespace cpuformer
