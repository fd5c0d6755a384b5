// AVX-512 fp32 GEMM: 14×32 register tile (28 zmm accumulators, two zmm of W per k step, A
// broadcast from memory), blocked and threaded by gemm_driver_inl.h; a row-streaming GEMV kernel
// for m ≤ 14. Packed W layout: panels of 32 output features (see gemm_driver_inl.h).
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512 {
namespace {

#include "kernels/gemm/gemm_avx512_blocking_inl.h"
using WElem = float;

#include "kernels/gemm/gemm_driver_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_avx512_inl.h"
#include "kernels/gemm/transpose_avx512_inl.h"

using GemvFn = void (*)(const float*, long, const void*, long, float*, long, long, const TileEpilogue&);
constexpr GemvFn kGemvs[kGemvMaxRows] = {
    gemv_rows<1, kWF32>,  gemv_rows<2, kWF32>,  gemv_rows<3, kWF32>,  gemv_rows<4, kWF32>, gemv_rows<5, kWF32>,
    gemv_rows<6, kWF32>,  gemv_rows<7, kWF32>,  gemv_rows<8, kWF32>,  gemv_rows<9, kWF32>, gemv_rows<10, kWF32>,
    gemv_rows<11, kWF32>, gemv_rows<12, kWF32>, gemv_rows<13, kWF32>, gemv_rows<14, kWF32>};

void gemv_kernel(long rows, const float* a, long lda, const float* wp, long k, WeightType, float* c, long ldc,
                 long ncols, const TileEpilogue& ep) {
  kGemvs[rows - 1](a, lda, wp, k, c, ldc, ncols, ep);
}

const float* widen_slice(const float* src, long, WeightType) { return src; }

// pack_w (gemm_driver_inl.h's layout) in 16 × 16 blocks transposed in registers: 16 rows of W are
// read 64 bytes at a time and each k step's 16 features stored as one aligned vector, instead of
// one element at a time (11,264 × 2,048 on two Zen 4 threads, alternating: 12.7-21.8 → 9.8-13.5 ms).
void pack_w_f32(const float* w, long n, long k, long ldw, uint8_t* out) {
  static_assert(kNR % 16 == 0, "whole 16-feature halves per panel");
  float* packed = reinterpret_cast<float*>(out);
  const long panels = ceil_div(n, kNR);
  const int nt = threads_for(n * k / 8, panels);  // a copy: far cheaper per element than a multiply-add
  run_team(nt, [&](const Team& team) {
    long p0, p1;
    team.range(panels, &p0, &p1);
    for (long p = p0; p < p1; ++p) {
      float* panel = packed + p * k * kNR;
      const long cols = min_of(kNR, n - p * kNR);
      for (long k0 = 0; k0 < k; k0 += 16) {
        const long steps = min_of(16, k - k0);
        const __mmask16 mask = static_cast<__mmask16>((1u << steps) - 1);
        for (long h = 0; h < kNR; h += 16) {
          __m512 r[16];
          for (long j = 0; j < 16; ++j) {
            r[j] = h + j < cols ? _mm512_maskz_loadu_ps(mask, w + (p * kNR + h + j) * ldw + k0) : _mm512_setzero_ps();
          }
          transpose_16x16(r);
          for (long kk = 0; kk < steps; ++kk) _mm512_store_ps(panel + (k0 + kk) * kNR + h, r[kk]);
        }
      }
    }
  });
}

}  // namespace

const GemmKernels kGemmKernels = {packed_bytes_w, pack_w_f32, gemm_w};

}  // namespace avx512
}  // namespace cpuformer
