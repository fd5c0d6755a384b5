// AVX-512 pieces of the int8 GEMM shared by gemm_int8_avx512.cc (AVX-512BW, no VNNI) and
// gemm_int8_avx512vnni.cc: quantizing A rows and the epilogue of a finished row of a tile.
// Include INSIDE the ISA namespace (anonymous namespace) after gemm_int8_inl.h; like it, no
// include guard on purpose.

inline __mmask16 i8_mask16(long left) {
  if (left >= 16) return 0xFFFF;
  if (left <= 0) return 0;
  return static_cast<__mmask16>((1u << left) - 1);
}

// The same float operations as the scalar reference: amax by max (order-free), inv = 127 / amax,
// x · inv rounded to nearest even (MXCSR default) by vcvtps2dq. The max is taken over the bits of
// |x| as int32: they order like the values for finite |x|, and above every finite value lie +inf
// (0x7F800000) and then the NaNs, so one max finds amax and whether the row is finite.
float quantize_row(const float* x, long k, long kp, uint8_t* out) {
  __m512i vmax = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  for (long p = 0; p < k; p += 16) {
    const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(i8_mask16(k - p), x + p), abs_mask);
    vmax = _mm512_max_epi32(vmax, v);
  }
  const int32_t amax_bits = _mm512_reduce_max_epi32(vmax);
  const uint8_t zero = kUnsignedA ? 128 : 0;
  if (amax_bits >= 0x7F800000) {  // a NaN or ±inf: qa = 0 and sa = NaN, as the scalar reference
    std::memset(out, zero, static_cast<std::size_t>(kp));
    return __builtin_nanf("");
  }
  float amax;
  std::memcpy(&amax, &amax_bits, sizeof(amax));
  if (!(amax > 0.0f)) {
    std::memset(out, zero, static_cast<std::size_t>(kp));
    return 0.0f;
  }
  const float inv = 127.0f / amax;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i offset = _mm512_set1_epi32(kUnsignedA ? 128 : 0);
  // 64 values at a time: q in [-127, 127], so the saturating packs (int32 → int16 → int8, within
  // 128-bit lanes) are exact; one dword permutation restores the order, and q + 128 as a byte is
  // q XOR 0x80. Three shuffles per 64 values instead of four two-uop vpmovdb stores.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i flip = _mm512_set1_epi8(kUnsignedA ? static_cast<char>(0x80) : 0);
  long p = 0;
  for (; p + 64 <= k; p += 64) {
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + p), vinv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + p + 16), vinv));
    const __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + p + 32), vinv));
    const __m512i q3 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + p + 48), vinv));
    const __m512i bytes = _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3));
    _mm512_storeu_si512(out + p, _mm512_xor_si512(_mm512_permutexvar_epi32(order, bytes), flip));
  }
  for (; p < k; p += 16) {
    const __mmask16 mask = i8_mask16(k - p);
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + p), vinv));
    _mm512_mask_cvtepi32_storeu_epi8(out + p, mask, _mm512_add_epi32(q, offset));
  }
  for (long p = k; p < kp; ++p) out[p] = zero;
  return amax / 127.0f;
}

using avx512::gelu_erf_ps;
using avx512::gelu_tanh_ps;
using avx512::quick_gelu_ps;
using avx512::silu_ps;

// The activation is applied in registers with the lane-wise functions of vector_math_avx512.h,
// the ones kActivationKernels.apply runs on, so the result is the same bit for bit.
template <Activation kAct>
inline __m512 i8_activate(__m512 v) {
  switch (kAct) {
    case Activation::kRelu: return _mm512_max_ps(_mm512_setzero_ps(), v);  // NaN stays NaN (as apply)
    case Activation::kGeluErf: return gelu_erf_ps(v);
    case Activation::kGeluTanh: return gelu_tanh_ps(v);
    case Activation::kSilu: return silu_ps(v);
    case Activation::kQuickGelu: return quick_gelu_ps(v);
    default: return v;
  }
}

template <Activation kAct>
void finish_row_act(const int32_t* acc, const int32_t* comp, float sa, const float* scales, const float* bias,
                    const float* residual, float* c, long ncols) {
  const __m512 vsa = _mm512_set1_ps(sa);
  for (long j = 0; j < ncols; j += 16) {
    const __mmask16 mask = i8_mask16(ncols - j);
    __m512i s = _mm512_load_si512(acc + j);
    if (comp != nullptr) s = _mm512_sub_epi32(s, _mm512_loadu_si512(comp + j));
    const __m512 scale = _mm512_mul_ps(vsa, _mm512_loadu_ps(scales + j));
    __m512 v = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(s));
    __asm__("" : "+v"(v));  // keeps the compiler from fusing the multiply and the add (bit-exact)
    if (bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + j));
    v = i8_activate<kAct>(v);
    if (residual != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, residual + j));
    _mm512_mask_storeu_ps(c + j, mask, v);
  }
}
