// SDOT int8 GEMM for AArch64's dotprod and i8mm levels (Armv8.2 dot product; compiled with
// -march=armv8.2-a+dotprod, this file only). A rows are quantized to s8 (no +128 offset: SDOT
// multiplies signed by signed), the packed layout and the work split are gemm_int8_inl.h's: one k
// group of a panel is 16 columns × 4 bytes, which is exactly four SDOT operands of 4 int32 lanes.
// Register tile: 4 rows × 16 columns (16 int32x4 accumulators); per 16 k, each row's 16 values sit
// in one register and every (group, row, column vector) is one SDOT by lane: 4 multiply-adds per
// lane, 16 per instruction. The integer sums are exact (K ≤ kInt8GemmMaxK), so every level gives
// the same sums; the float epilogue is the scalar reference's.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {
float quantize_activation_row(const float* x, long k, int8_t* qa);  // gemm_int8_scalar.cc
}  // namespace scalar

namespace dotprod {
namespace {

constexpr long kMR = 4;
constexpr long kNR = 16;
constexpr long kKGroup = 4;
constexpr bool kUnsignedA = false;

#include "kernels/gemm/gemm_int8_inl.h"
#include "kernels/gemm/gemm_int8_neon_inl.h"

// Group G (of 4 k) of the 16 A values held in av[r]: acc[r][v] += w[v] · av[r].4B[G].
template <int R, int G>
__attribute__((always_inline)) inline void dot_group(int32x4_t (&acc)[R][4], const int8x16_t (&av)[R],
                                                     const int8_t* wg) {
  int8x16_t w[4];
  for (int v = 0; v < 4; ++v) w[v] = vld1q_s8(wg + 16 * v);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vdotq_laneq_s32(acc[r][v], w[v], av[r], G);
}

template <int R>
void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out) {
  int32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_s32(0);
  const int8_t* ar = reinterpret_cast<const int8_t*>(a);
  constexpr long kGroupBytes = 4 * kNR;  // one k group of the panel
  long p = 0;
  for (; p + 16 <= kp; p += 16) {
    int8x16_t av[R];
    for (int r = 0; r < R; ++r) av[r] = vld1q_s8(ar + r * lda + p);
    dot_group<R, 0>(acc, av, wp);
    dot_group<R, 1>(acc, av, wp + kGroupBytes);
    dot_group<R, 2>(acc, av, wp + 2 * kGroupBytes);
    dot_group<R, 3>(acc, av, wp + 3 * kGroupBytes);
    wp += 4 * kGroupBytes;
  }
  for (; p < kp; p += 4) {  // kp is a multiple of 4
    int8x16_t av[R];
    for (int r = 0; r < R; ++r) {
      int32_t a4;
      std::memcpy(&a4, ar + r * lda + p, 4);
      av[r] = vreinterpretq_s8_s32(vdupq_n_s32(a4));
    }
    dot_group<R, 0>(acc, av, wp);
    wp += kGroupBytes;
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) vst1q_s32(out + r * kNR + 4 * v, acc[r][v]);
}

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out, const char*, long) {
  switch (rows) {
    case 4: tile_rows<4>(a, lda, wp, kp, out); break;
    case 3: tile_rows<3>(a, lda, wp, kp, out); break;
    case 2: tile_rows<2>(a, lda, wp, kp, out); break;
    default: tile_rows<1>(a, lda, wp, kp, out); break;
  }
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace dotprod
}  // namespace cpuformer
