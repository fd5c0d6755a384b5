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
constexpr long kGemvMaxRows = 8;
// Up to kGemvChunkedMaxRowsF32 (float32 W) or kGemvChunkedMaxRows16 (16-bit W) rows go through the
// GEMV kernel in chunks of at most kGemvMaxRows (gemm_driver_inl.h, gemv). Measured on Zen 4 at BERT-base shapes, both
// levels: 9-64 rows ran 1.1-1.9x faster that way than blocked (float32 and float16), and float32 stayed 5-15 % faster
// up to 256 rows and 2-4 % at 1024. float16 widens W once per chunk, so from 512 rows on it ran 5-10 % slower than
// blocked at the avx512 level. The limits stay where the measured gain is clear; the blocked path keeps the large-M
// rates measured on other hosts.
constexpr long kGemvChunkedMaxRowsF32 = 256;
constexpr long kGemvChunkedMaxRows16 = 64;
constexpr long kGemvChunkedMinPanels = 4;
