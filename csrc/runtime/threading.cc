#include "runtime/threading.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <mutex>

#include "runtime/compute_slots.h"
#include "runtime/interrupt.h"
#include "runtime/thread_pool.h"

namespace cpuformer {
namespace {

int automatic_num_threads() {
  // omp_get_max_threads() honours OMP_NUM_THREADS and otherwise reports the CPUs in the affinity mask.
  const int n = omp_get_max_threads();
  return n > 0 ? n : 1;
}

std::atomic<int> g_default{0};
thread_local int t_current = 0;

// The forking thread is running Python (os.fork), so it is outside any parallel region: pausing
// succeeds. A fork from inside a parallel region (not something cpuformer does) makes the pause
// return nonzero and leaves the pool alone.
void before_fork() {
  shut_down_thread_pool();
  omp_pause_resource_all(omp_pause_hard);
}

void in_child_after_fork() {
  reset_compute_slots_after_fork();
  reset_sigint_watch_after_fork();
}

}  // namespace

int default_num_threads() {
  int n = g_default.load(std::memory_order_relaxed);
  if (n <= 0) {
    static const int automatic = automatic_num_threads();
    n = automatic;
  }
  return n;
}

void set_default_num_threads(int n) { g_default.store(n > 0 ? n : 0, std::memory_order_relaxed); }

int current_num_threads() { return t_current > 0 ? t_current : default_num_threads(); }

void install_fork_handlers() {
  static std::once_flag installed;
  std::call_once(installed, [] { pthread_atfork(before_fork, nullptr, in_child_after_fork); });
}

ScopedNumThreads::ScopedNumThreads(int n) : previous_(t_current) { t_current = n > 0 ? n : 0; }
ScopedNumThreads::~ScopedNumThreads() { t_current = previous_; }

}  // namespace cpuformer
