// SMMLA int8 GEMM for AArch64's i8mm level (Armv8.6 int8 matrix multiply, optional from Armv8.2;
// compiled with -march=armv8.2-a+dotprod+i8mm, this file only: Neoverse V1 and Graviton3 have i8mm
// on an Armv8.4 core, so nothing newer than the extension itself may be emitted). A rows are
// quantized to s8 exactly as for SDOT (gemm_int8_dotprod.cc), and the packing, the row quantization
// and the work split are gemm_int8_inl.h's with kKGroup = 8: one k group of a panel is 16 columns ×
// 8 bytes, which is 8 SMMLA operands of 2 columns × 8 k (column 2c's 8 bytes, then column 2c + 1's).
//
// SMMLA multiplies a 2×8 block of A (rows 2P and 2P + 1, 8 k) by an 8×2 block of W (2 columns) into
// a 2×2 int32 tile [r0·c0, r0·c1, r1·c0, r1·c1]: 32 multiply-adds per instruction, twice SDOT's.
// Register tile: 4 rows × 16 columns = 2 row pairs × 8 column pairs (16 accumulators); per 8 k, 8
// W registers and 2 A registers feed 16 SMMLA. An odd last row is paired with zeros.
//
// One row (decode, M = 1) stays in this kernel: an SMMLA with one live row does 16 useful
// multiply-adds, exactly one SDOT's worth, so it issues as many instructions as the SDOT kernel
// would, over the same bytes of W (one packed layout per level, no second copy of the weights).
// Decode is bound by memory bandwidth anyway.
//
// The integer sums are exact (K ≤ kInt8GemmMaxK; SMMLA wraps like SDOT and never saturates), so
// every level gives the same sums; the float epilogue is the scalar reference's.
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

namespace i8mm {
namespace {

constexpr long kMR = 4;
constexpr long kNR = 16;
constexpr long kKGroup = 8;
constexpr bool kUnsignedA = false;

#include "kernels/gemm/gemm_int8_inl.h"
#include "kernels/gemm/gemm_int8_neon_inl.h"

// One k group (8 k) of the panel at wg against the P row pairs in a[P]: acc[P][c] += a[P] · w[c]ᵀ.
template <int P>
__attribute__((always_inline)) inline void mmla_group(int32x4_t (&acc)[P][8], const int8x16_t (&a)[P],
                                                      const int8_t* wg) {
  int8x16_t w[8];
  for (int c = 0; c < 8; ++c) w[c] = vld1q_s8(wg + 16 * c);
  for (int q = 0; q < P; ++q)
    for (int c = 0; c < 8; ++c) acc[q][c] = vmmlaq_s32(acc[q][c], a[q], w[c]);
}

// R rows (1 ≤ R ≤ 4) in P = ceil(R / 2) pairs; a missing odd row reads as zeros.
template <int R>
void tile_rows(const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out) {
  constexpr int P = (R + 1) / 2;
  int32x4_t acc[P][8];
  for (int q = 0; q < P; ++q)
    for (int c = 0; c < 8; ++c) acc[q][c] = vdupq_n_s32(0);
  const int8_t* ar = reinterpret_cast<const int8_t*>(a);
  constexpr long kGroupBytes = kKGroup * kNR;  // one k group of the panel
  long p = 0;
  for (; p + 16 <= kp; p += 16) {
    // Rows 2q and 2q + 1, 16 k each; their first 8 k make one operand, the next 8 k another.
    int8x16_t lo[P], hi[P];
    for (int q = 0; q < P; ++q) {
      const int64x2_t r0 = vreinterpretq_s64_s8(vld1q_s8(ar + 2 * q * lda + p));
      const int64x2_t r1 = 2 * q + 1 < R ? vreinterpretq_s64_s8(vld1q_s8(ar + (2 * q + 1) * lda + p)) : vdupq_n_s64(0);
      lo[q] = vreinterpretq_s8_s64(vzip1q_s64(r0, r1));
      hi[q] = vreinterpretq_s8_s64(vzip2q_s64(r0, r1));
    }
    mmla_group<P>(acc, lo, wp);
    mmla_group<P>(acc, hi, wp + kGroupBytes);
    wp += 2 * kGroupBytes;
  }
  if (p < kp) {  // kp is a multiple of 8: one group left
    int8x16_t av[P];
    for (int q = 0; q < P; ++q) {
      const int8x8_t r0 = vld1_s8(ar + 2 * q * lda + p);
      const int8x8_t r1 = 2 * q + 1 < R ? vld1_s8(ar + (2 * q + 1) * lda + p) : vdup_n_s8(0);
      av[q] = vcombine_s8(r0, r1);
    }
    mmla_group<P>(acc, av, wp);
  }
  // acc[q][c] = [row 2q · col 2c, row 2q · col 2c+1, row 2q+1 · col 2c, row 2q+1 · col 2c+1].
  for (int q = 0; q < P; ++q)
    for (int c = 0; c < 8; c += 2) {
      const int64x2_t x = vreinterpretq_s64_s32(acc[q][c]), y = vreinterpretq_s64_s32(acc[q][c + 1]);
      vst1q_s32(out + 2 * q * kNR + 2 * c, vreinterpretq_s32_s64(vzip1q_s64(x, y)));
      if (2 * q + 1 < R) vst1q_s32(out + (2 * q + 1) * kNR + 2 * c, vreinterpretq_s32_s64(vzip2q_s64(x, y)));
    }
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

}  // namespace i8mm
}  // namespace cpuformer
