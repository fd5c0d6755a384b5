// Portable reference GEMM. "Packing" keeps W in its [N, K] row-major form so the reference reads
// exactly as the definition: c[i][j] = act(Σ_k a[i][k]·w[j][k] + bias[j]) + residual[i][j].
#include <cstring>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {
namespace {

std::size_t packed_bytes_f32(long n, long k) { return static_cast<std::size_t>(n) * k * sizeof(float); }

void pack_f32(const float* w, long n, long k, long ldw, uint8_t* out) {
  float* dst = reinterpret_cast<float*>(out);
  for (long j = 0; j < n; ++j) std::memcpy(dst + j * k, w + j * ldw, sizeof(float) * k);
}

void gemm_f32(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
              const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const float* wf = reinterpret_cast<const float*>(w.bytes());
  run_team(current_num_threads(), [&](const Team& team) {
    std::vector<float> row(n);  // the residual may alias c, so the row is finished here first
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) {
      const float* x = a + i * lda;
      for (long j = 0; j < n; ++j) {
        const float* wj = wf + j * k;
        float sum = 0.0f;
        for (long p = 0; p < k; ++p) sum += x[p] * wj[p];
        row[j] = sum + (epilogue.bias ? epilogue.bias[j] : 0.0f);
      }
      kActivationKernels.apply(epilogue.activation, row.data(), row.data(), n);
      const float* r = epilogue.residual ? epilogue.residual + i * epilogue.ldr : nullptr;
      float* out = c + i * ldc;
      for (long j = 0; j < n; ++j) out[j] = row[j] + (r ? r[j] : 0.0f);
    }
  });
}

}  // namespace

const GemmKernels kGemmKernels = {packed_bytes_f32, pack_f32, gemm_f32};

}  // namespace scalar
}  // namespace cpuformer
