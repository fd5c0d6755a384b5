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

// A work split for a stream of like items that threads may get through at different speeds (the
// panels of a decode step's GEMV: on a shared machine one thread's memory stream runs ~15 % slower
// than the other's for long stretches, and a static split made the faster one wait ~10 µs per
// projection). Each thread takes the items of its contiguous share from the front, in order, so
// that its reads stay one sequential stream; a thread whose share is done takes the last unclaimed
// item of the share with the most left. One per region, set up by the caller before run_team.
class StealingRanges {
 public:
  static constexpr int kMaxThreads = 64;
  // Shares [0, n) out among `threads` as Team::range does; false (use Team::range instead) when
  // there are more threads than kMaxThreads or n does not fit 32 bits.
  bool init(long n, int threads) {
    if (threads < 1 || threads > kMaxThreads || n < 0 || n > 0x7FFFFFFFL) return false;
    threads_ = threads;
    for (int t = 0; t < threads; ++t) {
      long begin, end;
      split_range(n, threads, t, &begin, &end);
      slots_[t].range.store(pack(begin, end), std::memory_order_relaxed);
    }
    return true;
  }
  // The calling thread's next item; false when every item is taken. *more: whether the item after
  // it in the same share was still unclaimed then (false for a taken-over item), that is, whether
  // this thread probably runs it next.
  bool next(const Team& team, long* item, bool* more) {
    std::atomic<uint64_t>& own = slots_[team.index()].range;
    for (uint64_t cur = own.load(std::memory_order_relaxed); front(cur) < back(cur);) {
      if (own.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed)) {
        *item = front(cur);
        *more = front(cur) + 1 < back(cur);
        return true;
      }
    }
    for (;;) {
      int victim = -1;
      long most = 0;
      for (int t = 0; t < threads_; ++t) {
        const uint64_t r = slots_[t].range.load(std::memory_order_relaxed);
        if (back(r) - front(r) > most) {
          most = back(r) - front(r);
          victim = t;
        }
      }
      if (victim < 0) return false;
      std::atomic<uint64_t>& other = slots_[victim].range;
      for (uint64_t cur = other.load(std::memory_order_relaxed); front(cur) < back(cur);) {
        if (other.compare_exchange_weak(cur, cur - (uint64_t{1} << 32), std::memory_order_relaxed)) {
          *item = back(cur) - 1;
          *more = false;
          return true;
        }
      }
    }
  }

 private:
  // A share's unclaimed items [front, back): front in the low 32 bits, back in the high.
  static uint64_t pack(long front, long back) {
    return static_cast<uint64_t>(front) | static_cast<uint64_t>(back) << 32;
  }
  static long front(uint64_t r) { return static_cast<long>(r & 0xFFFFFFFFu); }
  static long back(uint64_t r) { return static_cast<long>(r >> 32); }
  struct alignas(64) Slot {
    std::atomic<uint64_t> range;
  };
  Slot slots_[kMaxThreads];
  int threads_ = 0;
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
