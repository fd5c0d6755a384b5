// Releasing the GIL around a long native call, and calling back into Python from it, without
// aborting the process when the interpreter exits meanwhile.
//
// Once finalization has started, Python (3.11-3.13) ends any other thread that asks for the GIL
// with pthread_exit, which unwinds the thread's C++ stack. py::gil_scoped_release takes the GIL
// back in its destructor; pthread_exit from there unwinds through a noexcept frame and
// std::terminate aborts the whole process ("terminate called without an active exception"). So a
// daemon thread whose generation ends, or whose token callback fires, while the interpreter exits
// must not ask for the GIL: the callback throws InterpreterExiting instead, which unwinds the
// native loop, and GilReleased then parks the thread for the rest of the process's short life
// (as Python 3.14 itself does with such threads). Nothing is left half-done that the exiting
// process could observe.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <utility>

namespace cpuformer {

inline bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Never returns: sleeps until the process exits.
[[noreturn]] inline void park_thread_until_exit() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

// Thrown by a native-to-Python callback instead of taking the GIL during finalization.
struct InterpreterExiting : std::runtime_error {
  InterpreterExiting() : std::runtime_error("the Python interpreter is exiting") {}
};

// Like py::gil_scoped_release, but parks the thread instead of retaking the GIL once the
// interpreter is finalizing. Declare it before everything else in the scope, so that all other
// native state of the call is destroyed before this can park.
class GilReleased {
 public:
  GilReleased() : state_(PyEval_SaveThread()) {}
  ~GilReleased() {
    if (interpreter_finalizing()) park_thread_until_exit();
    PyEval_RestoreThread(state_);
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};

// Calls a Python callable from a native loop running under GilReleased.
template <typename... Args>
void call_python(const pybind11::object& callable, Args&&... args) {
  if (interpreter_finalizing()) throw InterpreterExiting();
  pybind11::gil_scoped_acquire acquire;
  callable(std::forward<Args>(args)...);
}

}  // namespace cpuformer
