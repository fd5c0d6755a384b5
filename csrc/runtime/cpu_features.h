// CPU feature detection and the instruction-set level cpuformer runs at.
//
// The level is chosen once per process (first call of active_isa()): the best level the CPU
// and OS support, or the level named by the CPUFORMER_ISA environment variable, which may only
// lower it. Every kernel family picks its function table from this level.
#pragma once

#include <string>
#include <vector>

namespace cpuformer {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avx512fp16 = false, avx_vnni = false;
  bool os_avx = false, os_avx512 = false;  // XGETBV: the OS saves the YMM / ZMM state

  bool supports(Isa isa) const;
  std::vector<std::string> names() const;  // e.g. {"avx2", "fma", "avx512f", ...}
};

const CpuFeatures& cpu_features();

// Level in use. Throws std::invalid_argument if CPUFORMER_ISA is unknown or names a level the
// CPU lacks; the message says what the CPU supports.
Isa active_isa();
const char* isa_name(Isa isa);

}  // namespace cpuformer
