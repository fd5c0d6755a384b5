// Owning, 64-byte aligned, uninitialised storage for packed weights and scratch space.
//
// Buffers of kMapThreshold bytes or more are mapped from the OS directly (mmap) and unmapped when
// freed: glibc serves them from its heap once its adaptive mmap threshold has grown, and then keeps
// the pages after free(), so a deleted model would stay resident. (Not under AddressSanitizer,
// which checks heap blocks but not private mappings.)
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

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

  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t count) { resize(count); }
  ~AlignedBuffer() { release(); }
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
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

  // Discards the contents. Throws std::bad_alloc when memory runs out.
  void resize(std::size_t count) {
    if (count == size_) return;
    release();
    if (count == 0) return;
    const std::size_t bytes = ((count * sizeof(T) + kAlignment - 1) / kAlignment) * kAlignment;
    if (bytes >= kMapThreshold) {
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
