#include "kernels/activation/activation.h"

#include "runtime/dispatch.h"
#include "runtime/threading.h"

namespace cpuformer {

const ActivationKernels& activation_kernels() {
#if CPUFORMER_X86_64
  static const ActivationKernels& table =
      select_for_isa(scalar::kActivationKernels, avx2::kActivationKernels, avx512::kActivationKernels);
#else
  static const ActivationKernels& table = select_for_isa(scalar::kActivationKernels, neon::kActivationKernels);
#endif
  return table;
}

// Below these sizes a parallel region costs more than it saves.
static constexpr long kMinElementsPerThread = 16384;

void apply_activation(Activation act, const float* x, float* y, long n) {
  const ActivationKernels& k = activation_kernels();
  parallel_ranges(n, kMinElementsPerThread, [&](long b, long e) { k.apply(act, x + b, y + b, e - b); });
}

void softmax_rows(const float* x, float* y, long rows, long n) {
  const ActivationKernels& k = activation_kernels();
  const long min_rows = n >= kMinElementsPerThread ? 1 : kMinElementsPerThread / (n > 0 ? n : 1);
  parallel_ranges(rows, min_rows, [&](long b, long e) {
    for (long r = b; r < e; ++r) k.softmax_row(x + r * n, y + r * n, n);
  });
}

void silu_mul(const float* gate, const float* up, float* y, long n) {
  const ActivationKernels& k = activation_kernels();
  parallel_ranges(n, kMinElementsPerThread, [&](long b, long e) { k.silu_mul(gate + b, up + b, y + b, e - b); });
}

}  // namespace cpuformer
