#include "runtime/load_scratch.h"

#include <stdexcept>

#include "runtime/aligned_buffer.h"

namespace cpuformer {
namespace {

constexpr int kSlots = static_cast<int>(LoadSlot::kCount);
thread_local int t_depth = 0;
thread_local AlignedBuffer<unsigned char> t_buffers[kSlots];

}  // namespace

LoadScratchScope::LoadScratchScope() { ++t_depth; }

LoadScratchScope::~LoadScratchScope() {
  if (--t_depth == 0)
    for (AlignedBuffer<unsigned char>& buffer : t_buffers) buffer = AlignedBuffer<unsigned char>();
}

void* load_scratch(LoadSlot slot, std::size_t bytes) {
  if (t_depth <= 0) throw std::logic_error("load_scratch needs a LoadScratchScope on the calling thread");
  AlignedBuffer<unsigned char>& buffer = t_buffers[static_cast<int>(slot)];
  if (buffer.size() < bytes) {
    buffer = AlignedBuffer<unsigned char>();  // the old contents are not needed: free them first
    buffer.resize(bytes);
  }
  return buffer.data();
}

}  // namespace cpuformer
