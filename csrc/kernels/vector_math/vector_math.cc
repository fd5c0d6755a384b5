#include "kernels/vector_math/vector_math.h"

#include "runtime/dispatch.h"

namespace cpuformer {

const VectorMathKernels& vector_math_kernels() {
#if CPUFORMER_X86_64
  static const VectorMathKernels& table =
      select_for_isa(scalar::kVectorMathKernels, avx2::kVectorMathKernels, avx512::kVectorMathKernels);
#else
  static const VectorMathKernels& table = select_for_isa(scalar::kVectorMathKernels, neon::kVectorMathKernels);
#endif
  return table;
}

}  // namespace cpuformer
