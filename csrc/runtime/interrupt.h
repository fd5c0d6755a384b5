// Ctrl-C during a long native call (generate, stream).
//
// Python handles SIGINT by setting a flag that only the interpreter's main loop looks at, so a
// main-thread call that runs for minutes in C++ with the GIL released would not see Ctrl-C until
// it returned. While a SigintWatch lives on the main thread, a chained SIGINT handler counts the
// signals (and still calls the previous handler, so Python records the signal as usual). Long
// loops call throw_if_interrupted() between steps; the binding turns Interrupted into Python's
// pending KeyboardInterrupt. Calls on other threads are not watched (Python delivers signals to
// the main thread only; stream() cancels its worker through its token callback instead).
#pragma once

#include <exception>

namespace cpuformer {

struct Interrupted : std::exception {
  const char* what() const noexcept override { return "interrupted by SIGINT"; }
};

class SigintWatch {
 public:
  // watch: whether this call should react to SIGINT (true only on Python's main thread).
  explicit SigintWatch(bool watch);
  ~SigintWatch();
  SigintWatch(const SigintWatch&) = delete;
  SigintWatch& operator=(const SigintWatch&) = delete;

 private:
  bool active_ = false;
};

// Throws Interrupted if SIGINT arrived since this thread's SigintWatch started. Cheap (one atomic
// load); a no-op on threads without an active watch.
void throw_if_interrupted();

// In a child process right after fork() (single-threaded): only the forking thread survives, so
// watches of other parent threads are gone. Their count is dropped (restoring the previous SIGINT
// handler if none remains) and the lock, which such a thread may have held, is made anew.
void reset_sigint_watch_after_fork();

}  // namespace cpuformer
