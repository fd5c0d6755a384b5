// NEON fp32 GEMM for AArch64 (the neon, dotprod and i8mm levels): a 6×16 register tile (24 of the
// 32 128-bit registers hold accumulators, 4 hold a row of W, 2 the six A values, multiplied in with
// fmla by lane), blocked and threaded by gemm_driver_inl.h like the x86 levels; a row-streaming GEMV
// kernel for m ≤ 6. Packed W layout: panels of 16 output features (see gemm_driver_inl.h).
//
// NEON is part of every AArch64 CPU, so this file is compiled without extra flags. The block sizes
// are the avx2 level's (gemm_avx2_blocking_inl.h: a 16 KB W slice in L1, a 168 KB A block in L2),
// which fit the L1 (32-64 KB) and L2 (256 KB-1 MB) of Cortex-A53 to Neoverse V1; they have not been
// measured on ARM hardware (docs/arm.md).
#include <arm_neon.h>
#include <omp.h>

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

constexpr long kMR = 6;
constexpr long kNR = 16;
constexpr long kKC = 256;
constexpr long kMCMax = 28 * kMR;
constexpr long kPrivateRowsMaxCBytes = 1L << 18;
constexpr long kGemvMaxRows = 6;
constexpr long kGemvChunkedMaxRowsF32 = 256;
constexpr long kGemvChunkedMaxRows16 = 64;  // read by the driver; no 16-bit NEON GEMM uses it yet
constexpr long kGemvChunkedMinPanels = 4;
using WElem = float;

#include "kernels/gemm/gemm_driver_inl.h"

// dst[kk·kMR + r] = a[r·lda + kk] for r < rows; rows past `rows` are left unset (the driver's contract).
void pack_a_panel(long rows, const float* a, long lda, long kc, float* dst) {
  for (long r = 0; r < rows; ++r) {
    const float* src = a + r * lda;
    for (long kk = 0; kk < kc; ++kk) dst[kk * kMR + r] = src[kk];
  }
}

// c = act(t + [c if load_c] + bias) + residual for the ROWS × ncols tile t = acc[r][v] (columns
// 4v..4v+3 of row r), in the order the x86 kernels apply it.
template <int ROWS>
__attribute__((always_inline)) inline void finish_tile(float32x4_t (&acc)[ROWS][4], float* c, long ldc, long ncols,
                                                       const TileEpilogue& ep) {
  alignas(16) float tile[ROWS][kNR];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < 4; ++v) vst1q_f32(tile[r] + 4 * v, acc[r][v]);
  const long full = ncols & ~3L;
  for (int r = 0; r < ROWS; ++r) {
    float* t = tile[r];
    const float* cr = c + r * ldc;
    long j = 0;
    for (; j < full; j += 4) {
      float32x4_t x = vld1q_f32(t + j);
      if (ep.load_c) x = vaddq_f32(x, vld1q_f32(cr + j));
      if (ep.bias != nullptr) x = vaddq_f32(x, vld1q_f32(ep.bias + j));
      vst1q_f32(t + j, x);
    }
    for (; j < ncols; ++j) {
      float x = t[j];
      if (ep.load_c) x += cr[j];
      if (ep.bias != nullptr) x += ep.bias[j];
      t[j] = x;
    }
    // The finished row goes through the activation table while it sits in L1.
    if (ep.activation != Activation::kNone) activation_kernels().apply(ep.activation, t, t, ncols);
    const float* res = ep.residual != nullptr ? ep.residual + r * ep.ldr : nullptr;
    float* out = c + r * ldc;
    for (j = 0; j < full; j += 4) {
      float32x4_t x = vld1q_f32(t + j);
      if (res != nullptr) x = vaddq_f32(x, vld1q_f32(res + j));
      vst1q_f32(out + j, x);
    }
    for (; j < ncols; ++j) out[j] = res != nullptr ? t[j] + res[j] : t[j];
  }
}

// One k step of the register tile: the 16 weights of row k times the ROWS values of A, by lane.
template <int ROWS>
__attribute__((always_inline)) inline void tile_step(float32x4_t (&acc)[ROWS][4], const float* ak, const float* wk) {
  float32x4_t w[4];
  for (int v = 0; v < 4; ++v) w[v] = vld1q_f32(wk + 4 * v);
  const float32x4_t a0 = vld1q_f32(ak);  // rows 0-3 (the packed micro-panel row holds kMR = 6 values)
  float32x2_t a1 = vdup_n_f32(0.0f);
  if constexpr (ROWS > 4) a1 = vld1_f32(ak + 4);  // rows 4-5
  for (int v = 0; v < 4; ++v) {
    if constexpr (ROWS > 0) acc[0][v] = vfmaq_laneq_f32(acc[0][v], w[v], a0, 0);
    if constexpr (ROWS > 1) acc[1][v] = vfmaq_laneq_f32(acc[1][v], w[v], a0, 1);
    if constexpr (ROWS > 2) acc[2][v] = vfmaq_laneq_f32(acc[2][v], w[v], a0, 2);
    if constexpr (ROWS > 3) acc[3][v] = vfmaq_laneq_f32(acc[3][v], w[v], a0, 3);
    if constexpr (ROWS > 4) acc[4][v] = vfmaq_lane_f32(acc[4][v], w[v], a1, 0);
    if constexpr (ROWS > 5) acc[5][v] = vfmaq_lane_f32(acc[5][v], w[v], a1, 1);
  }
}

// ROWS × 16 tile over a K slice (the columns past ncols are computed from the zero padding and not
// stored). Every 4 k steps one cache line of `prefetch` (the next panel's slice) is requested into
// L2, spread out so the requests never queue up behind each other.
template <int ROWS>
void tile(const float* ap, const float* wp, long kc, float* c, long ldc, long ncols, const TileEpilogue& ep,
          const char* prefetch, long prefetch_lines) {
  float32x4_t acc[ROWS][4];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_f32(0.0f);
  long kk = 0;
  for (; kk + 4 <= kc; kk += 4) {
    if (prefetch_lines > 0) {
      __builtin_prefetch(prefetch, 0, 2);
      prefetch += 64;
      --prefetch_lines;
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) tile_step<ROWS>(acc, ap + (kk + u) * kMR, wp + (kk + u) * kNR);
  }
  for (; kk < kc; ++kk) tile_step<ROWS>(acc, ap + kk * kMR, wp + kk * kNR);
  finish_tile<ROWS>(acc, c, ldc, ncols, ep);
}

// ROWS rows of a against one whole packed panel. With few rows there are too few independent
// accumulators to cover the fmla latency, so K is unrolled into U separate accumulator sets.
template <int ROWS>
void gemv_rows(const float* a, long lda, const float* wp, long k, float* c, long ldc, long ncols,
               const TileEpilogue& ep) {
  constexpr int U = ROWS == 1 ? 4 : ROWS <= 3 ? 2 : 1;  // U·ROWS·4 ≤ 24 of the 32 registers
  float32x4_t acc[U][ROWS][4];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < 4; ++v) acc[u][r][v] = vdupq_n_f32(0.0f);
  long kk = 0;
  for (; kk + U <= k; kk += U) {
    for (int u = 0; u < U; ++u) {
      const float* wk = wp + (kk + u) * kNR;
      __builtin_prefetch(wk + 512, 0, 3);  // 2 KB ahead: 32 rows of the panel
      float32x4_t w[4];
      for (int v = 0; v < 4; ++v) w[v] = vld1q_f32(wk + 4 * v);
      for (int r = 0; r < ROWS; ++r) {
        const float av = a[r * lda + kk + u];
        for (int v = 0; v < 4; ++v) acc[u][r][v] = vfmaq_n_f32(acc[u][r][v], w[v], av);
      }
    }
  }
  for (; kk < k; ++kk) {
    const float* wk = wp + kk * kNR;
    for (int r = 0; r < ROWS; ++r) {
      const float av = a[r * lda + kk];
      for (int v = 0; v < 4; ++v) acc[0][r][v] = vfmaq_n_f32(acc[0][r][v], vld1q_f32(wk + 4 * v), av);
    }
  }
  float32x4_t sum[ROWS][4];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < 4; ++v) {
      sum[r][v] = acc[0][r][v];
      for (int u = 1; u < U; ++u) sum[r][v] = vaddq_f32(sum[r][v], acc[u][r][v]);
    }
  finish_tile<ROWS>(sum, c, ldc, ncols, ep);
}

using TileFn = void (*)(const float*, const float*, long, float*, long, long, const TileEpilogue&, const char*, long);
constexpr TileFn kTiles[kMR] = {tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

void tile_kernel(long rows, const float* ap, const float* wp, long kc, float* c, long ldc, long ncols,
                 const TileEpilogue& ep, const char* prefetch, long prefetch_lines) {
  kTiles[rows - 1](ap, wp, kc, c, ldc, ncols, ep, prefetch, prefetch_lines);
}

using GemvFn = void (*)(const float*, long, const float*, long, float*, long, long, const TileEpilogue&);
constexpr GemvFn kGemvs[kGemvMaxRows] = {gemv_rows<1>, gemv_rows<2>, gemv_rows<3>,
                                         gemv_rows<4>, gemv_rows<5>, gemv_rows<6>};

void gemv_kernel(long rows, const float* a, long lda, const float* wp, long k, WeightType, float* c, long ldc,
                 long ncols, const TileEpilogue& ep) {
  kGemvs[rows - 1](a, lda, wp, k, c, ldc, ncols, ep);
}

const float* widen_slice(const float* src, long, WeightType) { return src; }

}  // namespace

const GemmKernels kGemmKernels = {packed_bytes_w, pack_w, gemm_w};

}  // namespace neon
}  // namespace cpuformer
