// Register tile and cache blocking of the avx2 GEMM levels, shared by the float32 (gemm_avx2.cc) and
// float16/bfloat16 (gemm_half_avx2.cc) GEMMs: the 16-bit path widens one W slice [kKC][kNR] at a
// time into exactly the slice the float32 tile kernel expects. Included inside the ISA's anonymous
// namespace before gemm_driver_inl.h (which reads these names); no include guard on purpose.
constexpr long kMR = 6;
constexpr long kNR = 16;
// W slice 256×16 floats = 16 KB (half of a 32 KB L1d); A block 168×256 floats = 168 KB, which
// fits the 256 KB L2 of the oldest AVX2 cores.
constexpr long kKC = 256;
constexpr long kMCMax = 28 * kMR;
constexpr long kPrivateRowsMaxCBytes = 1L << 19;
constexpr long kGemvMaxRows = 6;
// Up to 64 rows go through the GEMV kernel in chunks of at most kGemvMaxRows (gemm_driver_inl.h,
// gemv): measured on Zen 4 at BERT-base shapes, 9-64 rows ran 1.1-1.9x faster that way than blocked
// (float32 and float16, both levels); past 64 rows the two were within ~5 %.
constexpr long kGemvChunkedMaxRows = 64;
constexpr long kGemvChunkedMinPanels = 4;
