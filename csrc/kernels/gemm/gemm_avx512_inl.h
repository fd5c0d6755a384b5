// The avx512 fp32 register kernels (A packing, tile kernel, GEMV kernel), shared by the float32
// GEMM (gemm_avx512.cc) and the float16 / bfloat16 GEMM (gemm_half_avx512.cc), which widens its
// weights to float32 before they reach these kernels. Include it INSIDE cpuformer::avx512 (in an
// anonymous namespace), right after gemm_driver_inl.h. No include guard on purpose.

inline __mmask16 column_mask(long left) {
  if (left >= 16) return 0xFFFF;
  if (left <= 0) return 0;
  return static_cast<__mmask16>((1u << left) - 1);
}

// In place: r[i] holds column i of the 16×16 block whose rows were r[0..15].
__attribute__((always_inline)) inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // Then r[4i + j], 128-bit lane l, holds rows 4i..4i+3 of column 4l + j.
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD);
  }
}

// 16 k at a time through an in-register transpose: 16 loads, 64 shuffles and 16 stores per
// 16×14 block instead of one scalar store per element.
void pack_a_panel(long rows, const float* a, long lda, long kc, float* dst) {
  for (long k0 = 0; k0 < kc; k0 += 16) {
    const long cols = min_of(16, kc - k0);
    const __mmask16 load_mask = column_mask(cols);
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = i < rows ? _mm512_maskz_loadu_ps(load_mask, a + i * lda + k0) : _mm512_setzero_ps();
    transpose16(r);
    float* out = dst + k0 * kMR;
    for (int j = 0; j < 16; ++j)
      if (j < cols) _mm512_mask_storeu_ps(out + j * kMR, (1u << kMR) - 1, r[j]);
  }
}

// Applies the TileEpilogue to accumulators acc[r][v] = columns 16v..16v+15 of row r, and stores
// the ncols valid columns.
template <int ROWS, int NV>
__attribute__((always_inline)) inline void finish_tile(__m512 (&acc)[ROWS][NV], float* c, long ldc, long ncols,
                                                       const TileEpilogue& ep) {
  __mmask16 mask[NV];
  for (int v = 0; v < NV; ++v) mask[v] = column_mask(ncols - 16 * v);
  if (ep.load_c) {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v));
  }
  if (ep.bias != nullptr) {
    for (int v = 0; v < NV; ++v) {
      const __m512 b = _mm512_maskz_loadu_ps(mask[v], ep.bias + 16 * v);
      for (int r = 0; r < ROWS; ++r) acc[r][v] = _mm512_add_ps(acc[r][v], b);
    }
  }
  if (ep.activation != Activation::kNone) {
    // The finished tile goes through the activation table while it sits in L1.
    alignas(64) float tile[ROWS * NV * 16];
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) _mm512_store_ps(tile + (r * NV + v) * 16, acc[r][v]);
    kActivationKernels.apply(ep.activation, tile, tile, ROWS * NV * 16);
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_load_ps(tile + (r * NV + v) * 16);
  }
  if (ep.residual != nullptr) {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_maskz_loadu_ps(mask[v], ep.residual + r * ep.ldr + 16 * v));
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + r * ldc + 16 * v, mask[v], acc[r][v]);
}

// One k step of the register tile.
template <int ROWS, int NV>
__attribute__((always_inline)) inline void tile_step(__m512 (&acc)[ROWS][NV], const float* ak, const float* wk) {
  __m512 wv[NV];
  for (int v = 0; v < NV; ++v) wv[v] = _mm512_load_ps(wk + 16 * v);
  for (int r = 0; r < ROWS; ++r) {
    const __m512 av = _mm512_set1_ps(ak[r]);
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, wv[v], acc[r][v]);
  }
}

// ROWS × (16·NV) tile over a K slice. NV = 1 serves the last panel when it holds ≤ 16 columns.
// Every 4 k steps the kernel requests one cache line: first the lines of its own C tile (needed at
// the end: by then they are in L1 or L2), then `prefetch_lines` lines from `prefetch` into L2 (data
// the next tiles need). Spread out like this the requests never queue up behind each other and
// stall the FMAs, as a burst of them would.
template <int ROWS, int NV>
void tile(const float* ap, const float* wp, long kc, float* c, long ldc, long ncols, const TileEpilogue& ep,
          const char* prefetch, long prefetch_lines) {
  __m512 acc[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  long kk = 0;
  long c_line = 0;
  for (; kk + 4 <= kc; kk += 4) {
    if (c_line < ROWS * NV) {
      _mm_prefetch(reinterpret_cast<const char*>(c + (c_line / NV) * ldc + 16 * (c_line % NV)), _MM_HINT_T0);
      ++c_line;
    } else if (prefetch_lines > 0) {
      _mm_prefetch(prefetch, _MM_HINT_T1);
      prefetch += 64;
      --prefetch_lines;
    }
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) tile_step<ROWS, NV>(acc, ap + (kk + u) * kMR, wp + (kk + u) * kNR);
  }
  for (; kk < kc; ++kk) tile_step<ROWS, NV>(acc, ap + kk * kMR, wp + kk * kNR);
  finish_tile<ROWS, NV>(acc, c, ldc, ncols, ep);
}

// How the GEMV kernel's weights become float32 lanes: packed float32, IEEE binary16 (F16C) or
// bfloat16 (the upper half of a float32: zero-extend and shift). All three are exact.
enum WeightKind : int { kWF32 = 0, kWF16 = 1, kWBF16 = 2 };

// 16 weights from element i of an aligned packed panel.
template <int WK>
__attribute__((always_inline)) inline __m512 load_w(const void* base, long i) {
  if constexpr (WK == kWF32) {
    return _mm512_load_ps(static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (WK == kWF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// ROWS rows of a against one whole panel (weights of kind WK, widened in registers). With few rows there are too few
// independent accumulators to cover the FMA latency, so K is unrolled into U separate accumulator sets.
template <int ROWS, int WK>
void gemv_rows(const float* a, long lda, const void* wp, long k, float* c, long ldc, long ncols,
               const TileEpilogue& ep) {
  constexpr int U = ROWS == 1 ? 4 : ROWS <= 4 ? 2 : 1;  // U·ROWS·2 ≤ 16 accumulators below 5 rows, up to 28 above
  constexpr long kElemBytes = WK == kWF32 ? 4 : 2;
  __m512 acc[U][ROWS][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < ROWS; ++r) acc[u][r][0] = acc[u][r][1] = _mm512_setzero_ps();
  long kk = 0;
  for (; kk + U <= k; kk += U) {
    for (int u = 0; u < U; ++u) {
      // 2 KB ahead: 16 rows of float32, 32 of 16-bit weights (one line per row).
      const char* wk = static_cast<const char*>(wp) + (kk + u) * kNR * kElemBytes;
      _mm_prefetch(wk + 2048, _MM_HINT_T0);
      if constexpr (WK == kWF32) _mm_prefetch(wk + 2048 + 64, _MM_HINT_T0);
      const __m512 w0 = load_w<WK>(wp, (kk + u) * kNR), w1 = load_w<WK>(wp, (kk + u) * kNR + 16);
      for (int r = 0; r < ROWS; ++r) {
        const __m512 av = _mm512_set1_ps(a[r * lda + kk + u]);
        acc[u][r][0] = _mm512_fmadd_ps(av, w0, acc[u][r][0]);
        acc[u][r][1] = _mm512_fmadd_ps(av, w1, acc[u][r][1]);
      }
    }
  }
  for (; kk < k; ++kk) {
    const __m512 w0 = load_w<WK>(wp, kk * kNR), w1 = load_w<WK>(wp, kk * kNR + 16);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
      acc[0][r][0] = _mm512_fmadd_ps(av, w0, acc[0][r][0]);
      acc[0][r][1] = _mm512_fmadd_ps(av, w1, acc[0][r][1]);
    }
  }
  __m512 sum[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    sum[r][0] = acc[0][r][0];
    sum[r][1] = acc[0][r][1];
    for (int u = 1; u < U; ++u) {
      sum[r][0] = _mm512_add_ps(sum[r][0], acc[u][r][0]);
      sum[r][1] = _mm512_add_ps(sum[r][1], acc[u][r][1]);
    }
  }
  finish_tile<ROWS, 2>(sum, c, ldc, ncols, ep);
}

using TileFn = void (*)(const float*, const float*, long, float*, long, long, const TileEpilogue&, const char*, long);
constexpr TileFn kTiles[2][kMR] = {
    {tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>, tile<5, 1>, tile<6, 1>, tile<7, 1>, tile<8, 1>, tile<9, 1>,
     tile<10, 1>, tile<11, 1>, tile<12, 1>, tile<13, 1>, tile<14, 1>},
    {tile<1, 2>, tile<2, 2>, tile<3, 2>, tile<4, 2>, tile<5, 2>, tile<6, 2>, tile<7, 2>, tile<8, 2>, tile<9, 2>,
     tile<10, 2>, tile<11, 2>, tile<12, 2>, tile<13, 2>, tile<14, 2>},
};

void tile_kernel(long rows, const float* ap, const float* wp, long kc, float* c, long ldc, long ncols,
                 const TileEpilogue& ep, const char* prefetch, long prefetch_lines) {
  kTiles[ncols > 16 ? 1 : 0][rows - 1](ap, wp, kc, c, ldc, ncols, ep, prefetch, prefetch_lines);
}
