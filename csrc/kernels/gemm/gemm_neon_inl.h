// The NEON fp32 register kernels (A packing, tile kernel, GEMV kernel), shared by the float32 GEMM
// (gemm_neon.cc) and the float16 / bfloat16 GEMM (gemm_half_neon.cc), which widens its weights to
// float32 before they reach the tile kernel and inside the GEMV kernel. Include it INSIDE
// cpuformer::neon (in an anonymous namespace), right after gemm_driver_inl.h. No include guard on
// purpose.

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

// How the GEMV kernel's weights become float32 lanes: packed float32, IEEE binary16 (fcvtl /
// fcvtl2, baseline AArch64) or bfloat16 (the upper half of a float32: shift left by 16 into 32-bit
// lanes, shll / shll2). All three are exact.
enum WeightKind : int { kWF32 = 0, kWF16 = 1, kWBF16 = 2 };

// The 16 weights of one k step of a panel (w[v] = columns 4v..4v+3), widened to float32.
template <int WK>
__attribute__((always_inline)) inline void load_w(const void* wk, float32x4_t (&w)[4]) {
  if constexpr (WK == kWF32) {
    const float* p = static_cast<const float*>(wk);
    for (int v = 0; v < 4; ++v) w[v] = vld1q_f32(p + 4 * v);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(wk);
    for (int h = 0; h < 2; ++h) {
      const uint16x8_t x = vld1q_u16(p + 8 * h);
      if constexpr (WK == kWF16) {
        const float16x8_t f = vreinterpretq_f16_u16(x);
        w[2 * h] = vcvt_f32_f16(vget_low_f16(f));
        w[2 * h + 1] = vcvt_high_f32_f16(f);
      } else {
        w[2 * h] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16));
        w[2 * h + 1] = vreinterpretq_f32_u32(vshll_high_n_u16(x, 16));
      }
    }
  }
}

// ROWS rows of a against one whole packed panel (weights of kind WK, widened in registers). With few
// rows there are too few independent accumulators to cover the fmla latency, so K is unrolled into U
// separate accumulator sets.
// The unroll pragmas let GCC keep acc in registers: without them it stored the array to the stack
// at every k step (counted by benchmarks/arm_instruction_model.py).
template <int ROWS, int WK>
void gemv_rows(const float* a, long lda, const void* wp, long k, float* c, long ldc, long ncols,
               const TileEpilogue& ep) {
  constexpr int U = ROWS == 1 ? 4 : ROWS <= 3 ? 2 : 1;  // U·ROWS·4 ≤ 24 of the 32 registers
  constexpr long kStepBytes = kNR * (WK == kWF32 ? 4 : 2);  // one k step of the panel
  const char* wb = static_cast<const char*>(wp);
  float32x4_t acc[U][ROWS][4];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < 4; ++v) acc[u][r][v] = vdupq_n_f32(0.0f);
  long kk = 0;
  for (; kk + U <= k; kk += U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const char* wk = wb + (kk + u) * kStepBytes;
      __builtin_prefetch(wk + 2048, 0, 3);  // 2 KB ahead: 32 k steps of float32, 64 of 16-bit weights
      float32x4_t w[4];
      load_w<WK>(wk, w);
#pragma GCC unroll 6
      for (int r = 0; r < ROWS; ++r) {
        const float av = a[r * lda + kk + u];
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) acc[u][r][v] = vfmaq_n_f32(acc[u][r][v], w[v], av);
      }
    }
  }
  for (; kk < k; ++kk) {
    float32x4_t w[4];
    load_w<WK>(wb + kk * kStepBytes, w);
    for (int r = 0; r < ROWS; ++r) {
      const float av = a[r * lda + kk];
      for (int v = 0; v < 4; ++v) acc[0][r][v] = vfmaq_n_f32(acc[0][r][v], w[v], av);
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
