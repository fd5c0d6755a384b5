// Process-wide bound on compute threads when several Python threads call in at once.
//
// Every call into native compute (a model forward, an ops kernel) runs its own thread pool team of
// current_num_threads() threads. Without a bound, 8 Python threads × 2 pool threads on 2 cores
// means 16 spinning threads: every barrier then waits for descheduled threads and throughput
// collapses (measured ~10x on a loaded 2-core machine). A call therefore takes `threads` slots out
// of capacity() for its duration and waits (GIL released) until they are free. A call larger than
// the capacity runs when it is alone. Waiters are served first come, first served (a ticket queue),
// so a large call cannot be starved by a stream of small ones.
//
// Results do not depend on this: it only delays calls, never changes their thread count.
#pragma once

namespace cpuformer {

struct ComputeSlotsState;

// Slots the process may use at once: the CPUs in its affinity mask (fixed at first use).
int compute_capacity();

class ComputeSlots {
 public:
  // Blocks until `threads` slots (at least 1) are free, or nothing else runs. Call with the GIL released.
  explicit ComputeSlots(int threads);
  ~ComputeSlots();
  ComputeSlots(const ComputeSlots&) = delete;
  ComputeSlots& operator=(const ComputeSlots&) = delete;

 private:
  ComputeSlotsState* state_;  // the state the slots came from (replaced in a forked child)
  int taken_;
};

// In a child process right after fork() (single-threaded): starts from fresh state. The parent's
// counters, mutex and condition variable may have been in use by threads that do not exist in the
// child (a condition variable with phantom waiters can block its next notify).
void reset_compute_slots_after_fork();

// Test hooks: slots in use now, and the most in use at once since the last reset.
int compute_slots_in_use();
int compute_slots_peak();
void reset_compute_slots_peak();

}  // namespace cpuformer
