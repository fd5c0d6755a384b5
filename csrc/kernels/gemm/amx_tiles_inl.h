// The AMX tile configuration shared by the AMX kernels (gemm_amx_driver_inl.h) and their peak
// probes (gemm_peak_avx512amx.cc). Include only in translation units compiled with -mamx-tile.
#pragma once

#include <cstdint>
#include <cstring>

namespace cpuformer {
namespace avx512amx {

// The 64-byte operand of LDTILECFG (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Configures the first eight tiles as 16 rows × 64 bytes each (16 × 16 int32 C tiles, 16 × 64 u8
// A tiles, 16 groups × 16 × 4 s8 B tiles). GCC 12's _tile_loadconfig tells the compiler it reads
// only 8 bytes of the configuration (the stores of the rest were dropped as dead), and its tile
// loads do not say they read memory: the operand here is the whole configuration, and the memory
// clobber orders the caller's earlier stores (of tile operands) before the tile loads that follow.
inline void configure_tiles_16x64() {
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(config) : "memory");
}

}  // namespace avx512amx
}  // namespace cpuformer
