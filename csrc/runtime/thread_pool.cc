#include "runtime/thread_pool.h"

#include <sched.h>
#include <sys/resource.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace cpuformer {
namespace {

thread_local bool t_in_team = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

// Sleeps while word == old (spurious returns allowed: the caller loops).
void sleep_while_equal(std::atomic<uint32_t>& word, uint32_t old) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
#else
  (void)word;
  (void)old;
  std::this_thread::sleep_for(std::chrono::microseconds(20));
#endif
}

void wake_all(std::atomic<uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

// About a microsecond of pause-spinning before the yielding phase: the wait of a balanced region
// ends in it on an idle machine.
constexpr int kPauseSpins = 128;
// A sched_yield() that took longer than this and switched to another thread of this machine (the
// thread's involuntary context switches grew: a virtual machine's host can also stop a CPU for
// that long, which no waiting policy helps) shows that this CPU is wanted. The waiting
// thread then sleeps (a futex wake-up gets a woken thread back on the CPU at once, while a thread
// that only yielded waits out the other thread's time slice) and skips the yielding phase for
// its next kSleepFirstWaits waits before it tries again.
constexpr auto kYieldRanOther = std::chrono::microseconds(20);
constexpr int kSleepFirstWaits = 256;
thread_local int t_sleep_first = 0;
thread_local long t_involuntary = -1;

// The calling thread's involuntary context switches so far (a yield that ran another thread
// counts as one), or -1 when the kernel does not say.
long involuntary_switches() {
  struct rusage usage;
  t_involuntary = getrusage(RUSAGE_THREAD, &usage) == 0 ? usage.ru_nivcsw : -1;
  return t_involuntary;
}

// True when the calling thread was switched out involuntarily since the wait began yielding (its
// last involuntary_switches() call). Compared with the count of the previous wait instead, a
// time-slice preemption while the thread computed (a timer tick that ran a kernel thread) put it
// to sleep for its next kSleepFirstWaits waits: GPT-2 decode then slept ~15 times a token.
bool ran_another_thread() {
  const long before = t_involuntary;
  return before < 0 || involuntary_switches() != before;
}

// More threads of this machine are runnable than it has CPUs (the run-queue count of
// /proc/loadavg, read at most once a millisecond per thread): a waiting thread then sleeps at once,
// so that its CPU goes to the thread that wanted it, and the scheduler can move a competing
// thread (a busy process next to the model) off the CPU its team partner computes on. Without
// the count (not Linux, no /proc) the yields' own check above decides alone.
bool machine_oversubscribed() {
#if defined(__linux__)
  thread_local std::chrono::steady_clock::time_point t_checked;
  thread_local bool t_oversubscribed = false;
  const auto now = std::chrono::steady_clock::now();
  if (now - t_checked < std::chrono::milliseconds(1)) return t_oversubscribed;
  t_checked = now;
  static const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  static const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  char text[128];
  const ssize_t size = fd >= 0 ? pread(fd, text, sizeof(text) - 1, 0) : -1;
  if (size <= 0) return t_oversubscribed = false;
  text[size] = '\0';
  // "0.52 0.58 0.59 3/1234 5678": the fourth field's numerator is the runnable count.
  const char* field = text;
  for (int spaces = 0; *field != '\0' && spaces < 3; ++field) spaces += *field == ' ';
  long running = 0;
  for (; *field >= '0' && *field <= '9'; ++field) running = running * 10 + (*field - '0');
  return t_oversubscribed = cpus > 0 && running > cpus;
#else
  return false;
#endif
}

// Returns once word != old. The waker (bump) changes the word and then wakes the sleepers it
// counts; sleepers is incremented before the last check, so a bump either sees the sleeper or the
// sleeper sees the bump (both sequentially consistent).
void wait_while_equal(std::atomic<uint32_t>& word, std::atomic<int>& sleepers, uint32_t old) {
  if (word.load(std::memory_order_acquire) != old) return;
  const long budget = spin_microseconds();
  if (budget > 0) {
    for (int i = 0; i < kPauseSpins; ++i) {
      cpu_relax();
      if (word.load(std::memory_order_acquire) != old) return;
    }
    // sched_yield() runs any other thread that is runnable on this CPU and returns at once when
    // there is none; a long one means the CPU is shared, and the thread goes to sleep.
    if (t_sleep_first > 0) {
      --t_sleep_first;
    } else if (!machine_oversubscribed()) {
      involuntary_switches();  // the count this wait's yields are compared against
      const auto start = std::chrono::steady_clock::now();
      const auto limit = std::chrono::microseconds(budget);
      for (auto before = start;;) {
        sched_yield();
        const auto after = std::chrono::steady_clock::now();
        for (int i = 0; i < 8; ++i) {
          if (word.load(std::memory_order_acquire) != old) return;
          cpu_relax();
        }
        if (after - before > kYieldRanOther && ran_another_thread()) {
          t_sleep_first = kSleepFirstWaits;
          break;
        }
        if (after - start > limit) break;
        before = after;
      }
    }
  }
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (word.load(std::memory_order_seq_cst) == old) sleep_while_equal(word, old);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void bump(std::atomic<uint32_t>& word, std::atomic<int>& sleepers) {
  word.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) wake_all(word);
}

// One worker thread and its mailbox: the team function, context, shared state and index of its
// next region, written by the pool's owner before it bumps `word`.
struct alignas(64) Worker {
  std::atomic<uint32_t> word{0};
  std::atomic<int> sleepers{0};
  TeamFunction fn = nullptr;
  void* context = nullptr;
  TeamState* state = nullptr;
  int index = 0;
  bool stop = false;
  std::thread thread;
};

struct Pool {
  std::vector<std::unique_ptr<Worker>> workers;
  alignas(64) std::atomic<int> remaining{0};
  std::atomic<uint32_t> done{0};
  std::atomic<int> done_sleepers{0};

  void work(Worker* w) {
    uint32_t seen = 0;
    for (;;) {
      wait_while_equal(w->word, w->sleepers, seen);
      seen = w->word.load(std::memory_order_acquire);
      if (w->stop) return;
      t_in_team = true;
      w->fn(w->context, Team(w->state, w->index));
      t_in_team = false;
      if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) bump(done, done_sleepers);
    }
  }

  // At least n workers (may throw std::system_error when a thread cannot be created).
  void grow(int n) {
    while (static_cast<int>(workers.size()) < n) {
      auto w = std::make_unique<Worker>();
      Worker* raw = w.get();
      w->thread = std::thread([this, raw] { work(raw); });
      workers.push_back(std::move(w));
    }
  }

  ~Pool() {
    for (auto& w : workers) {
      w->stop = true;
      bump(w->word, w->sleepers);
    }
    for (auto& w : workers) w->thread.join();
  }
};

thread_local std::unique_ptr<Pool> t_pool;

long read_spin_microseconds() {
  const char* text = std::getenv("CPUFORMER_SPIN_US");
  if (text == nullptr || *text == '\0') return 200;
  long value = 0;  // digits only, as the Python package checks (no sign, no spaces)
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || value > 1000000) return 200;
    value = value * 10 + (*c - '0');
  }
  return value > 1000000 ? 200 : value;
}

}  // namespace

long spin_microseconds() {
  static const long value = read_spin_microseconds();
  return value;
}

bool in_team() { return t_in_team; }

void Team::barrier() const {
  TeamState& s = *state_;
  if (s.size <= 1) return;
  const uint32_t generation = s.generation.load(std::memory_order_acquire);
  if (s.arrived.fetch_add(1, std::memory_order_acq_rel) == s.size - 1) {
    s.arrived.store(0, std::memory_order_relaxed);
    bump(s.generation, s.sleepers);
  } else {
    wait_while_equal(s.generation, s.sleepers, generation);
  }
}

void run_team_erased(int nt, TeamFunction fn, void* context) {
  if (nt <= 1 || t_in_team) {
    TeamState solo;
    const bool outer = t_in_team;
    t_in_team = true;
    fn(context, Team(&solo, 0));
    t_in_team = outer;
    return;
  }
  if (!t_pool) t_pool = std::make_unique<Pool>();
  Pool& pool = *t_pool;
  pool.grow(nt - 1);
  TeamState state;
  state.size = nt;
  pool.remaining.store(nt - 1, std::memory_order_relaxed);
  const uint32_t done = pool.done.load(std::memory_order_acquire);
  for (int i = 0; i < nt - 1; ++i) {
    Worker& w = *pool.workers[i];
    w.fn = fn;
    w.context = context;
    w.state = &state;
    w.index = i + 1;
    bump(w.word, w.sleepers);
  }
  t_in_team = true;
  fn(context, Team(&state, 0));
  t_in_team = false;
  while (pool.remaining.load(std::memory_order_acquire) != 0) wait_while_equal(pool.done, pool.done_sleepers, done);
}

void shut_down_thread_pool() { t_pool.reset(); }

}  // namespace cpuformer
