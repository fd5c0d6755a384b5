// Portable reference int4 GEMM: the definition the SIMD levels must match bit for bit (see
// Int4GemmKernels in gemm.h). Packed layout: scales [n][groups] float16 bits, zero points
// [n][groups] bytes (with zero points only), then u [n][Kp / 2] nibble pairs as given to pack.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {

float quantize_activation_row(const float* x, long k, int8_t* qa);  // gemm_int8_scalar.cc

namespace {

std::size_t packed_bytes(long n, long k, long group_size, bool zero_point) {
  const long groups = int4_groups(k, group_size);
  const std::size_t header = static_cast<std::size_t>(n) * groups * (sizeof(uint16_t) + (zero_point ? 1 : 0));
  return header + static_cast<std::size_t>(n) * groups * group_size / 2;
}

void pack(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long k, long group_size,
          uint8_t* out) {
  const std::size_t cells = static_cast<std::size_t>(n) * int4_groups(k, group_size);
  std::memcpy(out, scales, cells * sizeof(uint16_t));
  out += cells * sizeof(uint16_t);
  if (zeros != nullptr) {
    std::memcpy(out, zeros, cells);
    out += cells;
  }
  std::memcpy(out, u, cells * group_size / 2);
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k, group_size = w.group_size, groups = int4_groups(k, group_size);
  const long kp = groups * group_size;
  const std::size_t cells = static_cast<std::size_t>(n) * groups;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(w.bytes());
  const uint8_t* zeros = w.zero_point ? w.bytes() + cells * sizeof(uint16_t) : nullptr;
  const uint8_t* u = w.bytes() + cells * (sizeof(uint16_t) + (w.zero_point ? 1 : 0));
  run_team(current_num_threads(), [&](const Team& team) {
    std::vector<int8_t> qa(static_cast<std::size_t>(kp), 0);  // padded with zeros past k
    std::vector<float> row(n);  // the residual may alias c, so the row is finished here first
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) {
      const float sa = quantize_activation_row(a + i * lda, k, qa.data());
      for (long j = 0; j < n; ++j) {
        const uint8_t* uj = u + j * (kp / 2);
        float acc = 0.0f;
        for (long g = 0; g < groups; ++g) {
          int32_t dot = 0, sum = 0;
          for (long p = g * group_size; p < (g + 1) * group_size; ++p) {
            const int32_t nibble = p % 2 == 0 ? uj[p / 2] & 0x0F : uj[p / 2] >> 4;
            dot += static_cast<int32_t>(qa[p]) * nibble;
            sum += qa[p];
          }
          const int32_t z = zeros != nullptr ? zeros[j * groups + g] : 8;
          const int32_t t = dot - z * sum;
          acc = std::fma(half_to_float(scales[j * groups + g]), static_cast<float>(t), acc);
        }
        row[j] = sa * acc + (epilogue.bias ? epilogue.bias[j] : 0.0f);
      }
      kActivationKernels.apply(epilogue.activation, row.data(), row.data(), n);
      const float* r = epilogue.residual ? epilogue.residual + i * epilogue.ldr : nullptr;
      float* out = c + i * ldc;
      for (long j = 0; j < n; ++j) out[j] = row[j] + (r ? r[j] : 0.0f);
    }
  });
}

}  // namespace

const Int4GemmKernels kInt4GemmKernels = {packed_bytes, pack, gemm};

}  // namespace scalar
}  // namespace cpuformer
