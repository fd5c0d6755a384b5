// AMX int8 GEMM: the products of GEMMs with many rows (encoders, prefill) on TDPBUSD tiles, every
// other call on the AVX-512 VNNI kernel. The packed layout is avx512vnni's (gemm_int8_inl.h, panels
// of 64 features in groups of 4 k): one k group of a panel is 64 features × 4 bytes, so 16
// consecutive groups of 16 features are an AMX B tile as they lie (16 rows of 64 bytes, row stride
// 256 bytes), and a packed-weights file of the VNNI kernel serves this one unchanged. A rows are
// quantized to u8 (qa + 128) as for vpdpbusd and the compensation 128·Σq is subtracted in the same
// epilogue: TDPBUSD sums u8 × s8 products into int32 without saturation, like vpdpbusd, so the
// integer sums, and the outputs, are those of the VNNI kernel bit for bit.
//
// A work tile is 32 rows × 64 features: per half of the panel (32 features) four C tiles (2 × 2 of
// 16 × 16 int32), two A tiles (16 rows × 64 k) and two B tiles (16 groups of 4 k × 16 features)
// take the eight tile registers; the C tiles are stored to a buffer that the VNNI kernel's epilogue
// (dequantize, bias, activation, residual) reads row by row.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/amx_tiles_inl.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx512.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512amx {
extern const Int8GemmKernels kInt8GemmKernels;
namespace {

constexpr long kMR = 6;
constexpr long kNR = 64;
constexpr long kKGroup = 4;
constexpr bool kUnsignedA = true;

#include "kernels/gemm/gemm_int8_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_int8_avx512_inl.h"

// The vpdpbusd register tile of the calls that do not take the tiles (as gemm_int8_avx512vnni.cc).
struct Vnni {
  using A = uint8_t;
  using Out = int32_t;
  using Acc = __m512i;
  static constexpr long kGroup = 4;
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc dot(Acc acc, __m512i a, __m512i w) { return _mm512_dpbusd_epi32(acc, a, w); }
  static Acc add(Acc x, Acc y) { return _mm512_add_epi32(x, y); }
  static Acc load(const int32_t* p) { return _mm512_load_si512(p); }
  static void store(int32_t* p, Acc v) { _mm512_store_si512(p, v); }
};

#include "kernels/gemm/gemm_dot_tile_inl.h"

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out) {
  dot_tile<Vnni>(rows, a, lda, wp, kp, out);
}

constexpr long kAmxRows = 32;        // rows of a work tile: two A tiles of 16
constexpr long kAmxK = 64;           // k of one TDPBUSD step (an A tile row is 64 bytes)
constexpr long kAmxRowBlock = 256;   // rows of a work item: its panel stays in L2 across 8 tiles
constexpr long kPanelRowBytes = kNR * kKGroup;  // one k group of a panel: the B tiles' row stride
// Fewer rows than this run on vpdpbusd: a GEMV or a few rows stream W from memory, where the tiles
// gain nothing and would multiply padded rows.
constexpr long kAmxMinRows = 16;

// acc[r·kNR + j] = Σ_p a[r·kp + p]·panel[p, j] (wrapping int32), r < 32, j < 64; kp a multiple of 64.
void amx_tile(const uint8_t* a, long kp, const int8_t* panel, int32_t* acc) {
  constexpr long kAccStride = kNR * sizeof(int32_t);
  for (long half = 0; half < 2; ++half) {
    const int8_t* b = panel + half * 32 * kKGroup;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long p = 0; p < kp; p += kAmxK) {
      const int8_t* bp = b + (p / kKGroup) * kPanelRowBytes;
      _tile_loadd(4, a + p, kp);
      _tile_loadd(6, bp, kPanelRowBytes);
      _tile_loadd(7, bp + 16 * kKGroup, kPanelRowBytes);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_loadd(5, a + 16 * kp + p, kp);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
    int32_t* out = acc + half * 32;
    _tile_stored(0, out, kAccStride);
    _tile_stored(1, out + 16, kAccStride);
    _tile_stored(2, out + 16 * kNR, kAccStride);
    _tile_stored(3, out + 16 * kNR + 16, kAccStride);
  }
}

void gemm_amx(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
              const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const long np = i8_ceil_div(n, kNR) * kNR, kp = i8_ceil_div(k, kKGroup) * kKGroup;
  if (m < kAmxMinRows || kp % kAmxK != 0) return avx512amx::gemm(a, m, lda, w, c, ldc, epilogue);
  const float* scales = reinterpret_cast<const float*>(w.bytes());
  const int32_t* comp = reinterpret_cast<const int32_t*>(w.bytes() + np * sizeof(float));
  const int8_t* panels = reinterpret_cast<const int8_t*>(w.bytes() + np * (sizeof(float) + sizeof(int32_t)));

  // Quantized A: [mp][kp] u8, rows past m hold qa = 0 (their sums are computed and not stored);
  // then sa [m]. Allocated here: no exception may leave the parallel region.
  const long mp = i8_ceil_div(m, kAmxRows) * kAmxRows;
  const std::size_t qa_floats = (static_cast<std::size_t>(mp) * kp + 63) / 64 * 16;
  float* scratch = gemm_thread_scratch(qa_floats + static_cast<std::size_t>(m));
  uint8_t* qa = reinterpret_cast<uint8_t*>(scratch);
  float* sa = scratch + qa_floats;
  std::memset(qa + m * kp, 128, static_cast<std::size_t>((mp - m) * kp));

  const long panel_count = np / kNR;
  const long blocks = i8_ceil_div(m, kAmxRowBlock);
  const long items = panel_count * blocks;
  long nt = current_num_threads();
  if (nt > m * n * k / kInt8MinMacsPerThread) nt = m * n * k / kInt8MinMacsPerThread;
  if (nt > items) nt = items;
  if (nt < 1) nt = 1;

  run_team(static_cast<int>(nt), [&](const Team& team) {
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) sa[i] = quantize_row(a + i * lda, k, kp, qa + i * kp);
    team.barrier();  // every row is quantized before any tile reads it
    long begin, end;
    team.range(items, &begin, &end);
    if (begin >= end) return;
    configure_tiles_16x64();
    alignas(64) int32_t acc[kAmxRows * kNR];
    for (long item = begin; item < end; ++item) {
      const long p = item / blocks, b = item % blocks;
      const long j0 = p * kNR, ncols = n - j0 < kNR ? n - j0 : kNR;
      const long r_end = m < (b + 1) * kAmxRowBlock ? m : (b + 1) * kAmxRowBlock;
      for (long r0 = b * kAmxRowBlock; r0 < r_end; r0 += kAmxRows) {
        const long rows = r_end - r0 < kAmxRows ? r_end - r0 : kAmxRows;
        prefetch_tile_output(c + r0 * ldc + j0, ldc, rows, ncols);
        amx_tile(qa + r0 * kp, kp, panels + j0 * kp, acc);
        for (long r = 0; r < rows; ++r) {
          const long i = r0 + r;
          finish_row(acc + r * kNR, comp + j0, sa[i], scales + j0, epilogue.bias ? epilogue.bias + j0 : nullptr,
                     epilogue.activation, epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr,
                     c + i * ldc + j0, ncols);
        }
      }
    }
    _tile_release();
  });
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm_amx};

}  // namespace avx512amx
}  // namespace cpuformer
