// NEON attention for AArch64 (the neon, dotprod and i8mm levels): the tiled kernel of
// attention_tiled_inl.h on 4-lane vectors.
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_simd_neon.h"
#include "runtime/threading.h"

#define CPUFORMER_ATTENTION_ISA neon
#include "kernels/attention/attention_tiled_inl.h"
#undef CPUFORMER_ATTENTION_ISA

namespace cpuformer {
namespace neon { const AttentionKernels kAttentionKernels = {attention_tiled, attention_tiled_many}; }
}  // namespace cpuformer
