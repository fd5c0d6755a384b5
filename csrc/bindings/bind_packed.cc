// cpuformer._core's packed-weights files (io/packed_file.h): opening a converted directory's file
// for the running level, and the writer `cpuformer convert` / `cpuformer pack` record one with.
// Both are handed to the model classes' constructors as `packed`.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "io/packed_file.h"
#include "layers/linear.h"

namespace py = pybind11;

namespace cpuformer {
namespace bindings {

void register_packed(py::module_& m) {
  py::class_<PackedWeightsStore, std::shared_ptr<PackedWeightsStore>>(
      m, "PackedWeightsStore", "Where a model build takes packed weights from, or records them (layers/linear.h).");
  py::class_<io::PackedFile, PackedWeightsStore, std::shared_ptr<io::PackedFile>>(
      m, "PackedWeightsFile", "A converted directory's packed-weights file, mapped for the running level.")
      .def_property_readonly("path", &io::PackedFile::path)
      .def_property_readonly("matrices", &io::PackedFile::matrices, "the packed matrices the file holds")
      .def_property_readonly("used", &io::PackedFile::used, "how many of them the models built with it map");
  py::class_<io::PackedFileWriter, PackedWeightsStore, std::shared_ptr<io::PackedFileWriter>>(
      m, "PackedWeightsWriter", "Records every Linear a model build packs into a packed-weights file.")
      .def(py::init<const std::string&, std::string>(), py::arg("path"), py::arg("weights"))
      .def("finish", &io::PackedFileWriter::finish, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("matrices", &io::PackedFileWriter::matrices);
  m.def(
      "open_packed",
      [](const std::string& directory) {
        io::PackedFile::Opened opened = io::PackedFile::open_directory(directory);
        return py::make_tuple(opened.file, opened.warning);
      },
      py::arg("directory"),
      "(the directory's packed-weights file for the running level or None, why an existing one is not used or '')");
  m.def("packed_file_name", &io::packed_file_name, "cpuformer_packed.<level key>.bin for the running level");
  m.def("weights_fingerprint", &io::weights_fingerprint, py::arg("path"),
        "a safetensors file's size and header hash, as packed-weights files record it");
}

}  // namespace bindings
}  // namespace cpuformer
