// Tiled flash attention with an online softmax, written once for every SIMD level.
//
// Include only from attention_<isa>.cc, after attention_simd_<isa>.h, with CPUFORMER_ATTENTION_ISA
// defined to that ISA's namespace (avx2, avx512, neon). Everything below then lands in
// cpuformer::<isa>::(anonymous namespace): each level gets its own copy, compiled with its own
// flags, and no symbol can be shared between levels at link time.
//
// Work decomposition. The query rows that share one (batch, kv head) are flattened as
// row = i · group + g (query position i, query head kv_head · group + g, group = H / Hkv), so a
// grouped-query decode step (Tq = 1, group = 8) is one tile of 8 rows that streams its K/V once.
// A tile is up to kLanes consecutive such rows; tiles × batch × kv heads are the parallel tasks,
// and when they are too few to keep every thread busy (decode) each tile's key range is also split
// across tasks, with a final merge of the partial (max, sum, accumulator) triples.
//
// Two engines handle a tile, one key block (kKeyBlock keys) at a time:
//  - wide (≥ kMinWideRows rows; measured faster from half a vector of rows on): query rows in
//    vector lanes. Qᵀ [D][kLanes] is packed once per tile, so a key's scores for all rows are D
//    FMAs of a Qᵀ row with that key's broadcast elements; max, exp and sum over the block's keys
//    are then lane-wise (no horizontal work).
//  - narrow (fewer rows, e.g. an MHA decode step): keys in vector lanes. Each row's scores for
//    kLanes keys are kLanes dot products over D whose horizontal sums are done together
//    (vsum_transposed), so no lane is wasted on missing rows.
// Both then rescale the tile's accumulator by 2^(m_old − m_new) (scores are in base 2, below) and
// add P·V with a register-tiled kPvRows × kPvVecs microkernel. Key blocks outside every row's
// causal/window range are never visited; blocks inside every row's range skip the per-key range
// test; the additive mask is read only for visited keys.
//
// Removed keys. A key outside a row's causal/window range or with a -inf mask value is removed
// from that row and must not affect it, whatever its k and v hold (docs/reliability.md,
// "Non-finite values"). Its score is set to -inf by selection (never by adding -inf, which a NaN
// or +inf score would turn into NaN), so its probability is exactly 0. The P·V microkernel still
// multiplies that 0 by the key's value row where the key is visible to other rows of the tile:
// exact for finite values, but 0 · NaN and 0 · inf are NaN. NaN is sticky in the accumulator, so
// a tile whose accumulator ends non-finite after removing some key is computed again with the
// exact microkernel, which skips the removed (row, key) pairs and otherwise does the same
// operations in the same order: rows that cannot see a non-finite value get the bits they would
// get without it, at no cost while the values are finite.
#ifndef CPUFORMER_ATTENTION_ISA
#error "define CPUFORMER_ATTENTION_ISA (avx2, avx512 or neon) before including attention_tiled_inl.h"
#endif

namespace cpuformer {
namespace CPUFORMER_ATTENTION_ISA {
namespace {

using namespace attention_simd;

constexpr int kMinWideRows = kLanes / 2;
constexpr long kMinSplitKeys = 256;  // a key split shorter than this costs more to merge than it saves
constexpr long kMinParallelWork = 1L << 15;  // B·H·Tq·Tk·D below which one thread is faster (hot pool)
constexpr long kMinChunkWork = 1L << 16;     // multiply-adds per chunk of work items taken at once

static_assert(kKeyBlock % kLanes == 0 && kKeyBlock % kScoreKeys == 0, "key block must hold whole vectors");
static_assert(kPvVecs >= 1 && kPvVecs <= 4, "pv_rows dispatches 1..4 vectors");
static_assert(kPvRows >= 1 && kPvRows <= 6, "pv_accumulate dispatches 1..6 rows");
static_assert(kKeyBlock <= 64, "a key block's removed keys are one 64-bit word per row");

inline long min_l(long a, long b) { return a < b ? a : b; }
inline long max_l(long a, long b) { return a > b ? a : b; }
inline long round_up(long x, long m) { return (x + m - 1) / m * m; }
inline float scalar_exp2(float x) { return vfirst(vexp2(vset1(x))); }

// Scores are kept in base 2 (q pre-scaled by scale · log2 e, the mask by log2 e) so that the
// softmax needs 2^x, which is cheaper than e^x; the results are the same.
constexpr float kLog2e = 1.44269504088896341f;

#ifdef CPUFORMER_ATTENTION_AMX
// Keys of the AMX engine's K rows and Vᵀ rows: kv_len rounded up to 32, plus 32 zero keys, so that
// a key block starting anywhere below kv_len reads whole 32-key tile rows inside them.
inline long attention_amx_keys(long kv_len) { return round_up(kv_len, 32) + 32; }
#endif
#ifdef CPUFORMER_ATTENTION_BF16
// head_dim of the bfloat16 engine: whole vectors, and whole 32-wide tile rows with AMX.
#ifdef CPUFORMER_ATTENTION_AMX
constexpr long kBf16DimStep = 32;
#else
constexpr long kBf16DimStep = kLanes;
#endif
#endif

// vmask_to_base2 for one value.
inline float mask_to_base2(float mask) {
  if (mask == -__builtin_inff()) return mask;
  const float scaled = mask * kLog2e;
  return scaled < -3.40282347e38f ? -3.40282347e38f : scaled;
}

// Up to kLanes query rows of one (batch, kv head).
struct Tile {
  alignas(64) int first[kLanes];  // keys row r may see: [first[r], last[r]], empty when last < first
  alignas(64) int last[kLanes];   // (lanes ≥ rows: the full range, so they never restrict a block)
  const float* q[kLanes];
  float* out[kLanes];
  long mask_offset[kLanes];  // element (b, h, i, 0) of the additive mask
  int rows;
  long key_begin, key_end;  // union of the rows' ranges; empty when no row sees a key
  const float* k;           // key 0 of this (batch, kv head) (float32)
  const float* v;
  const char* k_raw;        // other kv types: key 0's elements, and the rows' int8 scales
  const char* v_raw;
  const float* k_scales;
  const float* v_scales;
  const uint16_t* k16;      // bf16 engine: this (batch, kv head)'s keys [Tk2][D] and value pairs
  const uint16_t* v16;      // [Tk2 / 2][D][2] in bfloat16 (null: the float32 engines)
};

// Per-thread scratch, carved from one attention_scratch block.
struct Workspace {
  float* q;     // wide: Qᵀ [D][kLanes]; narrow: rows [kLanes][d_pad] zero-padded; × scale · log2 e
  float* p;     // a key block's scores, then probabilities: wide [kKeyBlock][kLanes], narrow [kLanes][kKeyBlock]
  float* acc;   // [kLanes][d_pad] unnormalised output rows
  float* m;     // [kLanes] running max of each row (base-2 units)
  float* l;     // [kLanes] running softmax denominator
  float* corr;  // [kLanes] 2^(m_old − m_new) of the current block
  float* kbuf;  // a reduced-precision block's keys and values widened: [kKeyBlock][head_dim] each
  float* vbuf;
};

inline long workspace_floats(long d_pad) {
  return 2 * kLanes * d_pad + kKeyBlock * kLanes + 3 * 16 + 2 * kKeyBlock * d_pad;
}

inline Workspace workspace_at(float* base, long d_pad) {
  Workspace w;
  w.q = base;
  w.acc = w.q + kLanes * d_pad;
  w.p = w.acc + kLanes * d_pad;
  w.m = w.p + kKeyBlock * kLanes;
  w.l = w.m + 16;
  w.corr = w.l + 16;
  w.kbuf = w.corr + 16;
  w.vbuf = w.kbuf + kKeyBlock * d_pad;
  return w;
}

// Rows [j0, j0 + n) of the tile's keys (values) widened to float32 into dst [n][dim]: float16
// exactly (F16C / FCVTL), bfloat16 by a 16-bit shift, int8 times the row's scale
// (AttentionArgs::kv_type), with the level's row functions (widen_f16, widen_bf16, widen_s8).
void widen_block(const AttentionArgs& a, const Tile& t, bool values, long j0, long n, float* dst) {
  const long dim = a.head_dim, stride = values ? a.v_stride_t : a.k_stride_t;
  const char* base = values ? t.v_raw : t.k_raw;
  for (long j = 0; j < n; ++j) {
    float* d = dst + j * dim;
    switch (a.kv_type) {
      case KvType::kFloat16: widen_f16(reinterpret_cast<const uint16_t*>(base) + (j0 + j) * stride, d, dim); break;
      case KvType::kBFloat16: widen_bf16(reinterpret_cast<const uint16_t*>(base) + (j0 + j) * stride, d, dim); break;
      case KvType::kInt8:
        widen_s8(reinterpret_cast<const int8_t*>(base) + (j0 + j) * stride, (values ? t.v_scales : t.k_scales)[j0 + j],
                 d, dim);
        break;
      case KvType::kFloat32: break;  // never widened
    }
  }
}

// kLanes values of a key (value) row from element d as float32: a float32 row as it is, a
// reduced-precision cache's row widened in registers exactly as widen_block widens it (int8: the
// codes times the row's scale, one rounding per element), so both ways give the same bits.
template <KvType KT>
inline Vec load_kv(const char* row, long d, Vec scale) {
  if constexpr (KT == KvType::kFloat32) return vload(reinterpret_cast<const float*>(row) + d);
  if constexpr (KT == KvType::kFloat16) return vload_f16(reinterpret_cast<const uint16_t*>(row) + d);
  if constexpr (KT == KvType::kBFloat16) return vload_bf16(reinterpret_cast<const uint16_t*>(row) + d);
  if constexpr (KT == KvType::kInt8) return vmul(vload_s8(reinterpret_cast<const int8_t*>(row) + d), scale);
}

// Requests the keys' and values' rows [j0, j0 + kKeyBlock) ∩ [j0, key_end) of a reduced-precision
// cache (the block after next, from the engines): such a block's arithmetic is too short to
// cover its rows' cache misses (measured: GPT-2 int8 decode over an int8 cache at a 3,800-token
// context 12.2 → 9.4 ms a token, Intel Xeon, 2 threads). The float32 cache's rows ran no faster
// with the requests, so it gets none.
template <KvType KT>
inline void prefetch_kv_rows(const Tile& t, long dim, long k_stride, long v_stride, long j0, long key_end) {
  constexpr long kElem = kv_type_size(KT);
  const long row_bytes = dim * kElem, end = min_l(j0 + kKeyBlock, key_end);
  for (long j = j0; j < end; ++j)
    for (long x = 0; x < row_bytes; x += 64) {
      __builtin_prefetch(t.k_raw + j * k_stride * kElem + x);
      __builtin_prefetch(t.v_raw + j * v_stride * kElem + x);
    }
}

// Reads the float32 key rows [j0, j0 + n) (row stride `stride` floats, `dim` used), one load per
// 64-byte line in address order, before an engine computes their scores: both walk across the rows
// of several keys at a time (the narrow engine kLanes keys, the query-block engine kScoreKeys), an
// order that defeats the hardware prefetchers, and a decode step's keys come from memory. Software
// prefetches of the rows 1-4 blocks ahead (as prefetch_kv_rows does for the other caches) gained
// nothing; this pass did. Measured on Zen 4, alternating builds: ops.attention of one query row,
// 12 heads of 64 over cold keys, 1 thread ~10 → 20-27 GB/s and 2 threads 14-19 → 20-27 GB/s; a
// GPT-2 int8 decode step's attention 32-36 → 25 µs a layer (16-144 cached keys), and 8.4-9.2 →
// 6.7-7.4 ms a token at a 900-token prompt. The values need no such pass (P·V reads them row after
// row: staging them too gained nothing), nor do reduced-precision caches (no faster with it than
// with their prefetch_kv_rows requests). With the keys in L1/L2 already it costs ~15 % of the
// engine's time. The query-block engine uses it in the tiles that hold every query row of their
// kv head (run_wide's stage_keys): a grouped-query decode step over 2,048 cold keys (32/4 heads of
// 64), 1 thread 393-405 → 294-308 µs together with wide_scores_half.
inline void stage_key_rows(const float* k, long stride, long dim, long j0, long n) {
  const long row_bytes = dim * static_cast<long>(sizeof(float));
  const char* base = reinterpret_cast<const char*>(k + j0 * stride);
  unsigned sink = 0;
  if (stride == dim) {  // contiguous rows: one run of lines
    const char* end = base + n * row_bytes;
    for (const char* p = base; p < end; p += 64) sink |= *reinterpret_cast<const volatile char*>(p);
    sink |= *reinterpret_cast<const volatile char*>(end - 1);
  } else {
    for (long j = 0; j < n; ++j) {
      const char* row = base + j * stride * static_cast<long>(sizeof(float));
      for (long x = 0; x < row_bytes; x += 64) sink |= *reinterpret_cast<const volatile char*>(row + x);
      sink |= *reinterpret_cast<const volatile char*>(row + row_bytes - 1);
    }
  }
  __asm__ volatile("" : : "r"(sink));
}

void build_tile(const AttentionArgs& a, long unit, long tiles_per_head, Tile* t) {
  const long group = a.heads / a.kv_heads;
  const long tile = unit % tiles_per_head, bk = unit / tiles_per_head;
  const long kv_head = bk % a.kv_heads, b = bk / a.kv_heads;
  const long row0 = tile * kLanes;
  t->rows = static_cast<int>(min_l(kLanes, a.q_len * group - row0));
  t->k = t->v = nullptr;
  t->k_raw = t->v_raw = nullptr;
  t->k_scales = t->v_scales = nullptr;
  t->k16 = t->v16 = nullptr;
  if (a.kv_type == KvType::kFloat32) {
    t->k = a.k + b * a.k_stride_b + kv_head * a.k_stride_h;
    t->v = a.v + b * a.v_stride_b + kv_head * a.v_stride_h;
  } else {
    const long size = kv_type_size(a.kv_type);
    t->k_raw = static_cast<const char*>(a.k_data) + (b * a.k_stride_b + kv_head * a.k_stride_h) * size;
    t->v_raw = static_cast<const char*>(a.v_data) + (b * a.v_stride_b + kv_head * a.v_stride_h) * size;
    if (a.kv_type == KvType::kInt8) {
      t->k_scales = a.k_scale + b * a.scale_stride_b + kv_head * a.scale_stride_h;
      t->v_scales = a.v_scale + b * a.scale_stride_b + kv_head * a.scale_stride_h;
    }
  }
  long begin = a.kv_len, end = 0;
  for (int r = 0; r < kLanes; ++r) {
    if (r >= t->rows) {
      t->first[r] = 0;
      t->last[r] = static_cast<int>(a.kv_len - 1);
      t->q[r] = nullptr;
      t->out[r] = nullptr;
      t->mask_offset[r] = 0;
      continue;
    }
    const long row = row0 + r, i = row / group, h = kv_head * group + row % group;
    t->q[r] = a.q + b * a.q_stride_b + h * a.q_stride_h + i * a.q_stride_t;
    t->out[r] = a.out + b * a.out_stride_b + h * a.out_stride_h + i * a.out_stride_t;
    t->mask_offset[r] = b * a.mask_stride_b + h * a.mask_stride_h + i * a.mask_stride_q;
    long first = 0, last = a.kv_len - 1;
    if (a.causal) {
      const long diagonal = i + a.causal_offset;
      last = min_l(last, diagonal);
      if (a.window > 0) first = max_l(first, diagonal - a.window + 1);
    } else if (a.window > 0) {  // bidirectional: keys within window - 1 positions on both sides
      const long center = i + a.causal_offset;
      first = max_l(first, center - a.window + 1);
      last = min_l(last, center + a.window - 1);
    }
    if (last < first) first = 0, last = -1;  // sees nothing; keeps both in int range
    t->first[r] = static_cast<int>(first);
    t->last[r] = static_cast<int>(last);
    if (last >= first) {
      begin = min_l(begin, first);
      end = max_l(end, last + 1);
    }
  }
  // Keys the mask removes (-inf) for every row at either end of the range (padding) are never
  // visited; only possible when the rows share one mask row.
  if (a.mask && end > begin) {
    bool shared = true;
    for (int r = 1; r < t->rows; ++r) shared = shared && t->mask_offset[r] == t->mask_offset[0];
    if (shared) {
      const float* mask_row = a.mask + t->mask_offset[0];
      while (begin < end && mask_row[begin * a.mask_stride_k] == -__builtin_inff()) ++begin;
      while (end > begin && mask_row[(end - 1) * a.mask_stride_k] == -__builtin_inff()) --end;
    }
  }
  if (end <= begin) begin = end = 0;
  t->key_begin = begin;
  t->key_end = end;
}

// ---- P·V: acc[r][:] = acc[r][:] · corr[r] + Σ_j P(r, j) · v_j[:], P(r, j) at p[r·p_row + j·p_key]
// kExact: the terms of removed keys (bit j of removed[r]) are skipped instead of added as 0 · v_j.

// Small tiles (a decode row) accumulate even and odd keys separately: RR·NV chains alone would
// leave the FMA units waiting on their 4-cycle latency.
// KT: the element type of v (v_stride in elements; v_scales: the rows' int8 scales); other than
// float32 only with whole vectors (last is then the full mask).
template <int RR, int NV, bool kExact, KvType KT = KvType::kFloat32>
inline void pv_tile(float* acc, long ld_acc, const float* p, long p_row, long p_key, const float* corr, long n,
                    const void* v_rows, long v_stride, TailMask last, const uint64_t* removed,
                    const float* v_scales = nullptr) {
  const char* v = static_cast<const char*>(v_rows);
  const long v_step = v_stride * kv_type_size(KT);
  constexpr int kSets = RR * NV < 8 ? 2 : 1;
  Vec c[kSets][RR][NV];
  for (int r = 0; r < RR; ++r) {
    const Vec s = vset1(corr[r]);
    for (int u = 0; u < NV; ++u) {
      c[0][r][u] = vmul(vload(acc + r * ld_acc + u * kLanes), s);
      for (int set = 1; set < kSets; ++set) c[set][r][u] = vzero();
    }
  }
  long j = 0;
  for (; j + kSets <= n; j += kSets) {
    for (int set = 0; set < kSets; ++set, v += v_step) {
      Vec x[NV];
      if constexpr (KT == KvType::kFloat32) {
        const float* vf = reinterpret_cast<const float*>(v);
        for (int u = 0; u + 1 < NV; ++u) x[u] = in_register(vload(vf + u * kLanes));
        x[NV - 1] = in_register(vload_tail(vf + (NV - 1) * kLanes, last));
      } else {
        const Vec scale = KT == KvType::kInt8 ? vset1(v_scales[j + set]) : vzero();
        for (int u = 0; u < NV; ++u) x[u] = in_register(load_kv<KT>(v, u * kLanes, scale));
      }
      const float* pj = p + (j + set) * p_key;
      for (int r = 0; r < RR; ++r) {
        if (kExact && (removed[r] >> (j + set) & 1)) continue;
        const Vec pr = vset1(pj[r * p_row]);
        for (int u = 0; u < NV; ++u) c[set][r][u] = vfmadd(pr, x[u], c[set][r][u]);
      }
    }
  }
  if (j < n) {  // kSets == 2 and n odd
    Vec x[NV];
    if constexpr (KT == KvType::kFloat32) {
      const float* vf = reinterpret_cast<const float*>(v);
      for (int u = 0; u + 1 < NV; ++u) x[u] = vload(vf + u * kLanes);
      x[NV - 1] = vload_tail(vf + (NV - 1) * kLanes, last);
    } else {
      const Vec scale = KT == KvType::kInt8 ? vset1(v_scales[j]) : vzero();
      for (int u = 0; u < NV; ++u) x[u] = load_kv<KT>(v, u * kLanes, scale);
    }
    const float* pj = p + j * p_key;
    for (int r = 0; r < RR; ++r) {
      if (kExact && (removed[r] >> j & 1)) continue;
      const Vec pr = vset1(pj[r * p_row]);
      for (int u = 0; u < NV; ++u) c[0][r][u] = vfmadd(pr, x[u], c[0][r][u]);
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int u = 0; u < NV; ++u) {
      Vec sum = c[0][r][u];
      for (int set = 1; set < kSets; ++set) sum = vadd(sum, c[set][r][u]);
      vstore(acc + r * ld_acc + u * kLanes, sum);
    }
}

// acc rows are padded to a whole number of vectors, so only V needs masked loads.
template <int RR, bool kExact, KvType KT = KvType::kFloat32>
void pv_rows(float* acc, long ld_acc, const float* p, long p_row, long p_key, const float* corr, long n,
             const void* v_rows, long v_stride, long dim, const uint64_t* removed, const float* v_scales) {
  constexpr long kChunk = kPvVecs * kLanes;
  const char* v = static_cast<const char*>(v_rows);
  constexpr long kElem = kv_type_size(KT);
  long d = 0;
  for (; d + kChunk <= dim; d += kChunk)
    pv_tile<RR, kPvVecs, kExact, KT>(acc + d, ld_acc, p, p_row, p_key, corr, n, v + d * kElem, v_stride, full_mask(),
                                     removed, v_scales);
  const long rest = dim - d;
  if (rest == 0) return;
  const long vecs = (rest + kLanes - 1) / kLanes;
  const TailMask last = tail_mask(rest - (vecs - 1) * kLanes);
  const char* vd = v + d * kElem;
  switch (vecs) {  // 1 ≤ vecs ≤ kPvVecs
    case 1:
      pv_tile<RR, 1, kExact, KT>(acc + d, ld_acc, p, p_row, p_key, corr, n, vd, v_stride, last, removed, v_scales);
      break;
    case 2:
      pv_tile<RR, 2, kExact, KT>(acc + d, ld_acc, p, p_row, p_key, corr, n, vd, v_stride, last, removed, v_scales);
      break;
    case 3:
      pv_tile<RR, (kPvVecs > 3 ? 3 : kPvVecs), kExact, KT>(acc + d, ld_acc, p, p_row, p_key, corr, n, vd, v_stride,
                                                           last, removed, v_scales);
      break;
    default:  // 4 vectors: only when kPvVecs is 4 (AVX-512, NEON)
      pv_tile<RR, kPvVecs, kExact, KT>(acc + d, ld_acc, p, p_row, p_key, corr, n, vd, v_stride, last, removed,
                                       v_scales);
      break;
  }
}

// removed [rows]: bit j of removed[r] set when key j of the block is removed from row r (read
// only when kExact).
// KT, v_scales: as for pv_tile (v_stride in elements).
template <bool kExact, KvType KT = KvType::kFloat32>
void pv_accumulate(float* acc, long ld_acc, const float* p, long p_row, long p_key, const float* corr, int rows, long n,
                   const void* v, long v_stride, long dim, const uint64_t* removed, const float* v_scales = nullptr) {
  for (int r = 0; r < rows; r += kPvRows) {
    float* a = acc + r * ld_acc;
    const float* pr = p + r * p_row;
    const uint64_t* rm = removed + r;
    const float* cr = corr + r;
    switch (rows - r < kPvRows ? rows - r : kPvRows) {
      case 1: pv_rows<1, kExact, KT>(a, ld_acc, pr, p_row, p_key, cr, n, v, v_stride, dim, rm, v_scales); break;
      case 2: pv_rows<2, kExact, KT>(a, ld_acc, pr, p_row, p_key, cr, n, v, v_stride, dim, rm, v_scales); break;
      case 3: pv_rows<3, kExact, KT>(a, ld_acc, pr, p_row, p_key, cr, n, v, v_stride, dim, rm, v_scales); break;
      case 4:
        pv_rows<(kPvRows > 4 ? 4 : kPvRows), kExact, KT>(a, ld_acc, pr, p_row, p_key, cr, n, v, v_stride, dim, rm,
                                                         v_scales);
        break;
      case 5:
        pv_rows<(kPvRows > 5 ? 5 : kPvRows), kExact, KT>(a, ld_acc, pr, p_row, p_key, cr, n, v, v_stride, dim, rm,
                                                         v_scales);
        break;
      default: pv_rows<kPvRows, kExact, KT>(a, ld_acc, pr, p_row, p_key, cr, n, v, v_stride, dim, rm, v_scales); break;
    }
  }
}

// ---- wide engine: rows in lanes

// s[j][lane] = Σ_d qt[d][lane] · k_j[d] for kScoreKeys keys; keys ≥ nk repeat key nk − 1 (their
// scores land in scratch past the block's end and are never used, and leave `max` unchanged).
// Even and odd d accumulate separately: twice the independent FMA chains for the same number of
// key pointers (registers). max: lane-wise running maximum of the scores.
inline void wide_scores(const float* qt, long dim, const float* k, long k_stride, long nk, float* s, Vec* max) {
  const float* kp[kScoreKeys];
  for (int j = 0; j < kScoreKeys; ++j) kp[j] = k + (j < nk ? j : nk - 1) * k_stride;
  Vec even[kScoreKeys], odd[kScoreKeys];
  for (int j = 0; j < kScoreKeys; ++j) even[j] = odd[j] = vzero();
  long d = 0;
  for (; d + 2 <= dim; d += 2) {
    const Vec q0 = vload(qt + d * kLanes), q1 = vload(qt + (d + 1) * kLanes);
    for (int j = 0; j < kScoreKeys; ++j) {
      even[j] = vfmadd(q0, vset1(kp[j][d]), even[j]);
      odd[j] = vfmadd(q1, vset1(kp[j][d + 1]), odd[j]);
    }
  }
  if (d < dim) {
    const Vec q0 = vload(qt + d * kLanes);
    for (int j = 0; j < kScoreKeys; ++j) even[j] = vfmadd(q0, vset1(kp[j][d]), even[j]);
  }
  for (int j = 0; j < kScoreKeys; ++j) {
    const Vec score = vadd(even[j], odd[j]);
    vstore(s + j * kLanes, score);
    *max = vmax(*max, score);
  }
}

enum class MaskMode { kNone, kShared, kGather, kPerLane };

// Both engines: the tile's unnormalised rows over keys [key_begin, key_end) into w.acc, w.m, w.l.
// Returns whether some visited key was removed from some row, i.e. whether a non-finite value row
// of such a key may have reached the accumulator through 0 · v (kExact: never).
template <bool kExact>
bool run_wide(const AttentionArgs& a, const Tile& t, long key_begin, long key_end, const Workspace& w) {
  const long dim = a.head_dim, d_pad = round_up(dim, kLanes);
  const int rows = t.rows;
#ifdef CPUFORMER_ATTENTION_BF16
  // The bfloat16 engine (attention_simd_avx512bf16.h): Qᵀ as d pairs [D/2][kLanes], the
  // accumulator transposed, accᵀ [D][kLanes] in w.kbuf (float32 k/v are never widened), the
  // block's probability pairs in w.vbuf. The exact rerun (kExact) is the float32 engine.
  const bool bf16 = !kExact && t.k16 != nullptr;
  uint32_t* const qt2 = reinterpret_cast<uint32_t*>(w.q);
  float* const acct = w.kbuf;
  uint32_t* const p2 = reinterpret_cast<uint32_t*>(w.vbuf);
#else
  constexpr bool bf16 = false;
#endif
  // Qᵀ, kLanes × kLanes blocks at a time; lanes of missing rows stay 0.
  const Vec q_scale = vset1(a.scale * kLog2e);
  for (long d0 = 0; d0 < dim; d0 += kLanes) {
    const long count = min_l(kLanes, dim - d0);
    const TailMask tail = tail_mask(count);
    Vec block[kLanes];
    for (int r = 0; r < kLanes; ++r) block[r] = r < rows ? vload_tail(t.q[r] + d0, tail) : vzero();
    transpose(block);
#ifdef CPUFORMER_ATTENTION_BF16
    if (bf16) {  // count == kLanes: head_dim is a multiple of kLanes here
      for (long d = 0; d < count; d += 2)
        _mm512_storeu_si512(qt2 + (d0 + d) / 2 * kLanes,
                            attention_bf16::pack_pairs(vmul(block[d], q_scale), vmul(block[d + 1], q_scale)));
      continue;
    }
#endif
    for (long d = 0; d < count; ++d) vstore(w.q + (d0 + d) * kLanes, vmul(block[d], q_scale));
  }
  if (bf16) {
#ifdef CPUFORMER_ATTENTION_BF16
    for (long x = 0; x < kLanes * d_pad; ++x) acct[x] = 0.0f;
#endif
  } else {
    for (long x = 0; x < rows * d_pad; ++x) w.acc[x] = 0.0f;
  }

  const IVec first = iload(t.first), last = iload(t.last);
  long all_first = 0, all_last = a.kv_len - 1;  // keys every row sees
  for (int r = 0; r < rows; ++r) {
    all_first = max_l(all_first, t.first[r]);
    all_last = min_l(all_last, t.last[r]);
  }

  // Rows of one tile differ in their mask row only through h and i; when none differ (key
  // padding, or one head and a mask broadcast over queries) one broadcast per key serves all.
  MaskMode mode = MaskMode::kNone;
  const float* mask_base = nullptr;
  IVec mask_index = iset1(0);
  if (a.mask) {
    long lo = t.mask_offset[0], hi = lo;
    for (int r = 1; r < rows; ++r) {
      lo = min_l(lo, t.mask_offset[r]);
      hi = max_l(hi, t.mask_offset[r]);
    }
    mask_base = a.mask + lo;
    if (lo == hi) {
      mode = MaskMode::kShared;
    } else if (hi - lo <= 2147483647L) {
      mode = MaskMode::kGather;
      alignas(64) int index[kLanes];
      for (int r = 0; r < kLanes; ++r) index[r] = r < rows ? static_cast<int>(t.mask_offset[r] - lo) : 0;
      mask_index = iload(index);
    } else {
      mode = MaskMode::kPerLane;
    }
  }

  const bool widen = a.kv_type != KvType::kFloat32;
  const long k_stride = widen ? dim : a.k_stride_t, v_stride = widen ? dim : a.v_stride_t;
  const long mask_stride = a.mask_stride_k;
  // A tile that holds every query row of its kv head (a grouped-query decode or verification
  // step) reads each key once per call, from memory: its rows are read in address order first, as
  // in the single-row engine. Where several tiles share the keys (prefill), they are in L2 after
  // the first, and the pass would only cost.
  const bool stage_keys = !widen && !bf16 && a.q_len * (a.heads / a.kv_heads) <= kLanes;
  const Vec log2e = vset1(kLog2e);
  const unsigned row_lanes = (1u << rows) - 1u;  // rows ≤ kLanes ≤ 16
  uint64_t removed[kLanes] = {};  // kExact: per row, bit j = key j0 + j of the block is removed
  bool removed_any = false;
  Vec m = vneg_inf(), l = vzero();
  for (long j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
    const long n = min_l(kKeyBlock, key_end - j0);
    const float* kb = widen ? w.kbuf : t.k + j0 * k_stride;
    const float* vb = widen ? w.vbuf : t.v + j0 * v_stride;
    if (widen) {
      widen_block(a, t, false, j0, n, w.kbuf);
      widen_block(a, t, true, j0, n, w.vbuf);
    } else if (stage_keys) {
      stage_key_rows(t.k, k_stride, dim, j0, n);
    }
    Vec block_max = vneg_inf();
#ifdef CPUFORMER_ATTENTION_BF16
    if (bf16) {
#ifdef CPUFORMER_ATTENTION_AMX
      // 16 keys per tile; the scores of the padding keys past n are stored and never read.
      attention_amx::compiler_barrier();  // Qᵀ pairs were stored by vector code
      for (long j = 0; j < n; j += 16) attention_amx::scores16(t.k16 + (j0 + j) * dim, dim, qt2, w.p + j * kLanes);
      for (long j = 0; j < n; ++j) block_max = vmax(block_max, vload(w.p + j * kLanes));
#else
      const uint32_t* k2 = reinterpret_cast<const uint32_t*>(t.k16) + j0 * (dim / 2);
      for (long j = 0; j < n; j += 8)
        attention_bf16::wide_scores(qt2, dim / 2, k2 + j * (dim / 2), min_l(8, n - j), w.p + j * kLanes, &block_max);
#endif
    }
#endif
#ifdef CPUFORMER_ATTENTION_HALF_SCORES
    if (!bf16 && rows <= kLanes / 2) {
      for (long j = 0; j < n; j += kScoreKeys)
        wide_scores_half(w.q, dim, kb + j * k_stride, k_stride, min_l(kScoreKeys, n - j), w.p + j * kLanes, &block_max);
    } else
#endif
      for (long j = 0; !bf16 && j < n; j += kScoreKeys)
        wide_scores(w.q, dim, kb + j * k_stride, k_stride, min_l(kScoreKeys, n - j), w.p + j * kLanes, &block_max);

    const bool partial = j0 < all_first || j0 + n - 1 > all_last;
    if (kExact)
      for (int r = 0; r < rows; ++r) removed[r] = 0;
    if (partial || mode != MaskMode::kNone) block_max = vneg_inf();
    LaneMask removed_lanes = lanes_none();  // rows from which some key of the block is removed
    for (long j = 0; (partial || mode != MaskMode::kNone) && j < n; ++j) {
      const long key = j0 + j;
      Vec s = vload(w.p + j * kLanes);
      LaneMask out = partial ? lanes_outside(iset1(static_cast<int>(key)), first, last) : lanes_none();
      switch (mode) {
        case MaskMode::kNone: break;
        case MaskMode::kShared: {
          const float value = mask_base[key * mask_stride];
          if (value == -__builtin_inff()) out = lanes_all();
          else s = vadd(s, vset1(mask_to_base2(value)));
          break;
        }
        case MaskMode::kGather: {
          const Vec values = vmask_to_base2(vgather(mask_base + key * mask_stride, mask_index), log2e);
          out = lanes_or(out, lanes_neg_inf(values));
          s = vadd(s, values);
          break;
        }
        case MaskMode::kPerLane: {
          alignas(64) float raw[kLanes] = {};
          for (int r = 0; r < rows; ++r) raw[r] = a.mask[t.mask_offset[r] + key * mask_stride];
          const Vec values = vmask_to_base2(vload(raw), log2e);
          out = lanes_or(out, lanes_neg_inf(values));
          s = vadd(s, values);
          break;
        }
      }
      s = vremove(s, out);
      removed_lanes = lanes_or(removed_lanes, out);
      if (kExact) {
        const unsigned bits = lane_bits(out);
        for (int r = 0; r < rows; ++r) removed[r] |= static_cast<uint64_t>(bits >> r & 1u) << j;
      }
      vstore(w.p + j * kLanes, s);
      block_max = vmax(block_max, s);
    }
    removed_any = removed_any || (lane_bits(removed_lanes) & row_lanes) != 0;

    const Vec m_new = vmax(m, block_max);
    const Vec m_use = vfinite_or_zero(m_new);
    const Vec corr = vexp2(vsub(m, m_use));
    Vec sum = vzero();
    for (long j = 0; j < n; ++j) {
      const Vec p = vexp2(vsub(vload(w.p + j * kLanes), m_use));
      vstore(w.p + j * kLanes, p);
      sum = vadd(sum, p);
    }
    l = vfmadd(l, corr, sum);
    m = m_new;
#ifdef CPUFORMER_ATTENTION_BF16
    if (bf16) {
#ifdef CPUFORMER_ATTENTION_AMX
      // Key pairs (j0 + 2i, j0 + 2i + 1) of the block, zero past its end: one tile step of 32 keys
      // against Vᵀ from key j0 (padded with 32 zero keys past kv_len, so the step never leaves it).
      static_assert(kKeyBlock == 32, "one TDPBF16PS step per key block");
      for (long i = 0; i < kKeyBlock / 2; ++i) {
        const Vec lo = 2 * i < n ? vload(w.p + 2 * i * kLanes) : vzero();
        const Vec hi = 2 * i + 1 < n ? vload(w.p + (2 * i + 1) * kLanes) : vzero();
        _mm512_storeu_si512(p2 + i * kLanes, attention_bf16::pack_pairs(lo, hi));
      }
      // 0 · v of a key past the block is NaN when v is not finite: let run_tile check.
      if (n < kKeyBlock && j0 + n < a.kv_len) removed_any = true;
      for (long d = 0; d < dim; ++d) vstore(acct + d * kLanes, vmul(vload(acct + d * kLanes), corr));
      attention_amx::pv32(acct, p2, t.v16 + j0, attention_amx_keys(a.kv_len), dim);
      continue;
#endif
      // Key pairs (2i, 2i + 1) in absolute positions, so that V's pairs are shared by every tile;
      // a pair's key outside the block gets probability 0 here (it is another block's, or padding).
      const long pair0 = j0 / 2, pairs = (j0 + n + 1) / 2 - pair0;
      for (long i = 0; i < pairs; ++i) {
        const long j = 2 * (pair0 + i) - j0;  // the pair's first key, relative to j0
        const Vec lo = j >= 0 ? vload(w.p + j * kLanes) : vzero();
        const Vec hi = j + 1 < n ? vload(w.p + (j + 1) * kLanes) : vzero();
        _mm512_storeu_si512(p2 + i * kLanes, attention_bf16::pack_pairs(lo, hi));
      }
      // 0 · v of such a key is NaN when v is not finite: let run_tile check (and recompute exactly).
      if (j0 % 2 != 0 || ((j0 + n) % 2 != 0 && j0 + n < a.kv_len)) removed_any = true;
      attention_bf16::pv_accumulate(acct, corr, p2, pairs, reinterpret_cast<const uint32_t*>(t.v16) + pair0 * dim, dim);
      continue;
    }
#endif
    vstore(w.corr, corr);
    pv_accumulate<kExact>(w.acc, d_pad, w.p, 1, kLanes, w.corr, rows, n, vb, v_stride, dim, removed);
  }
#ifdef CPUFORMER_ATTENTION_BF16
  if (bf16) {  // accᵀ [D][kLanes] back to the rows [rows][d_pad] that write_rows reads
    for (long d0 = 0; d0 < dim; d0 += kLanes) {
      Vec block[kLanes];
      for (int i = 0; i < kLanes; ++i) block[i] = vload(acct + (d0 + i) * kLanes);
      transpose(block);
      for (int r = 0; r < rows; ++r) vstore(w.acc + r * d_pad + d0, block[r]);
    }
  }
#endif
  vstore(w.m, m);
  vstore(w.l, l);
  return removed_any;
}

// ---- narrow engine: keys in lanes

// Lane j: q · k_j for kLanes keys; keys ≥ nk repeat key nk − 1 (the caller masks them).
// The rows of a reduced-precision cache (KT; dim a multiple of kLanes, k_stride in elements,
// k_scales the keys' int8 scales) are widened in registers, one key at a time, and summed over d
// in the same order as float32 rows: the same bits as scores of the rows widen_block writes.
template <bool kFull, KvType KT>
inline Vec narrow_scores_typed(const float* q, long dim, const char* k, long k_stride, long nk, const float* k_scales) {
  Vec acc[kLanes];
  const long step = k_stride * kv_type_size(KT);
  for (int j = 0; j < kLanes; ++j) {
    const int jj = kFull || j < nk ? j : static_cast<int>(nk) - 1;
    const char* kj = k + jj * step;
    const Vec scale = KT == KvType::kInt8 ? vset1(k_scales[jj]) : vzero();
    Vec sum = vzero();
    for (long d = 0; d < dim; d += kLanes) sum = vfmadd(vload(q + d), load_kv<KT>(kj, d, scale), sum);
    acc[j] = sum;
  }
  return vsum_transposed(acc);
}

template <bool kFull>
inline Vec narrow_scores(const float* q, long dim, const float* k, long k_stride, long nk) {
  Vec acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = vzero();
  long d = 0;
  for (; d + kLanes <= dim; d += kLanes) {
    const Vec qv = vload(q + d);
    const float* kd = k + d;
    for (int j = 0; j < kLanes; ++j) {
      acc[j] = vfmadd(qv, vload(kd), acc[j]);
      if (kFull || j + 1 < nk) kd += k_stride;
    }
  }
  if (d < dim) {  // q is zero-padded; k must not be read past its row
    const TailMask tail = tail_mask(dim - d);
    const Vec qv = vload(q + d);
    const float* kd = k + d;
    for (int j = 0; j < kLanes; ++j) {
      acc[j] = vfmadd(qv, vload_tail(kd, tail), acc[j]);
      if (kFull || j + 1 < nk) kd += k_stride;
    }
  }
  return vsum_transposed(acc);
}

inline Vec mask_values(const float* mask, long stride, long nk) {
  if (stride == 1) return nk == kLanes ? vload(mask) : vload_tail(mask, tail_mask(nk));
  if (stride == 0) return vset1(*mask);
  alignas(64) float values[kLanes] = {};
  for (long j = 0; j < nk; ++j) values[j] = mask[j * stride];
  return vload(values);
}

// KT: float32 for a float32 cache, and for the others when head_dim is not a multiple of kLanes
// (their blocks are then widened into w.kbuf / w.vbuf first); otherwise the cache's type, read
// straight from the cache.
template <bool kExact, KvType KT>
bool run_narrow(const AttentionArgs& a, const Tile& t, long key_begin, long key_end, const Workspace& w) {
  const long dim = a.head_dim, d_pad = round_up(dim, kLanes);
  const int rows = t.rows;
  const float q_scale = a.scale * kLog2e;
  for (int r = 0; r < rows; ++r) {
    const float* q = t.q[r];
    float* qs = w.q + r * d_pad;
    for (long d = 0; d < dim; ++d) qs[d] = q[d] * q_scale;
    for (long d = dim; d < d_pad; ++d) qs[d] = 0.0f;
    w.m[r] = -__builtin_inff();
    w.l[r] = 0.0f;
  }
  for (long x = 0; x < rows * d_pad; ++x) w.acc[x] = 0.0f;

  constexpr bool kTyped = KT != KvType::kFloat32;
  const bool widen = !kTyped && a.kv_type != KvType::kFloat32;
  const long k_stride = widen ? dim : a.k_stride_t, v_stride = widen ? dim : a.v_stride_t;
  const long mask_stride = a.mask_stride_k;
  const Vec log2e = vset1(kLog2e);
  uint64_t removed[kLanes] = {};  // kExact: per row, bit j = key j0 + j of the block is removed
  bool removed_any = false;
  for (long j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
    const long n = min_l(kKeyBlock, key_end - j0);
    // The block's rows: float32 (the cache's, or widened into scratch), or the typed cache's.
    const float* kb = kTyped ? nullptr : widen ? w.kbuf : t.k + j0 * k_stride;
    const float* vb = kTyped ? nullptr : widen ? w.vbuf : t.v + j0 * v_stride;
    const char* kraw = kTyped ? t.k_raw + j0 * k_stride * kv_type_size(KT) : nullptr;
    const char* vraw = kTyped ? t.v_raw + j0 * v_stride * kv_type_size(KT) : nullptr;
    if constexpr (kTyped) prefetch_kv_rows<KT>(t, dim, k_stride, v_stride, j0 + 2 * kKeyBlock, key_end);
    else if (!widen) stage_key_rows(t.k, k_stride, dim, j0, n);
    if (widen) {
      widen_block(a, t, false, j0, n, w.kbuf);
      widen_block(a, t, true, j0, n, w.vbuf);
    }
    for (int r = 0; r < rows; ++r) {
      float* pr = w.p + r * kKeyBlock;
      const long first = max_l(t.first[r], j0), last = min_l(t.last[r], j0 + n - 1);
      if (kExact) removed[r] = 0;
      if (last < first) {  // this row sees none of the block's keys
        for (long j = 0; j < n; ++j) pr[j] = 0.0f;
        w.corr[r] = 1.0f;
        if (kExact) removed[r] = ~uint64_t{0};
        removed_any = true;
        continue;
      }
      const float* mask_row = a.mask ? a.mask + t.mask_offset[r] : nullptr;
      const IVec first_v = iset1(static_cast<int>(first)), last_v = iset1(static_cast<int>(last));
      Vec block_max = vneg_inf();
      for (long j = 0; j < n; j += kLanes) {
        const long key0 = j0 + j, nk = min_l(kLanes, n - j);
        Vec s;
        if constexpr (kTyped) {
          const char* kj = kraw + j * k_stride * kv_type_size(KT);
          const float* ks = KT == KvType::kInt8 ? t.k_scales + j0 + j : nullptr;
          s = nk == kLanes ? narrow_scores_typed<true, KT>(w.q + r * d_pad, dim, kj, k_stride, nk, ks)
                           : narrow_scores_typed<false, KT>(w.q + r * d_pad, dim, kj, k_stride, nk, ks);
        } else {
          const float* kj = kb + j * k_stride;
          s = nk == kLanes ? narrow_scores<true>(w.q + r * d_pad, dim, kj, k_stride, nk)
                           : narrow_scores<false>(w.q + r * d_pad, dim, kj, k_stride, nk);
        }
        const bool partial = key0 < first || key0 + kLanes - 1 > last;
        if (partial || mask_row) {
          // Lanes past nk repeat a key and fall outside [first, last]; they are no key of P·V.
          LaneMask out = partial ? lanes_outside(iota_plus(static_cast<int>(key0)), first_v, last_v) : lanes_none();
          if (mask_row) {
            const Vec values = vmask_to_base2(mask_values(mask_row + key0 * mask_stride, mask_stride, nk), log2e);
            out = lanes_or(out, lanes_neg_inf(values));
            s = vadd(s, values);
          }
          s = vremove(s, out);
          const uint64_t bits = lane_bits(out);
          removed_any |= (bits & ((uint64_t{1} << nk) - 1)) != 0;
          if (kExact) removed[r] |= bits << j;
        }
        vstore(pr + j, s);
        block_max = vmax(block_max, s);
      }
      const float m_old = w.m[r], block_m = hmax(block_max);
      const float m_new = block_m > m_old ? block_m : m_old;
      const float m_use = m_new == -__builtin_inff() ? 0.0f : m_new;
      const Vec mu = vset1(m_use);
      Vec sum = vzero();
      for (long j = 0; j < n; j += kLanes) {  // lanes past n hold -inf and give 0
        const Vec p = vexp2(vsub(vload(pr + j), mu));
        vstore(pr + j, p);
        sum = vadd(sum, p);
      }
      const float corr = scalar_exp2(m_old - m_use);
      w.l[r] = w.l[r] * corr + hsum(sum);
      w.m[r] = m_new;
      w.corr[r] = corr;
    }
    if constexpr (kTyped) {
      pv_accumulate<kExact, KT>(w.acc, d_pad, w.p, kKeyBlock, 1, w.corr, rows, n, vraw, v_stride, a.head_dim, removed,
                                KT == KvType::kInt8 ? t.v_scales + j0 : nullptr);
    } else {
      pv_accumulate<kExact>(w.acc, d_pad, w.p, kKeyBlock, 1, w.corr, rows, n, vb, v_stride, a.head_dim, removed);
    }
  }
  return removed_any;
}

// Whether every accumulated value of the tile's rows is finite (x · 0 is NaN for NaN and ±inf).
bool accumulators_finite(const Tile& t, const Workspace& w, long d_pad) {
  Vec probe = vzero();
  for (long x = 0; x < t.rows * d_pad; x += kLanes) probe = vadd(probe, vmul(vload(w.acc + x), vzero()));
  const float sum = hsum(probe);
  return sum == sum;
}

// The narrow engine for the call's cache: read in registers where head_dim is whole vectors.
template <bool kExact>
bool run_narrow_for(const AttentionArgs& a, const Tile& t, long key_begin, long key_end, const Workspace& w) {
  if (a.head_dim % kLanes == 0) {
    switch (a.kv_type) {
      case KvType::kFloat16: return run_narrow<kExact, KvType::kFloat16>(a, t, key_begin, key_end, w);
      case KvType::kBFloat16: return run_narrow<kExact, KvType::kBFloat16>(a, t, key_begin, key_end, w);
      case KvType::kInt8: return run_narrow<kExact, KvType::kInt8>(a, t, key_begin, key_end, w);
      case KvType::kFloat32: break;
    }
  }
  return run_narrow<kExact, KvType::kFloat32>(a, t, key_begin, key_end, w);
}

// Runs the tile's key range [key_begin, key_end) with the fast microkernel, and again with the
// exact one when a removed key may have brought 0 · NaN or 0 · inf into the accumulator.
void run_tile(const AttentionArgs& a, const Tile& t, long key_begin, long key_end, const Workspace& w, long d_pad) {
  const bool wide = t.rows >= kMinWideRows;
  const bool removed_any =
      wide ? run_wide<false>(a, t, key_begin, key_end, w) : run_narrow_for<false>(a, t, key_begin, key_end, w);
  if (!removed_any || accumulators_finite(t, w, d_pad)) return;
  if (wide) run_wide<true>(a, t, key_begin, key_end, w);
  else run_narrow_for<true>(a, t, key_begin, key_end, w);
}

// ---- results

void write_rows(const Tile& t, const Workspace& w, long dim, long d_pad) {
  for (int r = 0; r < t.rows; ++r) {
    const Vec inv = vset1(w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f);
    const float* acc = w.acc + r * d_pad;
    float* out = t.out[r];
    long d = 0;
    for (; d + kLanes <= dim; d += kLanes) vstore(out + d, vmul(vload(acc + d), inv));
    if (d < dim) vstore_tail(out + d, vmul(vload(acc + d), inv), tail_mask(dim - d));
  }
}

// A key split's result for row r: [m, l, weight, pad to kLanes floats, acc (d_pad floats)].
inline long record_floats(long d_pad) { return kLanes + d_pad; }

void write_partial(const Tile& t, const Workspace& w, long d_pad, float* records) {
  const long size = record_floats(d_pad);
  for (int r = 0; r < t.rows; ++r) {
    float* rec = records + r * size;
    rec[0] = w.m[r];
    rec[1] = w.l[r];
    const float* acc = w.acc + r * d_pad;
    for (long d = 0; d < d_pad; d += kLanes) vstore(rec + kLanes + d, vload(acc + d));
  }
}

// out = Σ_s 2^(m_s − M) acc_s / Σ_s 2^(m_s − M) l_s with M = max_s m_s; zeros if no split saw a
// key (every m_s = -inf). A NaN m_s (the split saw a NaN score) makes the row NaN through 2^(m_s − M).
void merge_partials(const Tile& t, float* records, long splits, long dim, long d_pad) {
  const long size = record_floats(d_pad);
  for (int r = 0; r < t.rows; ++r) {
    float* out = t.out[r];
    float m_max = -__builtin_inff();
    bool seen = false;
    for (long s = 0; s < splits; ++s) {
      const float m = records[(s * kLanes + r) * size];
      m_max = m > m_max ? m : m_max;
      seen = seen || m != -__builtin_inff();
    }
    if (!seen) {
      for (long d = 0; d < dim; ++d) out[d] = 0.0f;
      continue;
    }
    float denominator = 0.0f;
    for (long s = 0; s < splits; ++s) {
      float* rec = records + (s * kLanes + r) * size;
      rec[2] = scalar_exp2(rec[0] - m_max);
      denominator += rec[2] * rec[1];
    }
    const Vec inv = vset1(1.0f / denominator);
    for (long d = 0; d < dim; d += kLanes) {
      Vec sum = vzero();
      for (long s = 0; s < splits; ++s) {
        const float* rec = records + (s * kLanes + r) * size;
        sum = vfmadd(vset1(rec[2]), vload(rec + kLanes + d), sum);
      }
      sum = vmul(sum, inv);
      if (d + kLanes <= dim) vstore(out + d, sum);
      else vstore_tail(out + d, sum, tail_mask(dim - d));
    }
  }
}

// How one call's work is cut: units (batch × kv head × tiles of up to kLanes query rows), each over
// `splits` ranges of its keys when the units are too few to keep `threads` threads busy (decode).
// A call alone and among others (attention_tiled_many) is cut the same way, so its results are
// the same bits.
struct CallPlan {
  long tiles_per_head = 0, units = 0, splits = 1, items = 0;
  long item_work = 1;  // multiply-adds of one item, about
  long work = 0;       // of the whole call: B·H·Tq·Tk·D
};

CallPlan plan_call(const AttentionArgs& a, int threads) {
  CallPlan p;
  if (a.batch <= 0 || a.heads <= 0 || a.q_len <= 0) return p;
  const long group = a.heads / a.kv_heads;
  p.tiles_per_head = (a.q_len * group + kLanes - 1) / kLanes;
  p.units = a.batch * a.kv_heads * p.tiles_per_head;
  if (p.units < 4L * threads) {
    const long wanted = (4L * threads + p.units - 1) / p.units, most = a.kv_len / kMinSplitKeys;
    p.splits = max_l(1, min_l(wanted, most));
  }
  p.items = p.units * p.splits;
  p.item_work = min_l(kLanes, a.q_len * group) * max_l(1, a.kv_len / p.splits) * a.head_dim;
  p.work = a.batch * a.heads * a.q_len * a.kv_len * a.head_dim;
  return p;
}

// Floats of one item's partial results (a split call's).
inline long record_block_floats(long d_pad) { return kLanes * record_floats(d_pad); }

// Item `item` of call a: its tile over its key range, the rows written (one split) or its partial
// result written at `records`, the call's records (item's block). k16 / v16: the bf16 engine's
// rounded keys and values of every (batch, kv head) of the call, bf16_unit elements each (null:
// the float32 engines).
void run_item(const AttentionArgs& a, const CallPlan& p, long item, const Workspace& w, long d_pad, float* records,
              Tile& tile, [[maybe_unused]] const uint16_t* k16, [[maybe_unused]] const uint16_t* v16,
              [[maybe_unused]] long bf16_unit) {
  const long unit = item / p.splits, split = item % p.splits;
  build_tile(a, unit, p.tiles_per_head, &tile);
#ifdef CPUFORMER_ATTENTION_BF16
  if (k16) {
    tile.k16 = k16 + unit / p.tiles_per_head * bf16_unit;  // (build_tile's batch · kv_heads + kv head)
    tile.v16 = v16 + unit / p.tiles_per_head * bf16_unit;
  }
#endif
  long begin = tile.key_begin, end = tile.key_end;
  if (p.splits > 1) {
    const long n = end - begin, base = n / p.splits, extra = n % p.splits;
    begin += split * base + (split < extra ? split : extra);
    end = begin + base + (split < extra ? 1 : 0);
  }
  if (p.splits == 1) {  // start the output rows' cache misses now; they complete under the math
    for (int r = 0; r < tile.rows; ++r)
      for (long d = 0; d < a.head_dim; d += 64 / sizeof(float)) __builtin_prefetch(tile.out[r] + d, 1);
  }
  run_tile(a, tile, begin, end, w, d_pad);
  if (p.splits == 1) write_rows(tile, w, a.head_dim, d_pad);
  else write_partial(tile, w, d_pad, records + item * record_block_floats(d_pad));
}

// The output rows of unit `unit` of a split call from its items' partial results.
void merge_unit(const AttentionArgs& a, const CallPlan& p, long unit, long d_pad, float* records, Tile& tile) {
  build_tile(a, unit, p.tiles_per_head, &tile);
  merge_partials(tile, records + unit * p.splits * record_block_floats(d_pad), p.splits, a.head_dim, d_pad);
}

// Items are dealt one at a time (balance: causal tiles differ in cost), except small ones
// (beam-search and batched decode steps: one query row over a short cache), which go in chunks
// of about kMinChunkWork multiply-adds: one at a time, the shared counter's cache line moved
// between the cores for every item, as costly as such an item itself. The results do not depend
// on the schedule (every item is computed by one thread, the same way).
inline long items_per_chunk(long items, int nt, long item_work) {
  return max_l(1, min_l(items / (4L * nt), kMinChunkWork / item_work));
}

void attention_tiled(const AttentionArgs& a) {
  const int threads = current_num_threads();
  const CallPlan plan = plan_call(a, threads);
  const long items = plan.items;
  int nt = items < threads ? static_cast<int>(items) : threads;
  if (plan.work < kMinParallelWork) nt = 1;

  const long d_pad = round_up(a.head_dim, kLanes);
  const long per_thread = workspace_floats(d_pad);
  const long record_floats_all = plan.splits > 1 ? items * record_block_floats(d_pad) : 0;
#ifdef CPUFORMER_ATTENTION_BF16
  // bf16_products: every (batch, kv head)'s keys and value pairs rounded to bfloat16 once, before
  // the tiles (each of which reads them all): K [Tk2][D] and V [Tk2 / 2][D][2] per unit, Tk2 =
  // kv_len rounded up to even (the padding key is zero). Only where every head has a full tile of
  // query rows (the rounding is then a small part of the work), and not for key splits (decode).
  const long group = a.heads / a.kv_heads;
  const bool bf16 = a.bf16_products && a.kv_type == KvType::kFloat32 && a.head_dim % kBf16DimStep == 0 &&
                    a.q_len * group >= kLanes && plan.splits == 1;
#ifdef CPUFORMER_ATTENTION_AMX
  // The tiles: K [Tk32][D] and Vᵀ [D][Tk32] (attention_amx_keys), for head_dim a multiple of 32
  // (attention() sends no other here; anything else would take the float32 engines).
  const long tk2 = attention_amx_keys(a.kv_len), bf16_unit = tk2 * a.head_dim;
#else
  const long tk2 = round_up(a.kv_len, 2), bf16_unit = tk2 * a.head_dim;  // uint16 per (batch, kv head)
#endif
  const long bf16_floats = bf16 ? a.batch * a.kv_heads * bf16_unit : 0;   // K and V: 2 × uint16 each
#else
  const long bf16_floats = 0, bf16_unit = 0;
#endif
  float* scratch = attention_scratch(nt * per_thread + record_floats_all + bf16_floats);
  float* records = scratch + nt * per_thread;
  uint16_t* const k16 = bf16_floats > 0 ? reinterpret_cast<uint16_t*>(records + record_floats_all) : nullptr;
  uint16_t* const v16 = bf16_floats > 0 ? k16 + a.batch * a.kv_heads * bf16_unit : nullptr;

  const long chunk = items_per_chunk(items, nt, plan.item_work);
  run_team(static_cast<int>(nt), [&](const Team& team) {
    const Workspace w = workspace_at(scratch + team.index() * per_thread, d_pad);
    Tile tile;
#ifdef CPUFORMER_ATTENTION_BF16
    if (bf16) {
      long u0, u1;
      team.range(a.batch * a.kv_heads, &u0, &u1);
      for (long u = u0; u < u1; ++u) {
        const long b = u / a.kv_heads, h = u % a.kv_heads;
        attention_bf16::convert_keys(a.k + b * a.k_stride_b + h * a.k_stride_h, a.k_stride_t, a.kv_len, tk2, a.head_dim,
                                     k16 + u * bf16_unit);
#ifdef CPUFORMER_ATTENTION_AMX
        attention_amx::convert_values_transposed(a.v + b * a.v_stride_b + h * a.v_stride_h, a.v_stride_t, a.kv_len, tk2,
                                                 a.head_dim, v16 + u * bf16_unit);
#else
        attention_bf16::convert_value_pairs(a.v + b * a.v_stride_b + h * a.v_stride_h, a.v_stride_t, a.kv_len, tk2,
                                            a.head_dim, v16 + u * bf16_unit);
#endif
      }
      team.barrier();  // every unit is rounded before any tile reads it
#ifdef CPUFORMER_ATTENTION_AMX
      configure_tiles_16x64();
#endif
    }
#endif
    long first, last;
    while (team.next_chunk(items, chunk, &first, &last)) {
      for (long item = first; item < last; ++item)
        run_item(a, plan, item, w, d_pad, records, tile, k16, v16, bf16_unit);
    }
#ifdef CPUFORMER_ATTENTION_AMX
    if (bf16) _tile_release();
#endif
    if (plan.splits > 1) {
      team.barrier();  // every partial result is written
      long u0, u1;
      team.range(plan.units, &u0, &u1);
      for (long unit = u0; unit < u1; ++unit) merge_unit(a, plan, unit, d_pad, records, tile);
    }
  });
}

// Several calls in one parallel region: the sequences of a ragged batch, one call each (a decode
// step of 16 sequences opened one region per sequence and layer). Their items are dealt from one
// counter in call order, each cut and computed as it would be alone, so the outputs are those of
// the calls one after another. Every call has the same head_dim and none takes the bf16 engines
// (attention_many in attention.cc runs those one by one).
void attention_tiled_many(const AttentionArgs* calls, long count) {
  const int threads = current_num_threads();
  long items = 0, split_units = 0, record_floats_all = 0, work = 0, item_work = 1;
  const long d_pad = round_up(calls[0].head_dim, kLanes);
  for (long c = 0; c < count; ++c) {
    const CallPlan p = plan_call(calls[c], threads);
    items += p.items;
    work += p.work;
    item_work = max_l(item_work, p.item_work);
    if (p.splits > 1) {
      split_units += p.units;
      record_floats_all += p.items * record_block_floats(d_pad);
    }
  }
  if (items == 0) return;
  int nt = items < threads ? static_cast<int>(items) : threads;
  if (work < kMinParallelWork) nt = 1;
  const long per_thread = workspace_floats(d_pad);
  float* scratch = attention_scratch(nt * per_thread + record_floats_all);
  float* records = scratch + nt * per_thread;

  const long chunk = items_per_chunk(items, nt, item_work);
  run_team(static_cast<int>(nt), [&](const Team& team) {
    const Workspace w = workspace_at(scratch + team.index() * per_thread, d_pad);
    Tile tile;
    // Each thread walks the calls forward (its chunks come in increasing order): call c, its plan,
    // its first item and the start of its records.
    long c = 0, item_base = 0, record_base = 0;
    CallPlan p = plan_call(calls[0], threads);
    long first, last;
    while (team.next_chunk(items, chunk, &first, &last)) {
      for (long item = first; item < last; ++item) {
        while (item >= item_base + p.items) {
          item_base += p.items;
          if (p.splits > 1) record_base += p.items * record_block_floats(d_pad);
          p = plan_call(calls[++c], threads);
        }
        run_item(calls[c], p, item - item_base, w, d_pad, records + record_base, tile, nullptr, nullptr, 0);
      }
    }
    if (split_units > 0) {
      team.barrier();  // every partial result is written
      long u0, u1;
      team.range(split_units, &u0, &u1);
      long unit_base = 0;
      record_base = 0;
      c = 0;
      p = plan_call(calls[0], threads);
      for (long u = u0; u < u1; ++u) {
        while (p.splits == 1 || u >= unit_base + p.units) {
          if (p.splits > 1) {
            unit_base += p.units;
            record_base += p.items * record_block_floats(d_pad);
          }
          p = plan_call(calls[++c], threads);
        }
        merge_unit(calls[c], p, u - unit_base, d_pad, records + record_base, tile);
      }
    }
  });
}

}  // namespace
}  // namespace CPUFORMER_ATTENTION_ISA
}  // namespace cpuformer
