// AVX-512 attention with AMX-BF16: the tiled kernel of attention_tiled_inl.h with its bfloat16
// query-block engine (CPUFORMER_ATTENTION_BF16) computing both products of a key block on TDPBF16PS
// tiles (CPUFORMER_ATTENTION_AMX, attention_amx_inl.h). attention() picks this table inside the
// avx512 level when the CPU offers AMX-BF16, the caller set AttentionArgs::bf16_products and
// head_dim is a multiple of 32; every call the engine cannot serve runs the float32 paths.
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_amx_inl.h"
#include "kernels/attention/attention_simd_avx512.h"
#include "kernels/attention/attention_simd_avx512bf16.h"
#include "kernels/gemm/amx_tiles_inl.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512amx {
namespace attention_simd = ::cpuformer::avx512::attention_simd;
namespace attention_bf16 = ::cpuformer::avx512bf16::attention_bf16;
}  // namespace avx512amx
}  // namespace cpuformer

#define CPUFORMER_ATTENTION_ISA avx512amx
#define CPUFORMER_ATTENTION_BF16 1
#define CPUFORMER_ATTENTION_AMX 1
#include "kernels/attention/attention_tiled_inl.h"
#undef CPUFORMER_ATTENTION_AMX
#undef CPUFORMER_ATTENTION_BF16
#undef CPUFORMER_ATTENTION_ISA

namespace cpuformer {
namespace avx512amx { const AttentionKernels kAttentionKernels = {attention_tiled, attention_tiled_many}; }
}  // namespace cpuformer
