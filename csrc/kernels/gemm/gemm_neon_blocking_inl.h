// Register tile and cache blocking of the NEON GEMMs, shared by the float32 (gemm_neon.cc) and
// float16/bfloat16 (gemm_half_neon.cc) GEMMs: the 16-bit path widens one W slice [kKC][kNR] at a
// time into exactly the slice the float32 tile kernel expects. Included inside cpuformer::neon's
// anonymous namespace before gemm_driver_inl.h (which reads these names); no include guard on
// purpose.
//
// The block sizes are the avx2 level's (gemm_avx2_blocking_inl.h: a 16 KB W slice in L1, a 168 KB A
// block in L2), which fit the L1 (32-64 KB) and L2 (256 KB-1 MB) of Cortex-A53 to Neoverse V1; the
// GEMV limits are avx2's too. None of them has been measured on ARM hardware (docs/arm.md).
constexpr long kMR = 6;
constexpr long kNR = 16;
constexpr long kKC = 256;
constexpr long kMCMax = 28 * kMR;
constexpr long kPrivateRowsMaxCBytes = 1L << 18;
constexpr long kGemvMaxRows = 6;
constexpr long kGemvBlockBytes = 0;
constexpr long kGemvChunkRows = kGemvMaxRows;
constexpr long kGemvChunkedMaxRowsF32 = 256;
constexpr long kGemvChunkedMaxRows16 = 64;
constexpr long kGemvChunkedMinPanels = 4;
