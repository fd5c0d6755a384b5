// The cpuformer._core extension module. Each area registers itself from its own file; no math here.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace cpuformer {
namespace bindings {
void register_runtime(py::module_& m);
void register_ops_gemm(py::module_& m);
void register_ops_attention(py::module_& m);
void register_ops_norm(py::module_& m);
void register_models_encoder(py::module_& m);
void register_models_decoder(py::module_& m);
}  // namespace bindings
}  // namespace cpuformer

PYBIND11_MODULE(_core, m) {
  m.doc() = "cpuformer native core: kernels, runtime and models";
  cpuformer::bindings::register_runtime(m);
  cpuformer::bindings::register_ops_gemm(m);
  cpuformer::bindings::register_ops_attention(m);
  cpuformer::bindings::register_ops_norm(m);
  cpuformer::bindings::register_models_encoder(m);
  cpuformer::bindings::register_models_decoder(m);
}
