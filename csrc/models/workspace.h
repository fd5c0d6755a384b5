// Scratch memory a model reuses across calls: buffers only grow, so steady-state calls of the same
// or smaller shape allocate nothing.
#pragma once

#include <cstddef>

#include "runtime/aligned_buffer.h"

namespace cpuformer {

class ScratchBuffer {
 public:
  // At least `count` floats; the contents are not preserved when the buffer grows.
  float* reserve(std::size_t count) {
    if (buffer_.size() < count) buffer_.resize(count);
    return buffer_.data();
  }
  std::size_t capacity() const { return buffer_.size(); }

 private:
  AlignedBuffer<float> buffer_;
};

}  // namespace cpuformer
