// AVX2 int4 GEMM (see Int4GemmKernels in gemm.h for the arithmetic; it matches the scalar reference
// bit for bit). The weights are unsigned nibbles u ∈ [0, 15] and the A rows signed int8, so
// vpmaddubsw multiplies them directly: each int16 pair sum is at most 2·15·127 = 3810, and eight of
// them (32 input channels) at most 30480, so products are summed in int16 over 32 channels and
// widened to int32 once (vpmaddwd with ones) — one widening per 32 channels instead of per 4.
//
// Register tile: up to 4 rows × 8 output features. Packed W: ceil(N / 8) panels of 8 features; a
// panel holds its scales [groups][8] float16, then (with zero points) its zero points [groups][8]
// bytes, padded to 32 bytes, then for each group G / 8 blocks of 32 bytes: block b of group g
// holds, at byte 4·jj + t, u[j][k0 + t] in the low nibble and u[j][k0 + 4 + t] in the high one
// (k0 = g·G + 8·b, j the panel's feature jj), so the low nibbles form vpmaddubsw's int32 lanes for
// channels k0..k0+3 of the 8 features and the high nibbles those for k0+4..k0+7. Padding features
// have scale 0 and nibbles 0.
// The avx512 level uses this kernel too (gemm.cc): a 512-bit / VNNI variant is not written yet.
#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx2.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx2 {
namespace {

constexpr long kMR = 4;
constexpr long kNR = 8;
constexpr bool kUnsignedA = false;  // A rows as signed int8 (quantize_row of the int8 kernels)

// quantize_row, i8_activate, i8_mask8: the int8 GEMM's A quantization and epilogue pieces.
#include "kernels/gemm/gemm_int8_avx2_inl.h"
#include "kernels/gemm/gemm_rowwise_inl.h"

inline long ceil_div(long a, long b) { return (a + b - 1) / b; }

// Bytes ahead of the block being multiplied that are prefetched: a decode step (one row) streams
// the weights once and is bound by memory, where the hardware prefetcher alone left ~20 % of the
// read bandwidth unused with groups of 32 (two streams per panel: scales and nibbles).
constexpr long kPrefetchDistance = 1024;

// Bytes of a panel's scales and zero points, padded so its nibble blocks start 32-byte aligned.
inline long header_bytes(long groups, bool zero_point) {
  return ceil_div(groups * kNR * (2 + (zero_point ? 1 : 0)), 32) * 32;
}

inline long panel_bytes(long groups, long group_size, bool zero_point) {
  return header_bytes(groups, zero_point) + groups * group_size * kNR / 2;
}

std::size_t packed_bytes(long n, long k, long group_size, bool zero_point) {
  const long groups = int4_groups(k, group_size);
  return static_cast<std::size_t>(ceil_div(n, kNR)) * panel_bytes(groups, group_size, zero_point);
}

void pack(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long k, long group_size,
          uint8_t* out) {
  const long groups = int4_groups(k, group_size), kp = groups * group_size;
  const bool zero_point = zeros != nullptr;
  const long stride = panel_bytes(groups, group_size, zero_point), header = header_bytes(groups, zero_point);
  std::memset(out, 0, packed_bytes(n, k, group_size, zero_point));
  auto nibble = [&](long j, long p) -> uint8_t {
    const uint8_t byte = u[j * (kp / 2) + p / 2];
    return p % 2 == 0 ? byte & 0x0F : byte >> 4;
  };
  for (long p0 = 0; p0 < n; p0 += kNR) {
    uint8_t* panel = out + (p0 / kNR) * stride;
    uint16_t* panel_scales = reinterpret_cast<uint16_t*>(panel);
    uint8_t* panel_zeros = panel + groups * kNR * 2;
    uint8_t* blocks = panel + header;
    for (long jj = 0; jj < kNR && p0 + jj < n; ++jj) {
      const long j = p0 + jj;
      for (long g = 0; g < groups; ++g) {
        panel_scales[g * kNR + jj] = scales[j * groups + g];
        if (zero_point) panel_zeros[g * kNR + jj] = zeros[j * groups + g];
        for (long b = 0; b < group_size / 8; ++b) {
          const long k0 = g * group_size + 8 * b;
          uint8_t* block = blocks + (g * (group_size / 8) + b) * 32;
          for (long t = 0; t < 4; ++t)
            block[4 * jj + t] = static_cast<uint8_t>(nibble(j, k0 + t) | (nibble(j, k0 + 4 + t) << 4));
        }
      }
    }
  }
}

// facc[r] = Σ_g s[g]·t[g] over the panel for rows r < R (the fused order of gemm.h), stored to
// out[r·kNR ..]. kChunks = G / 32: int16 sums of 32 channels widened to int32 and added per group.
template <int R, int kChunks, bool kZeroPoint>
__attribute__((always_inline)) inline void tile_rows(const int8_t* a, long lda, const int32_t* asum, long groups,
                                                     const uint8_t* panel, long header, float* out) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(panel);
  const uint8_t* zeros = panel + groups * kNR * 2;
  const uint8_t* block = panel + header;
  __m256 facc[R];
  for (int r = 0; r < R; ++r) facc[r] = _mm256_setzero_ps();
  for (long g = 0; g < groups; ++g) {
    __m256i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
    const long k_group = g * kChunks * 32;
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      __m256i sum16[R];
      for (int r = 0; r < R; ++r) sum16[r] = _mm256_setzero_si256();
      for (int b = 0; b < 4; ++b, block += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchDistance, _MM_HINT_T0);
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(block));
        const __m256i w_lo = _mm256_and_si256(w, low);
        const __m256i w_hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
        const long k0 = k_group + chunk * 32 + 8 * b;
        for (int r = 0; r < R; ++r) {
          int32_t a_lo, a_hi;
          std::memcpy(&a_lo, a + r * lda + k0, 4);
          std::memcpy(&a_hi, a + r * lda + k0 + 4, 4);
          const __m256i p_lo = _mm256_maddubs_epi16(w_lo, _mm256_set1_epi32(a_lo));
          const __m256i p_hi = _mm256_maddubs_epi16(w_hi, _mm256_set1_epi32(a_hi));
          sum16[r] = _mm256_add_epi16(sum16[r], _mm256_add_epi16(p_lo, p_hi));
        }
      }
      for (int r = 0; r < R; ++r) dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(sum16[r], ones));
    }
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + g * kNR)));
    __m256i zero = _mm256_setzero_si256();
    if (kZeroPoint) {
      zero = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros + g * kNR)));
    }
    for (int r = 0; r < R; ++r) {
      const int32_t s = asum[r * groups + g];
      const __m256i offset = kZeroPoint ? _mm256_mullo_epi32(zero, _mm256_set1_epi32(s)) : _mm256_set1_epi32(8 * s);
      const __m256i t = _mm256_sub_epi32(dot[r], offset);
      facc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(t), facc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_store_ps(out + r * kNR, facc[r]);
}

template <int kChunks, bool kZeroPoint>
void tile_kernel(long rows, const int8_t* a, long lda, const int32_t* asum, long groups, const uint8_t* panel,
                 long header, float* out) {
  switch (rows) {
    case 4: return tile_rows<4, kChunks, kZeroPoint>(a, lda, asum, groups, panel, header, out);
    case 3: return tile_rows<3, kChunks, kZeroPoint>(a, lda, asum, groups, panel, header, out);
    case 2: return tile_rows<2, kChunks, kZeroPoint>(a, lda, asum, groups, panel, header, out);
    default: return tile_rows<1, kChunks, kZeroPoint>(a, lda, asum, groups, panel, header, out);
  }
}

using TileFunction = void (*)(long, const int8_t*, long, const int32_t*, long, const uint8_t*, long, float*);

TileFunction select_tile(long group_size, bool zero_point) {
  switch (group_size) {
    case 64: return zero_point ? tile_kernel<2, true> : tile_kernel<2, false>;
    case 128: return zero_point ? tile_kernel<4, true> : tile_kernel<4, false>;
    default: return zero_point ? tile_kernel<1, true> : tile_kernel<1, false>;
  }
}

// c[j] = act(sa·acc[j] + bias[j]) + residual[j] for j < ncols ≤ 8, in the scalar reference's order.
template <Activation kAct>
void finish_row_act(const float* acc, float sa, const float* bias, const float* residual, float* c, long ncols) {
  const bool tail = ncols < kNR;
  const __m256i mask = i8_mask8(ncols);
  __m256 v = _mm256_mul_ps(_mm256_set1_ps(sa), _mm256_load_ps(acc));
  __asm__("" : "+x"(v));  // keeps the compiler from fusing the multiply and the add (bit-exact)
  if (bias != nullptr) v = _mm256_add_ps(v, tail ? _mm256_maskload_ps(bias, mask) : _mm256_loadu_ps(bias));
  v = i8_activate<kAct>(v);
  if (residual != nullptr) v = _mm256_add_ps(v, tail ? _mm256_maskload_ps(residual, mask) : _mm256_loadu_ps(residual));
  if (tail) {
    _mm256_maskstore_ps(c, mask, v);
  } else {
    _mm256_storeu_ps(c, v);
  }
}

void finish_row(const float* acc, float sa, const float* bias, Activation act, const float* residual, float* c,
                long ncols) {
  switch (act) {
    case Activation::kRelu: return finish_row_act<Activation::kRelu>(acc, sa, bias, residual, c, ncols);
    case Activation::kGeluErf: return finish_row_act<Activation::kGeluErf>(acc, sa, bias, residual, c, ncols);
    case Activation::kGeluTanh: return finish_row_act<Activation::kGeluTanh>(acc, sa, bias, residual, c, ncols);
    case Activation::kSilu: return finish_row_act<Activation::kSilu>(acc, sa, bias, residual, c, ncols);
    case Activation::kQuickGelu: return finish_row_act<Activation::kQuickGelu>(acc, sa, bias, residual, c, ncols);
    default: return finish_row_act<Activation::kNone>(acc, sa, bias, residual, c, ncols);
  }
}

// Below this many multiply-adds per thread a second thread costs more than it saves.
constexpr long kInt4MinMacsPerThread = 1L << 19;

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k, group_size = w.group_size, groups = int4_groups(k, group_size);
  const long kp = groups * group_size;
  const long stride = panel_bytes(groups, group_size, w.zero_point), header = header_bytes(groups, w.zero_point);
  const TileFunction tile = select_tile(group_size, w.zero_point);

  // Quantized A ([m][kp] bytes), sa [m] and the group sums of qa [m][groups], allocated here: no
  // exception may leave the parallel region.
  const std::size_t qa_floats = (static_cast<std::size_t>(m) * kp + 63) / 64 * 16;
  const std::size_t asum_floats = static_cast<std::size_t>(m) * groups;
  float* scratch = gemm_thread_scratch(qa_floats + asum_floats + static_cast<std::size_t>(m));
  int8_t* qa = reinterpret_cast<int8_t*>(scratch);
  int32_t* asum = reinterpret_cast<int32_t*>(scratch + qa_floats);
  float* sa = scratch + qa_floats + asum_floats;

  rowwise_gemm(
      m, n, k, kInt4MinMacsPerThread,
      [&](long i) {
        int8_t* row = qa + i * kp;
        sa[i] = quantize_row(a + i * lda, k, kp, reinterpret_cast<uint8_t*>(row));
        for (long g = 0; g < groups; ++g) {
          int32_t s = 0;
          for (long p = g * group_size; p < (g + 1) * group_size; ++p) s += row[p];
          asum[i * groups + g] = s;
        }
      },
      [&](long i0, long rows, long j0, long ncols) {
        alignas(32) float acc[kMR * kNR];
        tile(rows, qa + i0 * kp, kp, asum + i0 * groups, groups, w.data.data() + (j0 / kNR) * stride, header, acc);
        for (long r = 0; r < rows; ++r) {
          const long i = i0 + r;
          finish_row(acc + r * kNR, sa[i], epilogue.bias ? epilogue.bias + j0 : nullptr, epilogue.activation,
                     epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr, c + i * ldc + j0, ncols);
        }
      });
}

}  // namespace

const Int4GemmKernels kInt4GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx2
}  // namespace cpuformer
