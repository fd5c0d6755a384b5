#include "runtime/compute_slots.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "runtime/threading.h"

namespace cpuformer {

struct ComputeSlotsState {
  std::mutex mutex;
  std::condition_variable changed;
  int in_use = 0;
  int peak = 0;
  uint64_t next_ticket = 0;  // handed to the next caller
  uint64_t serving = 0;      // the ticket allowed to take slots next
};

namespace {

using State = ComputeSlotsState;

// Never destroyed: calls may still finish during interpreter exit. Replaced (the old one leaked)
// only in a forked child, where no other thread exists.
std::atomic<State*> g_state{new State};

State& state() { return *g_state.load(std::memory_order_acquire); }

}  // namespace

int compute_capacity() {
  static const int capacity = available_cpus();
  return capacity;
}

ComputeSlots::ComputeSlots(int threads) : state_(&state()), taken_(threads > 0 ? threads : 1) {
  const int capacity = compute_capacity();
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  const uint64_t ticket = s.next_ticket++;
  s.changed.wait(lock, [&] { return s.serving == ticket && (s.in_use == 0 || s.in_use + taken_ <= capacity); });
  ++s.serving;
  s.in_use += taken_;
  if (s.in_use > s.peak) s.peak = s.in_use;
  lock.unlock();
  s.changed.notify_all();  // the next ticket may fit as well
}

ComputeSlots::~ComputeSlots() {
  // Slots taken before a fork (a fork from a token callback) belong to the parent's state.
  if (state_ != &state()) return;
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.in_use -= taken_;
  }
  s.changed.notify_all();
}

void reset_compute_slots_after_fork() { g_state.store(new State, std::memory_order_release); }

int compute_slots_in_use() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().in_use;
}

int compute_slots_peak() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().peak;
}

void reset_compute_slots_peak() {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().peak = state().in_use;
}

}  // namespace cpuformer
