// Pieces of the bfloat16 GEMMs shared by the vdpbf16ps kernel (gemm_half_avx512bf16.cc) and the
// AMX kernel (gemm_half_avx512amx.cc): rounding A rows to bfloat16 and the epilogue of a finished
// row. Include INSIDE the ISA namespace (anonymous namespace) of a translation unit compiled with
// AVX512-BF16, after <immintrin.h>, <cstring> and "kernels/activation/activation.h"; no include
// guard on purpose.

inline __mmask16 mask16(long left) {
  if (left >= 16) return 0xFFFF;
  if (left <= 0) return 0;
  return static_cast<__mmask16>((1u << left) - 1);
}

// out[0, kp) = bfloat16 of x[0, k), zero past k.
inline void convert_row(const float* x, long k, long kp, uint16_t* out) {
  for (long p = 0; p < k; p += 16) {
    const __mmask16 mask = mask16(k - p);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + p));
    __m256i bits;
    std::memcpy(&bits, &h, sizeof(bits));
    _mm256_mask_storeu_epi16(out + p, mask, bits);
  }
  if (kp > k) out[k] = 0;
}

// c[j] = act(acc[j] + bias[j]) + residual[j] for j < ncols (bias, residual may be null; residual
// may alias c).
inline void finish_row(float* acc, const float* bias, Activation act, const float* residual, float* c, long ncols) {
  if (bias != nullptr) {
    for (long j = 0; j < ncols; j += 16) {
      const __mmask16 mask = mask16(ncols - j);
      _mm512_store_ps(acc + j, _mm512_add_ps(_mm512_load_ps(acc + j), _mm512_maskz_loadu_ps(mask, bias + j)));
    }
  }
  if (act != Activation::kNone) avx512::kActivationKernels.apply(act, acc, acc, ncols);
  for (long j = 0; j < ncols; j += 16) {
    const __mmask16 mask = mask16(ncols - j);
    __m512 v = _mm512_load_ps(acc + j);
    if (residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + j));
    _mm512_mask_storeu_ps(c + j, mask, v);
  }
}
