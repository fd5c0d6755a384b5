// The cpuformer._core extension module. Each area registers itself from its own file; no math here.
#include <pybind11/pybind11.h>

#include "models/request_checks.h"
#include "models/tensor_source.h"
#include "runtime/checked_size.h"

namespace py = pybind11;

namespace cpuformer {
namespace bindings {
void register_runtime(py::module_& m);
void register_ops_gemm(py::module_& m);
void register_ops_attention(py::module_& m);
void register_ops_norm(py::module_& m);
void register_config(py::module_& m);
void register_models_encoder(py::module_& m);
void register_models_decoder(py::module_& m);
void register_models_seq2seq(py::module_& m);
void register_models_swin(py::module_& m);
void register_packed(py::module_& m);
void register_arch(py::module_& m);
}  // namespace bindings
}  // namespace cpuformer

PYBIND11_MODULE(_core, m) {
  m.doc() = "cpuformer native core: kernels, runtime and models";
  // pyproject.toml's version (CMakeLists.txt): cpuformer.__version__ and `cpuformer --version` read it.
  m.attr("__version__") = CPUFORMER_VERSION;
  // A size that overflows or cannot be allocated (runtime/checked_size.h) is the caller's request
  // being too large: ValueError, with the message naming the argument. Registered once here for
  // every binding (std::length_error would also map to ValueError; this makes it explicit).
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const cpuformer::SizeError& size_error) {
      PyErr_SetString(PyExc_ValueError, size_error.what());
    } catch (const cpuformer::TypeError& type_error) {  // a model tensor of the wrong kind (models/tensor_source.h)
      PyErr_SetString(PyExc_TypeError, type_error.what());
    } catch (const cpuformer::NotSupported& not_supported) {  // a request the core does not implement
      PyErr_SetString(PyExc_NotImplementedError, not_supported.what());
    }
  });
  cpuformer::bindings::register_runtime(m);
  cpuformer::bindings::register_ops_gemm(m);
  cpuformer::bindings::register_ops_attention(m);
  cpuformer::bindings::register_ops_norm(m);
  cpuformer::bindings::register_config(m);
  cpuformer::bindings::register_packed(m);
  cpuformer::bindings::register_arch(m);
  cpuformer::bindings::register_models_encoder(m);
  cpuformer::bindings::register_models_decoder(m);
  cpuformer::bindings::register_models_seq2seq(m);
  cpuformer::bindings::register_models_swin(m);
}
