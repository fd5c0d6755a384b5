#include "kernels/attention/attention.h"

#include "runtime/aligned_buffer.h"
#include "runtime/dispatch.h"

namespace cpuformer {

const AttentionKernels& attention_kernels() {
  static const AttentionKernels& table =
      select_for_isa(scalar::kAttentionKernels, avx2::kAttentionKernels, avx512::kAttentionKernels);
  return table;
}

float* attention_scratch(std::size_t floats) {
  // Per calling thread: Python threads that run attention concurrently never share it.
  thread_local AlignedBuffer<float> buffer;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

void attention(const AttentionArgs& args) {
  if (args.batch <= 0 || args.heads <= 0 || args.q_len <= 0) return;
  attention_kernels().attention(args);
}

}  // namespace cpuformer
