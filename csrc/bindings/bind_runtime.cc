#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "kernels/gemm/gemm.h"
#include "runtime/compute_slots.h"
#include "runtime/cpu_features.h"
#include "runtime/cpu_quota.h"
#include "runtime/load_scratch.h"
#include "runtime/threading.h"

namespace py = pybind11;

namespace cpuformer {
namespace bindings {

void register_runtime(py::module_& m) {
  install_fork_handlers();  // a forked child (os.fork, multiprocessing "fork", gunicorn --preload) computes
  // Called by cpuformer/__init__.py at import: chooses the ISA level once, so a bad
  // CPUFORMER_ISA fails the import with a clear message (std::invalid_argument -> ValueError).
  m.def("_select_isa", [] { return isa_name(active_isa()); });
  m.def(
      "cpu_info",
      [] {
        py::dict info;
        info["isa"] = isa_name(active_isa());
        info["best_isa"] = isa_name(best_isa());
        info["features"] = cpu_features().names();
        info["num_threads"] = default_num_threads();
        // The control group's CPU limit (a container's --cpus) that caps the default, if any.
        const double limit = cgroup_cpu_limit("");
        info["cpu_limit"] = limit > 0 ? py::object(py::float_(limit)) : py::object(py::none());
        py::dict matmul;
        matmul["float32"] = gemm_kernel_name(WeightType::kFloat32);
        matmul["float16"] = gemm_kernel_name(WeightType::kFloat16);
        matmul["bfloat16"] = gemm_kernel_name(WeightType::kBFloat16);
        matmul["int8"] = gemm_kernel_name(WeightType::kInt8);
        matmul["int4"] = gemm_kernel_name(WeightType::kInt4);
        info["matmul"] = matmul;
        return info;
      },
      "ISA level in use, CPU features, the default thread count, the container CPU limit (None: none) and the matmul "
      "kernel per weight dtype.");
  m.def(
      "set_num_threads",
      [](int n) {
        if (n < 0)
          throw py::value_error("num_threads must be >= 1 (or 0 for the automatic default), got " + std::to_string(n));
        set_default_num_threads(n);
      },
      py::arg("n"));
  m.def("get_num_threads", &default_num_threads);
  // std::invalid_argument -> ValueError with the core's message.
  m.def("set_float32_matmul_precision", static_cast<void (*)(const std::string&)>(&set_float32_matmul_precision),
        py::arg("precision"));
  m.def("get_float32_matmul_precision", &float32_matmul_precision_name);
  m.def(
      "_compute_slots",
      [] {
        py::dict d;
        d["capacity"] = compute_capacity();
        d["in_use"] = compute_slots_in_use();
        d["peak"] = compute_slots_peak();
        return d;
      },
      "Test hook: the process-wide compute-thread bound (capacity), slots in use now and the peak since the last "
      "reset.");
  m.def("_cgroup_cpu_limit", &cgroup_cpu_limit, py::arg("root"),
        "Test hook: the CPU limit (CPUs, 0: none) of the control group that root/proc/self/{cgroup,mountinfo} "
        "describe, every path read under root.");
  m.def("_cpus_within_limit", &cpus_within_limit, py::arg("cpus"), py::arg("limit"),
        "Test hook: the CPU count the default thread count uses for `cpus` affinity CPUs under a CPU limit.");
  m.def("_reset_compute_slots_peak", &reset_compute_slots_peak,
        "Test hook: restart the peak from the slots in use now.");
  // A model build's scratch scope (runtime/load_scratch.h) as a context manager: models/_graph.py
  // holds one around the construction of a model and all its layers, so they join and convert their
  // weights in the same buffers, freed when the block ends.
  struct LoadScratch {
    std::unique_ptr<LoadScratchScope> scope;
  };
  py::class_<LoadScratch>(m, "_LoadScratchScope",
                          "with _core._LoadScratchScope(): the weights built on this thread inside the block "
                          "reuse one set of load scratch buffers, freed at its end.")
      .def(py::init<>())
      .def(
          "__enter__",
          [](LoadScratch& s) -> LoadScratch& {
            if (!s.scope) s.scope = std::make_unique<LoadScratchScope>();
            return s;
          },
          py::return_value_policy::reference)
      .def("__exit__", [](LoadScratch& s, const py::args&) {
        s.scope.reset();
        return false;
      });
  m.def(
      "_release_free_memory",
      [] {
#if defined(__GLIBC__)
        malloc_trim(0);
#endif
      },
      "Returns the heap memory freed by loading (conversion and packing buffers) to the system (glibc's "
      "malloc_trim; a no-op elsewhere).");
}

}  // namespace bindings
}  // namespace cpuformer
