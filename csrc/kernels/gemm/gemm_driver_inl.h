// Cache-blocked fp32 GEMM driver shared by the SIMD levels. BLIS layering: the loops, the packing
// and the thread split live here; each ISA supplies only its register-tiled kernels and block sizes.
//
// Include this file INSIDE the ISA namespace (cpuformer::avx512 / cpuformer::avx2, in an anonymous
// namespace) of a per-ISA translation unit, after <immintrin.h>, <cstdint>, <cstdlib>,
// <cstring>, <new>, "kernels/gemm/gemm.h" and "runtime/threading.h". Everything here is then
// compiled once per ISA, under that ISA's namespace and flags, so no instantiation can leak into
// another level. It includes nothing and has no include guard on purpose.
//
// The including file defines before the #include:
//   constexpr long kMR, kNR;     register tile: kMR rows of A × kNR columns of W (a multiple of the
//                                vector width)
//   constexpr long kKC;          K slice: a W panel slice [kKC][kNR] stays in L1 while every micro-panel
//                                of the A block streams past it
//   constexpr long kMCMax;       rows of an A block (a multiple of kMR): [kMCMax][kKC] stays in L2
//   constexpr long kPrivateRowsMaxCBytes;  up to this size of a block's C rows (kMCMax × N floats)
//                                each thread takes its own rows (see gemm_f32)
//   constexpr long kGemvMaxRows; rows the GEMV kernel takes at once (≤ what it supports)
//   constexpr long kGemvBlockBytes;  > 0: kGemvMaxRows < m ≤ 2·kGemvMaxRows rows go in two chunks over
//                                K blocks of about this many bytes of W (see gemv); 0: never
//   constexpr long kGemvChunkRows;   rows per chunk (≤ kGemvMaxRows) when more rows go in chunks over
//                                whole panels
//   constexpr long kGemvChunkedMaxRowsF32, kGemvChunkedMaxRows16;  m ≤ this (for float32 / 16-bit
//                                W) takes the GEMV path too, in chunks, when N
//                                has at least kGemvChunkedMinPanels panels (the GEMV path shares out
//                                panels only, so narrow N goes blocked)
//   using WElem = ...;           element type of packed W: float, or uint16_t for float16 / bfloat16
//                                weights (PackedWeights::type says which)
// and, after it, the kernels declared below.
//
// Packed W ("panels"): ceil(N/kNR) panels of kNR output features; panel p starts at element p·K·kNR
// and holds W[p·kNR + j][kk] at [kk·kNR + j] (elements of type WElem). k-major, so each k step of a kernel reads one
// contiguous 64-byte aligned row of kNR weights and any K slice of a panel is contiguous.
// Columns past N are zero, so kernels may compute them; they never store them.
//
// Packed A (one block of rows × one K slice, per thread or shared by the team): micro-panels of
// kMR rows, micro-panel q at float q·kMR·kc holding a[i0 + q·kMR + r][k0 + kk] at [kk·kMR + r].
// Rows past the block's end are left unset: kernels read only the rows they were asked for.
// A is packed, not read in place, because kMR rows at a stride of a multiple of 4 KB (K = 1024,
// 2048, 3072, ...) all fall into one 12-way L1 set; packed, each k step reads one contiguous run.
// Packing costs 2-7% of the time (less for wider N), measured by leaving it out.

// What a kernel does with its finished accumulator tile t (rows × ncols):
//   c = act(t + [c if load_c] + bias) + residual, each term only when set.
// The driver folds bias and residual into the first K slice when there is no activation (they are
// linear, and a residual aliasing c is read before c holds partial sums); with an activation all of
// them wait for the last slice.
struct TileEpilogue {
  bool load_c = false;
  const float* bias = nullptr;      // at the tile's first column, or null
  Activation activation = Activation::kNone;
  const float* residual = nullptr;  // at the tile's first element, or null
  long ldr = 0;
};

// Provided by the including file.
// pack_a_panel: dst[kk·kMR + r] = a[r·lda + kk] for r < rows ≤ kMR, kk < kc (one A micro-panel).
void pack_a_panel(long rows, const float* a, long lda, long kc, float* dst);
// tile_kernel and gemv_kernel write c[rows, ncols] (row stride ldc) with
// 1 ≤ ncols ≤ kNR, as described by ep:
// tile_kernel: 1 ≤ rows ≤ kMR; t = ap · wp with ap a packed A micro-panel [kc][kMR] and wp a packed
//   W panel slice [kc][kNR] (64-byte aligned). Along the way it prefetches into L2 the
//   prefetch_lines cache lines from `prefetch` on (a hint for data the next tiles need).
// gemv_kernel: 1 ≤ rows ≤ kGemvMaxRows; t = a · wp with a [rows, k] as given (row stride lda) and wp
//   a whole packed W panel [k][kNR] (64-byte aligned) of weights of type `type`.
// widen_slice: a float32 copy of the packed W panel slice src [kc][kNR] (64-byte aligned) for
//   tile_kernel; with WElem = float it returns src itself. The copy belongs to the calling thread and
//   is valid until its next call.
void tile_kernel(long rows, const float* ap, const float* wp, long kc, float* c, long ldc, long ncols,
                 const TileEpilogue& ep, const char* prefetch, long prefetch_lines);
void gemv_kernel(long rows, const float* a, long lda, const WElem* wp, long k, WeightType type, float* c, long ldc,
                 long ncols, const TileEpilogue& ep);
const float* widen_slice(const WElem* src, long kc, WeightType type);

constexpr long kGemvChunkedMaxRows = sizeof(WElem) == sizeof(float) ? kGemvChunkedMaxRowsF32 : kGemvChunkedMaxRows16;

inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
inline long min_of(long a, long b) { return a < b ? a : b; }
inline long max_of(long a, long b) { return a > b ? a : b; }
// Range `index` of [0, n) cut into `parts` near-equal contiguous ranges.
inline void split_evenly(long n, long parts, long index, long* begin, long* end) {
  const long base = n / parts, extra = n % parts;
  *begin = index * base + (index < extra ? index : extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

// Below this many multiply-adds a second thread costs more to wake than it saves.
constexpr long kMinMacsPerThread = 1L << 17;

inline int threads_for(long macs, long max_parts) {
  long nt = current_num_threads();
  nt = min_of(nt, max_of(1, macs / kMinMacsPerThread));
  nt = min_of(nt, max_parts);
  return static_cast<int>(max_of(nt, 1));
}

std::size_t packed_bytes_w(long n, long k) {
  return static_cast<std::size_t>(ceil_div(n, kNR) * kNR * k) * sizeof(WElem);
}

[[maybe_unused]] void pack_w(const WElem* w, long n, long k, long ldw, uint8_t* out) {
  WElem* packed = reinterpret_cast<WElem*>(out);
  const long panels = ceil_div(n, kNR);
  const int nt = threads_for(n * k / 8, panels);  // a copy: far cheaper per element than a multiply-add
  run_team(nt, [&](const Team& team) {
    long p0, p1;
    team.range(panels, &p0, &p1);
    for (long p = p0; p < p1; ++p) {
      WElem* panel = packed + p * k * kNR;
      const long cols = min_of(kNR, n - p * kNR);
      // 16 k at a time: the kNR source lines being read stay in L1 while the panel rows fill up.
      for (long k0 = 0; k0 < k; k0 += 16) {
        const long k1 = min_of(k, k0 + 16);
        for (long j = 0; j < kNR; ++j) {
          if (j < cols) {
            const WElem* src = w + (p * kNR + j) * ldw;
            for (long kk = k0; kk < k1; ++kk) panel[kk * kNR + j] = src[kk];
          } else {
            for (long kk = k0; kk < k1; ++kk) panel[kk * kNR + j] = WElem(0);
          }
        }
      }
    }
  });
}

// ---- Work sharing -----------------------------------------------------------------------------
// The items of a phase (panels, or panel × row-group pieces) are dealt in contiguous ranges, one per
// thread asked for. A thread takes items from the front of its own range; when that is empty it
// takes them from the back of the others'. On a quiet machine every thread thus keeps the same
// items in every phase (its C columns and W panels stay in its own caches); when a core is shared
// with another process, the work of the thread that lost its core flows to the others instead of
// holding up the whole team, and a team smaller than asked still covers every range.
constexpr int kMaxTeam = 64;

struct alignas(64) WorkRange {  // one cache line per range: no false sharing
  uint64_t bounds;              // (front << 32) | back: the items [front, back) not yet taken
};

inline void deal(WorkRange* ranges, long items, int parts) {
  for (int t = 0; t < parts; ++t) {
    long front, back;
    split_evenly(items, parts, t, &front, &back);
    __atomic_store_n(&ranges[t].bounds, (static_cast<uint64_t>(front) << 32) | static_cast<uint64_t>(back),
                     __ATOMIC_RELAXED);
  }
}

// The data an item reads is published by barriers, not by these atomics: relaxed order suffices.
inline bool range_take(WorkRange* r, bool from_front, long* item) {
  uint64_t cur = __atomic_load_n(&r->bounds, __ATOMIC_RELAXED);
  for (;;) {
    const long front = static_cast<long>(cur >> 32), back = static_cast<long>(cur & 0xffffffffu);
    if (front >= back) return false;
    const uint64_t next = from_front ? cur + (uint64_t{1} << 32) : cur - 1;
    if (__atomic_compare_exchange_n(&r->bounds, &cur, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      *item = from_front ? front : back - 1;
      return true;
    }
  }
}

// Thread t of a team working on `parts` ranges (team ≤ parts).
inline bool next_item(WorkRange* ranges, int parts, int t, long* item) {
  if (t < parts && range_take(&ranges[t], true, item)) return true;
  for (int other = 1; other < parts; ++other) {
    if (range_take(&ranges[(t + other) % parts], false, item)) return true;
  }
  return false;
}

inline TileEpilogue epilogue_at(const GemmEpilogue& e, long j0) {
  TileEpilogue ep;
  ep.bias = e.bias ? e.bias + j0 : nullptr;
  ep.activation = e.activation;
  ep.residual = e.residual ? e.residual + j0 : nullptr;
  ep.ldr = e.ldr;
  return ep;
}

// Few rows (decode, short inputs): each packed panel is streamed from memory once, over the whole
// K; panels are the work items (a contiguous run per thread: one sequential stream each). Up to
// kGemvMaxRows rows go through the kernel at once. A few more (≤ 2·kGemvMaxRows, where the level has
// kGemvBlockBytes) go in two chunks that walk the panel in K blocks together: the first chunk, of
// kGemvMaxRows rows, reads each block from memory with its FMAs interleaved with the stream, the
// second reads it from L1, and partial sums wait in c. More rows (m ≤ kGemvChunkedMaxRows, N of at
// least kGemvChunkedMinPanels panels) go in near-equal chunks of at most kGemvChunkRows rows, each over
// the whole panel, the later ones reading it again from L2. Against the blocked GEMM this needs no A
// packing, no K slices and no barriers, which at such m cost more than the kernel's unpacked A reads
// (the limits and their measurements are in gemm_<isa>_blocking_inl.h).
void gemv(const float* a, long m, long lda, const WElem* wp, long n, long k, WeightType type, float* c, long ldc,
          const GemmEpilogue& epilogue) {
  const long panels = ceil_div(n, kNR);
  const int nt = threads_for(m * n * k, min_of(panels, kMaxTeam));
  // In K blocks a residual waits for the last block when there is an activation, by which time c
  // holds partial sums: a residual aliasing c needs whole panels.
  const bool k_blocks = kGemvBlockBytes > 0 && m > kGemvMaxRows && m <= 2 * kGemvMaxRows &&
                        !(epilogue.activation != Activation::kNone && epilogue.residual == c);
  const long chunks = m <= kGemvMaxRows ? 1 : k_blocks ? 2 : ceil_div(m, kGemvChunkRows);
  // Near-equal K blocks of a multiple of 16 k steps (each starts 64-byte aligned in its panel).
  const long blocks = k_blocks ? ceil_div(k * kNR * static_cast<long>(sizeof(WElem)), kGemvBlockBytes) : 1;
  const long kb = k_blocks ? ceil_div(ceil_div(k, blocks), 16) * 16 : k;
  WorkRange ranges[kMaxTeam];
  deal(ranges, panels, nt);
  run_team(nt, [&](const Team& team) {
    const int t = team.index();
    long p;
    while (next_item(ranges, nt, t, &p)) {
      const long j0 = p * kNR, ncols = min_of(kNR, n - j0);
      const TileEpilogue whole = epilogue_at(epilogue, j0);
      for (long k0 = 0; k0 < k; k0 += kb) {
        const long kc = min_of(kb, k - k0);
        const bool first = k0 == 0, last = k0 + kc == k;
        // As in the blocked GEMM: without an activation bias and residual join the first block (a
        // residual aliasing c is read before c holds partial sums), with one everything waits for the last.
        const bool finish_here = whole.activation == Activation::kNone ? first : last;
        TileEpilogue ep;
        ep.load_c = !first;
        ep.bias = finish_here ? whole.bias : nullptr;
        ep.activation = last ? whole.activation : Activation::kNone;
        ep.ldr = whole.ldr;
        for (long chunk = 0; chunk < chunks; ++chunk) {
          long i0, i1;
          if (k_blocks) {
            i0 = chunk == 0 ? 0 : kGemvMaxRows;
            i1 = chunk == 0 ? kGemvMaxRows : m;
          } else {
            split_evenly(m, chunks, chunk, &i0, &i1);
          }
          ep.residual = finish_here && whole.residual ? whole.residual + i0 * whole.ldr : nullptr;
          gemv_kernel(i1 - i0, a + i0 * lda + k0, lda, wp + (p * k + k0) * kNR, kc, type, c + i0 * ldc + j0, ldc, ncols,
                      ep);
        }
      }
    }
  });
}

// Everything a GEMM call's workers share, read-only.
struct GemmCall {
  const float* a;
  long m, lda;
  const WElem* wp;  // packed W
  WeightType type;
  long n, k, panels;
  float* c;
  long ldc;
  GemmEpilogue epilogue;  // with a residual aliasing c already replaced by a copy where needed
  long slices, kc_max;
};

// One phase of the blocked GEMM: a block of rows × one K slice.
struct Phase {
  long i0, rows, micro_rows, k0, kc;
  bool first_slice, last_slice;
};

inline Phase make_phase(const GemmCall& g, long i0, long rows, long slice) {
  Phase f;
  f.i0 = i0;
  f.rows = rows;
  f.micro_rows = ceil_div(rows, kMR);
  f.k0 = slice * g.kc_max;
  f.kc = min_of(g.kc_max, g.k - f.k0);
  f.first_slice = slice == 0;
  f.last_slice = slice == g.slices - 1;
  return f;
}

// Micro-rows [q0, q1) of phase f against panel p; ap is the phase's packed A block.
void run_panel(const GemmCall& g, const Phase& f, const float* ap, long p, long q0, long q1) {
  const long j0 = p * kNR, ncols = min_of(kNR, g.n - j0);
  const WElem* w_src = g.wp + (p * g.k + f.k0) * kNR;
  const float* w_slice = widen_slice(w_src, f.kc, g.type);  // w_src itself for float32 weights
  // The next panel's slice comes from L3 or memory: each kernel of this panel prefetches a share of
  // it into L2, so the next panel's first kernel does not wait on misses.
  const char* w_next = p + 1 < g.panels ? reinterpret_cast<const char*>(w_src + g.k * kNR) : nullptr;
  const long w_lines = f.kc * kNR * static_cast<long>(sizeof(WElem)) / 64;
  const long lines_per_row = ceil_div(w_lines, q1 - q0);
  // Bias and residual are linear: without an activation they join the first slice (so a residual
  // aliasing c is read before c holds partial sums); with one, everything waits for the last.
  const bool finish_here = g.epilogue.activation == Activation::kNone ? f.first_slice : f.last_slice;
  TileEpilogue ep;
  ep.load_c = !f.first_slice;
  ep.bias = finish_here && g.epilogue.bias ? g.epilogue.bias + j0 : nullptr;
  ep.activation = f.last_slice ? g.epilogue.activation : Activation::kNone;
  ep.ldr = g.epilogue.ldr;
  for (long q = q0; q < q1; ++q) {
    const long line0 = (q - q0) * lines_per_row;
    const long lines = w_next ? max_of(0, min_of(lines_per_row, w_lines - line0)) : 0;
    const long i = f.i0 + q * kMR;
    ep.residual = finish_here && g.epilogue.residual ? g.epilogue.residual + i * g.epilogue.ldr + j0 : nullptr;
    tile_kernel(min_of(kMR, f.i0 + f.rows - i), ap + q * kMR * f.kc, w_slice, f.kc, g.c + i * g.ldc + j0, g.ldc, ncols,
                ep, w_next ? w_next + 64 * line0 : nullptr, lines);
  }
}

// Narrow N: each thread takes its own contiguous share of the rows and runs the whole BLIS loop
// nest over it (blocks of at most kMCMax rows × K slices × all panels) with its own packed A: no
// barriers, nothing shared but the read-only W. Rows are shared out by micro-rows, so the shares
// differ by at most one. a_buffers: nt × kMCMax × kc_max floats, one piece per thread.
void gemm_private_rows(const GemmCall& g, int nt, float* a_buffers) {
  run_team(nt, [&](const Team& team) {
    const int t = team.index();
    long u0, u1;
    split_evenly(ceil_div(g.m, kMR), team.size(), t, &u0, &u1);
    const long r0 = u0 * kMR, r1 = min_of(g.m, u1 * kMR);
    if (r0 < r1) {
      const long mc = ceil_div(ceil_div(r1 - r0, ceil_div(r1 - r0, kMCMax)), kMR) * kMR;
      float* ap = a_buffers + t * kMCMax * g.kc_max;
      for (long i0 = r0; i0 < r1; i0 += mc) {
        for (long s = 0; s < g.slices; ++s) {
          const Phase f = make_phase(g, i0, min_of(mc, r1 - i0), s);
          for (long q = 0; q < f.micro_rows; ++q) {
            pack_a_panel(min_of(kMR, f.rows - q * kMR), g.a + (f.i0 + q * kMR) * g.lda + f.k0, g.lda, f.kc,
                         ap + q * kMR * f.kc);
          }
          for (long p = 0; p < g.panels; ++p) run_panel(g, f, ap, p, 0, f.micro_rows);
        }
      }
    }
  });
}

// Wide N (or few rows per thread): the threads work through the phases (block of at most kMCMax
// rows × K slice) together. The team packs the phase's A block into a buffer shared by all, then
// shares out its panels (work items, see above); each thread's C columns stay a fraction of the
// block. The A buffers, the work ranges and the packing counters are double-buffered, so one
// barrier per phase suffices and the threads that finish a phase first pack the next one.
// a_buffers: 2 × kMCMax × kc_max floats.
void gemm_shared_rows(const GemmCall& g, int nt, float* a_buffers) {
  const long mc = ceil_div(ceil_div(g.m, ceil_div(g.m, kMCMax)), kMR) * kMR;
  const long phases = ceil_div(g.m, mc) * g.slices;
  // The phase ends when its last item does: with few panels per thread the items are cut finer,
  // each panel's rows into groups, so the threads arrive at the barrier close together. A thread
  // takes its items in order, so consecutive groups of a panel still share its W slice. 16-bit
  // weights are widened once per item, so for them a group costs a widening of the whole slice:
  // they are cut only as far as it takes to give every thread two items.
  constexpr long kItemsPerThread = sizeof(WElem) == sizeof(float) ? 16 : 2;
  const long groups = min_of(mc / kMR, max_of(1, ceil_div(kItemsPerThread * nt, g.panels)));
  auto phase_at = [&](long ph) {
    const long i0 = ph / g.slices * mc;
    return make_phase(g, i0, min_of(mc, g.m - i0), ph % g.slices);
  };
  auto items_in = [&](const Phase& f) { return g.panels * min_of(groups, f.micro_rows); };

  WorkRange ranges[2][kMaxTeam];
  long pack_next[2] = {0, 0};  // next micro-panel to pack, per phase parity
  deal(ranges[0], items_in(phase_at(0)), nt);

  // Packs the micro-panels of phase ph not yet claimed by another thread.
  auto pack_phase = [&](long ph) {
    const Phase f = phase_at(ph);
    float* ap = a_buffers + (ph & 1) * mc * g.kc_max;
    for (;;) {
      const long q = __atomic_fetch_add(&pack_next[ph & 1], 1, __ATOMIC_RELAXED);
      if (q >= f.micro_rows) break;
      pack_a_panel(min_of(kMR, f.rows - q * kMR), g.a + (f.i0 + q * kMR) * g.lda + f.k0, g.lda, f.kc,
                   ap + q * kMR * f.kc);
    }
  };

  run_team(nt, [&](const Team& team) {
    const int t = team.index();
    pack_phase(0);
    team.barrier();
    for (long ph = 0; ph < phases; ++ph) {
      // Everyone is past phase ph - 1: its range buffer and the packing counter of phase ph are free.
      if (t == 0) {
        if (ph + 1 < phases) deal(ranges[(ph + 1) & 1], items_in(phase_at(ph + 1)), nt);
        __atomic_store_n(&pack_next[ph & 1], 0, __ATOMIC_RELAXED);  // for phase ph + 2
      }
      const Phase f = phase_at(ph);
      const float* ap = a_buffers + (ph & 1) * mc * g.kc_max;
      const long block_groups = min_of(groups, f.micro_rows);
      long item;
      while (next_item(ranges[ph & 1], nt, t, &item)) {
        long q0, q1;
        split_evenly(f.micro_rows, block_groups, item % block_groups, &q0, &q1);
        run_panel(g, f, ap, item / block_groups, q0, q1);
      }
      if (ph + 1 < phases) {
        pack_phase(ph + 1);
        team.barrier();
      }
    }
  });
}

// Many rows: BLIS loop order. For each block of rows (packed A in L2) and each K slice, every W
// panel slice stays in L1 while the block's micro-panels stream past it; partial sums accumulate in
// c from one slice to the next.
void gemm_w(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
            const GemmEpilogue& epilogue) {
  GemmCall g;
  g.a = a;
  g.m = m;
  g.lda = lda;
  g.wp = reinterpret_cast<const WElem*>(w.bytes());
  g.type = w.type;
  g.n = w.n;
  g.k = w.k;
  g.panels = ceil_div(w.n, kNR);
  g.c = c;
  g.ldc = ldc;
  g.epilogue = epilogue;
  // The path depends on the shape only, never on the thread count: a result must not change with it.
  if (m <= kGemvMaxRows || (m <= kGemvChunkedMaxRows && g.panels >= kGemvChunkedMinPanels)) {
    gemv(a, m, lda, g.wp, g.n, g.k, g.type, c, ldc, epilogue);
    return;
  }
  // K slices of near-equal length (no short last one).
  g.slices = ceil_div(g.k, kKC);
  g.kc_max = ceil_div(g.k, g.slices);

  const int nt = threads_for(m * g.n * g.k, min_of(ceil_div(m, kMR) * g.panels, kMaxTeam));
  // Private rows when each thread gets several micro-rows and a block's C rows (kMCMax × N) fit in
  // half of L2 next to the A block; otherwise the team shares each block and splits its columns.
  const bool private_rows =
      ceil_div(m, kMR) >= 4 * nt && kMCMax * g.n * static_cast<long>(sizeof(float)) <= kPrivateRowsMaxCBytes;
  // Everything is allocated here, by the calling thread: an exception must not leave a parallel region.
  float* a_buffers = gemm_thread_scratch(static_cast<std::size_t>((private_rows ? nt : 2) * kMCMax * g.kc_max));

  // With an activation the residual is added after the last slice, by which time c holds partial
  // sums: a residual aliasing c must be copied first.
  float* residual_copy = nullptr;
  if (epilogue.residual != nullptr && epilogue.residual == c && epilogue.activation != Activation::kNone &&
      g.slices > 1) {
    const std::size_t bytes = ((static_cast<std::size_t>(m * g.n) * sizeof(float) + 63) / 64) * 64;
    residual_copy = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (residual_copy == nullptr) throw std::bad_alloc();
    for (long i = 0; i < m; ++i) {
      std::memcpy(residual_copy + i * g.n, epilogue.residual + i * epilogue.ldr, g.n * sizeof(float));
    }
    g.epilogue.residual = residual_copy;
    g.epilogue.ldr = g.n;
  }

  if (private_rows) {
    gemm_private_rows(g, nt, a_buffers);
  } else {
    gemm_shared_rows(g, nt, a_buffers);
  }
  std::free(residual_copy);
}
