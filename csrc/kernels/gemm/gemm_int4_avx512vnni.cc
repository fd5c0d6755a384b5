// AVX512-VNNI int4 GEMM (see Int4GemmKernels in gemm.h for the arithmetic; it matches the scalar
// reference bit for bit). vpdpbusd multiplies the u8 nibbles u ∈ [0, 15] by the s8 activations qa
// and adds groups of 4 products straight into int32 lanes; each group's sums start at −z·Σqa, so
// they end at t exactly (|t| < 2^19), and acc = fma(s, t, acc) per group in order, as the reference.
//
// Packed layout: gemm_int4_layout_inl.h, the same as the avx2 level's (one packing for every level).
// A zmm register holds one 32-byte nibble block of each of two neighbouring panels: lanes 0-7 are
// the 8 features of panel p, lanes 8-15 those of panel p + 1, so one broadcast 4-byte group of a
// row of A feeds 16 features. Register tile: up to 8 rows × 16 features (per row a zmm of int32
// sums and one of float accumulators; up to 2 rows, the low and high nibbles sum in two chains).
// A decode step (one row) is a GEMV that streams each panel once, pulling the next pair into L2;
// a prefill tile reuses every unpacked block across its 8 rows, and a row block (64 rows) reuses
// the panel pair from L1/L2.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx512.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512vnni {
extern const Int4GemmKernels kInt4GemmKernels;
namespace {

constexpr long kMR = 8;
constexpr long kNR = 16;  // two panels of 8 features
constexpr bool kUnsignedA = false;  // A rows as signed int8 (quantize_row of the int8 kernels)

// gemm_int8_avx512_inl.h: quantize_row, i8_activate, i8_mask16 (the int8 GEMM's A quantization and
// epilogue pieces).
#include "kernels/gemm/gemm_int4_layout_inl.h"
#include "kernels/gemm/gemm_int8_avx512_inl.h"
#include "kernels/gemm/gemm_rowwise_inl.h"

// facc[r] = Σ_g s[g]·t[g] for rows r < R and the 16 features of the panels at `panel` and
// `panel + stride` (stride 0 for a lone last panel: its copy in lanes 8-15 is not stored by the
// caller), in the fused order of gemm.h, stored to out[r·16 ..]. kBlocks = G / 8; full_stride is
// the bytes of one panel.
template <int R, int kBlocks, bool kZeroPoint>
__attribute__((always_inline)) inline void tile_rows(const int8_t* a, long lda, const int32_t* start, long groups,
                                                     const uint8_t* panel, long stride, long header, float* out,
                                                     long full_stride) {
  constexpr bool kTwoChains = R <= 2;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const uint8_t* panel1 = panel + stride;
  const uint16_t* scales0 = reinterpret_cast<const uint16_t*>(panel);
  const uint16_t* scales1 = reinterpret_cast<const uint16_t*>(panel1);
  const uint8_t* zeros0 = panel + groups * kInt4Panel * 2;
  const uint8_t* zeros1 = panel1 + groups * kInt4Panel * 2;
  const uint8_t* block0 = panel + header;
  const uint8_t* block1 = panel1 + header;
  __m512 facc[R];
  for (int r = 0; r < R; ++r) facc[r] = _mm512_setzero_ps();
  // The next panel pair is pulled into L2 while this one is multiplied, a line per block and one
  // per group (2 · stride bytes in all; past the last pair, prefetches are harmless): a one-row
  // GEMV is bound by memory, and the hardware prefetcher alone (plus the near prefetches below)
  // left it at about half the read bandwidth of the int8 GEMV.
  const char* ahead = reinterpret_cast<const char*>(panel) + 2 * full_stride;
  for (long g = 0; g < groups; ++g) {
    _mm_prefetch(ahead, _MM_HINT_T1);
    ahead += 64;
    // The sums of a row start at −z·Σqa (start[] holds −8·Σqa, or −Σqa with zero points). Up to 2
    // rows, the low and high nibbles sum in separate chains (latency); more rows give enough.
    __m512i dot_lo[R], dot_hi[R];
    if (kZeroPoint) {
      const __m128i z8 = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros0 + g * kInt4Panel)),
                                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(zeros1 + g * kInt4Panel)));
      const __m512i z = _mm512_cvtepu8_epi32(z8);
      for (int r = 0; r < R; ++r) dot_lo[r] = _mm512_mullo_epi32(z, _mm512_set1_epi32(start[r * groups + g]));
    } else {
      for (int r = 0; r < R; ++r) dot_lo[r] = _mm512_set1_epi32(start[r * groups + g]);
    }
    if (kTwoChains)
      for (int r = 0; r < R; ++r) dot_hi[r] = _mm512_setzero_si512();
    const long k_group = g * kBlocks * 8;
    for (int b = 0; b < kBlocks; ++b, block0 += 32, block1 += 32) {
      _mm_prefetch(ahead, _MM_HINT_T1);
      ahead += 64;
      if (b % 2 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(block0) + kInt4PrefetchDistance, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(block1) + kInt4PrefetchDistance, _MM_HINT_T0);
      }
      const __m512i w =
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(block0))),
                             _mm256_load_si256(reinterpret_cast<const __m256i*>(block1)), 1);
      const __m512i w_lo = _mm512_and_si512(w, low);
      // With two chains the high nibbles stay in place (16·u, one operation instead of a shift and
      // an AND): their chain sums 16 times the products, exactly, and is shifted back per group.
      const __m512i w_hi = kTwoChains ? _mm512_andnot_si512(low, w) : _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
      const long k0 = k_group + 8 * b;
      for (int r = 0; r < R; ++r) {
        int32_t a_lo, a_hi;
        std::memcpy(&a_lo, a + r * lda + k0, 4);
        std::memcpy(&a_hi, a + r * lda + k0 + 4, 4);
        dot_lo[r] = _mm512_dpbusd_epi32(dot_lo[r], w_lo, _mm512_set1_epi32(a_lo));
        __m512i& hi = kTwoChains ? dot_hi[r] : dot_lo[r];
        hi = _mm512_dpbusd_epi32(hi, w_hi, _mm512_set1_epi32(a_hi));
      }
    }
    const __m256i s16 = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales0 + g * kInt4Panel))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales1 + g * kInt4Panel)), 1);
    const __m512 scale = _mm512_cvtph_ps(s16);
    for (int r = 0; r < R; ++r) {
      const __m512i t = kTwoChains ? _mm512_add_epi32(dot_lo[r], _mm512_srai_epi32(dot_hi[r], 4)) : dot_lo[r];
      facc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(t), facc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_store_ps(out + r * kNR, facc[r]);
}

// A pair of panels, or the last panel alone when ncols ≤ 8 (its copy in lanes 8-15 is not stored).
template <int kBlocks, bool kZeroPoint>
void tile_kernel(long rows, const int8_t* a, long lda, const int32_t* start, long groups, const uint8_t* panel,
                 long ncols, long full_stride, long header, float* out) {
  const long stride = ncols > kInt4Panel ? full_stride : 0;
  switch (rows) {
    case 8: return tile_rows<8, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    case 7: return tile_rows<7, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    case 6: return tile_rows<6, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    case 5: return tile_rows<5, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    case 4: return tile_rows<4, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    case 3: return tile_rows<3, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    case 2: return tile_rows<2, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
    default: return tile_rows<1, kBlocks, kZeroPoint>(a, lda, start, groups, panel, stride, header, out, full_stride);
  }
}

using TileFunction = void (*)(long, const int8_t*, long, const int32_t*, long, const uint8_t*, long, long, long,
                              float*);

TileFunction select_tile(long group_size, bool zero_point) {
  switch (group_size) {
    case 64: return zero_point ? tile_kernel<8, true> : tile_kernel<8, false>;
    case 128: return zero_point ? tile_kernel<16, true> : tile_kernel<16, false>;
    default: return zero_point ? tile_kernel<4, true> : tile_kernel<4, false>;
  }
}

// c[j] = act(sa·acc[j] + bias[j]) + residual[j] for j < ncols ≤ 16, in the scalar reference's order.
template <Activation kAct>
void finish_int4_row(const float* acc, float sa, const float* bias, const float* residual, float* c, long ncols) {
  const __mmask16 mask = i8_mask16(ncols);
  __m512 v = _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_load_ps(acc));
  __asm__("" : "+v"(v));  // keeps the compiler from fusing the multiply and the add (bit-exact)
  if (bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias));
  v = i8_activate<kAct>(v);
  if (residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual));
  _mm512_mask_storeu_ps(c, mask, v);
}

void finish_row(const float* acc, float sa, const float* bias, Activation act, const float* residual, float* c,
                long ncols) {
  switch (act) {
    case Activation::kRelu: return finish_int4_row<Activation::kRelu>(acc, sa, bias, residual, c, ncols);
    case Activation::kGeluErf: return finish_int4_row<Activation::kGeluErf>(acc, sa, bias, residual, c, ncols);
    case Activation::kGeluTanh: return finish_int4_row<Activation::kGeluTanh>(acc, sa, bias, residual, c, ncols);
    case Activation::kSilu: return finish_int4_row<Activation::kSilu>(acc, sa, bias, residual, c, ncols);
    case Activation::kQuickGelu: return finish_int4_row<Activation::kQuickGelu>(acc, sa, bias, residual, c, ncols);
    default: return finish_int4_row<Activation::kNone>(acc, sa, bias, residual, c, ncols);
  }
}

// Σ of the G int8 values at row (G = 32, 64 or 128), with vpdpbusd against ones.
inline int32_t group_sum(const int8_t* row, long group_size) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i s = _mm512_setzero_si512();
  for (long p = 0; p < group_size; p += 64) {
    const __mmask64 mask = group_size - p >= 64 ? ~0ULL : (1ULL << (group_size - p)) - 1;
    s = _mm512_dpbusd_epi32(s, ones, _mm512_maskz_loadu_epi8(mask, row + p));
  }
  return _mm512_reduce_add_epi32(s);
}

// qa (s8, zero-padded to kp) and sa: the int8 kernels' row quantization.
inline float int4_quantize_row(const float* a, long k, long kp, int8_t* row) {
  return quantize_row(a, k, kp, reinterpret_cast<uint8_t*>(row));
}

// The tile starts each group's sums at −z·Σqa: −8·Σqa, or −Σqa times the zero points it loads.
inline int32_t int4_group_value(const int8_t* row, long group_size, bool zero_point) {
  return (zero_point ? -1 : -8) * group_sum(row, group_size);
}

#include "kernels/gemm/gemm_int4_driver_inl.h"

}  // namespace

const Int4GemmKernels kInt4GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx512vnni
}  // namespace cpuformer
