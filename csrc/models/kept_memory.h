// Memory a model keeps from one generation run for the next: the KV cache and the scratch space of
// its passes.
//
// Fresh memory costs a page fault and the kernel's zeroing of each page at its first touch, on the
// thread that touches it: ~8 GB/s on the Zen 4 development host (2026-11-29), so ~10 ms for the
// 77 MB KV cache of GPT-2 124M with max_new_tokens=1000, which the first token's writes reach
// throughout (each head's slots lie apart), and ~40 ms for the 300 MB one of 8 rows of 512 + 1
// tokens. A run that maps its memory anew pays that every call; kept memory is already mapped.
//
// A model keeps at most one set, and only up to kept_memory_limit() bytes (512 MiB unless set):
// the memory of a larger run is freed at its end, as is the memory a second run allocated while
// another held the kept set (concurrent calls on one model from several Python threads). A run
// that ends by an exception gives its memory back too: every user resets what it reads (KvCache
// reset, ScratchBuffer reserve) before reading it.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>

namespace cpuformer {

inline std::atomic<std::size_t>& kept_memory_limit_value() {
  static std::atomic<std::size_t> limit{std::size_t{512} << 20};
  return limit;
}
inline std::size_t kept_memory_limit() { return kept_memory_limit_value().load(std::memory_order_relaxed); }
// Sets the limit for every model (tests); returns the previous one.
inline std::size_t set_kept_memory_limit(std::size_t bytes) { return kept_memory_limit_value().exchange(bytes); }

// Memory: default-constructible, with capacity_bytes() (the bytes it holds).
template <class Memory>
class KeptMemory {
 public:
  // The kept set, or a new one when none is kept (none yet, too large, or another run holds it).
  std::unique_ptr<Memory> take() const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (kept_) return std::move(kept_);
    }
    return std::make_unique<Memory>();
  }
  // Keeps `memory` for the next take() when no set is kept and it holds at most the limit; frees it
  // otherwise (after the lock is released: unmapping takes time).
  void give(std::unique_ptr<Memory> memory) const noexcept {
    if (!memory || memory->capacity_bytes() > kept_memory_limit()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kept_) kept_ = std::move(memory);
  }
  // Bytes of the kept set (0: none).
  std::size_t bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_ ? kept_->capacity_bytes() : 0;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::unique_ptr<Memory> kept_;
};

// A run's memory: taken from the model's KeptMemory on construction, given back on destruction.
template <class Memory>
class BorrowedMemory {
 public:
  explicit BorrowedMemory(const KeptMemory<Memory>& from) : from_(from), memory_(from.take()) {}
  ~BorrowedMemory() { from_.give(std::move(memory_)); }
  BorrowedMemory(const BorrowedMemory&) = delete;
  BorrowedMemory& operator=(const BorrowedMemory&) = delete;
  Memory& operator*() const { return *memory_; }
  Memory* operator->() const { return memory_.get(); }

 private:
  const KeptMemory<Memory>& from_;
  std::unique_ptr<Memory> memory_;
};

}  // namespace cpuformer
