// Peak probe of the AMX int8 kernel (gemm_int8_avx512amx.cc, gemm_peak.h): TDPBUSD into four
// independent C tiles from two A and two B tiles held in tile registers, 16 × 16 × 64 = 16,384
// multiply-adds per instruction, the kernel's tile shape.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/gemm/amx_tiles_inl.h"
#include "kernels/gemm/gemm_peak.h"

namespace cpuformer {
namespace avx512amx {

int64_t peak_tdpbusd(long steps) {
  alignas(64) int8_t operands[16 * 64];
  std::memset(operands, 3, sizeof(operands));
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
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_release();
  return static_cast<int64_t>(steps) * 4 * 16 * 16 * 64;
}

}  // namespace avx512amx
}  // namespace cpuformer
