// The packed int4 weight layout of every x86 SIMD level (gemm_int4_avx2.cc, gemm_int4_avxvnni.cc,
// gemm_int4_avx512vnni.cc): one packing for all of them, so a weight packed at one level reads the
// same at another (the layout is plain C++ and compiles identically in each translation unit).
//
// ceil(N / 8) panels of 8 output features; a panel holds its scales [groups][8] float16, then (with
// zero points) its zero points [groups][8] bytes, padded to 32 bytes, then for each group G / 8
// blocks of 32 bytes: block b of group g holds, at byte 4·jj + t, u[j][k0 + t] in the low nibble
// and u[j][k0 + 4 + t] in the high one (k0 = g·G + 8·b, j the panel's feature jj). The low nibbles
// are then the int32 lanes (4 channels k0..k0+3 of the 8 features) of vpmaddubsw / vpdpbusd, the
// high nibbles those of channels k0+4..k0+7. Padding features have scale 0 and nibbles 0.
//
// Include INSIDE the ISA namespace (in an anonymous namespace), after <cstring> and
// "runtime/threading.h"; like the other *_inl.h kernels it has no include guard on purpose.

constexpr long kInt4Panel = 8;  // output features per panel

inline long int4_ceil_div(long a, long b) { return (a + b - 1) / b; }

// Bytes of a panel's scales and zero points, padded so its nibble blocks start 32-byte aligned.
inline long int4_header_bytes(long groups, bool zero_point) {
  return int4_ceil_div(groups * kInt4Panel * (2 + (zero_point ? 1 : 0)), 32) * 32;
}

inline long int4_panel_bytes(long groups, long group_size, bool zero_point) {
  return int4_header_bytes(groups, zero_point) + groups * group_size * kInt4Panel / 2;
}

std::size_t packed_bytes(long n, long k, long group_size, bool zero_point) {
  const long groups = int4_groups(k, group_size);
  return static_cast<std::size_t>(int4_ceil_div(n, kInt4Panel)) * int4_panel_bytes(groups, group_size, zero_point);
}

// The panel of pack starting at feature p0 (`panel`, already zeroed).
void pack_panel(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long groups, long kp,
                long header, long p0, uint8_t* panel) {
  uint16_t* panel_scales = reinterpret_cast<uint16_t*>(panel);
  uint8_t* panel_zeros = panel + groups * kInt4Panel * 2;
  uint8_t* blocks = panel + header;
  for (long jj = 0; jj < kInt4Panel && p0 + jj < n; ++jj) {
    const long j = p0 + jj;
    for (long g = 0; g < groups; ++g) {
      panel_scales[g * kInt4Panel + jj] = scales[j * groups + g];
      if (zeros != nullptr) panel_zeros[g * kInt4Panel + jj] = zeros[j * groups + g];
    }
    // Each block takes 4 bytes of the row: k0..k0+7 as nibbles n0..n7 (n_i at bits 4i of the
    // little-endian word), stored as n0 n4 n1 n5 n2 n6 n3 n7 (byte t = n_t | n_(t+4) << 4): the
    // perfect shuffle of the word's nibbles, two swaps.
    const uint8_t* row = u + j * (kp / 2);
    for (long q = 0; q < kp / 8; ++q) {
      uint32_t x;
      std::memcpy(&x, row + 4 * q, 4);
      x = (x & 0xFF0000FFu) | ((x & 0x00FF0000u) >> 8) | ((x & 0x0000FF00u) << 8);  // n0 n1 n4 n5 n2 n3 n6 n7
      x = (x & 0xF00FF00Fu) | ((x & 0x0F000F00u) >> 4) | ((x & 0x00F000F0u) << 4);  // n0 n4 n1 n5 n2 n6 n3 n7
      std::memcpy(blocks + q * 32 + 4 * jj, &x, 4);
    }
  }
}

void pack(const uint8_t* u, const uint16_t* scales, const uint8_t* zeros, long n, long k, long group_size,
          uint8_t* out) {
  const long groups = int4_groups(k, group_size), kp = groups * group_size;
  const long stride = int4_panel_bytes(groups, group_size, zeros != nullptr);
  const long header = int4_header_bytes(groups, zeros != nullptr);
  // Panels split across the threads, each zeroed by the thread that fills it (the fresh pages are
  // first touched in parallel too).
  parallel_ranges(int4_ceil_div(n, kInt4Panel), 1, [&](long first, long last) {
    std::memset(out + first * stride, 0, static_cast<std::size_t>(last - first) * stride);
    for (long p = first; p < last; ++p)
      pack_panel(u, scales, zeros, n, groups, kp, header, p * kInt4Panel, out + p * stride);
  });
}

// Bytes ahead of the block being multiplied that are prefetched: a decode step (one row) streams
// the weights once and is bound by memory, where the hardware prefetcher alone left ~20 % of the
// read bandwidth unused with groups of 32 (two streams per panel: scales and nibbles).
constexpr long kInt4PrefetchDistance = 1024;
