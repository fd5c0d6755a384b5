// Register tile and cache blocking of the avx512 GEMM levels, shared by the float32 (gemm_avx512.cc) and
// float16/bfloat16 (gemm_half_avx512.cc) GEMMs: the 16-bit path widens one W slice [kKC][kNR] at a
// time into exactly the slice the float32 tile kernel expects. Included inside the ISA's anonymous
// namespace before gemm_driver_inl.h (which reads these names); no include guard on purpose.
constexpr long kMR = 14;
constexpr long kNR = 32;
// W slice 256×32 floats = 32 KB of the 48 KB L1d; A block 336×256 floats = 336 KB of the 2 MB L2.
constexpr long kKC = 256;
constexpr long kMCMax = 24 * kMR;
constexpr long kPrivateRowsMaxCBytes = 1L << 20;
// The GEMV kernel takes up to kGemvMaxRows rows at once (2 × 14 zmm accumulators). Up to 2 × kGemvMaxRows
// rows are streamed in K blocks of kGemvBlockBytes (a first chunk of kGemvMaxRows rows reads each block
// from memory, the rest from L1); more rows go in chunks of at most kGemvChunkRows over whole panels.
// Measured on an Intel Xeon (AMX host, 2026-11-28), float32, 48 BERT-base GEMMs with weights from
// memory: 16 rows 25.4 → 20.8 ms (two 8-row passes over whole panels before), 12 rows 21.2 → 18.9 ms;
// 8 KB and 32 KB blocks ran 5-10 % slower than 16 KB. From 32 rows on the K-blocked chunks ran 0-15 %
// slower than 8-row chunks over whole panels (partial sums go through c once per block), hence the
// limit.
constexpr long kGemvMaxRows = 14;
constexpr long kGemvBlockBytes = 16 * 1024;
constexpr long kGemvChunkRows = 8;
// Up to kGemvChunkedMaxRowsF32 (float32 W) or kGemvChunkedMaxRows16 (16-bit W) rows go through the
// GEMV kernel in chunks (gemm_driver_inl.h, gemv). Measured on Zen 4 at BERT-base shapes, both
// levels: 9-64 rows ran 1.1-1.9x faster that way than blocked (float32 and float16), and float32 stayed 5-15 % faster
// up to 256 rows and 2-4 % at 1024. float16 widens W once per chunk, so from 512 rows on it ran 5-10 % slower than
// blocked at the avx512 level. The limits stay where the measured gain is clear; the blocked path keeps the large-M
// rates measured on other hosts.
constexpr long kGemvChunkedMaxRowsF32 = 256;
constexpr long kGemvChunkedMaxRows16 = 64;
constexpr long kGemvChunkedMinPanels = 4;
