// Work split of the GEMMs that convert every row of A once per call and then run register tiles
// over the whole K: the int8 GEMM (rows quantized, gemm_int8_inl.h) and the bfloat16 GEMM on
// vdpbf16ps (rows rounded to bfloat16, gemm_half_avx512bf16.cc).
//
// Include this file INSIDE the ISA namespace (in an anonymous namespace) of a per-ISA translation
// unit, after "runtime/threading.h"; like gemm_driver_inl.h it includes nothing and has
// no include guard on purpose. The including file defines kMR and kNR (register tile: kMR rows ×
// kNR output features) before the #include.

// Rows of a block (a work item together with one W panel): the converted A block stays in L1/L2
// while the panel streams through.
constexpr long kRowBlock = 8 * kMR;

// Up to this many rows of A (decode steps), every thread converts all of them into a copy of its
// own instead of its share into one copy: that costs each thread the conversion of a few rows
// (~1 µs), and saves the barrier between conversion and tiles, where the threads of a decode step
// otherwise wait for each other once per projection.
constexpr long kPrivateRows = 4;

// The fewest weights of W a thread of a GEMV streams (see rowwise_gemm): 64 KB of int8, 32 KB of
// int4. With the multiply-add count of larger GEMMs instead (int8: 2^19), the 768 × 768 projection
// of a 124M-parameter model's decode step ran on one thread (40 µs a call, 12 calls a token).
constexpr long kGemvMinWeightsPerThread = 1L << 16;

// How many copies of the converted rows a caller of rowwise_gemm allocates for m rows.
inline long rowwise_copies(long m) { return m <= kPrivateRows ? current_num_threads() : 1; }

// Asks for the output lines of a tile (rows × ncols floats of c) in the state for writing, before
// the tile's K loop runs: the first store to each row of C otherwise waits on a miss after the
// loop (~5-10 % of the samples of an int8 GEMM at BERT-base shapes, K = 768, where a tile's loop
// is short).
inline void prefetch_tile_output(const float* c, long ldc, long rows, long ncols) {
  for (long r = 0; r < rows; ++r) {
    const char* row = reinterpret_cast<const char*>(c + r * ldc);
    const long bytes = ncols * static_cast<long>(sizeof(float));
    for (long b = 0; b < bytes; b += 64) {
#if defined(__x86_64__)
      __asm__ volatile("prefetchw %0" : : "m"(row[b]));  // a NOP on x86-64 CPUs without PREFETCHW
#else
      __builtin_prefetch(row + b, 1, 3);
#endif
    }
    if (reinterpret_cast<std::uintptr_t>(row) % 64 != 0) __builtin_prefetch(row + bytes - 1, 1, 3);
  }
}

// Lines of memory a tile pulls into L2 while it computes: `count` 64-byte lines from `begin`.
struct PanelLines {
  const char* begin;
  long count;
};

// What a tile may pull into L2 while it computes: part `part` of `parts` of the panel at feature j0,
// the next panel of the thread's run (parts == 0: nothing). See rowwise_gemm.
struct PanelAhead {
  long j0, part, parts;
  // The part's lines, given where that panel starts and its size.
  PanelLines lines(const void* panel, long panel_bytes) const {
    if (parts == 0) return PanelLines{nullptr, 0};
    const long total = panel_bytes / 64, first = total * part / parts;
    return PanelLines{static_cast<const char*>(panel) + 64 * first, total * (part + 1) / parts - first};
  }
};

// convert_row(i, copy) converts row i of A into copy `copy` (< rowwise_copies(m)); every row a
// thread's tiles read is converted before they run. tile(i0, rows, j0, ncols, copy, ahead) computes
// and stores c[i0, i0 + rows) × [j0, j0 + ncols) with rows ≤ kMR and ncols ≤ kNR (j0 a multiple of
// kNR), reading copy `copy`; `ahead` names a share of the thread's next panel that the tile may pull
// into L2 as it goes (a share for each tile of the last row block over a panel, when the thread's
// next item starts the next panel and m > 2). With up to kRowBlock rows the first tile over a panel
// reads it from memory and the others compute from cache; without the pull, memory sat idle while
// they did (measured on Zen 4, int8 3072 × 768 with W from memory, alternating processes: 16 rows
// 126-135 → 113-117 µs, 48 rows 305-314 → 294-296 µs, BERT-base 1 × 16 int8 ~7 % faster; the same
// lines pulled in one burst before each tile instead ran 5-40 % slower). Tiles of up to 2 rows
// prefetch their own panel as they stream it (gemm_dot_tile_inl.h).
// Threads: at most current_num_threads(), one per min_macs_per_thread multiply-adds. The work items
// (panel × row block) are dealt in contiguous ranges, panel-major: each thread streams its own
// panels, each once per row block (for m ≤ kRowBlock exactly once: the GEMV case). Up to
// kPrivateRows rows a thread whose range is done takes over the last panels of another's
// (StealingRanges): the faster thread of a decode step no longer waits for the slower one at the
// end of every projection (Zen 4, GPT-2 int8 decode: the wait at the end of the 3072-wide
// projections went from ~8-10 to ~1-2 µs). Nothing here allocates or throws: the callers allocate
// their scratch before calling.
template <class ConvertRow, class Tile>
void rowwise_gemm(long m, long n, long k, long min_macs_per_thread, const ConvertRow& convert_row, const Tile& tile) {
  const long panel_count = (n + kNR - 1) / kNR;
  const long blocks = (m + kRowBlock - 1) / kRowBlock;
  const long items = panel_count * blocks;
  long nt = current_num_threads();
  // A GEMV (m <= kPrivateRows) streams W from memory, and its time is W's bytes over the read
  // bandwidth, not its multiply-adds over the compute peak: a second thread pays once a thread
  // would stream kGemvMinWeightsPerThread weights (~4 µs of reading).
  const long work = m <= kPrivateRows ? n * k : m * n * k;
  const long per_thread = m <= kPrivateRows ? kGemvMinWeightsPerThread : min_macs_per_thread;
  if (nt > work / per_thread) nt = work / per_thread;
  if (nt > items) nt = items;
  if (nt < 1) nt = 1;

  const bool private_rows = m <= kPrivateRows;
  // A GEMV's panels go out with stealing (StealingRanges): one item per panel, each a few µs of
  // streaming, so a thread whose memory stream runs slower takes fewer of them.
  StealingRanges stealing;
  const bool steal = private_rows && nt > 1 && stealing.init(items, static_cast<int>(nt));
  run_team(static_cast<int>(nt), [&](const Team& team) {
    long copy = 0;
    if (private_rows) {
      copy = team.index();
      for (long i = 0; i < m; ++i) convert_row(i, copy);
    } else {
      long i0, i1;
      team.range(m, &i0, &i1);
      for (long i = i0; i < i1; ++i) convert_row(i, copy);
      team.barrier();  // every row is converted before any tile reads it
    }
    // Item `item`; `more`: the thread's next item is item + 1.
    auto run_item = [&](long item, bool more) {
      const long p = item / blocks, b = item % blocks;
      const long j0 = p * kNR, ncols = n - j0 < kNR ? n - j0 : kNR;
      const long i_end = m < (b + 1) * kRowBlock ? m : (b + 1) * kRowBlock;
      const bool pull_next = m > 2 && b == blocks - 1 && more;
      const long tiles = (i_end - b * kRowBlock + kMR - 1) / kMR;
      for (long r0 = b * kRowBlock, t = 0; r0 < i_end; r0 += kMR, ++t)
        tile(r0, i_end - r0 < kMR ? i_end - r0 : kMR, j0, ncols, copy, PanelAhead{j0 + kNR, t, pull_next ? tiles : 0});
    };
    if (steal) {
      long item;
      bool more;
      while (stealing.next(team, &item, &more)) run_item(item, more);
    } else {
      long begin, end;
      team.range(items, &begin, &end);
      for (long item = begin; item < end; ++item) run_item(item, item + 1 < end);
    }
  });
}
