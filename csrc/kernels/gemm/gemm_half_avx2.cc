// PLACEHOLDER: the avx2 level runs the scalar reference until its SIMD kernels land.
#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace avx2 {

const HalfGemmKernels kHalfGemmKernels = scalar::kHalfGemmKernels;

}  // namespace avx2
}  // namespace cpuformer
