// PLACEHOLDER until the avx512 activation kernels land: forwards to the scalar reference.
#include "kernels/activation/activation.h"

namespace cpuformer {
namespace avx512 {
const ActivationKernels kActivationKernels = scalar::kActivationKernels;
}  // namespace avx512
}  // namespace cpuformer
