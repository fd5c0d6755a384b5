// AVX-512 attention: the tiled kernel of attention_tiled_inl.h on 16-lane vectors.
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_simd_avx512.h"
#include "runtime/threading.h"

#define CPUFORMER_ATTENTION_ISA avx512
#include "kernels/attention/attention_tiled_inl.h"
#undef CPUFORMER_ATTENTION_ISA

namespace cpuformer {
namespace avx512 { const AttentionKernels kAttentionKernels = {attention_tiled, attention_tiled_many}; }
}  // namespace cpuformer
