// Register tile of the AVX-512 dot-product GEMMs (vpdpbusd for int8, vdpbf16ps for bfloat16):
// up to 6 rows of A × kNR = 64 output features over the whole K of one packed panel.
//
// Include INSIDE the ISA namespace (anonymous namespace) of the per-ISA translation unit, after
// <immintrin.h> and <cstring>, with kNR == 64 defined; no include guard on purpose (like
// gemm_driver_inl.h). The kernel is generic over a policy D:
//   D::A                 element type of the converted A rows (uint8_t / uint16_t)
//   D::kGroup            A elements one 32-bit lane of W holds (4 for vpdpbusd, 2 for vdpbf16ps)
//   D::Acc               accumulator vector (__m512i / __m512)
//   D::zero()            an all-zero accumulator
//   D::dot(acc, a, w)    acc + the dot products of the broadcast 32-bit A group a with W lanes w
//   D::add(x, y)         x + y (combines accumulator sets)
//   D::load(p)/store(p, v)  64-byte aligned loads and stores of accumulators
// Packed panel: one k group is kNR 32-bit lanes (256 bytes), consecutive groups follow each other.
//
// tile_rows<D, R, U> runs U independent accumulator sets over consecutive k groups (with few rows,
// as in decode, one set alone would wait on the latency of the dot-product instruction).
// Accumulator slot s < R·U holds row s % R over the k groups ≡ s / R (mod U); R·U ≤ 6 slots of 4
// zmm each, plus 4 weight vectors and the broadcast A group: at most 29 of the 32 zmm registers.
// One named variable per accumulator, no array: with an array, GCC's register allocation of the
// unrolled loop changed with unrelated code around it (under LTO) and could store every
// accumulator to the stack on every k step, halving the speed.
//
// out[r·kNR + j] = Σ over the k groups of row r (r < R), all kNR columns; kp (A elements) a
// multiple of D::kGroup. Meanwhile the ahead_lines 64-byte lines at `ahead` (a share of the panel
// a later tile reads: PanelAhead in gemm_rowwise_inl.h) are pulled into L2, two per step of the
// main loop: spread out so that they overlap the dot products without crowding the tile's loads.

// With one or two rows (decode) the panel streams from memory once: the kernel prefetches it this
// many bytes (8 k groups) ahead into L1. Measured on DRAM-bound GEMVs: +8 % tokens/s for
// bfloat16 GPT-2 decode, and bfloat16 GEMVs from ~0.75x to ~1.0x the speed of float16 ones.
// The hint is non-temporal (prefetchnta): the lines are read once, and with it the decode step's
// weight stream no longer pushes out of L2 and L3 what the step reads again, the KV cache above
// all (Zen 4, GPT-2 int8 decode: attention 31-36 → 25-27 µs a layer).
constexpr long kDotPrefetchBytes = 2048;

template <class D, int R, int U>
__attribute__((always_inline)) inline void tile_rows(const typename D::A* a, long lda, const void* panel, long kp,
                                                     typename D::Out* out, const char* ahead, long ahead_lines) {
  static_assert(R * U <= 6, "at most 6 accumulator slots");
  static_assert(kNR == 64, "4 zmm of 32-bit lanes per row");
  using Acc = typename D::Acc;
  constexpr long kGroupBytes = kNR * 4;
  const char* wp = static_cast<const char*>(panel);
  // clang-format off: it takes each run of slot macros below for one expression and re-wraps it
#define CF_SLOT_DECL(s) Acc c##s##0 = D::zero(), c##s##1 = c##s##0, c##s##2 = c##s##0, c##s##3 = c##s##0;
  CF_SLOT_DECL(0) CF_SLOT_DECL(1) CF_SLOT_DECL(2) CF_SLOT_DECL(3) CF_SLOT_DECL(4) CF_SLOT_DECL(5)
#undef CF_SLOT_DECL
  __m512i w0, w1, w2, w3;
  // Slot s over the k group at p + kGroup·(s / R), when u_count sets run (U in the main loop, 1 in
  // the tail); the first slot of each set loads that group's weights.
#define CF_SLOT_STEP(s, u_count)                                              \
  if constexpr ((s) < R * (u_count)) {                                        \
    if constexpr ((s) % R == 0) {                                             \
      const char* wu = wp + ((s) / R) * kGroupBytes;                          \
      if constexpr (R <= 2) {                                                 \
        _mm_prefetch(wu + kDotPrefetchBytes, _MM_HINT_NTA);                   \
        _mm_prefetch(wu + kDotPrefetchBytes + 64, _MM_HINT_NTA);              \
        _mm_prefetch(wu + kDotPrefetchBytes + 128, _MM_HINT_NTA);             \
        _mm_prefetch(wu + kDotPrefetchBytes + 192, _MM_HINT_NTA);             \
      }                                                                       \
      w0 = _mm512_load_si512(wu);                                             \
      w1 = _mm512_load_si512(wu + 64);                                        \
      w2 = _mm512_load_si512(wu + 128);                                       \
      w3 = _mm512_load_si512(wu + 192);                                       \
    }                                                                         \
    int32_t group;                                                            \
    std::memcpy(&group, a + ((s) % R) * lda + p + D::kGroup * ((s) / R), 4);  \
    const __m512i av = _mm512_set1_epi32(group);                              \
    c##s##0 = D::dot(c##s##0, av, w0);                                        \
    c##s##1 = D::dot(c##s##1, av, w1);                                        \
    c##s##2 = D::dot(c##s##2, av, w2);                                        \
    c##s##3 = D::dot(c##s##3, av, w3);                                        \
  }
#define CF_STEP_ALL(u_count)                                                  \
  CF_SLOT_STEP(0, u_count) CF_SLOT_STEP(1, u_count) CF_SLOT_STEP(2, u_count)  \
  CF_SLOT_STEP(3, u_count) CF_SLOT_STEP(4, u_count) CF_SLOT_STEP(5, u_count)
  long p = 0;
  for (; p + D::kGroup * U <= kp; p += D::kGroup * U) {
    if (ahead_lines > 0) {
      _mm_prefetch(ahead, _MM_HINT_T1);
      _mm_prefetch(ahead + 64, _MM_HINT_T1);
      ahead += 128;
      ahead_lines -= 2;
    }
    CF_STEP_ALL(U)
    wp += U * kGroupBytes;
  }
  if constexpr (U > 1) {
    for (; p < kp; p += D::kGroup) {
      CF_STEP_ALL(1)
      wp += kGroupBytes;
    }
  }
#undef CF_STEP_ALL
#undef CF_SLOT_STEP
  // The slots of the first set store their row, the others add theirs.
#define CF_SLOT_OUT(s)                                                        \
  if constexpr ((s) < R * U) {                                                \
    typename D::Out* o = out + ((s) % R) * kNR;                               \
    if constexpr ((s) < R) {                                                  \
      D::store(o, c##s##0);                                                   \
      D::store(o + 16, c##s##1);                                              \
      D::store(o + 32, c##s##2);                                              \
      D::store(o + 48, c##s##3);                                              \
    } else {                                                                  \
      D::store(o, D::add(D::load(o), c##s##0));                               \
      D::store(o + 16, D::add(D::load(o + 16), c##s##1));                     \
      D::store(o + 32, D::add(D::load(o + 32), c##s##2));                     \
      D::store(o + 48, D::add(D::load(o + 48), c##s##3));                     \
    }                                                                         \
  }
  CF_SLOT_OUT(0) CF_SLOT_OUT(1) CF_SLOT_OUT(2) CF_SLOT_OUT(3) CF_SLOT_OUT(4) CF_SLOT_OUT(5)
#undef CF_SLOT_OUT
  // clang-format on
}

// Rows of a tile → the instantiation: full tiles use one set (24 accumulators); 3 and 2 rows keep
// 12 and 8 (2 × 8) independent chains; the GEMV row runs 4 sets (16 chains).
template <class D>
inline void dot_tile(long rows, const typename D::A* a, long lda, const void* panel, long kp, typename D::Out* out,
                     const char* ahead, long ahead_lines) {
  switch (rows) {
    case 6: tile_rows<D, 6, 1>(a, lda, panel, kp, out, ahead, ahead_lines); break;
    case 5: tile_rows<D, 5, 1>(a, lda, panel, kp, out, ahead, ahead_lines); break;
    case 4: tile_rows<D, 4, 1>(a, lda, panel, kp, out, ahead, ahead_lines); break;
    case 3: tile_rows<D, 3, 1>(a, lda, panel, kp, out, ahead, ahead_lines); break;
    case 2: tile_rows<D, 2, 2>(a, lda, panel, kp, out, ahead, ahead_lines); break;
    default: tile_rows<D, 1, 4>(a, lda, panel, kp, out, ahead, ahead_lines); break;
  }
}
