#include "kernels/gemm/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/dispatch.h"
#include "runtime/load_scratch.h"
#include "runtime/threading.h"

namespace cpuformer {

#if CPUFORMER_X86_64

const GemmKernels& gemm_kernels() {
  static const GemmKernels& table = select_for_isa(scalar::kGemmKernels, avx2::kGemmKernels, avx512::kGemmKernels);
  return table;
}

// int8 kernels with the dot-product extensions (gemm_int8_avx512vnni.cc, gemm_int8_avxvnni.cc),
// picked inside their level when the CPU has them (CPUFORMER_DISABLE_FEATURES can hide them).
namespace avx512vnni { extern const Int8GemmKernels kInt8GemmKernels; }
namespace avxvnni { extern const Int8GemmKernels kInt8GemmKernels; }

const Int8GemmKernels& int8_gemm_kernels() {
  static const Int8GemmKernels& table = select_for_isa(
      scalar::kInt8GemmKernels, cpu_features().avx_vnni ? avxvnni::kInt8GemmKernels : avx2::kInt8GemmKernels,
      cpu_features().avx512vnni ? avx512vnni::kInt8GemmKernels : avx512::kInt8GemmKernels);
  return table;
}

// bfloat16 weights with vdpbf16ps (gemm_half_avx512bf16.cc; float16 weights go to the avx512 table).
namespace avx512bf16 { extern const HalfGemmKernels kHalfGemmKernels; }

const HalfGemmKernels& half_gemm_kernels() {
  static const HalfGemmKernels& table =
      select_for_isa(scalar::kHalfGemmKernels, avx2::kHalfGemmKernels,
                     cpu_features().avx512bf16 ? avx512bf16::kHalfGemmKernels : avx512::kHalfGemmKernels);
  return table;
}

// int4 (one packed layout for every x86 level, gemm_int4_layout_inl.h): vpdpbusd when the level's
// dot-product extension is there (gemm_int4_avx512vnni.cc, gemm_int4_avxvnni.cc), else the AVX2
// vpmaddubsw kernel, which also serves the avx512 level without AVX512-VNNI.
namespace avx512vnni { extern const Int4GemmKernels kInt4GemmKernels; }
namespace avxvnni { extern const Int4GemmKernels kInt4GemmKernels; }

const Int4GemmKernels& int4_gemm_kernels() {
  static const Int4GemmKernels& table = select_for_isa(
      scalar::kInt4GemmKernels, cpu_features().avx_vnni ? avxvnni::kInt4GemmKernels : avx2::kInt4GemmKernels,
      cpu_features().avx512vnni ? avx512vnni::kInt4GemmKernels : avx2::kInt4GemmKernels);
  return table;
}

MatmulInstruction matmul_instruction(WeightType type) {
  const Isa isa = active_isa();
  const CpuFeatures& f = cpu_features();
  if (isa == Isa::kScalar) return MatmulInstruction::kScalar;
  const bool wide = isa == Isa::kAvx512;
  switch (type) {
    case WeightType::kInt8:
      if (wide) return f.avx512vnni ? MatmulInstruction::kDpbusd512 : MatmulInstruction::kMaddubs512;
      return f.avx_vnni ? MatmulInstruction::kDpbusd256 : MatmulInstruction::kMaddubs256;
    case WeightType::kInt4:  // int4_gemm_kernels()
      if (wide) return f.avx512vnni ? MatmulInstruction::kDpbusd512 : MatmulInstruction::kMaddubs256;
      return f.avx_vnni ? MatmulInstruction::kDpbusd256 : MatmulInstruction::kMaddubs256;
    case WeightType::kBFloat16:
      if (wide && f.avx512bf16) return MatmulInstruction::kDpbf16x512;
      break;
    case WeightType::kFloat32:
    case WeightType::kFloat16: break;
  }
  return wide ? MatmulInstruction::kFma512 : MatmulInstruction::kFma256;
}

#elif CPUFORMER_AARCH64

// AArch64: float32, float16 and bfloat16 weights use the NEON kernels at the neon, dotprod and i8mm
// levels (the 16-bit ones widen to float32 with fcvtl / a shift, gemm_half_neon.cc); int8 weights
// the SDOT kernel at dotprod and the SMMLA kernel at i8mm (each packs its own layout); int4 weights
// the SDOT kernel at dotprod and i8mm (in the packed layout of the x86 levels,
// gemm_int4_layout_inl.h). docs/arm.md.
namespace dotprod { extern const Int4GemmKernels kInt4GemmKernels; }

const GemmKernels& gemm_kernels() {
  static const GemmKernels& table = select_for_isa(scalar::kGemmKernels, neon::kGemmKernels);
  return table;
}
const Int8GemmKernels& int8_gemm_kernels() {
  static const Int8GemmKernels& table = active_isa() == Isa::kI8mm      ? i8mm::kInt8GemmKernels
                                        : active_isa() == Isa::kDotprod ? dotprod::kInt8GemmKernels
                                                                        : scalar::kInt8GemmKernels;
  return table;
}
const HalfGemmKernels& half_gemm_kernels() {
  static const HalfGemmKernels& table = select_for_isa(scalar::kHalfGemmKernels, neon::kHalfGemmKernels);
  return table;
}
const Int4GemmKernels& int4_gemm_kernels() {
  static const Int4GemmKernels& table = active_isa() == Isa::kDotprod || active_isa() == Isa::kI8mm
                                            ? dotprod::kInt4GemmKernels
                                            : scalar::kInt4GemmKernels;
  return table;
}

MatmulInstruction matmul_instruction(WeightType type) {
  const Isa isa = active_isa();
  if (isa == Isa::kScalar) return MatmulInstruction::kScalar;
  switch (type) {
    case WeightType::kFloat32:
    case WeightType::kFloat16:
    case WeightType::kBFloat16: return MatmulInstruction::kNeonFma128;
    case WeightType::kInt8:
      if (isa == Isa::kI8mm) return MatmulInstruction::kSmmla128;
      return isa == Isa::kDotprod ? MatmulInstruction::kSdot128 : MatmulInstruction::kScalar;
    case WeightType::kInt4:
      return isa == Isa::kDotprod || isa == Isa::kI8mm ? MatmulInstruction::kSdot128 : MatmulInstruction::kScalar;
  }
  return MatmulInstruction::kScalar;
}

#endif

const char* gemm_kernel_name(WeightType type) {
  const bool f32 = type == WeightType::kFloat32, f16 = type == WeightType::kFloat16;
  switch (matmul_instruction(type)) {
    case MatmulInstruction::kScalar: return "scalar";
    case MatmulInstruction::kFma256: return f32 ? "avx2 fma" : f16 ? "avx2 f16c widen + fma" : "avx2 widen + fma";
    case MatmulInstruction::kFma512: return f32 ? "avx512 fma" : f16 ? "avx512 f16c widen + fma" : "avx512 widen + fma";
    case MatmulInstruction::kMaddubs256: return "avx2 vpmaddubsw";
    case MatmulInstruction::kMaddubs512: return "avx512bw vpmaddubsw";
    case MatmulInstruction::kDpbusd256: return "avx_vnni vpdpbusd";
    case MatmulInstruction::kDpbusd512: return "avx512_vnni vpdpbusd";
    case MatmulInstruction::kDpbf16x512: return "avx512_bf16 vdpbf16ps";
    case MatmulInstruction::kNeonFma128:
      return f32 ? "neon fmla" : f16 ? "neon fcvtl widen + fmla" : "neon widen + fmla";
    case MatmulInstruction::kSdot128: return "dotprod sdot";
    case MatmulInstruction::kSmmla128: return "i8mm smmla";
  }
  return "unknown";
}

float* gemm_thread_scratch(std::size_t count) {
  thread_local AlignedBuffer<float> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// The fewest rows of K weights a thread quantizes (~64 K weights: fewer cost more to hand out than
// they save).
static long quantize_rows_per_thread(long k) { return (1L << 16) / (k > 0 ? k : 1) + 1; }

// |x| as bits: for finite values their order is that of |x|; NaN and ±inf are above 0x7F7FFFFF.
// Loops over these bits (and the selects below, which agree with fmax / fmin / nearbyint for every
// non-NaN value) vectorize at every level; std::fmax and std::nearbyint compiled for the baseline
// x86-64 were library calls per weight, and quantizing a 1.1B model at load took seconds.
static inline uint32_t abs_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits & 0x7FFFFFFFu;
}

static inline float float_of_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

constexpr uint32_t kLargestFiniteBits = 0x7F7FFFFFu;

// nearbyint in the default rounding mode (to nearest, ties to even) for |v| < 2^22; larger
// magnitudes (and ±inf) stay beyond ±2^21, which every caller clamps the same way.
static inline float round_to_nearest_even(float v) {
  const float magic = 12582912.0f;  // 1.5 · 2^23: v + magic has no fraction bits left
  return (v + magic) - magic;
}

// Rows [j0, j1) of quantize_weights_s8.
static void quantize_rows_s8(const float* w, long j0, long j1, long k, long ldw, int8_t* q, float* scales) {
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
      const float r = round_to_nearest_even(row[p] * inv);  // |row[p] · inv| ≤ 127 (+ rounding)
      out[p] = static_cast<int8_t>(static_cast<int>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r)));
    }
    scales[j] = amax / 127.0f;
  }
}

void quantize_weights_s8(const float* w, long n, long k, long ldw, int8_t* q, float* scales) {
  // Rows are independent: split across the threads (loading a 1.1B model in int8 quantizes ~1e9
  // weights), each row computed the same way whichever thread takes it.
  parallel_ranges(n, quantize_rows_per_thread(k),
                  [&](long j0, long j1) { quantize_rows_s8(w, j0, j1, k, ldw, q, scales); });
}

uint16_t float_to_bfloat16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float bfloat16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

uint16_t float_to_half(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t abs = f & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to ≥ 65520: inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value = m · 2^-24, m = round_half_even(|x| · 2^24).
    float ax;
    std::memcpy(&ax, &abs, 4);
    const float m = std::nearbyint(ax * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  // Normal: rebias the exponent (127 → 15) and round the 23-bit mantissa to 10 bits, half to even.
  uint32_t h = ((abs >> 13) - ((127u - 15u) << 10));
  const uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal or zero, exact
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
  }
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

std::size_t packed_weight_bytes(long n, long k, const WeightFormat& format) {
  switch (format.type) {
    case WeightType::kFloat32: return gemm_kernels().packed_bytes_f32(n, k);
    case WeightType::kInt8: return int8_gemm_kernels().packed_bytes(n, k);
    case WeightType::kInt4: return int4_gemm_kernels().packed_bytes(n, k, format.group_size, format.zero_point);
    case WeightType::kFloat16:
    case WeightType::kBFloat16: return half_gemm_kernels().packed_bytes(n, k, format.type);
  }
  throw std::invalid_argument("packed_weight_bytes: unknown weight type");
}

PackedWeights pack_weights_f32(const float* w, long n, long k, long ldw) {
  const GemmKernels& kernels = gemm_kernels();
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = WeightType::kFloat32;
  packed.isa = active_isa();
  packed.data.resize(kernels.packed_bytes_f32(n, k));
  kernels.pack_f32(w, n, k, ldw, packed.data.data());
  return packed;
}

PackedWeights pack_weights_s8(const int8_t* q, const float* scales, long n, long k, long ldq) {
  const Int8GemmKernels& kernels = int8_gemm_kernels();
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = WeightType::kInt8;
  packed.isa = active_isa();
  packed.data.resize(kernels.packed_bytes(n, k));
  kernels.pack(q, scales, n, k, ldq, packed.data.data());
  return packed;
}

PackedWeights pack_weights_16(const uint16_t* w, WeightType type, long n, long k, long ldw) {
  if (type != WeightType::kFloat16 && type != WeightType::kBFloat16) {
    throw std::invalid_argument("pack_weights_16 takes float16 or bfloat16 weights");
  }
  const HalfGemmKernels& kernels = half_gemm_kernels();
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = type;
  packed.isa = active_isa();
  packed.data.resize(kernels.packed_bytes(n, k, type));
  kernels.pack(w, type, n, k, ldw, packed.data.data());
  return packed;
}

namespace {

// The nearest integer to v (half to even) plus offset, clamped to [0, 15]; v is finite.
inline int round_nibble(float v, int offset) {
  const float r = round_to_nearest_even(v) + static_cast<float>(offset);
  return r < 0.0f ? 0 : (r > 15.0f ? 15 : static_cast<int>(r));
}

}  // namespace

// Rows [j0, j1) of quantize_weights_s4 (group_size valid).
static void quantize_rows_s4(const float* w, long j0, long j1, long k, long ldw, long group_size, bool zero_point,
                             uint8_t* u, uint16_t* scales, uint8_t* zeros) {
  const long groups = int4_groups(k, group_size), kp = groups * group_size;
  std::vector<uint8_t> row(static_cast<std::size_t>(kp));
  for (long j = j0; j < j1; ++j) {
    const float* x = w + j * ldw;
    for (long g = 0; g < groups; ++g) {
      const long begin = g * group_size, end = std::min(k, begin + group_size);
      uint32_t top = 0;
      float lo = 0.0f, hi = 0.0f;  // lo ≤ 0 ≤ hi: zero is always representable
      for (long p = begin; p < end; ++p) {
        const uint32_t a = abs_bits(x[p]);
        top = a > top ? a : top;
        lo = x[p] < lo ? x[p] : lo;
        hi = x[p] > hi ? x[p] : hi;
      }
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
        float extreme = 0.0f;
        for (long p = begin; p < end && top != 0; ++p)
          if (abs_bits(x[p]) == top) {
            extreme = x[p];
            break;
          }
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
        for (long p = begin; p < end; ++p) codes[p - begin] = static_cast<uint8_t>(round_nibble(x[p] / s, z));
      } else {
        std::memset(codes, z, static_cast<std::size_t>(end - begin));
      }
      std::memset(codes + (end - begin), z, static_cast<std::size_t>(begin + group_size - end));
      scales[j * groups + g] = scale;
      if (zero_point) zeros[j * groups + g] = static_cast<uint8_t>(z);
    }
    uint8_t* out = u + j * (kp / 2);
    for (long b = 0; b < kp / 2; ++b) out[b] = static_cast<uint8_t>(row[2 * b] | (row[2 * b + 1] << 4));
  }
}

void quantize_weights_s4(const float* w, long n, long k, long ldw, long group_size, bool zero_point, uint8_t* u,
                         uint16_t* scales, uint8_t* zeros) {
  if (!valid_int4_group_size(group_size)) throw std::invalid_argument("int4 group size must be 32, 64 or 128");
  // Rows are independent: split across the threads, each row computed the same way whichever
  // thread takes it. A group no float16 scale can hold throws (the same message for any row):
  // caught inside the parallel region, rethrown here.
  std::exception_ptr error;
  std::mutex error_mutex;
  parallel_ranges(n, quantize_rows_per_thread(k), [&](long j0, long j1) {
    try {
      quantize_rows_s4(w, j0, j1, k, ldw, group_size, zero_point, u, scales, zeros);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

PackedWeights pack_weights_s4(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long k,
                              long group_size) {
  if (!valid_int4_group_size(group_size)) throw std::invalid_argument("int4 group size must be 32, 64 or 128");
  const Int4GemmKernels& kernels = int4_gemm_kernels();
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = WeightType::kInt4;
  packed.isa = active_isa();
  packed.group_size = group_size;
  packed.zero_point = zeros != nullptr;
  packed.data.resize(kernels.packed_bytes(n, k, group_size, zeros != nullptr));
  kernels.pack(u, scales, zeros, n, k, group_size, packed.data.data());
  return packed;
}

PackedWeights pack_weights(const float* w, const WeightFormat& format, long n, long k, long ldw) {
  const WeightType type = format.type;
  // The quantized or converted copy lives only until it is packed: load scratch, reused by the next
  // weight of a model build (runtime/load_scratch.h).
  LoadScratchScope scratch;
  const std::size_t count = static_cast<std::size_t>(n) * k;
  switch (type) {
    case WeightType::kInt4: {
      const std::size_t groups = static_cast<std::size_t>(int4_groups(k, format.group_size));
      uint8_t* u = load_scratch<uint8_t>(LoadSlot::kConverted, n * groups * format.group_size / 2);
      uint16_t* scales = load_scratch<uint16_t>(LoadSlot::kConvertedScales, n * groups);
      uint8_t* zeros = format.zero_point ? load_scratch<uint8_t>(LoadSlot::kConvertedZeros, n * groups) : nullptr;
      quantize_weights_s4(w, n, k, ldw, format.group_size, format.zero_point, u, scales, zeros);
      return pack_weights_s4(u, scales, zeros, n, k, format.group_size);
    }
    case WeightType::kFloat32: return pack_weights_f32(w, n, k, ldw);
    case WeightType::kInt8: {
      int8_t* q = load_scratch<int8_t>(LoadSlot::kConverted, count);
      float* scales = load_scratch<float>(LoadSlot::kConvertedScales, n);
      quantize_weights_s8(w, n, k, ldw, q, scales);
      return pack_weights_s8(q, scales, n, k, k);
    }
    case WeightType::kFloat16:
    case WeightType::kBFloat16: {
      uint16_t* h = load_scratch<uint16_t>(LoadSlot::kConverted, count);
      const bool half = type == WeightType::kFloat16;
      for (long j = 0; j < n; ++j)
        for (long p = 0; p < k; ++p) {
          const float x = w[j * ldw + p];
          h[j * k + p] = half ? float_to_half(x) : float_to_bfloat16(x);
        }
      return pack_weights_16(h, type, n, k, k);
    }
  }
  throw std::invalid_argument("unknown weight type");
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  if (m <= 0 || w.n <= 0) return;
  if (w.isa != active_isa()) throw std::logic_error("weights were packed for another ISA level");
  switch (w.type) {
    case WeightType::kFloat32: gemm_kernels().gemm_f32(a, m, lda, w, c, ldc, epilogue); return;
    case WeightType::kInt8: int8_gemm_kernels().gemm(a, m, lda, w, c, ldc, epilogue); return;
    case WeightType::kInt4: int4_gemm_kernels().gemm(a, m, lda, w, c, ldc, epilogue); return;
    case WeightType::kFloat16:
    case WeightType::kBFloat16: half_gemm_kernels().gemm(a, m, lda, w, c, ldc, epilogue); return;
  }
  throw std::logic_error("unknown weight type");
}

}  // namespace cpuformer
