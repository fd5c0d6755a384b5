// Binding side of runtime/interrupt.h: which calls watch for Ctrl-C, and how an interrupted call
// reaches Python.
#pragma once

#include <pybind11/pybind11.h>

#include "runtime/interrupt.h"

namespace cpuformer {

// True on Python's main thread (the only thread Python runs signal handlers on). Needs the GIL.
inline bool on_python_main_thread() {
  namespace py = pybind11;
  const py::object main = py::module_::import("threading").attr("main_thread")();
  return py::cast<unsigned long>(main.attr("ident")) == PyThread_get_thread_ident();
}

// After a loop stopped with Interrupted (GIL held again): run Python's pending signal handlers,
// which raise KeyboardInterrupt by default; if a custom handler chose not to raise, still report
// the stop as KeyboardInterrupt rather than return a truncated result as if it were complete.
[[noreturn]] inline void raise_interrupted() {
  if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
  PyErr_SetNone(PyExc_KeyboardInterrupt);
  throw pybind11::error_already_set();
}

}  // namespace cpuformer
