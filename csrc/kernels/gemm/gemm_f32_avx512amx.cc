// float32 weights on AMX-BF16 tiles, for float32 matmul precision "high"
// (set_float32_matmul_precision, gemm.h): each float32 x is split into two bfloat16, hi = bf16(x)
// and lo = bf16(x − hi) (x − hi is exact in float32), and c = a·Wᵀ is computed as
//   a_hi·W_hiᵀ + a_lo·W_hiᵀ + a_hi·W_loᵀ
// with TDPBF16PS (products exact in float32, float32 sums). hi + lo carries 16 of x's 24
// significant bits; the term left out, a_lo·W_lo, and the two splits' remainders are each ≤ 2^-18
// of |a·w|, so a product is off by at most 3·2^-18 ≈ 1.2e-5 of its magnitude (docs/precision.md;
// tests/kernels/test_gemm_high_precision.py). TDPBF16PS reads bfloat16 subnormals as zero, so a
// lo part below 2^-126 (of an x below about 2^-117) is dropped.
//
// The weights stay in the avx512 float32 kernel's packed panels (gemm_avx512.cc: 32 features,
// k-major), so one packing serves both precisions. Each thread splits the 64 features of the
// panel pair it works on into a per-thread buffer in the AMX B-tile layout (16 k pairs × 16
// features × 2 bfloat16 per tile) when it starts on them: one pass over the weights per 256 rows.
// A rows are split once per call. GEMMs below kMinRows / kMinRowK go to the float32 FMA kernel.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/amx_tiles_inl.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512amx {
namespace {

#include "kernels/gemm/gemm_half_bf16_inl.h"

constexpr long kF32PanelWidth = 32;  // features of an avx512 float32 panel (gemm_avx512_blocking_inl.h kNR)
constexpr long kFeatures = 64;  // features of a work panel: four 16-feature B tiles
constexpr long kStepK = 32;  // k of one tile step (an A tile row: 32 bfloat16)
constexpr long kTileRows = 16;  // rows of a work tile: one A tile
constexpr long kRowBlock = 256;  // rows of a work item
constexpr long kGroupRowElems = 2 * kFeatures;  // one k pair of a work panel, in bfloat16
constexpr long kPanelRowBytes = kGroupRowElems * 2;  // 256: the B tiles' row stride
constexpr long kPanelStepBytes = 16 * kPanelRowBytes;  // the 16 k pairs of one tile step
// The tiles take a GEMM from 32 rows and 32·768 row-k products: below, splitting the weights (once
// per call) costs more than the tiles save. Tiles ÷ FMA speed, AMX Xeon, 2 threads, N × K
// 768 × 768: 16 rows 0.88, 32 1.12, 64 1.40, 128 1.68, 256 1.78; 3072 × 768: 0.94, 1.22, 1.59, 1.82,
// 2.05; 384 × 384: 0.65, 0.82, 1.00, 1.49, 1.61.
constexpr long kMinRows = 32;
constexpr long kMinRowK = 32 * 768;
constexpr long kMinMacsPerThread = 1L << 18;

inline __m512 bf16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

inline __m256i to_bf16(__m512 x) {
  const __m256bh h = _mm512_cvtneps_pbh(x);
  __m256i bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

// hi and lo bfloat16 of 16 floats. An infinite x, or one beyond bfloat16's largest finite value
// (3.39e38), has an infinite hi and lo = NaN (inf − inf): every output it reaches is NaN (float32
// FMA would give ±inf or NaN there), never a finite value.
inline void split(__m512 x, __m256i* hi, __m256i* lo) {
  *hi = to_bf16(x);
  *lo = to_bf16(_mm512_sub_ps(x, bf16_to_f32(*hi)));
}

// hi[0, kp) and lo[0, kp) of x[0, k), zero past k.
void split_row(const float* x, long k, long kp, uint16_t* hi, uint16_t* lo) {
  for (long p = 0; p < kp; p += 16) {
    const __mmask16 mask = mask16(k - p);
    __m256i h, l;
    split(_mm512_maskz_loadu_ps(mask, x + p), &h, &l);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + p), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + p), l);
  }
}

// Splits features [j0, j0 + 64) of the packed float32 weights (panels of 32 features, [k][32]
// each, panel p at p·32·k, gemm_driver_inl.h; features past n are zeros) into hi / lo work
// panels: k pair g at [g·128, g·128 + 128) holds feature f's (k = 2g, 2g + 1) at 2f, 2f + 1; k
// pairs up to kp / 2, zero past k.
void split_panel(const float* packed, long n, long k, long kp, long j0, uint16_t* hi, uint16_t* lo) {
  // vpermw index interleaving two 16-value halves: (x0, y0, x1, y1, ...).
  alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  for (long half = 0; half < 2; ++half) {
    const long f0 = j0 + half * kF32PanelWidth;
    const float* panel = f0 < n ? packed + f0 * k : nullptr;
    for (long g = 0; g < kp / 2; ++g) {
      const long k0 = 2 * g, k1 = 2 * g + 1;
      uint16_t* hrow = hi + g * kGroupRowElems + half * 2 * kF32PanelWidth;
      uint16_t* lrow = lo + g * kGroupRowElems + half * 2 * kF32PanelWidth;
      for (long q = 0; q < kF32PanelWidth; q += 16) {
        const bool x_in = panel != nullptr && k0 < k, y_in = panel != nullptr && k1 < k;
        const __m512 x = x_in ? _mm512_load_ps(panel + k0 * kF32PanelWidth + q) : _mm512_setzero_ps();
        const __m512 y = y_in ? _mm512_load_ps(panel + k1 * kF32PanelWidth + q) : _mm512_setzero_ps();
        __m256i xh, xl, yh, yl;
        split(x, &xh, &xl);
        split(y, &yh, &yl);
        const __m512i h = _mm512_permutexvar_epi16(order, _mm512_inserti64x4(_mm512_castsi256_si512(xh), yh, 1));
        const __m512i l = _mm512_permutexvar_epi16(order, _mm512_inserti64x4(_mm512_castsi256_si512(xl), yl, 1));
        _mm512_store_si512(hrow + 2 * q, h);
        _mm512_store_si512(lrow + 2 * q, l);
      }
    }
  }
}

// acc[r·64 + j] = Σ_k (a_hi·b_hi + a_lo·b_hi + a_hi·b_lo) for 16 rows r of A from a_hi / a_lo (row
// stride a_stride bytes) and the 64 features j of the work panel. C tiles 0-3 hold features
// 0-15, ..., 48-63; A's hi and lo stay in tiles 4 and 5 for a step, B goes through 6 and 7: 10
// tile loads per 12 products, the fewest 8 tiles allow (a 32 × 32 work tile needs as many loads
// and ran 10-15 % slower). progress(done, steps) runs after each step (see gemm_f32_bf16x3).
template <class Progress>
inline void tile_x3(const uint8_t* a_hi, const uint8_t* a_lo, long a_stride, long steps, const uint8_t* b_hi,
                    const uint8_t* b_lo, float* acc, const Progress& progress) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long s = 0; s < steps; ++s) {
    const uint8_t* h = b_hi + s * kPanelStepBytes;
    const uint8_t* l = b_lo + s * kPanelStepBytes;
    _tile_loadd(4, a_hi + s * 64, a_stride);
    _tile_loadd(5, a_lo + s * 64, a_stride);
    _tile_loadd(6, h, kPanelRowBytes);
    _tile_loadd(7, h + 64, kPanelRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(0, 5, 6);
    _tile_dpbf16ps(1, 5, 7);
    _tile_loadd(6, h + 128, kPanelRowBytes);
    _tile_loadd(7, h + 192, kPanelRowBytes);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(3, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(6, l, kPanelRowBytes);
    _tile_loadd(7, l + 64, kPanelRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(6, l + 128, kPanelRowBytes);
    _tile_loadd(7, l + 192, kPanelRowBytes);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(3, 4, 7);
    progress(s + 1, steps);
  }
  constexpr long kAccStride = kFeatures * 4;
  uint8_t* out = reinterpret_cast<uint8_t*>(acc);
  _tile_stored(0, out, kAccStride);
  _tile_stored(1, out + 64, kAccStride);
  _tile_stored(2, out + 128, kAccStride);
  _tile_stored(3, out + 192, kAccStride);
}

}  // namespace

void gemm_f32_bf16x3(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
                     const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  if (m < kMinRows || m * k < kMinRowK) {
    avx512::kGemmKernels.gemm_f32(a, m, lda, w, c, ldc, epilogue);
    return;
  }
  const long kp = (k + kStepK - 1) / kStepK * kStepK, steps = kp / kStepK;
  const long mp = (m + kTileRows - 1) / kTileRows * kTileRows;
  const long panels = (n + kFeatures - 1) / kFeatures, blocks = (m + kRowBlock - 1) / kRowBlock;
  const long items = panels * blocks;
  long nt = current_num_threads();
  if (nt > m * n * k / kMinMacsPerThread) nt = m * n * k / kMinMacsPerThread;
  if (nt > items) nt = items;
  if (nt < 1) nt = 1;
  // Scratch (allocated here: no exception may leave the parallel region): A's hi and lo rows
  // [mp][kp] each (rows past m zero), then each thread's hi and lo work panels [kp / 2][128] each.
  const long a_elems = mp * kp, panel_elems = kp / 2 * kGroupRowElems;
  float* scratch = gemm_thread_scratch(static_cast<std::size_t>(a_elems + nt * panel_elems));  // 2 bf16 per float
  uint16_t* a_hi = reinterpret_cast<uint16_t*>(scratch);
  uint16_t* a_lo = a_hi + a_elems;
  uint16_t* panel_base = a_lo + a_elems;
  std::memset(a_hi + m * kp, 0, static_cast<std::size_t>((mp - m) * kp) * sizeof(uint16_t));
  std::memset(a_lo + m * kp, 0, static_cast<std::size_t>((mp - m) * kp) * sizeof(uint16_t));
  const float* packed = reinterpret_cast<const float*>(w.bytes());
  const long a_stride = kp * static_cast<long>(sizeof(uint16_t));

  run_team(static_cast<int>(nt), [&](const Team& team) {
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) split_row(a + i * lda, k, kp, a_hi + i * kp, a_lo + i * kp);
    team.barrier();  // every row is split before any tile reads it
    long begin, end;
    team.range(items, &begin, &end);
    if (begin >= end) return;
    uint16_t* b_hi = panel_base + team.index() * 2 * panel_elems;
    uint16_t* b_lo = b_hi + panel_elems;
    configure_tiles_16x64();
    // While the tiles of one work tile run, the rows of the one before go through the epilogue, a
    // share after each step, so that the vector units work while TMUL does (as gemm_amx_driver_inl.h).
    alignas(64) float acc[2][kTileRows * kFeatures];
    int cur = 0;
    long prev_r0 = 0, prev_rows = 0, prev_j0 = 0, prev_ncols = 0, finished = 0;
    auto finish_prev = [&](long upto) {
      for (; finished < upto; ++finished) {
        const long i = prev_r0 + finished;
        finish_row(acc[cur ^ 1] + finished * kFeatures, epilogue.bias ? epilogue.bias + prev_j0 : nullptr,
                   epilogue.activation, epilogue.residual ? epilogue.residual + i * epilogue.ldr + prev_j0 : nullptr,
                   c + i * ldc + prev_j0, prev_ncols);
      }
    };
    auto progress = [&](long done, long total) { finish_prev((prev_rows * done + total - 1) / total); };
    long split_p = -1;
    for (long item = begin; item < end; ++item) {
      const long p = item / blocks, b = item % blocks;
      const long j0 = p * kFeatures, ncols = n - j0 < kFeatures ? n - j0 : kFeatures;
      if (p != split_p) {
        split_panel(packed, n, k, kp, j0, b_hi, b_lo);
        split_p = p;
      }
      const long r_end = m < (b + 1) * kRowBlock ? m : (b + 1) * kRowBlock;
      for (long r0 = b * kRowBlock; r0 < r_end; r0 += kTileRows) {
        tile_x3(reinterpret_cast<const uint8_t*>(a_hi + r0 * kp), reinterpret_cast<const uint8_t*>(a_lo + r0 * kp),
                a_stride, steps, reinterpret_cast<const uint8_t*>(b_hi), reinterpret_cast<const uint8_t*>(b_lo),
                acc[cur], progress);
        finish_prev(prev_rows);
        prev_r0 = r0;
        prev_rows = r_end - r0 < kTileRows ? r_end - r0 : kTileRows;
        prev_j0 = j0;
        prev_ncols = ncols;
        finished = 0;
        cur ^= 1;
      }
    }
    finish_prev(prev_rows);
    _tile_release();
  });
}

}  // namespace avx512amx
}  // namespace cpuformer
