// PLACEHOLDER until the avx2 activation kernels land: forwards to the scalar reference.
#include "kernels/activation/activation.h"

namespace cpuformer {
namespace avx2 {
const ActivationKernels kActivationKernels = scalar::kActivationKernels;
}  // namespace avx2
}  // namespace cpuformer
