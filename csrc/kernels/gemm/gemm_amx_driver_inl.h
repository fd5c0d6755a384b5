// The AMX GEMM driver shared by the int8 (TDPBUSD, gemm_int8_avx512amx.cc) and bfloat16
// (TDPBF16PS, gemm_half_avx512amx.cc) kernels. Both multiply A rows converted once per call against
// the packed panels of their vector kernels (vpdpbusd, vdpbf16ps) as they lie: a panel holds 64
// features in groups of 4 bytes per feature (4 int8 k, or 2 bfloat16 k), one group row of 256
// bytes per 4 bytes of k, so 16 consecutive group rows of 16 features are a B tile (16 rows of 64
// bytes, row stride 256 bytes), and one tile step covers 64 bytes of an A row.
//
// Include INSIDE the ISA namespace (anonymous namespace) after "kernels/gemm/amx_tiles_inl.h" and
// "runtime/threading.h", with the including file having defined CPUFORMER_TILE_DOT as its tile
// dot product macro (_tile_dpbusd or _tile_dpbf16ps: the tile numbers must reach it as literals).
// No include guard on purpose.

constexpr long kAmxRows = 32;         // rows of a work tile: two A tiles of 16 (one for 16 or fewer)
constexpr long kAmxRowBlock = 256;    // rows of a work item: its panel stays in L2 across 8 tiles
constexpr long kAmxStepBytes = 64;    // bytes of an A row per tile step (an A tile row)
constexpr long kPanelRowBytes = 256;  // one group row of a panel: the B tiles' row stride
constexpr long kPanelStepBytes = 16 * kPanelRowBytes;  // the panel rows of one tile step
// int8 GEMMs with fewer rows than this run on vpdpbusd, whose 6-row register tile fits them (the
// bfloat16 kernel has its own threshold). AMX Xeon, 2 threads, int8 2304 × 768 / 768 × 3072 in
// GOP/s, vpdpbusd → tiles: 4 rows 761 / 665 → 644 / 525, 6 rows 878 / 769 → 776 / 691, 8 rows
// 775 / 790 → 1285 / 976, 12 rows 872 / 825 → 1603 / 1378.
constexpr long kAmxMinRows = 8;

// acc[r·64 + j] (32-bit lanes) = Σ over `steps` tile steps of A row r (a, row stride a_stride
// bytes) times panel feature j, for r < 32 and j < 64. Two passes over the panel, one per half of
// its features: each B tile feeds two A tiles. progress(done, total) runs after each of the 2 ·
// steps tile steps (see amx_gemm).
template <class Progress>
inline void amx_tile_32(const uint8_t* a, long a_stride, long steps, const uint8_t* panel, void* acc,
                        const Progress& progress) {
  constexpr long kAccStride = 64 * 4;
  for (long half = 0; half < 2; ++half) {
    const uint8_t* b = panel + half * 128;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long s = 0; s < steps; ++s) {
      const uint8_t* bp = b + s * kPanelStepBytes;
      _tile_loadd(4, a + s * kAmxStepBytes, a_stride);
      _tile_loadd(6, bp, kPanelRowBytes);
      _tile_loadd(7, bp + 64, kPanelRowBytes);
      CPUFORMER_TILE_DOT(0, 4, 6);
      CPUFORMER_TILE_DOT(1, 4, 7);
      _tile_loadd(5, a + 16 * a_stride + s * kAmxStepBytes, a_stride);
      CPUFORMER_TILE_DOT(2, 5, 6);
      CPUFORMER_TILE_DOT(3, 5, 7);
      progress(half * steps + s + 1, 2 * steps);
    }
    uint8_t* out = static_cast<uint8_t*>(acc) + half * 128;
    _tile_stored(0, out, kAccStride);
    _tile_stored(1, out + 64, kAccStride);
    _tile_stored(2, out + 16 * kAccStride, kAccStride);
    _tile_stored(3, out + 16 * kAccStride + 64, kAccStride);
  }
}

// The same for 16 rows (the last 16 or fewer of a block): one pass over the panel, all 64 features
// (four C tiles) per step, so that each step reads 16 whole panel rows, 4 KiB in one piece, which
// the hardware prefetcher streams when the panel comes from memory (a prompt of 16 tokens).
template <class Progress>
inline void amx_tile_16(const uint8_t* a, long a_stride, long steps, const uint8_t* panel, void* acc,
                        const Progress& progress) {
  constexpr long kAccStride = 64 * 4;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long s = 0; s < steps; ++s) {
    const uint8_t* bp = panel + s * kPanelStepBytes;
    _tile_loadd(4, a + s * kAmxStepBytes, a_stride);
    _tile_loadd(5, bp, kPanelRowBytes);
    _tile_loadd(6, bp + 64, kPanelRowBytes);
    CPUFORMER_TILE_DOT(0, 4, 5);
    _tile_loadd(7, bp + 128, kPanelRowBytes);
    CPUFORMER_TILE_DOT(1, 4, 6);
    _tile_loadd(5, bp + 192, kPanelRowBytes);
    CPUFORMER_TILE_DOT(2, 4, 7);
    CPUFORMER_TILE_DOT(3, 4, 5);
    progress(s + 1, steps);
  }
  uint8_t* out = static_cast<uint8_t*>(acc);
  _tile_stored(0, out, kAccStride);
  _tile_stored(1, out + 64, kAccStride);
  _tile_stored(2, out + 128, kAccStride);
  _tile_stored(3, out + 192, kAccStride);
}

// Runs c = A·Wᵀ for m ≥ kAmxMinRows rows on the tiles. `a_rows` holds m rows rounded up to 16 of
// row_bytes bytes each (a multiple of 64; rows past m converted from zeros), filled by
// convert_row(i) before any tile reads it (row i's share per thread, then a barrier);
// finish_row(i, acc_row, j0, ncols) applies the epilogue to row i's finished 64 lanes of panel
// j0 / 64 (ncols of them are output features). Unlike the vector kernels' tiles these do not
// prefetch their output lines for writing: a tile's K loop is short
// enough on AMX that the prefetches (128 lines per 32-row tile) stalled the loop instead (BERT-base
// int8 8 × 128 ran 60.3-60.7 seq/s with them, 62.8-64.4 without, Intel Xeon with AMX, 2026-11-27).
// Threads: at most one per min_macs multiply-adds (m·n·k) and one per work item (panel × block of
// 256 rows, dealt in contiguous ranges, panel-major).
template <class Acc, class ConvertRow, class FinishRow>
void amx_gemm(long m, long n, long k, long min_macs, const uint8_t* a_rows, long row_bytes, const uint8_t* panels,
              const ConvertRow& convert_row, const FinishRow& finish_row) {
  const long panel_count = (n + 63) / 64;
  const long blocks = (m + kAmxRowBlock - 1) / kAmxRowBlock;
  const long items = panel_count * blocks;
  const long steps = row_bytes / kAmxStepBytes;
  long nt = current_num_threads();
  if (nt > m * n * k / min_macs) nt = m * n * k / min_macs;
  if (nt > items) nt = items;
  if (nt < 1) nt = 1;

  run_team(static_cast<int>(nt), [&](const Team& team) {
    long i0, i1;
    team.range(m, &i0, &i1);
    for (long i = i0; i < i1; ++i) convert_row(i);
    team.barrier();  // every row is converted before any tile reads it
    long begin, end;
    team.range(items, &begin, &end);
    if (begin >= end) return;
    configure_tiles_16x64();
    // Software pipeline: while the tiles of one work tile (≤ 32 rows × one panel) run, the rows of
    // the previous one go through the epilogue, a share after each tile step, so that the vector
    // units work while TMUL does (in program order the epilogue of a whole tile, ~25 vector
    // instructions per row, is more than the reorder buffer holds: TMUL sat idle through it).
    alignas(64) Acc acc[2][kAmxRows * 64];
    struct Done {
      long r0 = 0, rows = 0, j0 = 0, ncols = 0, finished = 0;
    } prev;
    int cur = 0;
    auto finish_prev = [&](long upto) {
      Acc* done = acc[cur ^ 1];
      for (; prev.finished < upto; ++prev.finished)
        finish_row(prev.r0 + prev.finished, done + prev.finished * 64, prev.j0, prev.ncols);
    };
    auto progress = [&](long step, long total) { finish_prev((prev.rows * step + total - 1) / total); };
    for (long item = begin; item < end; ++item) {
      const long p = item / blocks, b = item % blocks;
      const long j0 = p * 64, ncols = n - j0 < 64 ? n - j0 : 64;
      const uint8_t* panel = panels + j0 * row_bytes;  // a panel holds 64 features' row_bytes each
      const long r_end = m < (b + 1) * kAmxRowBlock ? m : (b + 1) * kAmxRowBlock;
      for (long r0 = b * kAmxRowBlock; r0 < r_end; r0 += kAmxRows) {
        const long rows = r_end - r0 < kAmxRows ? r_end - r0 : kAmxRows;
        const uint8_t* a = a_rows + r0 * row_bytes;
        if (rows > 16) amx_tile_32(a, row_bytes, steps, panel, acc[cur], progress);
        else amx_tile_16(a, row_bytes, steps, panel, acc[cur], progress);
        finish_prev(prev.rows);
        prev.r0 = r0;
        prev.rows = rows;
        prev.j0 = j0;
        prev.ncols = ncols;
        prev.finished = 0;
        cur ^= 1;
      }
    }
    finish_prev(prev.rows);
    _tile_release();
  });
}
