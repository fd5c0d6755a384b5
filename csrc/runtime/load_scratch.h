// Reusable scratch memory for building a model's weights: the rows of a fused matrix joined (q/k/v,
// gate/up) and a weight quantized or converted before it is packed.
//
// Fresh memory costs more than its size suggests: the kernel zeroes every new page on first touch
// (and in a virtual machine the host may first have to back it), so a 1.1B float32 model that joined
// its fused matrices in new buffers touched ~2.5 GB of pages it threw away again. While a
// LoadScratchScope lives on a thread, load_scratch(slot, bytes) on that thread hands out the same
// buffer for a slot every time (grown when a request is larger); the outermost scope's end frees
// them all. A model build holds one scope around all of its layers (the Python builder through
// _core._LoadScratchScope, the C API's graph loader in C++); Linear and pack_weights hold their own,
// so a weight packed on its own (ops.Linear) frees its scratch when it is done.
#pragma once

#include <cstddef>

namespace cpuformer {

enum class LoadSlot { kJoined, kJoinedScales, kJoinedZeros, kConverted, kConvertedScales, kConvertedZeros, kCount };

class LoadScratchScope {
 public:
  LoadScratchScope();
  ~LoadScratchScope();
  LoadScratchScope(const LoadScratchScope&) = delete;
  LoadScratchScope& operator=(const LoadScratchScope&) = delete;
};

// At least `bytes` bytes (64-byte aligned, contents undefined) for `slot`, valid until the next
// request for that slot on this thread or the end of the outermost scope. Throws std::logic_error
// without an active scope on the calling thread (the buffers would otherwise never be freed).
void* load_scratch(LoadSlot slot, std::size_t bytes);

template <typename T>
T* load_scratch(LoadSlot slot, std::size_t count) {
  return static_cast<T*>(load_scratch(slot, count * sizeof(T)));
}

}  // namespace cpuformer
