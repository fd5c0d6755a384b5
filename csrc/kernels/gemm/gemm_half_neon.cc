// NEON GEMM over float16 / bfloat16 weights for AArch64 (the neon, dotprod and i8mm levels): the
// counterpart of gemm_half_avx2.cc. Packed W: the panels of gemm_driver_inl.h (16 output features,
// k-major, columns past N zero) with 16-bit elements, so decode streams half the bytes of float32.
// The weights are widened to float32 exactly (float16 with fcvtl / fcvtl2, which baseline AArch64
// has; bfloat16 by a shift left by 16 into 32-bit lanes, shll / shll2) and multiplied with float32
// fmla into float32 sums; A stays float32. Few rows (m ≤ 6, and up to 64 rows in chunks when N has
// 4 panels or more): the GEMV kernel widens each weight in registers as it streams past. Many rows:
// the float32 driver and tile kernel of gemm_neon.cc run unchanged, each thread widening a W panel
// slice [kc][16] into its own float32 buffer once per (row block, slice, panel) and running the
// register tile over it. NEON is baseline: no extra compiler flags. The bfloat16 dot products
// (BFDOT / BFMMLA, the bf16 feature) are not used.
#include <arm_neon.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/aligned_buffer.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace neon {
namespace {

#include "kernels/gemm/gemm_neon_blocking_inl.h"
using WElem = uint16_t;

#include "kernels/gemm/gemm_driver_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_neon_inl.h"

using GemvFn = void (*)(const float*, long, const void*, long, float*, long, long, const TileEpilogue&);
constexpr GemvFn kGemvs[2][kGemvMaxRows] = {
    {gemv_rows<1, kWF16>, gemv_rows<2, kWF16>, gemv_rows<3, kWF16>, gemv_rows<4, kWF16>, gemv_rows<5, kWF16>,
     gemv_rows<6, kWF16>},
    {gemv_rows<1, kWBF16>, gemv_rows<2, kWBF16>, gemv_rows<3, kWBF16>, gemv_rows<4, kWBF16>, gemv_rows<5, kWBF16>,
     gemv_rows<6, kWBF16>},
};

void gemv_kernel(long rows, const float* a, long lda, const uint16_t* wp, long k, WeightType type, float* c, long ldc,
                 long ncols, const TileEpilogue& ep) {
  kGemvs[type == WeightType::kFloat16 ? 0 : 1][rows - 1](a, lda, wp, k, c, ldc, ncols, ep);
}

const float* widen_slice(const uint16_t* src, long kc, WeightType type) {
  thread_local AlignedBuffer<float> buffer;
  const long count = kc * kNR;
  if (static_cast<long>(buffer.size()) < count) buffer.resize(static_cast<std::size_t>(kKC * kNR));
  float* dst = buffer.data();
  if (type == WeightType::kFloat16) {
    for (long i = 0; i < count; i += 8) {
      const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
      vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
      vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
  } else {
    for (long i = 0; i < count; i += 8) {
      const uint16x8_t x = vld1q_u16(src + i);
      vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)));
      vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(x, 16)));
    }
  }
  return dst;
}

std::size_t packed_bytes(long n, long k, WeightType) { return packed_bytes_w(n, k); }
void pack(const uint16_t* w, WeightType, long n, long k, long ldw, uint8_t* out) { pack_w(w, n, k, ldw, out); }

}  // namespace

const HalfGemmKernels kHalfGemmKernels = {packed_bytes, pack, gemm_w};

}  // namespace neon
}  // namespace cpuformer
