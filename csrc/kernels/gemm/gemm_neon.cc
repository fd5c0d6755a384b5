// NEON fp32 GEMM for AArch64 (the neon, dotprod and i8mm levels): a 6×16 register tile (24 of the
// 32 128-bit registers hold accumulators, 4 hold a row of W, 2 the six A values, multiplied in with
// fmla by lane), blocked and threaded by gemm_driver_inl.h like the x86 levels; a row-streaming GEMV
// kernel for m ≤ 6. Packed W layout: panels of 16 output features (see gemm_driver_inl.h).
//
// NEON is part of every AArch64 CPU, so this file is compiled without extra flags. The kernels are
// gemm_neon_inl.h's, the block sizes gemm_neon_blocking_inl.h's (copied from avx2, not measured on
// ARM hardware: docs/arm.md).
#include <arm_neon.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace neon {
namespace {

#include "kernels/gemm/gemm_neon_blocking_inl.h"
using WElem = float;

#include "kernels/gemm/gemm_driver_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_neon_inl.h"

using GemvFn = void (*)(const float*, long, const void*, long, float*, long, long, const TileEpilogue&);
constexpr GemvFn kGemvs[kGemvMaxRows] = {gemv_rows<1, kWF32>, gemv_rows<2, kWF32>, gemv_rows<3, kWF32>,
                                         gemv_rows<4, kWF32>, gemv_rows<5, kWF32>, gemv_rows<6, kWF32>};

void gemv_kernel(long rows, const float* a, long lda, const float* wp, long k, WeightType, float* c, long ldc,
                 long ncols, const TileEpilogue& ep) {
  kGemvs[rows - 1](a, lda, wp, k, c, ldc, ncols, ep);
}

const float* widen_slice(const float* src, long, WeightType) { return src; }

}  // namespace

const GemmKernels kGemmKernels = {packed_bytes_w, pack_w, gemm_w};

}  // namespace neon
}  // namespace cpuformer
