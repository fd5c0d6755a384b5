// Owning, 64-byte aligned, uninitialised storage for packed weights and scratch space.
//
// Buffers of kMapThreshold bytes or more are mapped from the OS directly (mmap) and unmapped when
// freed: glibc serves them from its heap once its adaptive mmap threshold has grown, and then keeps
// the pages after free(), so a deleted model would stay resident. (Not under AddressSanitizer,
// which checks heap blocks but not private mappings.)
//
// Buffers of kHugeThreshold bytes or more (packed weight matrices, KV caches) are placed at a 2 MiB
// boundary and marked MADV_HUGEPAGE: with transparent huge pages in "madvise" mode (the common
// default) the kernel then backs them with 2 MiB pages. Streaming a 4 GB model through 4 KiB pages
// costs a TLB miss per page walked; with huge pages decode reads weights close to the machine's
// measured read bandwidth. Where THP is off the advice is ignored and nothing else changes.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include "runtime/checked_size.h"

namespace cpuformer {

template <typename T>
class AlignedBuffer {
 public:
  static constexpr std::size_t kAlignment = 64;
#if defined(__SANITIZE_ADDRESS__)
  static constexpr std::size_t kMapThreshold = ~std::size_t{0};
#else
  static constexpr std::size_t kMapThreshold = std::size_t{256} << 10;
#endif
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  static constexpr std::size_t kHugeThreshold = kHugePage;

  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) { resize(count); }
  ~AlignedBuffer() { release(); }
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        mapped_bytes_(std::exchange(other.mapped_bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Discards the contents. Throws SizeError when count · sizeof(T) overflows or exceeds what the
  // process can allocate (runtime/checked_size.h), std::bad_alloc when memory runs out.
  void resize(std::size_t count) {
    if (count == size_) return;
    const std::size_t needed =
        checked_buffer_bytes(count, sizeof(T), "a buffer");  // a refused size keeps the old buffer
    release();
    if (count == 0) return;
    const std::size_t bytes = ((needed + kAlignment - 1) / kAlignment) * kAlignment;
    if (bytes >= kHugeThreshold && kMapThreshold != ~std::size_t{0}) {
      // Over-map by one huge page, keep the part that starts at a 2 MiB boundary, unmap the rest.
      // Only whole huge pages are advised: a partly used one would be resident in full.
      const std::size_t mapped = ((bytes + 4095) / 4096) * 4096;
      void* p = mmap(nullptr, mapped + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(p);
      const std::uintptr_t aligned = (base + kHugePage - 1) & ~(std::uintptr_t{kHugePage} - 1);
      if (aligned > base) munmap(p, aligned - base);
      const std::uintptr_t tail = aligned + mapped, end = base + mapped + kHugePage;
      if (end > tail) munmap(reinterpret_cast<void*>(tail), end - tail);
      madvise(reinterpret_cast<void*>(aligned), bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: may fail
      data_ = reinterpret_cast<T*>(aligned);
      mapped_bytes_ = mapped;
    } else if (bytes >= kMapThreshold) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<T*>(p);  // page-aligned, so 64-byte aligned
      mapped_bytes_ = bytes;
    } else {
      data_ = static_cast<T*>(std::aligned_alloc(kAlignment, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
    }
    size_ = count;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  void release() noexcept {
    if (mapped_bytes_) {
      munmap(data_, mapped_bytes_);
    } else {
      std::free(data_);
    }
    data_ = nullptr;
    size_ = 0;
    mapped_bytes_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_bytes_ = 0;  // nonzero: data_ is a private mapping of this many bytes
};

}  // namespace cpuformer
