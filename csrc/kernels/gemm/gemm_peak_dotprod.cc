// Peak probe of the SDOT int8 kernel of AArch64's dotprod and i8mm levels (gemm_int8_dotprod.cc,
// gemm_peak.h): 128-bit SDOT, 16 multiply-adds per instruction. Compiled with
// -march=armv8.2-a+dotprod like the kernel.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace dotprod {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"
}  // namespace

int64_t peak_sdot(long steps) {
  return peak_probe<10, 16>(
      steps, vdupq_n_s32(0), [](int32x4_t c, int8x16_t a, int8x16_t w) { return vdotq_s32(c, a, w); }, vdupq_n_s8(3),
      vdupq_n_s8(-5));
}

}  // namespace dotprod
}  // namespace cpuformer
