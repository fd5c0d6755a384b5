// PLACEHOLDER: the avx512 level runs the scalar reference until its SIMD kernels land.
#include "kernels/gemm/gemm.h"

namespace cpuformer {
namespace avx512 {

const Int8GemmKernels kInt8GemmKernels = scalar::kInt8GemmKernels;

}  // namespace avx512
}  // namespace cpuformer
