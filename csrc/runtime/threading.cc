#include "runtime/threading.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "runtime/compute_slots.h"
#include "runtime/cpu_quota.h"
#include "runtime/interrupt.h"
#include "runtime/thread_pool.h"

namespace cpuformer {
namespace {

// The most threads a count may ask for: set_num_threads(), num_threads and the C API accept
// 1..1024, and an automatic default above that (OMP_NUM_THREADS=5000, a machine with more CPUs) is
// used as 1024.
constexpr int kMaxThreads = 1024;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// One entry of an OMP_NUM_THREADS list as libgomp reads it (strtoul after optional white space, a
// '+' allowed, no '-'; zero and values beyond LONG_MAX are not counts), from *p; leaves *p after the
// entry and its trailing white space. 0: not a positive integer; values above INT_MAX give INT_MAX.
long read_entry(const char** p) {
  const char* s = *p;
  while (is_space(*s)) ++s;
  if (*s == '+') ++s;
  if (*s < '0' || *s > '9') return 0;
  unsigned long long value = 0;
  for (; *s >= '0' && *s <= '9'; ++s) {
    value = value * 10 + static_cast<unsigned>(*s - '0');
    if (value > static_cast<unsigned long long>(LONG_MAX)) return 0;
  }
  while (is_space(*s)) ++s;
  *p = s;
  return static_cast<long>(std::min<unsigned long long>(value, INT_MAX));
}

}  // namespace

int parse_num_threads_variable(const char* value) {
  if (value == nullptr) return 0;
  const char* p = value;
  const long first = read_entry(&p);
  if (first <= 0) return 0;
  // The other entries (counts for nested levels, which cpuformer does not open) must be valid too,
  // or libgomp ignores the whole variable.
  while (*p == ',') {
    ++p;
    if (read_entry(&p) <= 0) return 0;
  }
  if (*p != '\0') return 0;
  return static_cast<int>(first);
}

namespace {

int affinity_cpus() {
#if defined(__linux__)
  // The affinity mask (taskset, cgroup cpusets), in a set as large as the kernel's: a fixed cpu_set_t
  // holds 1024 CPUs, and sched_getaffinity fails with EINVAL when the kernel's mask is larger.
  for (int cpus = 1024; cpus <= (1 << 22); cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) break;
    const size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, set);
    const int rc = sched_getaffinity(0, size, set);
    const int count = rc == 0 ? CPU_COUNT_S(size, set) : 0;
    const bool too_small = rc != 0 && errno == EINVAL;
    CPU_FREE(set);
    if (count > 0) return count;
    if (!too_small) break;
  }
#endif
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(std::min<long>(online, INT_MAX)) : 1;
}

}  // namespace

int cpus_within_limit(int cpus, double limit) {
  if (!(limit > 0)) return cpus;
  const double rounded_up = std::ceil(limit);
  return rounded_up < cpus ? std::max(1, static_cast<int>(rounded_up)) : cpus;
}

int available_cpus() { return cpus_within_limit(affinity_cpus(), cgroup_cpu_limit("")); }

namespace {

int automatic_num_threads() {
  int n = parse_num_threads_variable(std::getenv("OMP_NUM_THREADS"));
  if (n <= 0) n = available_cpus();
  return std::min(n, kMaxThreads);
}

std::atomic<int> g_default{0};
thread_local int t_current = 0;

void before_fork() { shut_down_thread_pool(); }

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
