// PLACEHOLDER until the avx512 attention kernel lands: forwards to the scalar reference.
#include "kernels/attention/attention.h"

namespace cpuformer {
namespace avx512 {
const AttentionKernels kAttentionKernels = scalar::kAttentionKernels;
}  // namespace avx512
}  // namespace cpuformer
