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

#include "kernels/gemm/gemm_int8_avx512vnni_inl.h"

}  // namespace

const Int8GemmKernels kInt8GemmKernels = {packed_bytes, pack, gemm};

}  // namespace avx512vnni
}  // namespace cpuformer
