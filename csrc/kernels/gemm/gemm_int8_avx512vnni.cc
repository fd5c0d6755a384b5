// AVX-512 VNNI int8 GEMM: A rows quantized to u8 (qa + 128), vpdpbusd against s8 weights, the
// compensation 128·Σq subtracted in the epilogue. Register tile 6 rows × 64 features (24 zmm
// accumulators); driver and packed layout in gemm_int8_inl.h.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"
#include "kernels/vector_math/vector_math_avx512.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace avx512vnni {
extern const Int8GemmKernels kInt8GemmKernels;
namespace {

constexpr long kMR = 6;
constexpr long kNR = 64;
constexpr long kKGroup = 4;
constexpr bool kUnsignedA = true;

#include "kernels/gemm/gemm_int8_inl.h"
// Order matters: the kernels included next need the declarations of the driver above.
#include "kernels/gemm/gemm_int8_avx512_inl.h"

// The vpdpbusd policy of the shared register tile: u8 A groups of 4 against s8 W, wrapping int32
// sums (the order of the adds does not matter).
struct Vnni {
  using A = uint8_t;
  using Out = int32_t;
  using Acc = __m512i;
  static constexpr long kGroup = 4;
  static Acc zero() { return _mm512_setzero_si512(); }
  static Acc dot(Acc acc, __m512i a, __m512i w) { return _mm512_dpbusd_epi32(acc, a, w); }
  static Acc add(Acc x, Acc y) { return _mm512_add_epi32(x, y); }
  static Acc load(const int32_t* p) { return _mm512_load_si512(p); }
  static void store(int32_t* p, Acc v) { _mm512_store_si512(p, v); }
};

#include "kernels/gemm/gemm_dot_tile_inl.h"

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out) {
  dot_tile<Vnni>(rows, a, lda, wp, kp, out);
}

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx512vnni
}  // namespace cpuformer
