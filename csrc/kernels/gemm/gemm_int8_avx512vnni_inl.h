// The AVX-512 VNNI int8 GEMM (register tile 6 rows × 64 features, vpdpbusd) as a whole: its
// constants, the driver and packed layout (gemm_int8_inl.h), the AVX-512 row quantizer and epilogue
// (gemm_int8_avx512_inl.h) and its register tile. Included by gemm_int8_avx512vnni.cc and by the
// AMX kernel (gemm_int8_avx512amx.cc), which runs it for the GEMMs its tiles do not take. Include
// INSIDE the ISA namespace (anonymous namespace) of a translation unit compiled with AVX512-VNNI,
// after <immintrin.h>, <cstdint>, <cstring>, "kernels/activation/activation.h",
// "kernels/gemm/gemm.h", "kernels/vector_math/vector_math_avx512.h" and "runtime/threading.h";
// no include guard on purpose.

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

void tile_kernel(long rows, const uint8_t* a, long lda, const int8_t* wp, long kp, int32_t* out, const char* ahead,
                 long ahead_lines) {
  dot_tile<Vnni>(rows, a, lda, wp, kp, out, ahead, ahead_lines);
}
