// Releasing the GIL around a long native call, and calling back into Python from it, without
// aborting the process when the interpreter exits meanwhile.
//
// Once finalization has started, Python (3.11-3.13) ends any other thread that asks for the GIL
// with pthread_exit, which unwinds the thread's C++ stack (a "forced unwind"). The thread may be
// asking already, queued for the GIL, when finalization starts. py::gil_scoped_release takes the
// GIL back in its destructor, a noexcept frame: the forced unwind cannot pass it and
// std::terminate aborts the whole process ("terminate called without an active exception").
// Letting the unwind through would be no better: the frames below would drop Python references
// without the GIL. So a thread that would be ended this way is parked instead, for the rest of the
// process's short life (as Python 3.14 itself does with such threads): GilReleased and
// call_python check for finalization before asking for the GIL and catch the forced unwind if it
// started while they waited. A token callback that cannot call Python throws InterpreterExiting,
// which unwinds the native loop first. Nothing is left half-done that the exiting process could
// observe.
#pragma once

#include <cxxabi.h>
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
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {  // finalization started while this thread waited
      park_thread_until_exit();
    }
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_;
};

// Calls a Python callable from a native loop running under GilReleased; returns the truth value
// of its result (None: false).
template <typename... Args>
bool call_python(const pybind11::object& callable, Args&&... args) {
  if (interpreter_finalizing()) throw InterpreterExiting();
  PyGILState_STATE state;
  try {
    state = PyGILState_Ensure();
  } catch (abi::__forced_unwind&) {  // finalization started while this thread waited
    park_thread_until_exit();
  }
  struct Release {
    PyGILState_STATE state;
    ~Release() { PyGILState_Release(state); }
  } release{state};
  const pybind11::object result = callable(std::forward<Args>(args)...);
  const int truth = PyObject_IsTrue(result.ptr());
  if (truth < 0) throw pybind11::error_already_set();
  return truth == 1;
}

}  // namespace cpuformer
