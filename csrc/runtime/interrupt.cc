#include "runtime/interrupt.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace cpuformer {
namespace {

std::atomic<long> g_sigint_count{0};  // lock-free: written from the signal handler
static_assert(std::atomic<long>::is_always_lock_free, "the SIGINT counter must be async-signal-safe");

std::mutex* g_install_mutex = new std::mutex;  // replaced (the old one leaked) in a forked child
int g_watchers = 0;            // active watches (guarded by *g_install_mutex)
struct sigaction g_previous;   // the handler ours replaced (Python's, normally)

thread_local long t_start = -1;  // g_sigint_count when this thread's watch began; -1 = no watch

void on_sigint(int signal, siginfo_t* info, void* context) {
  g_sigint_count.fetch_add(1, std::memory_order_relaxed);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(signal, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    g_previous.sa_handler(signal);
  }
}

}  // namespace

SigintWatch::SigintWatch(bool watch) {
  if (!watch || t_start >= 0) return;  // not asked for, or already watched (a nested call)
  std::lock_guard<std::mutex> lock(*g_install_mutex);
  if (g_watchers == 0) {
    struct sigaction current;
    if (sigaction(SIGINT, nullptr, &current) != 0) return;
    const bool handled =
        (current.sa_flags & SA_SIGINFO) || (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
    if (!handled) return;  // SIGINT ignored or fatal: nothing to chain to, leave it alone
    struct sigaction ours = {};
    ours.sa_sigaction = on_sigint;
    ours.sa_flags = SA_SIGINFO | (current.sa_flags & SA_ONSTACK);
    sigemptyset(&ours.sa_mask);
    g_previous = current;
    if (sigaction(SIGINT, &ours, nullptr) != 0) return;
  }
  ++g_watchers;
  active_ = true;
  t_start = g_sigint_count.load(std::memory_order_relaxed);
}

SigintWatch::~SigintWatch() {
  if (!active_) return;
  t_start = -1;
  std::lock_guard<std::mutex> lock(*g_install_mutex);
  if (--g_watchers == 0) {
    struct sigaction current;
    // Restore only if ours is still installed (Python code may have set another handler since).
    if (sigaction(SIGINT, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == on_sigint) {
      sigaction(SIGINT, &g_previous, nullptr);
    }
  }
}

void reset_sigint_watch_after_fork() {
  g_install_mutex = new std::mutex;
  g_watchers = t_start >= 0 ? 1 : 0;  // the forking thread's own watch, if it forked from inside a call
  struct sigaction current;
  if (g_watchers == 0 && sigaction(SIGINT, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
      current.sa_sigaction == on_sigint) {
    sigaction(SIGINT, &g_previous, nullptr);
  }
}

void throw_if_interrupted() {
  const long start = t_start;
  if (start >= 0 && g_sigint_count.load(std::memory_order_relaxed) != start) throw Interrupted();
}

}  // namespace cpuformer
