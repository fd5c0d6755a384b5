// Checked size arithmetic: every buffer size made from user or config input (batch × beams,
// prompt length + max_new_tokens, config dimensions, array shapes) is computed here.
//
// A product that wraps around gives a small allocation that later writes run past (a heap
// overflow), so products are computed exactly and a result that does not fit, or a buffer larger
// than this process can allocate, throws SizeError instead. SizeError derives from
// std::length_error; the Python bindings raise it as ValueError (bindings/module.cc). Code that
// knows which argument asked for the size (the generation loop, a binding) adds it to the message
// with with_size_context, so the user reads e.g.
//   "max_new_tokens 4611686018427387904 (...) is too large: the KV cache [...] would need ..."
#pragma once

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace cpuformer {

class SizeError : public std::length_error {
 public:
  using std::length_error::length_error;
};

// The most bytes one buffer may take: the machine's physical memory plus swap, lowered by the
// process's RLIMIT_AS / RLIMIT_DATA soft limits when set. (A buffer is mapped lazily, so only the
// pages written become resident; this bounds what a run could ever need, not what it uses.)
struct AllocationLimit {
  std::size_t bytes;
  const char* source;  // "physical memory and swap", "RLIMIT_AS", "RLIMIT_DATA"
};
AllocationLimit allocation_limit();

// ∏ dims elements (every dim ≥ 0). SizeError "<what> [d0 × d1 × ...] overflows a 64-bit size"
// when the product does not fit a signed 64-bit count.
std::size_t checked_count(std::initializer_list<long> dims, const char* what);

// Bytes of ∏ dims elements of element_bytes each. SizeError "<what> [d0 × d1 × ...] would need
// N bytes, more than the M bytes this process can allocate (<source>)" when it overflows or
// exceeds allocation_limit().
std::size_t checked_bytes(std::initializer_list<long> dims, std::size_t element_bytes, const char* what);

// As checked_bytes for `count` elements already held as a std::size_t (AlignedBuffer).
std::size_t checked_buffer_bytes(std::size_t count, std::size_t element_bytes, const char* what);

// a + b and a × b for a, b ≥ 0, as a long; SizeError naming `what` when they do not fit.
long checked_add(long a, long b, const char* what);
long checked_multiply(long a, long b, const char* what);

// Runs f(); a SizeError it throws is rethrown as "<describe()> is too large: <message>".
// describe is only called on failure (it formats the request: argument names and values).
template <typename Describe, typename F>
decltype(auto) with_size_context(Describe&& describe, F&& f) {
  try {
    return f();
  } catch (const SizeError& error) {
    throw SizeError(std::string(describe()) + " is too large: " + error.what());
  }
}

}  // namespace cpuformer
