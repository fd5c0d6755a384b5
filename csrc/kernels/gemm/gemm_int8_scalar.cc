// Portable reference int8 GEMM: the definition the SIMD levels must match exactly in the integer
// part (see Int8GemmKernels in gemm.h). Packed layout: scales [n] float, then q [n][k] int8.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {

// A row of A as the int8 and int4 GEMMs quantize it (gemm.h):
// qa = round_half_even(x · (127 / amax)); returns sa = amax / 127 (0 for a zero row; NaN, with
// qa = 0, for a row holding a NaN or ±inf, so that every output of the row is NaN).
float quantize_activation_row(const float* x, long k, int8_t* qa) {
  float amax = 0.0f;
  bool finite = true;
  for (long p = 0; p < k; ++p) {
    const float magnitude = std::fabs(x[p]);
    finite = finite && magnitude <= std::numeric_limits<float>::max();  // false for NaN and inf
    amax = std::fmax(amax, magnitude);
  }
  if (!finite) {
    std::memset(qa, 0, static_cast<std::size_t>(k));
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (!(amax > 0.0f)) {
    std::memset(qa, 0, static_cast<std::size_t>(k));
    return 0.0f;
  }
  const float inv = 127.0f / amax;
  for (long p = 0; p < k; ++p) qa[p] = static_cast<int8_t>(std::nearbyint(x[p] * inv));
  return amax / 127.0f;
}

namespace {

std::size_t packed_bytes(long n, long k) {
  return static_cast<std::size_t>(n) * sizeof(float) + static_cast<std::size_t>(n) * k;
}

void pack(const int8_t* q, const float* scales, long n, long k, long ldq, uint8_t* out) {
  std::memcpy(out, scales, sizeof(float) * n);
  int8_t* dst = reinterpret_cast<int8_t*>(out + sizeof(float) * n);
  for (long j = 0; j < n; ++j) std::memcpy(dst + j * k, q + j * ldq, static_cast<std::size_t>(k));
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const float* scales = reinterpret_cast<const float*>(w.bytes());
  const int8_t* q = reinterpret_cast<const int8_t*>(w.bytes() + sizeof(float) * n);
  run_team(current_num_threads(), [&](const Team& team) {
    std::vector<int8_t> qa(k);
    std::vector<float> row(n);  // the residual may alias c, so the row is finished here first
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) {
      const float sa = quantize_activation_row(a + i * lda, k, qa.data());
      for (long j = 0; j < n; ++j) {
        const int8_t* wj = q + j * k;
        int32_t sum = 0;
        for (long p = 0; p < k; ++p) sum += static_cast<int32_t>(qa[p]) * wj[p];
        row[j] = sa * scales[j] * static_cast<float>(sum) + (epilogue.bias ? epilogue.bias[j] : 0.0f);
      }
      kActivationKernels.apply(epilogue.activation, row.data(), row.data(), n);
      const float* r = epilogue.residual ? epilogue.residual + i * epilogue.ldr : nullptr;
      float* out = c + i * ldc;
      for (long j = 0; j < n; ++j) out[j] = row[j] + (r ? r[j] : 0.0f);
    }
  });
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace scalar
}  // namespace cpuformer
