// PLACEHOLDER until the avx2 GEMM lands: forwards to the scalar reference.
#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace avx2 {
const GemmKernels kGemmKernels = scalar::kGemmKernels;
}  // namespace avx2
}  // namespace cpuformer
