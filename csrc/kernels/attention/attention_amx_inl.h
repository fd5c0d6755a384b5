// The AMX pieces of the bfloat16 query-block attention engine (AttentionArgs::bf16_products), used by
// attention_tiled_inl.h when it is compiled in attention_avx512amx.cc (CPUFORMER_ATTENTION_AMX): the
// two products of a key block run on TDPBF16PS tiles instead of vdpbf16ps, with the same operands
// (rounded to bfloat16 the same way) and float32 sums in the tiles' order. The softmax, the masks and
// everything else stay the engine's. Include only from *_avx512amx.cc files; everything lives in
// cpuformer::avx512amx::attention_amx.
//
// TDPBF16PS C[m][n] += Σ_p A[m][2p]·B[p][2n] + A[m][2p+1]·B[p][2n+1] (16 × 16 float32 C, A 16 rows
// of 32 bfloat16, B 16 rows of 16 bfloat16 pairs; tiles configured by configure_tiles_16x64). With
// the query rows in the columns of C both products match the engine's transposed layouts:
//   scores  s[key][row] = K rows (A: 16 keys × 32 d) · Qᵀ pairs (B: 16 d pairs × 16 rows)
//   P·V     accᵀ[d][row] += Vᵀ (A: 16 d × 32 keys) · P pairs (B: 16 key pairs × 16 rows)
// so K is kept as rows [Tk32][D] (the vdpbf16ps engine's convert_keys) and V transposed, [D][Tk32],
// both with the keys padded with zeros to Tk32 = kv_len rounded up to 32.
//
// GCC's tile loads do not tell the compiler that they read memory: the callers' vector stores of
// the operands are ordered before them by an explicit compiler barrier.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/attention/attention_simd_avx512.h"

namespace cpuformer {
namespace avx512amx {
namespace attention_amx {

inline void compiler_barrier() { __asm__ volatile("" : : : "memory"); }

// Vᵀ of one (batch, kv head) in bfloat16, dst [D][tkp] (keys ≥ kv_len zero): 16 × 16 blocks through
// the kernel's in-register transpose, rounded by vcvtneps2bf16 (nearest even, as pack_pairs).
inline void convert_values_transposed(const float* v, long v_stride, long kv_len, long tkp, long dim, uint16_t* dst) {
  for (long t0 = 0; t0 < tkp; t0 += 16) {
    for (long d0 = 0; d0 < dim; d0 += 16) {
      __m512 block[16];
      for (int i = 0; i < 16; ++i)
        block[i] = t0 + i < kv_len ? _mm512_loadu_ps(v + (t0 + i) * v_stride + d0) : _mm512_setzero_ps();
      avx512::attention_simd::transpose(block);  // block[j]: d0 + j over keys t0 .. t0 + 15
      for (int j = 0; j < 16; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (d0 + j) * tkp + t0),
                            (__m256i)_mm512_cvtneps_pbh(block[j]));
    }
  }
}

// s[j][lane] = Σ_d k[j][d] · q[lane][d] for the 16 keys of k (rows of dim bfloat16 from the block's
// key j0 + j); qt2: Qᵀ pairs [dim / 2][16]. dim a multiple of 32.
inline void scores16(const uint16_t* k, long dim, const uint32_t* qt2, float* s) {
  _tile_zero(0);
  for (long d0 = 0; d0 < dim; d0 += 32) {
    _tile_loadd(1, k + d0, dim * static_cast<long>(sizeof(uint16_t)));
    _tile_loadd(2, qt2 + d0 / 2 * 16, 64);
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, s, 64);
}

// accᵀ[d][lane] += Σ_key P[key][lane] · v[key][d] over 32 keys: p2 their 16 pairs [16][16], vt the
// block's first key in Vᵀ (row stride tkp). accᵀ [dim][16], dim a multiple of 16.
inline void pv32(float* acct, const uint32_t* p2, const uint16_t* vt, long tkp, long dim) {
  compiler_barrier();  // acct and p2 were just stored by vector code
  _tile_loadd(2, p2, 64);
  for (long d0 = 0; d0 < dim; d0 += 16) {
    _tile_loadd(0, acct + d0 * 16, 64);
    _tile_loadd(1, vt + d0 * tkp, tkp * static_cast<long>(sizeof(uint16_t)));
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, acct + d0 * 16, 64);
  }
}

}  // namespace attention_amx
}  // namespace avx512amx
}  // namespace cpuformer
