// AMX int8 GEMM: the products of GEMMs with many rows (encoders, prefill) on TDPBUSD tiles, every
// other call on the AVX-512 VNNI kernel. The packed layout is avx512vnni's (gemm_int8_inl.h, panels
// of 64 features in groups of 4 k): one k group of a panel is 64 features × 4 bytes, so 16
// consecutive groups of 16 features are an AMX B tile as they lie (16 rows of 64 bytes, row stride
// 256 bytes), and a packed-weights file of the VNNI kernel serves this one unchanged. A rows are
// quantized to u8 (qa + 128) as for vpdpbusd and the compensation 128·Σq is subtracted in the same
// epilogue: TDPBUSD sums u8 × s8 products into int32 without saturation, like vpdpbusd, so the
// integer sums, and the outputs, are those of the VNNI kernel bit for bit.
//
// Tiles, work split and the AMX epilogue buffer: gemm_amx_driver_inl.h (shared with the bfloat16
// kernel); the epilogue of a finished row (dequantize, bias, activation, residual) is the VNNI
// kernel's.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/amx_tiles_inl.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx512.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512amx {
extern const Int8GemmKernels kInt8GemmKernels;
namespace {

// The VNNI kernel (packing, quantizer, epilogue, and the GEMMs the tiles do not take).
#include "kernels/gemm/gemm_int8_avx512vnni_inl.h"

#define CPUFORMER_TILE_DOT _tile_dpbusd
#include "kernels/gemm/gemm_amx_driver_inl.h"
#undef CPUFORMER_TILE_DOT

void gemm_amx(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
              const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const long np = i8_ceil_div(n, kNR) * kNR, kp = i8_ceil_div(k, kKGroup) * kKGroup;
  if (m < kAmxMinRows || kp % kAmxStepBytes != 0) return avx512amx::gemm(a, m, lda, w, c, ldc, epilogue);
  const float* scales = reinterpret_cast<const float*>(w.bytes());
  const int32_t* comp = reinterpret_cast<const int32_t*>(w.bytes() + np * sizeof(float));
  const uint8_t* panels = w.bytes() + np * (sizeof(float) + sizeof(int32_t));

  // Quantized A: [mp][kp] u8 (m rounded up to an A tile), rows past m hold qa = 0 (their sums are
  // computed and not stored); then sa [m]. Allocated here: no exception may leave the parallel region.
  const long mp = i8_ceil_div(m, 16) * 16;
  const std::size_t qa_floats = (static_cast<std::size_t>(mp) * kp + 63) / 64 * 16;
  float* scratch = gemm_thread_scratch(qa_floats + static_cast<std::size_t>(m));
  uint8_t* qa = reinterpret_cast<uint8_t*>(scratch);
  float* sa = scratch + qa_floats;
  std::memset(qa + m * kp, 128, static_cast<std::size_t>((mp - m) * kp));

  amx_gemm<int32_t>(
      m, n, k, kInt8MinMacsPerThread, qa, kp, panels,
      [&](long i) { sa[i] = quantize_row(a + i * lda, k, kp, qa + i * kp); },
      [&](long i, const int32_t* acc, long j0, long ncols) {
        finish_row(acc, comp + j0, sa[i], scales + j0, epilogue.bias ? epilogue.bias + j0 : nullptr,
                   epilogue.activation, epilogue.residual ? epilogue.residual + i * epilogue.ldr + j0 : nullptr,
                   c + i * ldc + j0, ncols);
      });
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm_amx};

}  // namespace avx512amx
}  // namespace cpuformer
