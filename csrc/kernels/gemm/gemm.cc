#include "kernels/gemm/gemm.h"

#include <stdexcept>

#include "runtime/dispatch.h"

namespace cpuformer {

const GemmKernels& gemm_kernels() {
  static const GemmKernels& table = select_for_isa(scalar::kGemmKernels, avx2::kGemmKernels, avx512::kGemmKernels);
  return table;
}

float* gemm_thread_scratch(std::size_t count) {
  thread_local AlignedBuffer<float> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

PackedWeights pack_weights_f32(const float* w, long n, long k, long ldw) {
  const GemmKernels& kernels = gemm_kernels();
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = WeightType::kFloat32;
  packed.isa = active_isa();
  packed.data.resize(kernels.packed_bytes_f32(n, k));
  kernels.pack_f32(w, n, k, ldw, packed.data.data());
  return packed;
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  if (m <= 0 || w.n <= 0) return;
  if (w.isa != active_isa()) throw std::logic_error("weights were packed for another ISA level");
  gemm_kernels().gemm_f32(a, m, lda, w, c, ldc, epilogue);
}

}  // namespace cpuformer
