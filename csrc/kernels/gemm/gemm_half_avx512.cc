// AVX-512 GEMM over float16 / bfloat16 weights. Packed W: the panels of gemm_driver_inl.h (32
// output features, k-major, columns past N zero) with 16-bit elements, so decode streams half the
// bytes of float32. The weights are widened to float32 exactly (vcvtph2ps for float16; zero-extend
// and shift left by 16 for bfloat16) and multiplied with float32 FMAs into float32 sums; A stays
// float32. Few rows (m ≤ 14): the GEMV kernel widens each weight in registers as it streams past.
// Many rows: the float32 driver and tile kernel of gemm_avx512.cc run unchanged, each thread
// widening a W panel slice [kc][32] into its own float32 buffer once per (row block, slice, panel)
// and running the register tile over it.
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "runtime/aligned_buffer.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512 {
namespace {

#include "kernels/gemm/gemm_avx512_blocking_inl.h"
using WElem = uint16_t;

#include "kernels/gemm/gemm_driver_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_avx512_inl.h"

using GemvFn = void (*)(const float*, long, const void*, long, float*, long, long, const TileEpilogue&);
constexpr GemvFn kGemvs[2][kGemvMaxRows] = {
    {gemv_rows<1, kWF16>, gemv_rows<2, kWF16>, gemv_rows<3, kWF16>, gemv_rows<4, kWF16>, gemv_rows<5, kWF16>,
     gemv_rows<6, kWF16>, gemv_rows<7, kWF16>, gemv_rows<8, kWF16>, gemv_rows<9, kWF16>, gemv_rows<10, kWF16>,
     gemv_rows<11, kWF16>, gemv_rows<12, kWF16>, gemv_rows<13, kWF16>, gemv_rows<14, kWF16>},
    {gemv_rows<1, kWBF16>, gemv_rows<2, kWBF16>, gemv_rows<3, kWBF16>, gemv_rows<4, kWBF16>, gemv_rows<5, kWBF16>,
     gemv_rows<6, kWBF16>, gemv_rows<7, kWBF16>, gemv_rows<8, kWBF16>, gemv_rows<9, kWBF16>, gemv_rows<10, kWBF16>,
     gemv_rows<11, kWBF16>, gemv_rows<12, kWBF16>, gemv_rows<13, kWBF16>, gemv_rows<14, kWBF16>},
};

void gemv_kernel(long rows, const float* a, long lda, const uint16_t* wp, long k, WeightType type, float* c, long ldc,
                 long ncols, const TileEpilogue& ep) {
  kGemvs[type == WeightType::kFloat16 ? 0 : 1][rows - 1](a, lda, wp, k, c, ldc, ncols, ep);
}

const float* widen_slice(const uint16_t* src, long kc, WeightType type) {
  thread_local AlignedBuffer<float> buffer;
  const long count = kc * kNR;
  if (static_cast<long>(buffer.size()) < count) buffer.resize(static_cast<std::size_t>(kKC * kNR));
  float* dst = buffer.data();
  const __m256i* s = reinterpret_cast<const __m256i*>(src);
  if (type == WeightType::kFloat16) {
    for (long i = 0; i < count / 16; ++i) _mm512_store_ps(dst + 16 * i, _mm512_cvtph_ps(_mm256_load_si256(s + i)));
  } else {
    for (long i = 0; i < count / 16; ++i)
      _mm512_store_si512(dst + 16 * i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256(s + i)), 16));
  }
  return dst;
}

std::size_t packed_bytes(long n, long k, WeightType) { return packed_bytes_w(n, k); }
void pack(const uint16_t* w, WeightType, long n, long k, long ldw, uint8_t* out) { pack_w(w, n, k, ldw, out); }

}  // namespace

const HalfGemmKernels kHalfGemmKernels = {packed_bytes, pack, gemm_w};

}  // namespace avx512
}  // namespace cpuformer
