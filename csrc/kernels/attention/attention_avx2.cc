// AVX2 + FMA attention: the tiled kernel of attention_tiled_inl.h on 8-lane vectors.
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_simd_avx2.h"
#include "runtime/threading.h"

#define CPUFORMER_ATTENTION_ISA avx2
#include "kernels/attention/attention_tiled_inl.h"
#undef CPUFORMER_ATTENTION_ISA

namespace cpuformer {
namespace avx2 { const AttentionKernels kAttentionKernels = {attention_tiled, attention_tiled_many}; }
}  // namespace cpuformer
