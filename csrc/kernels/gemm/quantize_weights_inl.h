// The load-time weight quantizers of gemm.h (quantize_weights_s8, quantize_weights_s4), one row
// range at a time, written so that they vectorize: the largest magnitude from the weights' bits,
// selects for the group's extremes (they agree with fmax / fmin for every non-NaN value, and a NaN
// makes the row or group non-finite anyway), and no C library call per weight (std::fmax and
// std::nearbyint compiled for the baseline x86-64 were calls, and quantizing a 1.1B model at load
// took seconds). Each level's translation unit compiles this file at its vector width
// (quantize_weights_scalar.cc, _avx2.cc, _avx512.cc), so every level gives the same codes and
// scales bit for bit.
//
// Include INSIDE the level's namespace, after <algorithm>, <cstring>, <limits>, <stdexcept>,
// <string>, <vector>, "kernels/gemm/gemm.h" (and <immintrin.h> at a level compiled with AVX-512,
// whose whole int4 groups of 32 take vector code); the including file defines
//   float round_half_even(float v)   nearbyint in the default rounding mode (to nearest, ties to
//                                    even); for |v| ≥ 2^22 and ±inf any value beyond ±2^21 of
//                                    the same sign (every caller clamps it to its end code).
// No include guard on purpose.

// |x| as bits: for finite values their order is that of |x|; NaN and ±inf are above 0x7F7FFFFF.
inline uint32_t abs_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits & 0x7FFFFFFFu;
}

inline float float_of_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

constexpr uint32_t kLargestFiniteBits = 0x7F7FFFFFu;

// A signed integer that orders like x for every non-NaN x (−0 just below +0): the bits for x ≥ +0,
// the bits with the magnitude bits flipped for x < 0. Its own inverse.
inline int32_t order_key(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const int32_t b = static_cast<int32_t>(bits);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

inline float float_of_key(int32_t key) {
  const uint32_t bits = static_cast<uint32_t>(key ^ ((key >> 31) & 0x7FFFFFFF));
  return float_of_bits(bits);
}

// Rows [j0, j1) of quantize_weights_s8.
void quantize_rows_s8(const float* w, long j0, long j1, long k, long ldw, int8_t* q, float* scales) {
  for (long j = j0; j < j1; ++j) {
    const float* row = w + j * ldw;
    uint32_t top = 0;
    for (long p = 0; p < k; ++p) {
      const uint32_t a = abs_bits(row[p]);
      top = a > top ? a : top;
    }
    const bool finite = top <= kLargestFiniteBits;  // false for NaN and ±inf
    const float amax = float_of_bits(top);
    int8_t* out = q + j * k;
    if (!finite || !(amax > 0.0f)) {
      // A zero row quantizes to zeros. A row with NaN or ±inf (int8 holds neither) gets zeros and a
      // NaN scale, so every output of that channel is NaN, as float32 weights give for NaN and
      // (through inf - inf or 0 · inf) mostly for inf; docs/reliability.md, "Non-finite values".
      std::memset(out, 0, static_cast<std::size_t>(k));
      scales[j] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float inv = 127.0f / amax;
    for (long p = 0; p < k; ++p) {
      const float r = round_half_even(row[p] * inv);  // |row[p] · inv| ≤ 127 (+ rounding)
      out[p] = static_cast<int8_t>(static_cast<int>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r)));
    }
    scales[j] = amax / 127.0f;
  }
}

// The nearest integer to v (half to even) plus offset, clamped to [0, 15]; v may be ±inf (a weight
// over a tiny scale), which clamps to an end code.
inline int round_nibble(float v, int offset) {
  const float r = round_half_even(v) + static_cast<float>(offset);
  return r < 0.0f ? 0 : (r > 15.0f ? 15 : static_cast<int>(r));
}

// The extremes of a group of len weights (see quantize_rows_s4): top over |x|'s bits, lo and hi
// over order keys with lo ≤ 0 ≤ hi, and the first index whose |x| has the bits top (len if none).
struct GroupExtremes {
  uint32_t top = 0;
  int32_t lo_key = 0, hi_key = 0, first = 0;
};

#if defined(__AVX512F__)
// A whole group of 32 weights in two vectors (the default group size): the same integer
// reductions and the same codes as the loops below (the int4 quantization was ~half of a 1.1B
// int4 load on Zen 4; ops.quantize_int4 of 5,632 × 2,048 went from 11.6-13.7 to 7.9-10.4 ms).
inline GroupExtremes group_extremes_32(const float* x) {
  const __m512i b0 = _mm512_loadu_si512(x), b1 = _mm512_loadu_si512(x + 16);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i a0 = _mm512_and_si512(b0, magnitude), a1 = _mm512_and_si512(b1, magnitude);
  // order_key: the bits, the magnitude bits flipped for negative values.
  const __m512i k0 = _mm512_xor_si512(b0, _mm512_and_si512(_mm512_srai_epi32(b0, 31), magnitude));
  const __m512i k1 = _mm512_xor_si512(b1, _mm512_and_si512(_mm512_srai_epi32(b1, 31), magnitude));
  GroupExtremes e;
  e.top = _mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1));
  e.lo_key = std::min(0, _mm512_reduce_min_epi32(_mm512_min_epi32(k0, k1)));
  e.hi_key = std::max(0, _mm512_reduce_max_epi32(_mm512_max_epi32(k0, k1)));
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(e.top));
  const uint32_t hits = static_cast<uint32_t>(_mm512_cmpeq_epi32_mask(a0, top)) |
                        (static_cast<uint32_t>(_mm512_cmpeq_epi32_mask(a1, top)) << 16);
  e.first = hits != 0 ? __builtin_ctz(hits) : 32;
  return e;
}

// codes[0, 32) = round_nibble(x[p] / s, z): the same operations on 16 lanes (vroundps to nearest
// even is nearbyint in the default rounding mode; ±inf stays ±inf and clamps to an end code).
inline void group_codes_32(const float* x, float s, int z, uint8_t* codes) {
  const __m512 scale = _mm512_set1_ps(s), offset = _mm512_set1_ps(static_cast<float>(z));
  const __m512 zero = _mm512_setzero_ps(), fifteen = _mm512_set1_ps(15.0f);
  for (int h = 0; h < 2; ++h) {
    const __m512 q = _mm512_div_ps(_mm512_loadu_ps(x + 16 * h), scale);
    __m512 r = _mm512_add_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), offset);
    r = _mm512_min_ps(_mm512_max_ps(r, zero), fifteen);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16 * h), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)));
  }
}
#endif

inline GroupExtremes group_extremes(const float* x, int32_t len) {
#if defined(__AVX512F__)
  if (len == 32) return group_extremes_32(x);
#endif
  GroupExtremes e;
  for (int32_t p = 0; p < len; ++p) {
    const uint32_t a = abs_bits(x[p]);
    e.top = a > e.top ? a : e.top;
    const int32_t key = order_key(x[p]);
    e.lo_key = key < e.lo_key ? key : e.lo_key;
    e.hi_key = key > e.hi_key ? key : e.hi_key;
  }
  // The first index as a min reduction: no early exit, so it vectorizes.
  e.first = len;
  for (int32_t i = 0; i < len; ++i) {
    const int32_t candidate = abs_bits(x[i]) == e.top ? i : len;
    e.first = candidate < e.first ? candidate : e.first;
  }
  return e;
}

inline void group_codes(const float* x, int32_t len, float s, int z, uint8_t* codes) {
#if defined(__AVX512F__)
  if (len == 32) return group_codes_32(x, s, z, codes);
#endif
  for (int32_t p = 0; p < len; ++p) codes[p] = static_cast<uint8_t>(round_nibble(x[p] / s, z));
}

// Rows [j0, j1) of quantize_weights_s4 (group_size valid).
void quantize_rows_s4(const float* w, long j0, long j1, long k, long ldw, long group_size, bool zero_point, uint8_t* u,
                      uint16_t* scales, uint8_t* zeros) {
  const long groups = int4_groups(k, group_size), kp = groups * group_size;
  std::vector<uint8_t> row(static_cast<std::size_t>(kp));
  for (long j = j0; j < j1; ++j) {
    const float* x = w + j * ldw;
    for (long g = 0; g < groups; ++g) {
      const long begin = g * group_size, end = std::min(k, begin + group_size);
      const float* gx = x + begin;
      const int32_t len = static_cast<int32_t>(end - begin);
      // The extremes as integer reductions (they vectorize; float ones with their NaN and signed-
      // zero rules did not, and kept lo in memory: ~75 % of an int4 load): top over |x|'s bits, lo
      // and hi over order keys, with lo ≤ 0 ≤ hi (zero is always representable). The keys order
      // −0 below +0 where the float comparisons kept whichever came first; every result below is
      // the same for either zero (they only enter as hi − lo and −lo / s, rounded).
      const GroupExtremes e = group_extremes(gx, len);
      const uint32_t top = e.top;
      const float lo = float_of_key(e.lo_key), hi = float_of_key(e.hi_key);
      const bool finite = top <= kLargestFiniteBits;  // false for NaN and ±inf
      int z = 8;
      uint16_t scale = 0;
      if (!finite) {
        scale = 0x7E00;  // NaN: every output of the channel is NaN
      } else if (zero_point) {
        scale = float_to_half((hi - lo) / 15.0f);
      } else {
        // The first weight of the largest magnitude (its sign sets the scale's); +0 when every
        // weight is ±0 (the scale is then −0, whatever the zeros' signs).
        const float extreme = top != 0 && e.first < len ? gx[e.first] : 0.0f;
        scale = float_to_half(extreme / -8.0f);
      }
      const float s = half_to_float(scale);
      if (std::isinf(s)) {
        throw std::invalid_argument(
            "a weight group spans more than int4's float16 scales can hold (magnitudes up to about " +
            std::string(zero_point ? "9.8e5" : "5.2e5") + "); use int8 or a float dtype");
      }
      const bool usable = finite && s != 0.0f;
      if (zero_point) z = usable ? round_nibble(-lo / s, 0) : 0;
      uint8_t* codes = row.data() + begin;
      if (usable) {
        group_codes(gx, len, s, z, codes);
      } else {
        std::memset(codes, z, static_cast<std::size_t>(end - begin));
      }
      if (end - begin < group_size)
        std::memset(codes + (end - begin), z, static_cast<std::size_t>(begin + group_size - end));
      scales[j * groups + g] = scale;
      if (zero_point) zeros[j * groups + g] = static_cast<uint8_t>(z);
    }
    uint8_t* out = u + j * (kp / 2);
    for (long b = 0; b < kp / 2; ++b) out[b] = static_cast<uint8_t>(row[2 * b] | (row[2 * b + 1] << 4));
  }
}

// float_to_half (gemm.cc) without branches, so that a row vectorizes: the normal encoding rounded
// half to even from the dropped 13 bits, the subnormal one from |x| · 2^24 rounded (exact: a power
// of two), then overflow (≥ 65520 rounds to inf) and NaN (the quiet NaN 0x7E00) selected over them.
inline uint16_t half_bits(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  const uint32_t sign = (f >> 16) & 0x8000u, abs = f & 0x7FFFFFFFu;
  const uint32_t up = (abs & 0x1FFFu) + ((abs >> 13) & 1u) > 0x1000u ? 1u : 0u;
  const uint32_t normal = (abs >> 13) - ((127u - 15u) << 10) + up;
  const bool small = abs < 0x38800000u;
  const uint32_t subnormal =
      static_cast<uint32_t>(static_cast<int32_t>(round_half_even(float_of_bits(small ? abs : 0u) * 16777216.0f)));
  uint32_t h = small ? subnormal : normal;
  h = abs >= 0x477FF000u ? 0x7C00u : h;
  h = abs > 0x7F800000u ? 0x7E00u : h;
  return static_cast<uint16_t>(sign | h);
}

// float_to_bfloat16 (gemm.cc) without branches: round half to even on the upper 16 bits; NaN keeps
// its sign and upper payload, made quiet.
inline uint16_t bfloat16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? (bits >> 16) | 0x0040u : rounded);
}

// Rows [j0, j1) of w (row stride ldw) as float16 (half) or bfloat16 bits into h [.., k], the bits of
// float_to_half / float_to_bfloat16.
void convert_rows_16(const float* w, long j0, long j1, long k, long ldw, bool half, uint16_t* h) {
  for (long j = j0; j < j1; ++j) {
    const float* src = w + j * ldw;
    uint16_t* dst = h + j * k;
    if (half) {
      for (long p = 0; p < k; ++p) dst[p] = half_bits(src[p]);
    } else {
      for (long p = 0; p < k; ++p) dst[p] = bfloat16_bits(src[p]);
    }
  }
}
