// int8 GEMM driver shared by the SIMD levels (see Int8GemmKernels in gemm.h for the arithmetic).
//
// Include this file INSIDE the ISA namespace (in an anonymous namespace) of a per-ISA translation
// unit, after <immintrin.h>, <cstdint>, <cstring>, "kernels/gemm/gemm.h" and
// "runtime/threading.h". It is compiled once per ISA under that ISA's flags; it has no include
// guard on purpose (like gemm_driver_inl.h) and includes only gemm_rowwise_inl.h, the work split
// it shares with the vdpbf16ps GEMM.
//
// The including file defines before the #include:
//   constexpr long kMR, kNR;     register tile: kMR rows of A × kNR output features
//   constexpr long kKGroup;      k per column in one group of a panel: 4 (vpdpbusd, vpmaddubsw
//                                pairs, SDOT) or 8 (SMMLA: two columns' 8 k are one 2×8 operand)
//   constexpr bool kUnsignedA;   A rows are stored as u8 = qa + 128 (vpdpbusd) and the packed
//                                compensation 128·Σ_k q[j][k] is subtracted from every sum;
//                                otherwise A rows are stored as s8 qa
// and, after it, quantize_row, tile_kernel and finish_row_act declared below.
//
// Packed W (bytes): scales [Np] float, comp [Np] int32 (128·Σ_k q[j][k], wrapping), then
// Np / kNR panels, panel p holding q[p·kNR + j][G·g + t] at [(g·kNR + j)·G + t] for the Kp / G
// groups g of G = kKGroup k (Np = N rounded up to kNR, Kp = K rounded up to G; padding is zero).
// One k group of a panel is kNR·G contiguous bytes: with G = 4, kNR int32 lanes of vpdpbusd /
// vpmaddubsw pairs / SDOT; with G = 8, kNR / 2 SMMLA operands of 2 columns × 8 k.
//
// Integer exactness: the sums of vpdpbusd wrap modulo 2^32 (no saturation). Σ (qa+128)·q may leave
// the int32 range for long K, but Σ qa·q = Σ (qa+128)·q − 128·Σ q does not (K ≤ 2^17), so the
// wrapped difference is the exact sum.

// Provided by the including file.
// quantize_row: out[0, kp) = the row's quantized values (contract in gemm.h) in this level's A
//   format, k ≤ p < kp padded with the value of qa = 0; returns sa (0 for an all-zero row, NaN
//   with qa = 0 for a row holding a NaN or ±inf).
float quantize_row(const float* x, long k, long kp, uint8_t* out);
// tile_kernel: out[r·kNR + j] = Σ_p a[r·lda + p] ⊙ wp[p, j] (wrapping int32; before the
//   compensation) for r < rows ≤ kMR, all kNR columns; wp a packed panel, kp a multiple of kKGroup.
//   While it runs it may pull the ahead_lines 64-byte lines at `ahead` (part of the panel a later
//   tile reads from memory: PanelAhead in gemm_rowwise_inl.h) into L2; a level may ignore them.
void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out, const char* ahead,
                 long ahead_lines);
// finish_row_act<act>: c[j] = act(sa·scales[j]·float(acc[j] − comp[j]) + bias[j]) + residual[j],
//   j < ncols (comp, bias, residual may be null; residual may alias c). The float operations are
//   those of the scalar reference, in its order, unfused; the activation is the level's lane-wise
//   function, the one its activation kernel runs.
template <Activation kAct>
void finish_row_act(const int32_t* acc, const int32_t* comp, float sa, const float* scales, const float* bias,
                    const float* residual, float* c, long ncols);

// The epilogue of one finished tile row, with the activation chosen once per row.
inline void finish_row(const int32_t* acc, const int32_t* comp, float sa, const float* scales, const float* bias,
                       Activation act, const float* residual, float* c, long ncols) {
  switch (act) {
    case Activation::kRelu: return finish_row_act<Activation::kRelu>(acc, comp, sa, scales, bias, residual, c, ncols);
    case Activation::kGeluErf:
      return finish_row_act<Activation::kGeluErf>(acc, comp, sa, scales, bias, residual, c, ncols);
    case Activation::kGeluTanh:
      return finish_row_act<Activation::kGeluTanh>(acc, comp, sa, scales, bias, residual, c, ncols);
    case Activation::kSilu: return finish_row_act<Activation::kSilu>(acc, comp, sa, scales, bias, residual, c, ncols);
    case Activation::kQuickGelu:
      return finish_row_act<Activation::kQuickGelu>(acc, comp, sa, scales, bias, residual, c, ncols);
    default: return finish_row_act<Activation::kNone>(acc, comp, sa, scales, bias, residual, c, ncols);
  }
}

inline long i8_ceil_div(long a, long b) { return (a + b - 1) / b; }

std::size_t packed_bytes(long n, long k) {
  const long np = i8_ceil_div(n, kNR) * kNR, kp = i8_ceil_div(k, kKGroup) * kKGroup;
  return static_cast<std::size_t>(np) * (sizeof(float) + sizeof(int32_t)) + static_cast<std::size_t>(np) * kp;
}

// Panels split across the threads; each row's whole k groups copied as kKGroup-byte units (a 1.1B
// model quantized at load packs ~1e9 weights).
void pack(const int8_t* q, const float* scales, long n, long k, long ldq, uint8_t* out) {
  const long np = i8_ceil_div(n, kNR) * kNR, kp = i8_ceil_div(k, kKGroup) * kKGroup;
  const long groups = kp / kKGroup, whole = k / kKGroup, rest = k - whole * kKGroup;
  float* sc = reinterpret_cast<float*>(out);
  int32_t* comp = reinterpret_cast<int32_t*>(out + np * sizeof(float));
  int8_t* panels = reinterpret_cast<int8_t*>(out + np * (sizeof(float) + sizeof(int32_t)));
  parallel_ranges(np / kNR, 1, [&](long p0, long p1) {
    for (long p = p0; p < p1; ++p) {
      int8_t* panel = panels + p * kNR * kp;
      for (long jj = 0; jj < kNR; ++jj) {
        const long j = p * kNR + jj;
        int8_t* dst = panel + jj * kKGroup;
        if (j >= n) {
          sc[j] = 0.0f;
          comp[j] = 0;
          for (long g = 0; g < groups; ++g) std::memset(dst + g * kNR * kKGroup, 0, kKGroup);
          continue;
        }
        const int8_t* src = q + j * ldq;
        uint32_t s = 0;
        for (long t = 0; t < k; ++t) s += static_cast<uint32_t>(static_cast<int32_t>(src[t]));
        sc[j] = scales[j];
        comp[j] = static_cast<int32_t>(s * 128u);
        for (long g = 0; g < whole; ++g) std::memcpy(dst + g * kNR * kKGroup, src + g * kKGroup, kKGroup);
        if (rest > 0) {
          int8_t* last = dst + whole * kNR * kKGroup;
          std::memset(last, 0, kKGroup);
          std::memcpy(last, src + whole * kKGroup, rest);
        }
      }
    }
  });
}

// Below this many multiply-adds per thread a second thread costs more than it saves.
constexpr long kInt8MinMacsPerThread = 1L << 19;

#include "kernels/gemm/gemm_rowwise_inl.h"

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const long np = i8_ceil_div(n, kNR) * kNR, kp = i8_ceil_div(k, kKGroup) * kKGroup;
  const float* scales = reinterpret_cast<const float*>(w.bytes());
  const int32_t* comp = reinterpret_cast<const int32_t*>(w.bytes() + np * sizeof(float));
  const int8_t* panels = reinterpret_cast<const int8_t*>(w.bytes() + np * (sizeof(float) + sizeof(int32_t)));

  // Quantized A ([m][kp] bytes, 64-byte aligned rows start) and sa [m], rowwise_copies(m) copies
  // 64-byte aligned, allocated here: no exception may leave the parallel region.
  const std::size_t qa_floats = (static_cast<std::size_t>(m) * kp + 63) / 64 * 16;
  const std::size_t copy_floats = (qa_floats + static_cast<std::size_t>(m) + 15) / 16 * 16;
  float* scratch = gemm_thread_scratch(copy_floats * static_cast<std::size_t>(rowwise_copies(m)));

  rowwise_gemm(
      m, n, k, kInt8MinMacsPerThread,
      [&](long i, long copy) {
        float* base = scratch + copy * copy_floats;
        base[qa_floats + i] = quantize_row(a + i * lda, k, kp, reinterpret_cast<uint8_t*>(base) + i * kp);
      },
      [&](long i0, long rows, long j0, long ncols, long copy, const PanelAhead& ahead) {
        const float* base = scratch + copy * copy_floats;
        const uint8_t* qa = reinterpret_cast<const uint8_t*>(base);
        const float* sa = base + qa_floats;
        alignas(64) int32_t acc[kMR * kNR];
        prefetch_tile_output(c + i0 * ldc + j0, ldc, rows, ncols);
        const PanelLines next = ahead.lines(panels + ahead.j0 * kp, kNR * kp);
        tile_kernel(rows, qa + i0 * kp, kp, panels + j0 * kp, kp, acc, next.begin, next.count);
        for (long r = 0; r < rows; ++r) {
          const long i = i0 + r;
          finish_row(acc + r * kNR, kUnsignedA ? comp + j0 : nullptr, sa[i], scales + j0,
                     epilogue.bias ? epilogue.bias + j0 : nullptr, epilogue.activation,
                     epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr, c + i * ldc + j0, ncols);
        }
      });
}
