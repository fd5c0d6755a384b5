// Portable reference GEMM over float16 / bfloat16 weights: each weight is widened to float32
// exactly and the sum is accumulated in float32. Packed layout: w [n][k] uint16, as given.
#include <cstring>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {
namespace {

std::size_t packed_bytes(long n, long k, WeightType) { return static_cast<std::size_t>(n) * k * sizeof(uint16_t); }

void pack(const uint16_t* w, WeightType, long n, long k, long ldw, uint8_t* out) {
  uint16_t* dst = reinterpret_cast<uint16_t*>(out);
  for (long j = 0; j < n; ++j) std::memcpy(dst + j * k, w + j * ldw, sizeof(uint16_t) * k);
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const uint16_t* wh = reinterpret_cast<const uint16_t*>(w.bytes());
  const bool half = w.type == WeightType::kFloat16;
  run_team(current_num_threads(), [&](const Team& team) {
    std::vector<float> wrow(k);
    std::vector<float> row(n);  // the residual may alias c, so the row is finished here first
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) {
      const float* x = a + i * lda;
      for (long j = 0; j < n; ++j) {
        for (long p = 0; p < k; ++p) wrow[p] = half ? half_to_float(wh[j * k + p]) : bfloat16_to_float(wh[j * k + p]);
        float sum = 0.0f;
        for (long p = 0; p < k; ++p) sum += x[p] * wrow[p];
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

const HalfGemmKernels kHalfGemmKernels = {packed_bytes, pack, gemm};

}  // namespace scalar
}  // namespace cpuformer
