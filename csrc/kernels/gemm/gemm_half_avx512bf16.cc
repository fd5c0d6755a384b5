// AVX512-BF16 GEMM over bfloat16 weights: vdpbf16ps, two products per float32 lane and instruction.
// Picked inside the avx512 level when the CPU has AVX512-BF16 (gemm.cc); float16 weights go to the
// avx512 widening kernels unchanged.
//
// Arithmetic (gemm.h, HalfGemmKernels): each row of A is rounded to bfloat16 once per call
// (vcvtneps2bf16: nearest even; NaN stays NaN; subnormal inputs become zero), and every product
// bf16(a)·w is exact in float32 and summed in float32 (vdpbf16ps also flushes subnormal products
// and sums to zero). Against the widening kernels this adds at most 2^-9·Σ|a·w| of error, half an
// ulp of bfloat16 per activation; docs/precision.md measures what that does to a model.
//
// Packed W (uint16): Np / kNR panels, panel p holding W[p·kNR + j][2g + t] at [(g·kNR + j)·2 + t]
// for the Kp / 2 pairs g of k (Np = N rounded up to kNR, Kp = K rounded up to 2, padding zero).
// One k pair of a panel is kNR 32-bit lanes, each (W[j][2g], W[j][2g+1]): the operand layout of
// vdpbf16ps, so the kernel broadcasts a pair of A values and loads W without any shuffle.
//
// Driver (gemm_rowwise_inl.h, shared with the int8 GEMM): A is converted to bfloat16 rows first
// ([m][Kp]); then each work item (a W panel × a block of rows) runs register tiles of kMR rows × kNR
// features over the whole K, and the epilogue (bias, activation, residual) is applied to each
// finished tile row. With few rows (decode) every thread streams its own run of panels once.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512bf16 {
extern const HalfGemmKernels kHalfGemmKernels;
namespace {

constexpr long kMR = 6;
constexpr long kNR = 64;
// Below this many multiply-adds per thread a second thread costs more than it saves.
constexpr long kMinMacsPerThread = 1L << 17;

#include "kernels/gemm/gemm_half_bf16_inl.h"
#include "kernels/gemm/gemm_rowwise_inl.h"

inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
const HalfGemmKernels& widening() { return avx512::kHalfGemmKernels; }

std::size_t packed_bytes(long n, long k, WeightType type) {
  if (type != WeightType::kBFloat16) return widening().packed_bytes(n, k, type);
  return static_cast<std::size_t>(ceil_div(n, kNR) * kNR * ceil_div(k, 2) * 2) * sizeof(uint16_t);
}

#include "kernels/gemm/transpose_avx512_inl.h"

// A k pair of a row is one 32-bit word, so a panel is a k-major transpose of words: 16 rows × 16
// pairs at a time, loaded (an odd K's last pair with a zero high half by the load mask), transposed
// in registers and stored one aligned vector per pair; panels split across the threads.
void pack(const uint16_t* w, WeightType type, long n, long k, long ldw, uint8_t* out) {
  if (type != WeightType::kBFloat16) {
    widening().pack(w, type, n, k, ldw, out);
    return;
  }
  static_assert(kNR % 16 == 0, "whole 16-feature blocks per panel");
  const long panels = ceil_div(n, kNR), pairs = ceil_div(k, 2);
  float* words = reinterpret_cast<float*>(out);  // moved as float lanes, never computed with
  parallel_ranges(panels, 1, [&](long p0, long p1) {
    for (long p = p0; p < p1; ++p) {
      float* panel = words + p * kNR * pairs;
      for (long g0 = 0; g0 < pairs; g0 += 16) {
        const long e0 = 2 * g0, elements = k - e0 < 32 ? k - e0 : 32, steps = pairs - g0 < 16 ? pairs - g0 : 16;
        const __mmask32 mask = elements == 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << elements) - 1);
        for (long h = 0; h < kNR; h += 16) {
          __m512 r[16];
          for (long j = 0; j < 16; ++j) {
            const long row = p * kNR + h + j;
            r[j] =
                row < n ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, w + row * ldw + e0)) : _mm512_setzero_ps();
          }
          transpose_16x16(r);
          for (long g = 0; g < steps; ++g) _mm512_store_ps(panel + (g0 + g) * kNR + h, r[g]);
        }
      }
    }
  });
}

inline __m512bh as_bh(__m512i v) {
  __m512bh r;
  std::memcpy(&r, &v, sizeof(r));
  return r;
}

// The vdpbf16ps policy of the shared register tile: bfloat16 A pairs against bfloat16 W pairs,
// float32 sums.
struct Bf16Dot {
  using A = uint16_t;
  using Out = float;
  using Acc = __m512;
  static constexpr long kGroup = 2;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc dot(Acc acc, __m512i a, __m512i w) { return _mm512_dpbf16_ps(acc, as_bh(a), as_bh(w)); }
  static Acc add(Acc x, Acc y) { return _mm512_add_ps(x, y); }
  static Acc load(const float* p) { return _mm512_load_ps(p); }
  static void store(float* p, Acc v) { _mm512_store_ps(p, v); }
};

#include "kernels/gemm/gemm_dot_tile_inl.h"

// out[r·kNR + j] = Σ_p a[r·lda + p]·wp[p, j] in float32 for r < rows ≤ kMR, all kNR columns.
void tile_kernel(long rows, const uint16_t* a, long lda, const uint16_t* wp, long kp, float* out, const char* ahead,
                 long ahead_lines) {
  dot_tile<Bf16Dot>(rows, a, lda, wp, kp, out, ahead, ahead_lines);
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  if (w.type != WeightType::kBFloat16) {
    widening().gemm(a, m, lda, w, c, ldc, epilogue);
    return;
  }
  const long n = w.n, k = w.k;
  const long kp = ceil_div(k, 2) * 2;
  const uint16_t* panels = reinterpret_cast<const uint16_t*>(w.bytes());
  // bfloat16 A ([m][kp]), rowwise_copies(m) copies 64-byte aligned, allocated here: no exception
  // may leave the parallel region.
  const std::size_t copy_floats = ((static_cast<std::size_t>(m) * kp + 1) / 2 + 15) / 16 * 16;
  float* scratch = gemm_thread_scratch(copy_floats * static_cast<std::size_t>(rowwise_copies(m)));
  rowwise_gemm(
      m, n, k, kMinMacsPerThread,
      [&](long i, long copy) {
        convert_row(a + i * lda, k, kp, reinterpret_cast<uint16_t*>(scratch + copy * copy_floats) + i * kp);
      },
      [&](long i0, long rows, long j0, long ncols, long copy, const PanelAhead& ahead) {
        const uint16_t* ab = reinterpret_cast<const uint16_t*>(scratch + copy * copy_floats);
        alignas(64) float acc[kMR * kNR];
        prefetch_tile_output(c + i0 * ldc + j0, ldc, rows, ncols);
        const PanelLines next = ahead.lines(panels + ahead.j0 * kp, kNR * kp * 2);
        tile_kernel(rows, ab + i0 * kp, kp, panels + j0 * kp, kp, acc, next.begin, next.count);
        for (long r = 0; r < rows; ++r) {
          const long i = i0 + r;
          finish_row(acc + r * kNR, epilogue.bias ? epilogue.bias + j0 : nullptr, epilogue.activation,
                     epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr, c + i * ldc + j0, ncols);
        }
      });
}

}  // namespace

const HalfGemmKernels kHalfGemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx512bf16
}  // namespace cpuformer
