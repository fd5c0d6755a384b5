// PLACEHOLDER until the avx512 GEMM lands: forwards to the scalar reference.
#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace avx512 {
const GemmKernels kGemmKernels = scalar::kGemmKernels;
}  // namespace avx512
}  // namespace cpuformer
