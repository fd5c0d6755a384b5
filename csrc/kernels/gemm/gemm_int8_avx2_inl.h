// AVX2 pieces of the int8 GEMM shared by gemm_int8_avx2.cc (no VNNI) and gemm_int8_avxvnni.cc:
// quantizing A rows and the epilogue of a finished row of a tile. Include INSIDE the ISA namespace
// (anonymous namespace) after gemm_int8_inl.h; like it, no include guard on purpose.

inline __m256i i8_mask8(long left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline int8_t i8_round(float v) {  // v = x · inv, |v| ≤ 127 (or NaN)
  const float r = std::nearbyint(v);
  return r == r ? static_cast<int8_t>(r) : static_cast<int8_t>(-128);
}

// The same float operations as the scalar reference: amax by max (order-free), inv = 127 / amax,
// x · inv rounded to nearest even (MXCSR default) by vcvtps2dq. The max is taken over the bits of
// |x| as int32: they order like the values for finite |x|, and above every finite value lie +inf
// (0x7F800000) and then the NaNs, so one max finds amax and whether the row is finite.
float quantize_row(const float* x, long k, long kp, uint8_t* out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i vmax = _mm256_setzero_si256();
  long p = 0;
  for (; p + 8 <= k; p += 8)
    vmax =
        _mm256_max_epi32(vmax, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + p)), abs_mask));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  int32_t amax_bits = 0;
  for (int i = 0; i < 8; ++i) amax_bits = lanes[i] > amax_bits ? lanes[i] : amax_bits;
  for (; p < k; ++p) {
    int32_t bits;
    std::memcpy(&bits, x + p, sizeof(bits));
    bits &= 0x7FFFFFFF;
    amax_bits = bits > amax_bits ? bits : amax_bits;
  }
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
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(kUnsignedA ? 0x80 : 0));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  p = 0;
  for (; p + 32 <= k; p += 32) {
    const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + p), vinv));
    const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + p + 8), vinv));
    const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + p + 16), vinv));
    const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + p + 24), vinv));
    // packs work per 128-bit lane: the dwords come out as 0,4,1,5,2,6,3,7 groups of 4 bytes.
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p),
                        _mm256_xor_si256(_mm256_permutevar8x32_epi32(b, order), flip));
  }
  for (; p < k; ++p) out[p] = static_cast<uint8_t>(i8_round(x[p] * inv)) ^ (kUnsignedA ? 0x80u : 0u);
  for (; p < kp; ++p) out[p] = zero;
  return amax / 127.0f;
}

using avx2::gelu_erf_ps;
using avx2::gelu_tanh_ps;
using avx2::quick_gelu_ps;
using avx2::silu_ps;

// The activation is applied in registers with the lane-wise functions of vector_math_avx2.h, the
// ones kActivationKernels.apply runs on, so the result is the same bit for bit.
template <Activation kAct>
inline __m256 i8_activate(__m256 v) {
  switch (kAct) {
    case Activation::kRelu: return _mm256_max_ps(_mm256_setzero_ps(), v);  // NaN stays NaN (as apply)
    case Activation::kGeluErf: return gelu_erf_ps(v);
    case Activation::kGeluTanh: return gelu_tanh_ps(v);
    case Activation::kSilu: return silu_ps(v);
    case Activation::kQuickGelu: return quick_gelu_ps(v);
    default: return v;
  }
}

// Eight columns from j of a finished row; kTail: fewer than eight are left (mask says which).
template <Activation kAct, bool kTail>
__attribute__((always_inline)) inline void finish_chunk(const int32_t* acc, const int32_t* comp, __m256 vsa,
                                                        const float* scales, const float* bias, const float* residual,
                                                        float* c, long j, __m256i mask) {
  __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc + j));
  if (comp != nullptr) s = _mm256_sub_epi32(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(comp + j)));
  const __m256 scale = _mm256_mul_ps(vsa, _mm256_loadu_ps(scales + j));  // scales are padded to kNR
  __m256 v = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(s));
  __asm__("" : "+x"(v));  // keeps the compiler from fusing the multiply and the add (bit-exact)
  if (bias != nullptr) v = _mm256_add_ps(v, kTail ? _mm256_maskload_ps(bias + j, mask) : _mm256_loadu_ps(bias + j));
  v = i8_activate<kAct>(v);
  if (residual != nullptr)
    v = _mm256_add_ps(v, kTail ? _mm256_maskload_ps(residual + j, mask) : _mm256_loadu_ps(residual + j));
  if (kTail) {
    _mm256_maskstore_ps(c + j, mask, v);
  } else {
    _mm256_storeu_ps(c + j, v);
  }
}

// Whole chunks with plain loads and stores, only the tail masked: vmaskmovps stores are
// microcoded on AMD Zen, and masking every chunk cost ~8 % of an int8 BERT-base forward on Zen 3.
template <Activation kAct>
void finish_row_act(const int32_t* acc, const int32_t* comp, float sa, const float* scales, const float* bias,
                    const float* residual, float* c, long ncols) {
  const __m256 vsa = _mm256_set1_ps(sa);
  long j = 0;
  for (; j + 8 <= ncols; j += 8)
    finish_chunk<kAct, false>(acc, comp, vsa, scales, bias, residual, c, j, _mm256_setzero_si256());
  if (j < ncols) finish_chunk<kAct, true>(acc, comp, vsa, scales, bias, residual, c, j, i8_mask8(ncols - j));
}
