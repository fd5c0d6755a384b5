// PLACEHOLDER: the avx2 level runs the scalar reference until its SIMD kernels land.
#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace avx2 {

const Int8GemmKernels kInt8GemmKernels = scalar::kInt8GemmKernels;

}  // namespace avx2
}  // namespace cpuformer
