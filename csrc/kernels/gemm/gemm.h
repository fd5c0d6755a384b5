// Matrix multiplication against a weight matrix packed once: c = epilogue(a · Wᵀ).
//
// Shapes and layout (row-major, element strides):
//   a [M, K] with row stride lda ≥ K; W [N, K] (PyTorch nn.Linear layout) with row stride ldw ≥ K;
//   c [M, N] with row stride ldc ≥ N; bias [N]; residual [M, N] with row stride ldr.
// Epilogue, per element: c = act(a·Wᵀ + bias) + residual. residual may alias c (then ldr == ldc:
// accumulate in place); a must not alias c. No alignment is required of a, c or residual.
// Threads: gemm() uses current_num_threads() threads (runtime/thread_pool.h). PackedWeights is immutable after
// packing and may be shared by any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "kernels/activation/activation.h"
#include "runtime/aligned_buffer.h"
#include "runtime/cpu_features.h"

namespace cpuformer {

enum class WeightType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kInt8 = 3, kInt4 = 4 };

// The dtype name of a weight type, as the Python API spells it ("float32", ..., "int4").
inline const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kFloat16: return "float16";
    case WeightType::kBFloat16: return "bfloat16";
    case WeightType::kInt8: return "int8";
    case WeightType::kInt4: return "int4";
    case WeightType::kFloat32: break;
  }
  return "float32";
}

// int4 weights come in groups of this many input channels by default; 32, 64 and 128 are allowed.
constexpr long kInt4DefaultGroupSize = 32;
// True for the group sizes the int4 kernels serve.
inline bool valid_int4_group_size(long g) { return g == 32 || g == 64 || g == 128; }

// How a weight is stored: its type and, for int4, the group size and whether groups carry a zero
// point (asymmetric) or not (symmetric). Implicit from a WeightType (int4: G = 32, symmetric).
struct WeightFormat {
  WeightType type = WeightType::kFloat32;
  long group_size = kInt4DefaultGroupSize;
  bool zero_point = false;

  WeightFormat() = default;
  WeightFormat(WeightType t) : type(t) {}  // NOLINT(google-explicit-constructor)
  WeightFormat(WeightType t, long g, bool z) : type(t), group_size(g), zero_point(z) {}
};

struct GemmEpilogue {
  const float* bias = nullptr;              // [N] or null
  Activation activation = Activation::kNone;
  const float* residual = nullptr;          // [M, ldr] or null; added after the activation
  long ldr = 0;
};

// W packed for the GEMM of one ISA level. The byte layout of its bytes belongs to that level's
// kernels (see gemm_<isa>.cc); nothing else interprets them. The bytes are either owned (`data`,
// filled by the pack_weights_* functions) or a view of memory someone else owns (a converted
// directory's mapped packed-weights file, io/packed_file.h), kept alive by `keep_alive`. Kernels
// read them through bytes(). Changing any level's layout requires bumping kPackedLayoutVersion.
struct PackedWeights {
  long n = 0;  // output features (rows of W)
  long k = 0;  // input features (columns of W)
  WeightType type = WeightType::kFloat32;
  Isa isa = Isa::kScalar;
  long group_size = 0;      // int4 only
  bool zero_point = false;  // int4 only
  AlignedBuffer<uint8_t> data;  // owned bytes (empty for a view)

  const uint8_t* bytes() const { return view_ != nullptr ? view_ : data.data(); }
  std::size_t byte_size() const { return view_ != nullptr ? view_bytes_ : data.size(); }
  bool is_view() const { return view_ != nullptr; }
  // Makes this a view of `bytes` (64-byte aligned, byte_size bytes, the running level's layout for
  // n, k, type, ...), which stay valid while `keep_alive` lives; drops any owned bytes.
  void set_view(const uint8_t* bytes, std::size_t byte_size, std::shared_ptr<const void> keep_alive) {
    data = AlignedBuffer<uint8_t>();
    view_ = bytes;
    view_bytes_ = byte_size;
    keep_alive_ = std::move(keep_alive);
  }

 private:
  const uint8_t* view_ = nullptr;
  std::size_t view_bytes_ = 0;
  std::shared_ptr<const void> keep_alive_;
};

// The version of every level's packed layouts as a whole: stored in packed-weights files
// (io/packed_file.h), which are not used when it differs. Bump it when any pack function changes.
constexpr long kPackedLayoutVersion = 1;
// The bytes the running level's packer writes for [n, k] weights in `format`.
std::size_t packed_weight_bytes(long n, long k, const WeightFormat& format);

struct GemmKernels {
  std::size_t (*packed_bytes_f32)(long n, long k);
  void (*pack_f32)(const float* w, long n, long k, long ldw, uint8_t* out);
  // Multi-threaded (current_num_threads()). m ≥ 1.
  void (*gemm_f32)(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
                   const GemmEpilogue& epilogue);
};

// Quantized and 16-bit weights. Same contract as gemm_f32 (epilogue, aliasing, threads); only the
// weight storage and the arithmetic differ.
//
// int8 (WeightType::kInt8): W[n][k] ≈ q[n][k]·scale[n], q in [-127, 127] (symmetric, per output
// channel; see quantize_weights_s8). Each row of A is quantized on the fly, symmetric per row:
//   amax = max_k |a[i][k]|, sa[i] = amax / 127, qa[i][k] = round_half_even(a[i][k] · (127 / amax))
//   (qa = 0 and sa = 0 for an all-zero row; qa = 0 and sa = NaN for a row holding a NaN or ±inf,
//   which int8 cannot represent: every output of that row is NaN), then
//   c[i][j] = act(sa[i]·scale[j]·Σ_k qa[i][k]·q[j][k] + bias[j]) + residual[i][j]
// with the integer sum exact in int32 at every ISA level (K ≤ kInt8GemmMaxK = 2^17 keeps it in range:
// 2^17·127·127 < 2^31; callers check it: ops.Linear's binding, models' Linear). The
// product 127/amax and the rounding are done in float32 exactly as written, so every level
// produces the same qa and the same integer sums.
constexpr long kInt8GemmMaxK = 1L << 17;

struct Int8GemmKernels {
  std::size_t (*packed_bytes)(long n, long k);
  // q [n, k] (row stride ldq) int8 in [-127, 127]; scales [n]. Both are copied into `out`.
  void (*pack)(const int8_t* q, const float* scales, long n, long k, long ldq, uint8_t* out);
  void (*gemm)(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
               const GemmEpilogue& epilogue);
};

// int4 (WeightType::kInt4): group-wise 4-bit weights. The input channels of each output row j split
// into groups of G consecutive channels (G = PackedWeights::group_size: 32, 64 or 128; when G does
// not divide K the last group is completed with zero weights, K padded to Kp = ceil(K / G)·G):
//   W[j][k] ≈ s[j][g]·(u[j][k] − z[j][g]),  g = k / G,  u, z ∈ [0, 15],  s a float16,
// with z = 8 for every group when the weights are symmetric (no zero points). A rows are quantized
// exactly as for int8 (qa, sa above). Then, per row i and output j,
//   t[g] = Σ_{k in g} qa[i][k]·u[j][k] − z[j][g]·Σ_{k in g} qa[i][k]   (exact in int32: |t| < 2^19)
//   acc = 0; for g = 0, 1, ...: acc = fma(float(s[j][g]), float(t[g]), acc)   (float32, fused)
//   c[i][j] = act(sa[i]·acc + bias[j]) + residual[i][j]
// Every level computes these operations in this order, so every level gives the same bits.
// A group whose scale is NaN (it held a NaN or ±inf) makes its channel's outputs NaN.
struct Int4GemmKernels {
  std::size_t (*packed_bytes)(long n, long k, long group_size, bool zero_point);
  // u [n, Kp / 2] bytes (Kp = groups·G): u[j][2b] in the low nibble of byte b of row j,
  // u[j][2b + 1] in the high nibble; scales [n, groups] float16 bits; zeros [n, groups] (one zero
  // point per byte, ≤ 15) or null for symmetric weights. Copied into `out`.
  void (*pack)(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long k, long group_size,
               uint8_t* out);
  void (*gemm)(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
               const GemmEpilogue& epilogue);
};

// float16 / bfloat16 (WeightType::kFloat16 / kBFloat16): W holds 16-bit bit patterns (IEEE binary16
// or the upper half of a float32). c = act(a·float(W)ᵀ + bias) + residual, accumulated in float32.
// The widening kernels (every level) convert each weight to float32 exactly and keep a in float32,
// so the result is a float32 GEMM on the rounded weights up to summation order. On a CPU with
// AVX512-BF16 the avx512 level multiplies bfloat16 weights with vdpbf16ps instead
// (gemm_half_avx512bf16.cc): a is rounded to bfloat16 (nearest even, subnormals to zero), the
// products are exact and summed in float32, which adds at most 2^-9·Σ|a·w| (docs/precision.md).
// CPUFORMER_DISABLE_FEATURES=avx512_bf16 selects the widening kernel there too.
struct HalfGemmKernels {
  std::size_t (*packed_bytes)(long n, long k, WeightType type);
  // w [n, k] (row stride ldw) 16-bit values of type `type` (kFloat16 or kBFloat16).
  void (*pack)(const uint16_t* w, WeightType type, long n, long k, long ldw, uint8_t* out);
  void (*gemm)(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
               const GemmEpilogue& epilogue);
};

// How float32 weights are multiplied (the names of torch.set_float32_matmul_precision):
// kHighest (the default) in float32 with FMA at every level; kHigh lets a CPU with AMX-BF16 take
// GEMMs of 32 rows or more on TDPBF16PS tiles with each float32 operand split into two bfloat16
// (gemm_f32_avx512amx.cc): 16 significant bits per operand instead of 24, each product off by at
// most 3·2^-18 ≈ 1.2e-5 of its magnitude, several times the float32 FMA rate. Elsewhere kHigh is kHighest.
// Process-wide; read by every GEMM call, so it may change between calls.
enum class Float32MatmulPrecision : int { kHighest = 0, kHigh = 1 };
void set_float32_matmul_precision(Float32MatmulPrecision precision);
Float32MatmulPrecision float32_matmul_precision();
// Sets it by name, "highest" or "high" (the Python and C APIs); std::invalid_argument naming the
// value otherwise.
void set_float32_matmul_precision(const std::string& name);
const char* float32_matmul_precision_name();

const GemmKernels& gemm_kernels();
const Int8GemmKernels& int8_gemm_kernels();
const HalfGemmKernels& half_gemm_kernels();
const Int4GemmKernels& int4_gemm_kernels();
// The instruction sequence the selected kernels multiply weights of `type` with: plain C++ at the
// scalar level, FMA (float32, and the widening 16-bit kernels), the vpmaddubsw/vpmaddwd sequence
// or vpdpbusd (int8), vdpbf16ps (bfloat16 with AVX512-BF16); 256 or 512 bits wide; or AMX tiles,
// TDPBUSD (int8 with AMX-INT8) and TDPBF16PS (bfloat16 with AMX-BF16). On AArch64:
// NEON fmla on 128 bits (float32, and the widening 16-bit kernels), SDOT on 128 bits (int8 at the
// dotprod level, int4), SMMLA on 128 bits (int8 at the i8mm level).
enum class MatmulInstruction {
  kScalar,
  kFma256,
  kFma512,
  kMaddubs256,
  kMaddubs512,
  kDpbusd256,
  kDpbusd512,
  kDpbf16x512,
  kAmxInt8,  // TDPBUSD tiles for GEMMs of 8 rows or more, 512-bit vpdpbusd below
  kAmxBf16,  // TDPBF16PS tiles for GEMMs of 4 rows or more, vdpbf16ps below
  kAmxBf16x3,  // float32 at precision kHigh: TDPBF16PS on split operands from 32 rows, FMA below
  kNeonFma128,
  kSdot128,
  kSmmla128
};
MatmulInstruction matmul_instruction(WeightType type);
// Its name, e.g. "avx512_vnni vpdpbusd" (shown by cpu_info() and `cpuformer info`).
const char* gemm_kernel_name(WeightType type);

// Load-time conversions (generic code, identical at every ISA level; `cpuformer convert` uses them
// too, so a converted directory holds exactly what quantize-at-load would compute).
// q[j][:] = round_half_even(w[j][:] · (127 / max|w[j][:]|)), scales[j] = max|w[j][:]| / 127
// (a zero row gives q = 0, scale = 0; a row holding a NaN or ±inf gives q = 0, scale = NaN, so
// every output of that channel is NaN). q is [n, k] contiguous.
void quantize_weights_s8(const float* w, long n, long k, long ldw, int8_t* q, float* scales);
// Group-wise int4 (layout of Int4GemmKernels::pack; groups = ceil(k / G), Kp = groups·G). Per group:
//   symmetric: m = the value of largest magnitude (the first), s = float16(m / −8),
//     u = clamp(round_half_even(w / s), −8, 7) + 8 (z = 8): the extreme value maps to −8 exactly;
//   zero point: lo = min(0, min w), hi = max(0, max w), s = float16((hi − lo) / 15),
//     z = clamp(round_half_even(−lo / s), 0, 15), u = clamp(round_half_even(w / s) + z, 0, 15);
//   w / s uses the rounded scale. A group of zeros (or one whose scale rounds to 0) gets u = z
//   (exact zeros), a group holding a NaN or ±inf a NaN scale and u = z; padding nibbles are z.
// std::invalid_argument when a scale overflows float16 (a group spanning more than about 5.2e5
// symmetric, 9.8e5 with zero points).
void quantize_weights_s4(const float* w, long n, long k, long ldw, long group_size, bool zero_point, uint8_t* u,
                         uint16_t* scales, uint8_t* zeros);
inline long int4_groups(long k, long group_size) { return (k + group_size - 1) / group_size; }
// Round to nearest even; NaN stays NaN, overflow goes to ±inf.
uint16_t float_to_half(float x);
uint16_t float_to_bfloat16(float x);
float half_to_float(uint16_t h);
float bfloat16_to_float(uint16_t h);

// Scratch space owned by the calling thread (grown on demand, kept for the thread's lifetime), so
// the per-ISA kernels can pack A blocks without allocating on every call. 64-byte aligned.
// Valid until the same thread calls it again.
float* gemm_thread_scratch(std::size_t count);

PackedWeights pack_weights_f32(const float* w, long n, long k, long ldw);
PackedWeights pack_weights_s8(const int8_t* q, const float* scales, long n, long k, long ldq);
PackedWeights pack_weights_16(const uint16_t* w, WeightType type, long n, long k, long ldw);
// u, scales, zeros as quantize_weights_s4 writes them; std::invalid_argument for a group size the
// kernels do not serve.
PackedWeights pack_weights_s4(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long k,
                              long group_size);
// From float32 to any format: quantizes / rounds first (quantize_weights_s8, quantize_weights_s4,
// float_to_half, float_to_bfloat16), then packs.
PackedWeights pack_weights(const float* w, const WeightFormat& format, long n, long k, long ldw);
// The same for float32 weights whose rows come in `count` blocks (a fused projection's parts: q, k
// and v), block i `rows[i]` rows of k elements at row stride ldw: packed as the one matrix the
// blocks make one after another. Each block is quantized or converted straight into its rows of the
// copy that is packed; float32 blocks that end on a panel boundary are packed straight into their
// place (no joined copy of the model's largest matrices at load).
PackedWeights pack_weights_blocks(const float* const* blocks, const long* rows, std::size_t count,
                                  const WeightFormat& format, long k, long ldw);
// Dispatches on w.type.
void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
          const GemmEpilogue& epilogue = {});

namespace scalar {
extern const GemmKernels kGemmKernels;
extern const Int8GemmKernels kInt8GemmKernels;
extern const HalfGemmKernels kHalfGemmKernels;
extern const Int4GemmKernels kInt4GemmKernels;
}  // namespace scalar
namespace avx2 {
extern const GemmKernels kGemmKernels;
extern const Int8GemmKernels kInt8GemmKernels;
extern const HalfGemmKernels kHalfGemmKernels;
extern const Int4GemmKernels kInt4GemmKernels;
}  // namespace avx2
namespace avx512 {
extern const GemmKernels kGemmKernels;
extern const Int8GemmKernels kInt8GemmKernels;
extern const HalfGemmKernels kHalfGemmKernels;
}  // namespace avx512
// AArch64 (docs/arm.md): float32, float16 and bfloat16 at the neon level and up, int8 with SDOT at
// the dotprod level and with SMMLA at the i8mm level, int4 with SDOT at dotprod and up
// (dotprod::kInt4GemmKernels is declared in gemm.cc, as the x86 int4 tables are).
namespace neon {
extern const GemmKernels kGemmKernels;
extern const HalfGemmKernels kHalfGemmKernels;
}  // namespace neon
namespace dotprod { extern const Int8GemmKernels kInt8GemmKernels; }
namespace i8mm { extern const Int8GemmKernels kInt8GemmKernels; }

}  // namespace cpuformer
