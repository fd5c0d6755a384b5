// CPU feature detection and the instruction-set level cpuformer runs at.
//
// The level is chosen once per process (first call of active_isa()): the best level the CPU
// and OS support, or the level named by the CPUFORMER_ISA environment variable, which may only
// lower it. Every kernel family picks its function table from this level.
//
// Levels per architecture, lowest first (a build knows only its own architecture's):
//   x86-64:  scalar, avx2 (AVX2 + FMA + F16C), avx512 (F/BW/DQ/VL)
//   AArch64: scalar, neon (Advanced SIMD, every AArch64 CPU), dotprod (+ SDOT/UDOT, Armv8.2 asimddp),
//            i8mm (+ SMMLA, Armv8.6 int8 matrix multiply)
// Extensions that select a kernel inside a level are features, not levels: avx512_vnni, avx512_bf16,
// avx_vnni, amx_int8, amx_bf16 on x86-64; bf16, fphp/asimdhp on AArch64 (docs/arm.md).
#pragma once

#include <string>
#include <vector>

namespace cpuformer {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kNeon = 3, kDotprod = 4, kI8mm = 5 };

struct CpuFeatures {
  // x86-64 (CPUID)
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avx512fp16 = false, avx_vnni = false;
  // AMX tiles with TDPBUSD (amx_int8) and TDPBF16PS (amx_bf16): the CPU has AMX-TILE and the
  // instruction, the OS saves the tile state (XCR0 bits 17, 18) and granted this process the right
  // to use it (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked once at detection).
  bool amx_int8 = false, amx_bf16 = false;
  bool os_avx = false, os_avx512 = false;  // XGETBV: the OS saves the YMM / ZMM state
  // AArch64 (getauxval AT_HWCAP / AT_HWCAP2; the names of /proc/cpuinfo)
  bool asimd = false;    // Advanced SIMD (NEON)
  bool asimddp = false;  // SDOT / UDOT
  bool i8mm = false;     // SMMLA / UMMLA / USMMLA, USDOT
  bool bf16 = false;     // BFDOT / BFMMLA / BFCVT
  bool fphp = false;     // scalar float16 arithmetic
  bool asimdhp = false;  // vector float16 arithmetic

  bool supports(Isa isa) const;
  std::vector<std::string> names() const;  // e.g. {"avx2", "fma", "avx512f", ...} or {"asimd", "asimddp", ...}
};

const CpuFeatures& cpu_features();

// The best level this CPU (and this build's architecture) supports.
Isa best_isa();

// Level in use. Throws std::invalid_argument if CPUFORMER_ISA is unknown or names a level the
// CPU lacks; the message says what the CPU supports.
Isa active_isa();
const char* isa_name(Isa isa);

// The levels of this build's architecture, lowest first ({scalar, avx2, avx512} on x86-64).
std::vector<Isa> architecture_levels();

}  // namespace cpuformer
