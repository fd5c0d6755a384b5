// SDOT int4 GEMM for AArch64's dotprod and i8mm levels (Armv8.2 dot product; compiled with
// -march=armv8.2-a+dotprod, this file only). See Int4GemmKernels in gemm.h for the arithmetic; it
// matches the scalar reference bit for bit up to the activation, which is the level's (as for the
// int8 SDOT kernel).
//
// Packed layout: gemm_int4_layout_inl.h, the one of every x86 level. A 32-byte nibble block of a
// panel is two q registers: bytes 0-15 hold features 0-3, bytes 16-31 features 4-7, each int32 lane
// 4 channels of one feature. The nibbles u ∈ [0, 15] are valid s8 values, so after AND 0x0F (low
// nibbles: channels k0..k0+3) or a shift right by 4 (high: k0+4..k0+7) they are SDOT operands
// (signed × signed) against the s8 activations qa; a row's 16 values of two blocks sit in one
// register, one 4-byte lane per half block (vdotq_laneq_s32). Per group the int32 sums are
// Σ qa·u exactly; t = Σ qa·u − z·Σ qa (exact: |t| < 2^19), acc = fma(s, t, acc) per group in order.
// Register tile: up to 4 rows × one panel of 8 features (per row two int32x4 sums, four up to 2
// rows so the SDOT chains are shorter, and two float32x4 accumulators).
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
extern const Int4GemmKernels kInt4GemmKernels;
namespace {

constexpr long kMR = 4;
constexpr long kNR = 8;  // one panel

#include "kernels/gemm/gemm_int4_layout_inl.h"
#include "kernels/gemm/gemm_rowwise_inl.h"

inline int8x16_t low_nibbles(uint8x16_t w) { return vreinterpretq_s8_u8(vandq_u8(w, vdupq_n_u8(0x0F))); }
inline int8x16_t high_nibbles(uint8x16_t w) { return vreinterpretq_s8_u8(vshrq_n_u8(w, 4)); }

// out[r·8 + jj] = Σ_g s[g]·t[g] (the fused order of gemm.h) for rows r < R and the panel's 8
// features. a: R rows of qa (stride lda, padded with zeros to Kp); asum [R][groups]: Σ qa per
// group. kSteps = G / 16: each step multiplies two nibble blocks (16 channels).
template <int R, int kSteps, bool kZeroPoint>
__attribute__((always_inline)) inline void tile_rows(const int8_t* a, long lda, const int32_t* asum, long groups,
                                                     const uint8_t* panel, long header, float* out) {
  constexpr bool kTwoChains = R <= 2;
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(panel);
  const uint8_t* zeros = panel + groups * kInt4Panel * 2;
  const uint8_t* block = panel + header;
  float32x4_t facc[R][2];
  for (int r = 0; r < R; ++r) facc[r][0] = facc[r][1] = vdupq_n_f32(0.0f);
  for (long g = 0; g < groups; ++g) {
    // dot[r][h]: features 4h..4h+3 of row r; with two chains, the high nibbles sum in dot2.
    int32x4_t dot[R][2], dot2[R][2];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) dot[r][h] = dot2[r][h] = vdupq_n_s32(0);
    const long k_group = g * kSteps * 16;
    for (int step = 0; step < kSteps; ++step, block += 64) {
      __builtin_prefetch(block + kInt4PrefetchDistance);
      const uint8x16_t w0 = vld1q_u8(block), w1 = vld1q_u8(block + 16);  // block 2·step
      const uint8x16_t w2 = vld1q_u8(block + 32), w3 = vld1q_u8(block + 48);  // block 2·step + 1
      const int8x16_t lo[2][2] = {{low_nibbles(w0), low_nibbles(w1)}, {low_nibbles(w2), low_nibbles(w3)}};
      const int8x16_t hi[2][2] = {{high_nibbles(w0), high_nibbles(w1)}, {high_nibbles(w2), high_nibbles(w3)}};
      const long k0 = k_group + 16 * step;
      for (int r = 0; r < R; ++r) {
        const int8x16_t av = vld1q_s8(a + r * lda + k0);
        for (int h = 0; h < 2; ++h) {
          int32x4_t& d2 = kTwoChains ? dot2[r][h] : dot[r][h];
          dot[r][h] = vdotq_laneq_s32(dot[r][h], lo[0][h], av, 0);
          d2 = vdotq_laneq_s32(d2, hi[0][h], av, 1);
          dot[r][h] = vdotq_laneq_s32(dot[r][h], lo[1][h], av, 2);
          d2 = vdotq_laneq_s32(d2, hi[1][h], av, 3);
        }
      }
    }
    const float16x8_t s16 = vreinterpretq_f16_u16(vld1q_u16(scales + g * kInt4Panel));
    const float32x4_t scale[2] = {vcvt_f32_f16(vget_low_f16(s16)), vcvt_high_f32_f16(s16)};
    int32x4_t z[2] = {vdupq_n_s32(8), vdupq_n_s32(8)};
    if (kZeroPoint) {
      const uint16x8_t z16 = vmovl_u8(vld1_u8(zeros + g * kInt4Panel));
      z[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(z16)));
      z[1] = vreinterpretq_s32_u32(vmovl_high_u16(z16));
    }
    for (int r = 0; r < R; ++r) {
      const int32x4_t sum = vdupq_n_s32(asum[r * groups + g]);
      for (int h = 0; h < 2; ++h) {
        const int32x4_t d = kTwoChains ? vaddq_s32(dot[r][h], dot2[r][h]) : dot[r][h];
        const int32x4_t t = vmlsq_s32(d, z[h], sum);  // exact: |t| < 2^19
        facc[r][h] = vfmaq_f32(facc[r][h], scale[h], vcvtq_f32_s32(t));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    vst1q_f32(out + r * kNR, facc[r][0]);
    vst1q_f32(out + r * kNR + 4, facc[r][1]);
  }
}

template <int kSteps, bool kZeroPoint>
void tile_kernel(long rows, const int8_t* a, long lda, const int32_t* asum, long groups, const uint8_t* panel,
                 long /*ncols: one panel*/, long /*stride*/, long header, float* out) {
  switch (rows) {
    case 4: return tile_rows<4, kSteps, kZeroPoint>(a, lda, asum, groups, panel, header, out);
    case 3: return tile_rows<3, kSteps, kZeroPoint>(a, lda, asum, groups, panel, header, out);
    case 2: return tile_rows<2, kSteps, kZeroPoint>(a, lda, asum, groups, panel, header, out);
    default: return tile_rows<1, kSteps, kZeroPoint>(a, lda, asum, groups, panel, header, out);
  }
}

using TileFunction = void (*)(long, const int8_t*, long, const int32_t*, long, const uint8_t*, long, long, long,
                              float*);

TileFunction select_tile(long group_size, bool zero_point) {
  switch (group_size) {
    case 64: return zero_point ? tile_kernel<4, true> : tile_kernel<4, false>;
    case 128: return zero_point ? tile_kernel<8, true> : tile_kernel<8, false>;
    default: return zero_point ? tile_kernel<2, true> : tile_kernel<2, false>;
  }
}

// c[j] = act(sa·acc[j] + bias[j]) + residual[j] for j < ncols ≤ 8: the scalar reference's float
// operations in its order, unfused (GCC contracts a·b + c into fmadd on AArch64 unless kept from
// it), then the level's activation on the row. residual may alias c.
void finish_row(const float* acc, float sa, const float* bias, Activation act, const float* residual, float* c,
                long ncols) {
  float row[kNR];
  for (long j = 0; j < ncols; ++j) {
    float product = sa * acc[j];
    __asm__("" : "+w"(product));  // keeps the multiply and the add apart (bit-exact)
    row[j] = product + (bias != nullptr ? bias[j] : 0.0f);
  }
  if (act != Activation::kNone) activation_kernels().apply(act, row, row, ncols);
  for (long j = 0; j < ncols; ++j) c[j] = row[j] + (residual != nullptr ? residual[j] : 0.0f);
}

// Σ of the G int8 values at row (G = 32, 64 or 128).
inline int32_t group_sum(const int8_t* row, long group_size) {
  int32_t s = 0;
  for (long p = 0; p < group_size; p += 16) s += vaddlvq_s8(vld1q_s8(row + p));
  return s;
}

// qa (s8, zero-padded to kp) and sa: the scalar level's row quantization (the int8 SDOT kernel's).
inline float int4_quantize_row(const float* a, long k, long kp, int8_t* row) {
  const float sa = scalar::quantize_activation_row(a, k, row);
  std::memset(row + k, 0, static_cast<std::size_t>(kp - k));
  return sa;
}

// The tile reads each group's plain Σ qa (it multiplies it by 8 or by the zero points itself).
inline int32_t int4_group_value(const int8_t* row, long group_size, bool /*zero_point*/) {
  return group_sum(row, group_size);
}

#include "kernels/gemm/gemm_int4_driver_inl.h"

}  // namespace

const Int4GemmKernels kInt4GemmKernels = {packed_bytes, pack, gemm};

}  // namespace dotprod
}  // namespace cpuformer
