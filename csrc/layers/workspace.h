// Scratch memory a model reuses across calls: buffers only grow, so steady-state calls of the same
// or smaller shape allocate nothing.
#pragma once

#include <cstddef>
#include <initializer_list>

#include "runtime/aligned_buffer.h"
#include "runtime/checked_size.h"

namespace cpuformer {

class ScratchBuffer {
 public:
  // At least ∏ dims floats (e.g. {rows, width}); the contents are not preserved when the buffer
  // grows. The product is checked (SizeError when it overflows or cannot be allocated).
  float* reserve(std::initializer_list<long> dims) {
    const std::size_t count = checked_bytes(dims, sizeof(float), "a scratch buffer") / sizeof(float);
    if (buffer_.size() < count) buffer_.resize(count);
    return buffer_.data();
  }
  std::size_t capacity() const { return buffer_.size(); }

 private:
  AlignedBuffer<float> buffer_;
};

}  // namespace cpuformer
