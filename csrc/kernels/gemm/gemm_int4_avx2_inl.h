// The 256-bit int4 GEMM of the avx2 level (see Int4GemmKernels in gemm.h for the arithmetic; it
// matches the scalar reference bit for bit), shared by gemm_int4_avx2.cc (vpmaddubsw) and
// gemm_int4_avxvnni.cc (AVX-VNNI vpdpbusd). Packed layout: gemm_int4_layout_inl.h. Register tile:
// up to 4 rows × one panel of 8 features.
//
// Include INSIDE the ISA namespace (in an anonymous namespace) after gemm_int8_avx2_inl.h (for
// quantize_row, i8_activate, i8_mask8), gemm_rowwise_inl.h and gemm_int4_layout_inl.h; no include
// guard on purpose. The GEMM itself is the shared driver (gemm_int4_driver_inl.h). The including file defines kMR = 4,
// kNR = 8 and
//   struct Int4Dot {
//     // part + the products of the 8 channels of one block: w_lo / w_hi the low / high nibbles
//     // (u8, 4 channels per int32 lane), a_lo / a_hi the 4 matching s8 activations broadcast.
//     static __m256i step(__m256i part, __m256i w_lo, __m256i w_hi, __m256i a_lo, __m256i a_hi);
//     static __m256i add_part(__m256i dot, __m256i part);  // dot (int32 lanes) + part, exact
//   };
// where a part holds at most 32 channels (4 blocks).

// facc[r] = Σ_g s[g]·t[g] over the panel for rows r < R (the fused order of gemm.h), stored to
// out[r·kNR ..]. kChunks = G / 32: Int4Dot sums each chunk of 32 channels (its `part`), then adds
// it to the group's int32 sums. stride: the bytes of one panel (the next one is prefetched).
template <int R, int kChunks, bool kZeroPoint>
__attribute__((always_inline)) inline void tile_rows(const int8_t* a, long lda, const int32_t* asum, long groups,
                                                     const uint8_t* panel, long stride, long header, float* out) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(panel);
  const uint8_t* zeros = panel + groups * kNR * 2;
  const uint8_t* block = panel + header;
  __m256 facc[R];
  for (int r = 0; r < R; ++r) facc[r] = _mm256_setzero_ps();
  // The next panel is pulled into L2 while this one is multiplied, a line per two blocks and one
  // per group (stride bytes in all; past the last panel, prefetches are harmless): a one-row GEMV
  // is bound by memory, and the near prefetches alone left it well below the int8 GEMV's rate.
  const char* ahead = reinterpret_cast<const char*>(panel) + stride;
  for (long g = 0; g < groups; ++g) {
    _mm_prefetch(ahead, _MM_HINT_T1);
    ahead += 64;
    __m256i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
    const long k_group = g * kChunks * 32;
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      __m256i part[R];
      for (int r = 0; r < R; ++r) part[r] = _mm256_setzero_si256();
      for (int b = 0; b < 4; ++b, block += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(block) + kInt4PrefetchDistance, _MM_HINT_T0);
        if (b % 2 == 1) {
          _mm_prefetch(ahead, _MM_HINT_T1);
          ahead += 64;
        }
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(block));
        const __m256i w_lo = _mm256_and_si256(w, low);
        const __m256i w_hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
        const long k0 = k_group + chunk * 32 + 8 * b;
        for (int r = 0; r < R; ++r) {
          int32_t a_lo, a_hi;
          std::memcpy(&a_lo, a + r * lda + k0, 4);
          std::memcpy(&a_hi, a + r * lda + k0 + 4, 4);
          part[r] = Int4Dot::step(part[r], w_lo, w_hi, _mm256_set1_epi32(a_lo), _mm256_set1_epi32(a_hi));
        }
      }
      for (int r = 0; r < R; ++r) dot[r] = Int4Dot::add_part(dot[r], part[r]);
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
                 long /*ncols: one panel*/, long stride, long header, float* out) {
  switch (rows) {
    case 4: return tile_rows<4, kChunks, kZeroPoint>(a, lda, asum, groups, panel, stride, header, out);
    case 3: return tile_rows<3, kChunks, kZeroPoint>(a, lda, asum, groups, panel, stride, header, out);
    case 2: return tile_rows<2, kChunks, kZeroPoint>(a, lda, asum, groups, panel, stride, header, out);
    default: return tile_rows<1, kChunks, kZeroPoint>(a, lda, asum, groups, panel, stride, header, out);
  }
}

using TileFunction = void (*)(long, const int8_t*, long, const int32_t*, long, const uint8_t*, long, long, long,
                              float*);

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

// qa (s8, zero-padded to kp) and sa: the int8 kernels' row quantization.
inline float int4_quantize_row(const float* a, long k, long kp, int8_t* row) {
  return quantize_row(a, k, kp, reinterpret_cast<uint8_t*>(row));
}

// The tile reads each group's plain Σ qa (it multiplies it by 8 or by the zero points itself).
inline int32_t int4_group_value(const int8_t* row, long group_size, bool /*zero_point*/) {
  int32_t s = 0;
  for (long p = 0; p < group_size; ++p) s += row[p];
  return s;
}

#include "kernels/gemm/gemm_int4_driver_inl.h"
