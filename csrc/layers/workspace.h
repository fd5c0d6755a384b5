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
  // grows. The product is checked (SizeError when it overflows or cannot be allocated). A size the
  // buffer already holds returns at once: the allocation limit (checked_bytes reads it from the
  // kernel, three system calls) only matters for growing, and a GPT-2 decode step reserves
  // buffers ~60 times a token (the calls and an error message formatted but not thrown took
  // ~14 µs a layer: ~4-5 % of a GPT-2 int8 token on Zen 4).
  float* reserve(std::initializer_list<long> dims) {
    std::size_t held = 1;
    bool fits = true;
    for (long d : dims) fits = fits && d >= 0 && !__builtin_mul_overflow(held, static_cast<std::size_t>(d), &held);
    if (fits && held <= buffer_.size()) return buffer_.data();
    const std::size_t count = checked_bytes(dims, sizeof(float), "a scratch buffer") / sizeof(float);
    if (buffer_.size() < count) buffer_.resize(count);
    return buffer_.data();
  }
  std::size_t capacity() const { return buffer_.size(); }  // floats

 private:
  AlignedBuffer<float> buffer_;
};

}  // namespace cpuformer
