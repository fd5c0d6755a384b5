// PLACEHOLDER until the avx2 norm kernels land: forwards to the scalar reference.
#include "kernels/norm/norm.h"

namespace cpuformer {
namespace avx2 {
const NormKernels kNormKernels = scalar::kNormKernels;
}  // namespace avx2
}  // namespace cpuformer
