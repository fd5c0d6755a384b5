// PLACEHOLDER until the avx2 attention kernel lands: forwards to the scalar reference.
#include "kernels/attention/attention.h"

namespace cpuformer {
namespace avx2 {
const AttentionKernels kAttentionKernels = scalar::kAttentionKernels;
}  // namespace avx2
}  // namespace cpuformer
