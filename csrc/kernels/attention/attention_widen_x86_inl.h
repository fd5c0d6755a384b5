// The KV-cache row widening of the tiled attention kernel for the x86 levels (AVX2 + F16C
// instructions, shared by avx2 and avx512; 16 lanes at a time where the file is compiled with
// AVX-512): include only inside the attention_simd namespace of
// attention_simd_avx2.h / attention_simd_avx512.h. attention_simd_neon.h has the same functions
// for AArch64.

// 8 cache values from p as float32: float16 exactly (F16C), bfloat16 by a 16-bit shift (exact),
// int8 codes (not yet scaled).
inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline __m256 load8_s8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// kLanes cache values from p as float32, converted as load8_* converts them: the narrow engine
// reads the cache into registers with these, widen_* below writes them to scratch.
#ifdef __AVX512F__
inline __m512 vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 vload_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 vload_s8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#else
inline __m256 vload_f16(const uint16_t* p) { return load8_f16(p); }
inline __m256 vload_bf16(const uint16_t* p) { return load8_bf16(p); }
inline __m256 vload_s8(const int8_t* p) { return load8_s8(p); }
#endif

// dst[0, n) = the float16 values src[0, n) as float32 (exact).
inline void widen_f16(const uint16_t* src, float* dst, long n) {
  long x = 0;
#ifdef __AVX512F__
  for (; x + 16 <= n; x += 16) _mm512_storeu_ps(dst + x, vload_f16(src + x));
#endif
  for (; x + 8 <= n; x += 8) _mm256_storeu_ps(dst + x, load8_f16(src + x));
  for (; x < n; ++x) dst[x] = _cvtsh_ss(src[x]);
}

// dst[0, n) = the bfloat16 values src[0, n) as float32 (exact).
inline void widen_bf16(const uint16_t* src, float* dst, long n) {
  long x = 0;
#ifdef __AVX512F__
  for (; x + 16 <= n; x += 16) _mm512_storeu_ps(dst + x, vload_bf16(src + x));
#endif
  for (; x + 8 <= n; x += 8) _mm256_storeu_ps(dst + x, load8_bf16(src + x));
  for (; x < n; ++x) {
    const uint32_t bits = static_cast<uint32_t>(src[x]) << 16;
    __builtin_memcpy(dst + x, &bits, sizeof(float));
  }
}

// dst[0, n) = scale · src[0, n), one rounding per element as in the scalar level.
inline void widen_s8(const int8_t* src, float scale, float* dst, long n) {
  long x = 0;
#ifdef __AVX512F__
  for (; x + 16 <= n; x += 16) _mm512_storeu_ps(dst + x, _mm512_mul_ps(vload_s8(src + x), _mm512_set1_ps(scale)));
#endif
  for (; x + 8 <= n; x += 8) _mm256_storeu_ps(dst + x, _mm256_mul_ps(load8_s8(src + x), _mm256_set1_ps(scale)));
  for (; x < n; ++x) dst[x] = scale * static_cast<float>(src[x]);
}
