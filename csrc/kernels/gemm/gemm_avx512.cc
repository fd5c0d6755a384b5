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

}  // namespace

const GemmKernels kGemmKernels = {packed_bytes_w, pack_w, gemm_w};

}  // namespace avx512
}  // namespace cpuformer
