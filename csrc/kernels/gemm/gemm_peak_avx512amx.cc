// Peak probes of the AMX kernels (gemm_int8_avx512amx.cc, gemm_half_avx512amx.cc; gemm_peak.h):
// TDPBUSD (16 × 16 × 64 = 16,384 multiply-adds) or TDPBF16PS (16 × 16 × 32) into four independent C
// tiles from two A and two B tiles held in tile registers, the kernels' tile shape.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/amx_tiles_inl.h"
#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512amx {

namespace {

// `steps` steps of four TDPBUSD (or TDPBF16PS) into four independent C tiles from two A and two B
// tiles loaded once.
template <bool kBf16>
void run_tiles(long steps) {
  alignas(64) int8_t operands[16 * 64];
  std::memset(operands, kBf16 ? 0x3F : 3, sizeof(operands));  // bfloat16 0x3F3F: about 0.75
  configure_tiles_16x64();  // after the memset: its memory clobber keeps the operands' stores
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operands, 64);
  _tile_loadd(5, operands, 64);
  _tile_loadd(6, operands, 64);
  _tile_loadd(7, operands, 64);
  for (long s = 0; s < steps; ++s) {
    if (kBf16) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
  }
  _tile_release();
}

}  // namespace

int64_t peak_tdpbusd(long steps) {
  run_tiles<false>(steps);
  return static_cast<int64_t>(steps) * 4 * 16 * 16 * 64;
}

int64_t peak_tdpbf16ps(long steps) {
  run_tiles<true>(steps);
  return static_cast<int64_t>(steps) * 4 * 16 * 16 * 32;
}

}  // namespace avx512amx
}  // namespace cpuformer
