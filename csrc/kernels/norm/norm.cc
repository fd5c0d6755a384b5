#include "kernels/norm/norm.h"

#include "runtime/dispatch.h"
#include "runtime/threading.h"

namespace cpuformer {

const NormKernels& norm_kernels() {
#if CPUFORMER_X86_64
  static const NormKernels& table = select_for_isa(scalar::kNormKernels, avx2::kNormKernels, avx512::kNormKernels);
#else
  static const NormKernels& table = select_for_isa(scalar::kNormKernels, neon::kNormKernels);
#endif
  return table;
}

static long min_rows_per_thread(long n) {
  constexpr long kMinElementsPerThread = 16384;
  return n >= kMinElementsPerThread ? 1 : kMinElementsPerThread / (n > 0 ? n : 1);
}

void layer_norm(const float* x, const float* residual, float* sum_out, const float* weight, const float* bias,
                float eps, float* y, long rows, long n) {
  const NormKernels& k = norm_kernels();
  parallel_ranges(rows, min_rows_per_thread(n), [&](long b, long e) {
    for (long r = b; r < e; ++r) {
      const long o = r * n;
      k.layer_norm_row(x + o, residual ? residual + o : nullptr, sum_out ? sum_out + o : nullptr, weight, bias, eps,
                       y + o, n);
    }
  });
}

void rms_norm(const float* x, const float* residual, float* sum_out, const float* weight, float eps, float* y,
              long rows, long n) {
  const NormKernels& k = norm_kernels();
  parallel_ranges(rows, min_rows_per_thread(n), [&](long b, long e) {
    for (long r = b; r < e; ++r) {
      const long o = r * n;
      k.rms_norm_row(x + o, residual ? residual + o : nullptr, sum_out ? sum_out + o : nullptr, weight, eps, y + o, n);
    }
  });
}

}  // namespace cpuformer
