// Cache-blocked fp32 GEMM driver shared by the SIMD levels. BLIS layering: the loops, the packing
// and the thread split live here; each ISA supplies only its register-tiled kernels and block sizes.
//
// Include this file INSIDE the ISA namespace (cpuformer::avx512 / cpuformer::avx2, in an anonymous
// namespace) of a per-ISA translation unit, after <immintrin.h>, <omp.h>, <cstdint>, <cstdlib>, <cstring>,
// "kernels/gemm/gemm.h" and "runtime/threading.h". Everything here is then compiled once per ISA,
// under that ISA's namespace and flags, so no instantiation can leak into another level. It
// includes nothing and has no include guard on purpose.
//
// The including file defines before the #include:
//   constexpr long kMR, kNR;     register tile: kMR rows of A × kNR columns of W (a multiple of the
//                                vector width)
//   constexpr long kKC;          K slice: a W panel slice [kKC][kNR] stays in L1 while every micro-panel
//                                of the A block streams past it
//   constexpr long kMCMax;       rows of an A block (a multiple of kMR): [kMCMax][kKC] stays in L2
//   constexpr long kGemvMaxRows; m ≤ kGemvMaxRows takes the GEMV path (≤ what its kernel supports)
// and, after it, the two kernels declared below.
//
// Packed W ("panels"): ceil(N/kNR) panels of kNR output features; panel p starts at float p·K·kNR
// and holds W[p·kNR + j][kk] at [kk·kNR + j]. k-major, so each k step of a kernel reads one
// contiguous 64-byte aligned row of kNR weights and any K slice of a panel is contiguous.
// Columns past N are zero, so kernels may compute them; they never store them.
//
// Packed A (per thread, per K slice): micro-panels of kMR rows, micro-panel q at float q·kMR·kc,
// holding a[q·kMR + r][k0 + kk] at [kk·kMR + r]. Rows past the block's end are left unset: kernels
// read only the rows they were asked for.

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
//   W panel slice [kc][kNR] (64-byte aligned).
// gemv_kernel: 1 ≤ rows ≤ kGemvMaxRows; t = a · wp with a [rows, k] as given (row stride lda) and wp
//   a whole packed W panel [k][kNR] (64-byte aligned).
void tile_kernel(long rows, const float* ap, const float* wp, long kc, float* c, long ldc, long ncols,
                 const TileEpilogue& ep);
void gemv_kernel(long rows, const float* a, long lda, const float* wp, long k, float* c, long ldc, long ncols,
                 const TileEpilogue& ep);

inline long ceil_div(long a, long b) { return (a + b - 1) / b; }
inline long min_of(long a, long b) { return a < b ? a : b; }
inline long max_of(long a, long b) { return a > b ? a : b; }
inline long gcd_of(long a, long b) {
  while (b != 0) {
    const long t = a % b;
    a = b;
    b = t;
  }
  return a;
}
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

std::size_t packed_bytes_f32(long n, long k) {
  return static_cast<std::size_t>(ceil_div(n, kNR) * kNR * k) * sizeof(float);
}

void pack_f32(const float* w, long n, long k, long ldw, uint8_t* out) {
  float* packed = reinterpret_cast<float*>(out);
  const long panels = ceil_div(n, kNR);
  const int nt = threads_for(n * k / 8, panels);  // a copy: far cheaper per element than a multiply-add
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (long p = 0; p < panels; ++p) {
    float* panel = packed + p * k * kNR;
    const long cols = min_of(kNR, n - p * kNR);
    // 16 k at a time: the kNR source lines being read stay in L1 while the panel rows fill up.
    for (long k0 = 0; k0 < k; k0 += 16) {
      const long k1 = min_of(k, k0 + 16);
      for (long j = 0; j < kNR; ++j) {
        if (j < cols) {
          const float* src = w + (p * kNR + j) * ldw;
          for (long kk = k0; kk < k1; ++kk) panel[kk * kNR + j] = src[kk];
        } else {
          for (long kk = k0; kk < k1; ++kk) panel[kk * kNR + j] = 0.0f;
        }
      }
    }
  }
}

// Packs a[0:mc, 0:kc] (row stride lda) into micro-panels (layout above).
void pack_a(const float* a, long lda, long mc, long kc, float* ap) {
  for (long i0 = 0; i0 < mc; i0 += kMR) pack_a_panel(min_of(kMR, mc - i0), a + i0 * lda, lda, kc, ap + i0 * kc);
}

// Few rows (decode): memory-bound on W. Each packed panel is streamed exactly once, over the whole
// K, and the panels are split across threads in contiguous ranges (one sequential stream each).
void gemv(const float* a, long m, long lda, const float* wp, long n, long k, float* c, long ldc,
          const GemmEpilogue& epilogue) {
  const long panels = ceil_div(n, kNR);
  const int nt = threads_for(m * n * k, panels);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    // The team may be smaller than asked (e.g. when called from inside another parallel region).
    long p0, p1;
    split_evenly(panels, omp_get_num_threads(), omp_get_thread_num(), &p0, &p1);
    for (long p = p0; p < p1; ++p) {
      const long j0 = p * kNR;
      TileEpilogue ep;
      ep.bias = epilogue.bias ? epilogue.bias + j0 : nullptr;
      ep.activation = epilogue.activation;
      ep.residual = epilogue.residual ? epilogue.residual + j0 : nullptr;
      ep.ldr = epilogue.ldr;
      gemv_kernel(m, a, lda, wp + p * k * kNR, k, c + j0, ldc, min_of(kNR, n - j0), ep);
    }
  }
}

void gemm_f32(const float* a, long m, long lda, const PackedWeights& w, float* c, long ldc,
              const GemmEpilogue& epilogue) {
  const long n = w.n, k = w.k;
  const float* wp = reinterpret_cast<const float*>(w.data.data());
  if (m <= kGemvMaxRows) {
    gemv(a, m, lda, wp, n, k, c, ldc, epilogue);
    return;
  }

  // K slices of near-equal length (no short last slice).
  const long slices = ceil_div(k, kKC);
  const long kc_max = ceil_div(k, slices);

  // With an activation the residual is added after the last slice, by which time c holds partial
  // sums: a residual aliasing c must be copied first.
  const float* residual = epilogue.residual;
  long ldr = epilogue.ldr;
  float* residual_copy = nullptr;
  if (residual != nullptr && residual == c && epilogue.activation != Activation::kNone && slices > 1) {
    const std::size_t bytes = ((static_cast<std::size_t>(m * n) * sizeof(float) + 63) / 64) * 64;
    residual_copy = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (residual_copy == nullptr) throw std::bad_alloc();
    for (long i = 0; i < m; ++i) std::memcpy(residual_copy + i * n, residual + i * ldr, n * sizeof(float));
    residual = residual_copy;
    ldr = n;
  }

  // Work is cut into m_blocks × n_blocks tiles, each run by one thread from start to finish. Rows
  // are cut into A blocks of at most kMCMax; when that gives too few blocks to share evenly
  // (M-light shapes), the panels are cut too, so both M-heavy and N-heavy shapes use every thread.
  const long panels = ceil_div(n, kNR);
  const long max_threads = threads_for(m * n * k, ceil_div(m, kMR) * panels);
  long m_blocks = ceil_div(m, kMCMax), n_blocks = 1;
  if (m_blocks % max_threads != 0 && m_blocks < 4 * max_threads) {
    n_blocks = max_threads / gcd_of(m_blocks, max_threads);
    if (n_blocks > panels) {
      n_blocks = 1;
      m_blocks = min_of(ceil_div(m_blocks, max_threads) * max_threads, ceil_div(m, kMR));
    }
  }
  const long mc = ceil_div(ceil_div(m, m_blocks), kMR) * kMR;
  m_blocks = ceil_div(m, mc);
  const long tiles = m_blocks * n_blocks;
  const int nt = static_cast<int>(min_of(max_threads, tiles));

#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* ap = gemm_thread_scratch(static_cast<std::size_t>(mc * kc_max));
    long t0, t1;  // by the team actually running, which may be smaller than asked
    split_evenly(tiles, omp_get_num_threads(), omp_get_thread_num(), &t0, &t1);
    for (long t = t0; t < t1; ++t) {
      const long i0 = (t / n_blocks) * mc, i1 = min_of(m, i0 + mc);
      long p0, p1;
      split_evenly(panels, n_blocks, t % n_blocks, &p0, &p1);
      for (long s = 0; s < slices; ++s) {
        const long k0 = s * kc_max, kc = min_of(kc_max, k - k0);
        const bool first = s == 0, last = s == slices - 1;
        const bool linear = epilogue.activation == Activation::kNone;
        pack_a(a + i0 * lda + k0, lda, i1 - i0, kc, ap);
        const long micro_rows = ceil_div(i1 - i0, kMR);
        const long w_lines = kc * kNR * static_cast<long>(sizeof(float)) / 64;
        const long lines_per_row = ceil_div(w_lines, micro_rows);
        for (long p = p0; p < p1; ++p) {
          const long j0 = p * kNR, ncols = min_of(kNR, n - j0);
          const float* w_slice = wp + (p * k + k0) * kNR;
          // The next panel's slice comes from L3 or memory: fetch it into L2 a share at a time
          // while this panel's micro-rows run, so its first kernel does not wait on misses.
          const char* w_next = p + 1 < p1 ? reinterpret_cast<const char*>(w_slice + k * kNR) : nullptr;
          TileEpilogue ep;
          ep.load_c = !first;
          const bool finish_here = linear ? first : last;
          ep.bias = finish_here && epilogue.bias ? epilogue.bias + j0 : nullptr;
          ep.activation = last ? epilogue.activation : Activation::kNone;
          for (long i = i0; i < i1; i += kMR) {
            if (w_next != nullptr) {
              const long first = (i - i0) / kMR * lines_per_row, last = min_of(w_lines, first + lines_per_row);
              for (long line = first; line < last; ++line) _mm_prefetch(w_next + 64 * line, _MM_HINT_T1);
            }
            ep.residual = finish_here && residual ? residual + i * ldr + j0 : nullptr;
            ep.ldr = ldr;
            tile_kernel(min_of(kMR, i1 - i), ap + (i - i0) * kc, w_slice, kc, c + i * ldc + j0, ldc, ncols, ep);
          }
        }
      }
    }
  }
  std::free(residual_copy);
}
