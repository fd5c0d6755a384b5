// Thread-count plumbing. Kernels open their own parallel regions (runtime/thread_pool.h) with
// current_num_threads() threads; the caller (a model, or the ops bindings) sets the count
// for the calling thread with a ScopedNumThreads guard. The value is thread-local, so several
// Python threads can each run a model with its own count.
#pragma once

#include "runtime/thread_pool.h"

namespace cpuformer {

int default_num_threads();   // OMP_NUM_THREADS if set, else available_cpus(); at most 1024
int current_num_threads();   // the count set on this thread, else the process-wide default
void set_default_num_threads(int n);  // n <= 0 restores the automatic default

// The CPUs this process may run on: its affinity mask (sched_getaffinity, masks of any size), else
// the online CPUs (sysconf), capped by its control group's CPU limit rounded up
// (runtime/cpu_quota.h: a container's `--cpus`); at least 1. The one count behind the default
// thread count and the compute slots' capacity (runtime/compute_slots.h).
int available_cpus();
// `cpus` capped by a CPU limit (0: none): ceil(limit), at least 1.
int cpus_within_limit(int cpus, double limit);

// The thread count an OMP_NUM_THREADS value asks for, read as GNU libgomp reads it: a
// comma-separated list of positive integers (white space around each allowed) whose first entry is
// the count; 0 for nullptr or a value libgomp would ignore ("", "0", "abc", "2,x", "-1").
// cpuformer links no OpenMP runtime; it reads the variable itself so that the setting users know
// keeps working.
int parse_num_threads_variable(const char* value);

// fork() safety, installed once when the Python module loads (idempotent).
//
// cpuformer's pools (runtime/thread_pool.h), like GNU libgomp's, keep worker threads per thread that
// opened a parallel region: a child forked after the forking thread had used one inherits a pool
// whose workers do not exist, and its first parallel region would wait for them forever. Before
// fork(), the forking thread's pools are therefore shut down (shut_down_thread_pool(): their
// workers are released and joined); the child then builds a fresh pool of its own threads on first use, and
// the parent rebuilds its pool lazily (thread creation, microseconds). Pools of other threads need
// nothing: those threads do not exist in the child, and a thread created there starts without a pool.
// In the child, process-wide state that other parent threads may have held at fork time (the
// compute slots, the SIGINT watch) is reset so that nothing waits for a thread that is gone.
void install_fork_handlers();

class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int n);
  ~ScopedNumThreads();
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int previous_;
};

// Runs fn(begin, end) over [0, n) split into contiguous ranges, one per thread, using at most
// current_num_threads() threads and at least `min_per_thread` items per thread.
// Use from generic (non-ISA) translation units only.
template <typename Fn>
void parallel_ranges(long n, long min_per_thread, Fn&& fn) {
  if (n <= 0) return;
  long by_size = min_per_thread > 0 ? n / min_per_thread : n;
  if (by_size < 1) by_size = 1;
  const int max_threads = current_num_threads();
  const int nt = by_size < max_threads ? static_cast<int>(by_size) : max_threads;
  if (nt <= 1) {
    fn(0L, n);
    return;
  }
  run_team(nt, [&](const Team& team) {
    long begin, end;
    team.range(n, &begin, &end);
    if (begin < end) fn(begin, end);
  });
}

}  // namespace cpuformer
