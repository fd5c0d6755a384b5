#include "kernels/gemm/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gemm/quantize_weights.h"
#include "runtime/dispatch.h"
#include "runtime/load_scratch.h"
#include "runtime/threading.h"

namespace cpuformer {

#if CPUFORMER_X86_64

const GemmKernels& gemm_kernels() {
  static const GemmKernels& table = select_for_isa(scalar::kGemmKernels, avx2::kGemmKernels, avx512::kGemmKernels);
  return table;
}

// int8 kernels with the dot-product extensions (gemm_int8_avx512vnni.cc, gemm_int8_avxvnni.cc) and
// AMX tiles (gemm_int8_avx512amx.cc, vpdpbusd below 8 rows), picked inside their level when the CPU
// has them (CPUFORMER_DISABLE_FEATURES can hide them).
namespace avx512vnni { extern const Int8GemmKernels kInt8GemmKernels; }
namespace avx512amx {
extern const Int8GemmKernels kInt8GemmKernels;
extern const HalfGemmKernels kHalfGemmKernels;
void gemm_f32_bf16x3(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
                     const GemmEpilogue& epilogue);
}  // namespace avx512amx
namespace avxvnni { extern const Int8GemmKernels kInt8GemmKernels; }

const Int8GemmKernels& int8_gemm_kernels() {
  static const Int8GemmKernels& table = select_for_isa(
      scalar::kInt8GemmKernels, cpu_features().avx_vnni ? avxvnni::kInt8GemmKernels : avx2::kInt8GemmKernels,
      cpu_features().amx_int8     ? avx512amx::kInt8GemmKernels
      : cpu_features().avx512vnni ? avx512vnni::kInt8GemmKernels
                                  : avx512::kInt8GemmKernels);
  return table;
}

// bfloat16 weights with vdpbf16ps (gemm_half_avx512bf16.cc; float16 weights go to the avx512 table).
namespace avx512bf16 { extern const HalfGemmKernels kHalfGemmKernels; }

const HalfGemmKernels& half_gemm_kernels() {
  static const HalfGemmKernels& table = select_for_isa(scalar::kHalfGemmKernels, avx2::kHalfGemmKernels,
                                                       cpu_features().amx_bf16     ? avx512amx::kHalfGemmKernels
                                                       : cpu_features().avx512bf16 ? avx512bf16::kHalfGemmKernels
                                                                                   : avx512::kHalfGemmKernels);
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
      if (wide && f.amx_int8) return MatmulInstruction::kAmxInt8;
      if (wide) return f.avx512vnni ? MatmulInstruction::kDpbusd512 : MatmulInstruction::kMaddubs512;
      return f.avx_vnni ? MatmulInstruction::kDpbusd256 : MatmulInstruction::kMaddubs256;
    case WeightType::kInt4:  // int4_gemm_kernels()
      if (wide) return f.avx512vnni ? MatmulInstruction::kDpbusd512 : MatmulInstruction::kMaddubs256;
      return f.avx_vnni ? MatmulInstruction::kDpbusd256 : MatmulInstruction::kMaddubs256;
    case WeightType::kBFloat16:
      if (wide && f.amx_bf16) return MatmulInstruction::kAmxBf16;
      if (wide && f.avx512bf16) return MatmulInstruction::kDpbf16x512;
      break;
    case WeightType::kFloat32:
      if (wide && f.amx_bf16 && float32_matmul_precision() == Float32MatmulPrecision::kHigh)
        return MatmulInstruction::kAmxBf16x3;
      break;
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
    case MatmulInstruction::kAmxInt8: return "amx_int8 tdpbusd";
    case MatmulInstruction::kAmxBf16: return "amx_bf16 tdpbf16ps";
    case MatmulInstruction::kAmxBf16x3: return "amx_bf16 tdpbf16ps (bfloat16x3)";
    case MatmulInstruction::kNeonFma128:
      return f32 ? "neon fmla" : f16 ? "neon fcvtl widen + fmla" : "neon widen + fmla";
    case MatmulInstruction::kSdot128: return "dotprod sdot";
    case MatmulInstruction::kSmmla128: return "i8mm smmla";
  }
  return "unknown";
}

static std::atomic<int> g_float32_matmul_precision{static_cast<int>(Float32MatmulPrecision::kHighest)};

void set_float32_matmul_precision(Float32MatmulPrecision precision) {
  g_float32_matmul_precision.store(static_cast<int>(precision), std::memory_order_relaxed);
}

Float32MatmulPrecision float32_matmul_precision() {
  return static_cast<Float32MatmulPrecision>(g_float32_matmul_precision.load(std::memory_order_relaxed));
}

void set_float32_matmul_precision(const std::string& name) {
  if (name == "highest") set_float32_matmul_precision(Float32MatmulPrecision::kHighest);
  else if (name == "high") set_float32_matmul_precision(Float32MatmulPrecision::kHigh);
  else throw std::invalid_argument("float32 matmul precision must be 'highest' or 'high', got '" + name + "'");
}

const char* float32_matmul_precision_name() {
  return float32_matmul_precision() == Float32MatmulPrecision::kHigh ? "high" : "highest";
}

float* gemm_thread_scratch(std::size_t count) {
  thread_local AlignedBuffer<float> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// The fewest rows of K weights a thread quantizes (~64 K weights: fewer cost more to hand out than
// they save).
static long quantize_rows_per_thread(long k) { return (1L << 16) / (k > 0 ? k : 1) + 1; }

void quantize_weights_s8(const float* w, long n, long k, long ldw, int8_t* q, float* scales) {
  // Rows are independent: split across the threads (loading a 1.1B model in int8 quantizes ~1e9
  // weights), each row computed the same way whichever thread takes it.
  parallel_ranges(n, quantize_rows_per_thread(k),
                  [&](long j0, long j1) { weight_quantizers().rows_s8(w, j0, j1, k, ldw, q, scales); });
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

// float32 blocks of rows (the parts of a fused projection) packed as the one matrix they make one
// after another: each block straight into its place when the blocks before it fill whole panels,
// else (rows of one panel in two blocks) joined in load scratch first.
static PackedWeights pack_weights_f32_blocks(const float* const* blocks, const long* rows, std::size_t count, long k,
                                             long ldw) {
  const GemmKernels& kernels = gemm_kernels();
  const std::size_t row_bytes = static_cast<std::size_t>(k) * sizeof(float);
  long n = 0;
  bool in_place = true;
  for (std::size_t i = 0; i < count; ++i) {
    n += rows[i];
    // A block packs into its own place when its panels hold only its rows (it fills its last one).
    in_place = in_place && (i + 1 == count || kernels.packed_bytes_f32(rows[i], k) == rows[i] * row_bytes);
  }
  if (!in_place) {
    LoadScratchScope scratch;
    float* joined = load_scratch<float>(LoadSlot::kJoined, static_cast<std::size_t>(n) * k);
    long row = 0;
    for (std::size_t i = 0; i < count; ++i) {
      for (long j = 0; j < rows[i]; ++j)
        std::copy(blocks[i] + j * ldw, blocks[i] + j * ldw + k, joined + (row + j) * k);
      row += rows[i];
    }
    const float* whole = joined;
    return pack_weights_f32_blocks(&whole, &n, 1, k, k);
  }
  PackedWeights packed;
  packed.n = n;
  packed.k = k;
  packed.type = WeightType::kFloat32;
  packed.isa = active_isa();
  packed.data.resize(kernels.packed_bytes_f32(n, k));
  std::size_t offset = 0;
  for (std::size_t i = 0; i < count; ++i) {
    kernels.pack_f32(blocks[i], rows[i], k, ldw, packed.data.data() + offset);
    offset += rows[i] * row_bytes;
  }
  return packed;
}

PackedWeights pack_weights_f32(const float* w, long n, long k, long ldw) {
  return pack_weights_f32_blocks(&w, &n, 1, k, ldw);
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
      weight_quantizers().rows_s4(w, j0, j1, k, ldw, group_size, zero_point, u, scales, zeros);
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

// Rows [0, n) of w (row stride ldw) rounded to float16 or bfloat16 into h [n, k] (float_to_half /
// float_to_bfloat16 at the level's vector width), split across the threads by rows.
static void convert_weights_16(const float* w, long n, long k, long ldw, WeightType type, uint16_t* h) {
  const bool half = type == WeightType::kFloat16;
  parallel_ranges(n, quantize_rows_per_thread(k),
                  [&](long j0, long j1) { weight_quantizers().rows_16(w, j0, j1, k, ldw, half, h); });
}

PackedWeights pack_weights_blocks(const float* const* blocks, const long* rows, std::size_t count,
                                  const WeightFormat& format, long k, long ldw) {
  const WeightType type = format.type;
  if (type == WeightType::kFloat32) return pack_weights_f32_blocks(blocks, rows, count, k, ldw);
  long n = 0;
  for (std::size_t i = 0; i < count; ++i) n += rows[i];
  // The quantized or converted copy lives only until it is packed: load scratch, reused by the next
  // weight of a model build (runtime/load_scratch.h). Rows are quantized independently, so each
  // block is quantized straight into its own rows of that copy.
  LoadScratchScope scratch;
  const std::size_t count_all = static_cast<std::size_t>(n) * k;
  switch (type) {
    case WeightType::kInt4: {
      const long groups = int4_groups(k, format.group_size), half_kp = groups * format.group_size / 2;
      uint8_t* u = load_scratch<uint8_t>(LoadSlot::kConverted, static_cast<std::size_t>(n) * half_kp);
      uint16_t* scales = load_scratch<uint16_t>(LoadSlot::kConvertedScales, static_cast<std::size_t>(n) * groups);
      uint8_t* zeros = format.zero_point
                           ? load_scratch<uint8_t>(LoadSlot::kConvertedZeros, static_cast<std::size_t>(n) * groups)
                           : nullptr;
      long row = 0;
      for (std::size_t i = 0; i < count; ++i) {
        quantize_weights_s4(blocks[i], rows[i], k, ldw, format.group_size, format.zero_point, u + row * half_kp,
                            scales + row * groups, zeros ? zeros + row * groups : nullptr);
        row += rows[i];
      }
      return pack_weights_s4(u, scales, zeros, n, k, format.group_size);
    }
    case WeightType::kInt8: {
      int8_t* q = load_scratch<int8_t>(LoadSlot::kConverted, count_all);
      float* scales = load_scratch<float>(LoadSlot::kConvertedScales, n);
      long row = 0;
      for (std::size_t i = 0; i < count; ++i) {
        quantize_weights_s8(blocks[i], rows[i], k, ldw, q + row * k, scales + row);
        row += rows[i];
      }
      return pack_weights_s8(q, scales, n, k, k);
    }
    case WeightType::kFloat16:
    case WeightType::kBFloat16: {
      uint16_t* h = load_scratch<uint16_t>(LoadSlot::kConverted, count_all);
      long row = 0;
      for (std::size_t i = 0; i < count; ++i) {
        convert_weights_16(blocks[i], rows[i], k, ldw, type, h + row * k);
        row += rows[i];
      }
      return pack_weights_16(h, type, n, k, k);
    }
    case WeightType::kFloat32: break;  // above
  }
  throw std::invalid_argument("unknown weight type");
}

PackedWeights pack_weights(const float* w, const WeightFormat& format, long n, long k, long ldw) {
  return pack_weights_blocks(&w, &n, 1, format, k, ldw);
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  if (m <= 0 || w.n <= 0) return;
  if (w.isa != active_isa()) throw std::logic_error("weights were packed for another ISA level");
  switch (w.type) {
    case WeightType::kFloat32:
#if CPUFORMER_X86_64
      if (matmul_instruction(WeightType::kFloat32) == MatmulInstruction::kAmxBf16x3) {
        avx512amx::gemm_f32_bf16x3(a, m, lda, w, c, ldc, epilogue);
        return;
      }
#endif
      gemm_kernels().gemm_f32(a, m, lda, w, c, ldc, epilogue);
      return;
    case WeightType::kInt8: int8_gemm_kernels().gemm(a, m, lda, w, c, ldc, epilogue); return;
    case WeightType::kInt4: int4_gemm_kernels().gemm(a, m, lda, w, c, ldc, epilogue); return;
    case WeightType::kFloat16:
    case WeightType::kBFloat16: half_gemm_kernels().gemm(a, m, lda, w, c, ldc, epilogue); return;
  }
  throw std::logic_error("unknown weight type");
}

}  // namespace cpuformer
