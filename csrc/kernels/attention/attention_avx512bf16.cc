// AVX-512 attention with AVX512-BF16: the tiled kernel of attention_tiled_inl.h on 16-lane vectors,
// plus its vdpbf16ps query-block engine (CPUFORMER_ATTENTION_BF16, attention_simd_avx512bf16.h).
// attention() picks this table inside the avx512 level when the CPU has AVX512-BF16 and the caller
// set AttentionArgs::bf16_products; every call it cannot serve in bfloat16 runs the float32 paths
// it shares with attention_avx512.cc.
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_simd_avx512.h"
#include "kernels/attention/attention_simd_avx512bf16.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512bf16 {
namespace attention_simd = ::cpuformer::avx512::attention_simd;
}
}  // namespace cpuformer

#define CPUFORMER_ATTENTION_ISA avx512bf16
#define CPUFORMER_ATTENTION_BF16 1
#include "kernels/attention/attention_tiled_inl.h"
#undef CPUFORMER_ATTENTION_BF16
#undef CPUFORMER_ATTENTION_ISA

namespace cpuformer {
namespace avx512bf16 { const AttentionKernels kAttentionKernels = {attention_tiled, attention_tiled_many}; }
}  // namespace cpuformer
