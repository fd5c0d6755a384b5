// The avx2 fp32 register kernels (A packing, tile kernel, GEMV kernel), shared by the float32
// GEMM (gemm_avx2.cc) and the float16 / bfloat16 GEMM (gemm_half_avx2.cc), which widens its
// weights to float32 before they reach these kernels. Include it INSIDE cpuformer::avx2 (in an
// anonymous namespace), right after gemm_driver_inl.h. No include guard on purpose.

// Lanes [0, left) set; all lanes when left ≥ 8, none when left ≤ 0.
inline __m256i column_mask(long left) {
  const int clamped = left < 0 ? 0 : left > 8 ? 8 : static_cast<int>(left);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(clamped), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Masked forms only for the partial vector of the last panel: vmaskmov is slower than a plain move.
inline __m256 load_columns(const float* p, bool full, __m256i mask) {
  return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}
inline void store_columns(float* p, bool full, __m256i mask, __m256 v) {
  if (full) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, mask, v);
  }
}

// In place: r[i] holds column i of the 8×8 block whose rows were r[0..7].
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // Then r[4i + j], 128-bit lane l, holds rows 4i..4i+3 of column 4l + j.
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);
    t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

// 8 k at a time through an in-register transpose instead of one scalar store per element.
void pack_a_panel(long rows, const float* a, long lda, long kc, float* dst) {
  const __m256i row_mask = column_mask(kMR);
  for (long k0 = 0; k0 < kc; k0 += 8) {
    const long cols = min_of(8, kc - k0);
    const bool full = cols == 8;
    const __m256i load_mask = column_mask(cols);
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? load_columns(a + i * lda + k0, full, load_mask) : _mm256_setzero_ps();
    transpose8(r);
    float* out = dst + k0 * kMR;
    for (int j = 0; j < 8; ++j)
      if (j < cols) _mm256_maskstore_ps(out + j * kMR, row_mask, r[j]);
  }
}

// Applies the TileEpilogue to accumulators acc[r][v] = columns 8v..8v+7 of row r, and stores the
// ncols valid columns.
template <int ROWS, int NV>
__attribute__((always_inline)) inline void finish_tile(__m256 (&acc)[ROWS][NV], float* c, long ldc, long ncols,
                                                       const TileEpilogue& ep) {
  __m256i mask[NV];
  bool full[NV];
  for (int v = 0; v < NV; ++v) {
    mask[v] = column_mask(ncols - 8 * v);
    full[v] = ncols - 8 * v >= 8;
  }
  if (ep.load_c) {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm256_add_ps(acc[r][v], load_columns(c + r * ldc + 8 * v, full[v], mask[v]));
  }
  if (ep.bias != nullptr) {
    for (int v = 0; v < NV; ++v) {
      const __m256 b = load_columns(ep.bias + 8 * v, full[v], mask[v]);
      for (int r = 0; r < ROWS; ++r) acc[r][v] = _mm256_add_ps(acc[r][v], b);
    }
  }
  if (ep.activation != Activation::kNone) {
    // The finished tile goes through the activation table while it sits in L1.
    alignas(32) float tile[ROWS * NV * 8];
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) _mm256_store_ps(tile + (r * NV + v) * 8, acc[r][v]);
    kActivationKernels.apply(ep.activation, tile, tile, ROWS * NV * 8);
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_load_ps(tile + (r * NV + v) * 8);
  }
  if (ep.residual != nullptr) {
    for (int r = 0; r < ROWS; ++r)
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm256_add_ps(acc[r][v], load_columns(ep.residual + r * ep.ldr + 8 * v, full[v], mask[v]));
  }
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) store_columns(c + r * ldc + 8 * v, full[v], mask[v], acc[r][v]);
}

// One k step of the register tile.
template <int ROWS, int NV>
__attribute__((always_inline)) inline void tile_step(__m256 (&acc)[ROWS][NV], const float* ak, const float* wk) {
  __m256 wv[NV];
  for (int v = 0; v < NV; ++v) wv[v] = _mm256_load_ps(wk + 8 * v);
  for (int r = 0; r < ROWS; ++r) {
    const __m256 av = _mm256_set1_ps(ak[r]);
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, wv[v], acc[r][v]);
  }
}

// ROWS × (8·NV) tile over a K slice. NV = 1 serves the last panel when it holds ≤ 8 columns.
// Every 4 k steps the kernel requests one cache line: first the lines of its own C tile (needed at
// the end: by then they are in L1 or L2), then `prefetch_lines` lines from `prefetch` into L2 (data
// the next tiles need). Spread out like this the requests never queue up behind each other and
// stall the FMAs, as a burst of them would.
template <int ROWS, int NV>
void tile(const float* ap, const float* wp, long kc, float* c, long ldc, long ncols, const TileEpilogue& ep,
          const char* prefetch, long prefetch_lines) {
  __m256 acc[ROWS][NV];
  for (int r = 0; r < ROWS; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  long kk = 0;
  long c_line = 0;
  for (; kk + 4 <= kc; kk += 4) {
    if (c_line < ROWS * NV) {
      _mm_prefetch(reinterpret_cast<const char*>(c + (c_line / NV) * ldc + 8 * (c_line % NV)), _MM_HINT_T0);
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

// 8 weights from element i of an aligned packed panel.
template <int WK>
__attribute__((always_inline)) inline __m256 load_w(const void* base, long i) {
  if constexpr (WK == kWF32) {
    return _mm256_load_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    if constexpr (WK == kWF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// ROWS rows of a against one whole panel (weights of kind WK, widened in registers). With few rows there are too few
// independent accumulators to cover the FMA latency, so K is unrolled into U separate accumulator sets.
template <int ROWS, int WK>
void gemv_rows(const float* a, long lda, const void* wp, long k, float* c, long ldc, long ncols,
               const TileEpilogue& ep) {
  constexpr int U = ROWS == 1 ? 4 : ROWS <= 3 ? 2 : 1;  // U·ROWS·2 ≤ 12 of the 16 ymm
  constexpr long kElemBytes = WK == kWF32 ? 4 : 2;
  __m256 acc[U][ROWS][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < ROWS; ++r) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
  long kk = 0;
  for (; kk + U <= k; kk += U) {
    for (int u = 0; u < U; ++u) {
      // 2 KB ahead: 32 rows of float32 (one line each), 64 of 16-bit weights.
      const char* wk = static_cast<const char*>(wp) + (kk + u) * kNR * kElemBytes;
      _mm_prefetch(wk + 2048, _MM_HINT_T0);
      const __m256 w0 = load_w<WK>(wp, (kk + u) * kNR), w1 = load_w<WK>(wp, (kk + u) * kNR + 8);
      for (int r = 0; r < ROWS; ++r) {
        const __m256 av = _mm256_set1_ps(a[r * lda + kk + u]);
        acc[u][r][0] = _mm256_fmadd_ps(av, w0, acc[u][r][0]);
        acc[u][r][1] = _mm256_fmadd_ps(av, w1, acc[u][r][1]);
      }
    }
  }
  for (; kk < k; ++kk) {
    const __m256 w0 = load_w<WK>(wp, kk * kNR), w1 = load_w<WK>(wp, kk * kNR + 8);
    for (int r = 0; r < ROWS; ++r) {
      const __m256 av = _mm256_set1_ps(a[r * lda + kk]);
      acc[0][r][0] = _mm256_fmadd_ps(av, w0, acc[0][r][0]);
      acc[0][r][1] = _mm256_fmadd_ps(av, w1, acc[0][r][1]);
    }
  }
  __m256 sum[ROWS][2];
  for (int r = 0; r < ROWS; ++r) {
    sum[r][0] = acc[0][r][0];
    sum[r][1] = acc[0][r][1];
    for (int u = 1; u < U; ++u) {
      sum[r][0] = _mm256_add_ps(sum[r][0], acc[u][r][0]);
      sum[r][1] = _mm256_add_ps(sum[r][1], acc[u][r][1]);
    }
  }
  finish_tile<ROWS, 2>(sum, c, ldc, ncols, ep);
}

using TileFn = void (*)(const float*, const float*, long, float*, long, long, const TileEpilogue&, const char*, long);
constexpr TileFn kTiles[2][kMR] = {
    {tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>, tile<5, 1>, tile<6, 1>},
    {tile<1, 2>, tile<2, 2>, tile<3, 2>, tile<4, 2>, tile<5, 2>, tile<6, 2>},
};

void tile_kernel(long rows, const float* ap, const float* wp, long kc, float* c, long ldc, long ncols,
                 const TileEpilogue& ep, const char* prefetch, long prefetch_lines) {
  kTiles[ncols > 8 ? 1 : 0][rows - 1](ap, wp, kc, c, ldc, ncols, ep, prefetch, prefetch_lines);
}
