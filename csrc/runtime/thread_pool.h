// cpuformer's own parallel regions: run_team(nt, fn) runs fn(team) on nt threads (the calling thread
// is team.index() 0) and returns when all have finished. Kernels use it instead of OpenMP's
// `#pragma omp parallel` so that the waits between regions and at barriers are cpuformer's own
// (runtime/thread_pool.cc, docs/runtime.md "Waiting threads"): a waiting thread spins for a short
// while, then spins with sched_yield() (which hands its CPU to any other runnable thread: on a
// shared machine a waiter does not take the time slice of the thread it waits for), then sleeps.
// libgomp offers one spin count for both cases: long spins are 10-20 % faster on an idle machine
// and several times slower on a shared one.
//
// Semantics, as OpenMP's with nesting disabled (libgomp's default): every thread that calls
// run_team has a pool of its own workers, created on first use and joined when the thread exits;
// a run_team inside a team (or with nt ≤ 1) runs fn on the calling thread alone. fn must not throw
// (as nothing may leave an OpenMP region). fork(): install_fork_handlers() (runtime/threading.h) joins the
// forking thread's pool before fork; parent and child rebuild it on next use.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace cpuformer {

// Splits [0, n) into `parts` contiguous ranges of near-equal size; returns range `index`.
inline void split_range(long n, int parts, int index, long* begin, long* end) {
  const long base = n / parts, extra = n % parts;
  *begin = index * base + (index < extra ? index : extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

// What the threads of one region share: the barrier and the dynamic-schedule counter.
struct TeamState {
  int size = 1;
  std::atomic<int> arrived{0};
  std::atomic<uint32_t> generation{0};
  std::atomic<int> sleepers{0};
  std::atomic<long> next{0};  // dynamic schedule: the next unclaimed item (one dynamic loop per region)
};

class Team {
 public:
  Team(TeamState* state, int index) : state_(state), index_(index) {}
  int index() const { return index_; }
  int size() const { return state_->size; }
  // Waits until every thread of the team has arrived (OpenMP's `#pragma omp barrier`).
  void barrier() const;
  // This thread's contiguous share of [0, n) (OpenMP's `schedule(static)`).
  void range(long n, long* begin, long* end) const { split_range(n, size(), index_, begin, end); }
  // The next chunk of at most `chunk` items of [0, n) not yet claimed by a thread of the team
  // (`schedule(dynamic, chunk)`); false when none is left. One such loop per region: the counter is
  // shared by every dynamic loop of the region.
  bool next_chunk(long n, long chunk, long* begin, long* end) const {
    const long b = state_->next.fetch_add(chunk, std::memory_order_relaxed);
    if (b >= n) return false;
    *begin = b;
    *end = b + chunk < n ? b + chunk : n;
    return true;
  }

 private:
  TeamState* state_;
  int index_;
};

using TeamFunction = void (*)(void* context, const Team& team);

// True on a thread that is running fn of a team (a worker, or a caller inside run_team).
bool in_team();
void run_team_erased(int nt, TeamFunction fn, void* context);

template <typename Fn>
void run_team(int nt, Fn&& fn) {
  using F = std::remove_reference_t<Fn>;
  run_team_erased(
      nt, [](void* context, const Team& team) { (*static_cast<F*>(context))(team); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

// The waiting policy, for tests and docs: how long a waiting thread spins before it sleeps
// (CPUFORMER_SPIN_US, default 200 µs; 0: sleep at once).
long spin_microseconds();

// Joins the calling thread's pool (before fork; tests). The next run_team rebuilds it.
void shut_down_thread_pool();

}  // namespace cpuformer
