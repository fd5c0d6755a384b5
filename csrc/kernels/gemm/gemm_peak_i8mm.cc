// Peak probe of the SMMLA int8 kernel of AArch64's i8mm level (gemm_int8_i8mm.cc, gemm_peak.h):
// 128-bit SMMLA, a 2×8 by 8×2 int8 block into 2×2 int32 lanes, 32 multiply-adds per instruction.
// Compiled with -march=armv8.2-a+dotprod+i8mm like the kernel.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace i8mm {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
}  // namespace

int64_t peak_smmla(long steps) {
  return peak_probe<10, 32>(
      steps, vdupq_n_s32(0), [](int32x4_t c, int8x16_t a, int8x16_t w) { return vmmlaq_s32(c, a, w); }, vdupq_n_s8(3),
      vdupq_n_s8(-5));
}

}  // namespace i8mm
}  // namespace cpuformer
