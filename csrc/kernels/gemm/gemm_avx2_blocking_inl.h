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
// A thread's C block (kMCMax rows × N floats) stays in L2 across K slices only when it fits half of
// it: AVX2-only cores have 256-512 KB of L2 (Haswell-Comet Lake, Zen 2-3), hence 256 KB. With 512 KB
// here, N = 768 took the private-rows path with a 516 KB C block that streamed from L3 every slice:
// on Zen 3 (512 KB L2, 2026-11-26) BERT's 768 → 768 and 3072 → 768 GEMMs ran 5-15 % faster at 256 KB
// (best of 40 calls, alternating builds; noisy host).
constexpr long kPrivateRowsMaxCBytes = 1L << 18;
constexpr long kGemvMaxRows = 6;
// No K-blocked two-chunk GEMV at this level (kGemvBlockBytes = 0): not measured on an AVX2-only CPU.
constexpr long kGemvBlockBytes = 0;
constexpr long kGemvChunkRows = kGemvMaxRows;
// Up to kGemvChunkedMaxRowsF32 (float32 W) or kGemvChunkedMaxRows16 (16-bit W) rows go through the
// GEMV kernel in chunks (gemm_driver_inl.h, gemv). Measured on Zen 4 at BERT-base shapes, both
// levels: 9-64 rows ran 1.1-1.9x faster that way than blocked (float32 and float16), and float32 stayed 5-15 % faster
// up to 256 rows and 2-4 % at 1024. float16 widens W once per chunk, so from 512 rows on it ran 5-10 % slower than
// blocked at the avx512 level. The limits stay where the measured gain is clear; the blocked path keeps the large-M
// rates measured on other hosts.
constexpr long kGemvChunkedMaxRowsF32 = 256;
constexpr long kGemvChunkedMaxRows16 = 64;
constexpr long kGemvChunkedMinPanels = 4;
