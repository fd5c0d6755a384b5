#include "kernels/attention/attention.h"

#include "runtime/dispatch.h"

namespace cpuformer {

const AttentionKernels& attention_kernels() {
  static const AttentionKernels& table =
      select_for_isa(scalar::kAttentionKernels, avx2::kAttentionKernels, avx512::kAttentionKernels);
  return table;
}

void attention(const AttentionArgs& args) {
  if (args.batch <= 0 || args.heads <= 0 || args.q_len <= 0) return;
  attention_kernels().attention(args);
}

}  // namespace cpuformer
