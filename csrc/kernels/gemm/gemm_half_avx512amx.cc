// AMX bfloat16 GEMM: bfloat16 weights times activations rounded to bfloat16 on TDPBF16PS tiles for
// GEMMs with many rows (encoders, prefill); every other call (few rows, K not a multiple of 32,
// float16 weights) goes to the vdpbf16ps table (gemm_half_avx512bf16.cc), whose packing this kernel
// reads as it lies: one k pair of a panel is 64 features × 2 bfloat16, so 16 pairs of 16 features
// are a B tile (gemm_amx_driver_inl.h), and a packed-weights file of that kernel serves this one.
//
// Arithmetic: the vdpbf16ps kernel's (gemm.h, HalfGemmKernels; rows rounded with vcvtneps2bf16,
// products exact in float32, float32 sums, subnormal inputs and outputs flushed to zero), with the
// float32 sums taken in the tile's order: the results differ from the vdpbf16ps kernel's by float32
// rounding only, within the bound tests/kernels/test_gemm_half.py checks for both.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/amx_tiles_inl.h"
#include "kernels/gemm/gemm.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512bf16 { extern const HalfGemmKernels kHalfGemmKernels; }
namespace avx512amx {
extern const HalfGemmKernels kHalfGemmKernels;
namespace {

// Below this many multiply-adds per thread a second thread costs more than it saves.
constexpr long kMinMacsPerThread = 1L << 17;
// From this many rows bfloat16 GEMMs take the tiles (int8's kAmxMinRows is 8): vdpbf16ps runs at
// half the float32 FMA rate on the AMX Xeon of 2026-11-27, so even a tile that is mostly padding
// beats it (2 threads, 2304 × 768 / 768 × 3072: 4 rows 130 / 115 → 193 / 141 GOP/s, 8 rows
// 155 / 139 → 360 / 293, 12 rows 161 / 164 → 515 / 411); one or two rows (decode) stream the
// weights and stay on vdpbf16ps (1 row: 62 / 45 there, 50 / 38 on tiles).
constexpr long kAmxMinRowsBf16 = 4;

#include "kernels/gemm/gemm_half_bf16_inl.h"

#define CPUFORMER_TILE_DOT _tile_dpbf16ps
#include "kernels/gemm/gemm_amx_driver_inl.h"
#undef CPUFORMER_TILE_DOT

const HalfGemmKernels& vector_kernels() { return avx512bf16::kHalfGemmKernels; }

std::size_t packed_bytes(long n, long k, WeightType type) { return vector_kernels().packed_bytes(n, k, type); }

void pack(const uint16_t* w, WeightType type, long n, long k, long ldw, uint8_t* out) {
  vector_kernels().pack(w, type, n, k, ldw, out);
}

void gemm(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc, const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k, kp = (k + 1) / 2 * 2;
  const long row_bytes = kp * static_cast<long>(sizeof(uint16_t));
  if (w.type != WeightType::kBFloat16 || m < kAmxMinRowsBf16 || row_bytes % kAmxStepBytes != 0) {
    vector_kernels().gemm(a, m, lda, w, c, ldc, epilogue);
    return;
  }
  // bfloat16 A: [mp][kp] (m rounded up to an A tile), rows past m zero. Allocated here: no
  // exception may leave the parallel region.
  const long mp = (m + 15) / 16 * 16;
  float* scratch = gemm_thread_scratch((static_cast<std::size_t>(mp) * kp / 2 + 15) / 16 * 16);
  uint16_t* ab = reinterpret_cast<uint16_t*>(scratch);
  std::memset(ab + m * kp, 0, static_cast<std::size_t>((mp - m) * row_bytes));
  amx_gemm<float>(
      m, n, k, kMinMacsPerThread, reinterpret_cast<const uint8_t*>(ab), row_bytes, w.bytes(),
      [&](long i) { convert_row(a + i * lda, k, kp, ab + i * kp); },
      [&](long i, float* acc, long j0, long ncols) {
        finish_row(acc, epilogue.bias ? epilogue.bias + j0 : nullptr, epilogue.activation,
                   epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr, c + i * ldc + j0, ncols);
      });
}

}  // namespace

const HalfGemmKernels kHalfGemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx512amx
}  // namespace cpuformer
