// PLACEHOLDER until the avx512 norm kernels land: forwards to the scalar reference.
#include "kernels/norm/norm.h"

namespace cpuformer {
namespace avx512 {
const NormKernels kNormKernels = scalar::kNormKernels;
}  // namespace avx512
}  // namespace cpuformer
