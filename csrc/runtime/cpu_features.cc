#include "runtime/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <stdexcept>

namespace cpuformer {
namespace {

// CPUFORMER_TEST_MAX_ISA and CPUFORMER_DISABLE_FEATURES, applied to what detect() found.
void apply_test_hooks(CpuFeatures& f);

#if defined(__x86_64__)

uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux gives a process the AMX tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA, kernel 5.16 and later); without it the first tile instruction faults.
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = ecx & (1u << 27);
  f.fma = ecx & (1u << 12);
  f.f16c = ecx & (1u << 29);
  const bool avx = ecx & (1u << 28);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;  // XGETBV faults without OSXSAVE
  if (avx) {
    f.os_avx = (xcr0 & 0x6) == 0x6;            // XMM + YMM state
    f.os_avx512 = (xcr0 & 0xE6) == 0xE6;       // + opmask, ZMM_Hi256, Hi16_ZMM
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    f.avx2 = f.os_avx && (ebx & (1u << 5));
    f.avx512f = f.os_avx512 && (ebx & (1u << 16));
    f.avx512dq = f.os_avx512 && (ebx & (1u << 17));
    f.avx512bw = f.os_avx512 && (ebx & (1u << 30));
    f.avx512vl = f.os_avx512 && (ebx & (1u << 31));
    f.avx512vnni = f.os_avx512 && (ecx & (1u << 11));
    f.avx512fp16 = f.os_avx512 && (edx & (1u << 23));
    const bool amx_tile = edx & (1u << 24), amx_int8 = edx & (1u << 25), amx_bf16 = edx & (1u << 22);
    const bool os_amx = amx_tile && (xcr0 & 0x60000) == 0x60000 && request_amx_permission();  // XTILECFG + XTILEDATA
    f.amx_int8 = f.avx512vnni && os_amx && amx_int8;
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    f.avx_vnni = f.os_avx && (eax & (1u << 4));
    f.avx512bf16 = f.os_avx512 && (eax & (1u << 5));
    f.amx_bf16 = f.avx512bf16 && os_amx && amx_bf16;
  }
  f.fma = f.fma && f.os_avx;
  f.f16c = f.f16c && f.os_avx;
  apply_test_hooks(f);
  return f;
}

const Isa kLevels[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

#elif defined(__aarch64__)

// The kernel's HWCAP bits (arch/arm64/include/uapi/asm/hwcap.h), for C libraries whose
// <sys/auxv.h> predates them.
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_FPHP
#define HWCAP_FPHP (1UL << 9)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1UL << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1UL << 14)
#endif

CpuFeatures detect() {
  CpuFeatures f;
  // The kernel sets a HWCAP bit only when the CPU has the feature and the kernel supports it, so
  // no separate OS check is needed (unlike XGETBV on x86-64).
  const unsigned long hwcap = getauxval(AT_HWCAP);
  const unsigned long hwcap2 = getauxval(AT_HWCAP2);
  f.asimd = hwcap & HWCAP_ASIMD;
  f.fphp = hwcap & HWCAP_FPHP;
  f.asimdhp = hwcap & HWCAP_ASIMDHP;
  f.asimddp = hwcap & HWCAP_ASIMDDP;
  f.i8mm = hwcap2 & HWCAP2_I8MM;
  f.bf16 = hwcap2 & HWCAP2_BF16;
  apply_test_hooks(f);
  return f;
}

const Isa kLevels[] = {Isa::kScalar, Isa::kNeon, Isa::kDotprod, Isa::kI8mm};

#else
#error "cpuformer builds for x86-64 and AArch64 only"
#endif

void apply_test_hooks(CpuFeatures& f) {
  // Test hook: pretend the CPU stops at a lower level, so the "CPU lacks this level" path can
  // be tested on any machine. Not for production use.
  if (const char* cap = std::getenv("CPUFORMER_TEST_MAX_ISA")) {
    const std::string level(cap);
    if (level == "scalar" || level == "avx2") {
      f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = false;
      f.avx512vnni = f.avx512bf16 = f.avx512fp16 = f.amx_int8 = f.amx_bf16 = false;
    }
    if (level == "scalar") f.avx2 = f.fma = f.f16c = f.avx_vnni = false;
    if (level == "scalar" || level == "neon" || level == "dotprod") f.i8mm = false;
    if (level == "scalar" || level == "neon") f.asimddp = false;
    if (level == "scalar") f.asimd = f.asimdhp = f.bf16 = false;
  }
  // CPUFORMER_DISABLE_FEATURES=avx512_vnni,avx_vnni,avx512_bf16: treat these extensions as absent,
  // so each fallback inside a level (e.g. the AVX2 int8 kernel without AVX-VNNI) can be run and
  // tested on a CPU that has the extension. Names as in names(); unknown names are ignored.
  if (const char* off = std::getenv("CPUFORMER_DISABLE_FEATURES")) {
    std::string list = std::string(",") + off + ",";
    auto disabled = [&](const char* name) { return list.find(std::string(",") + name + ",") != std::string::npos; };
    if (disabled("avx512_vnni")) f.avx512vnni = f.amx_int8 = false;  // the AMX kernel's small GEMMs run vpdpbusd
    if (disabled("amx_int8")) f.amx_int8 = false;
    if (disabled("avx_vnni")) f.avx_vnni = false;
    if (disabled("avx512_bf16")) f.avx512bf16 = f.amx_bf16 = false;  // likewise for the bfloat16 kernels
    if (disabled("amx_bf16")) f.amx_bf16 = false;
    if (disabled("avx512_fp16")) f.avx512fp16 = false;
    if (disabled("bf16")) f.bf16 = false;
    if (disabled("fphp")) f.fphp = false;
    if (disabled("asimdhp")) f.asimdhp = false;
  }
}

// "scalar, avx2 or avx512"
std::string level_list() {
  std::string out;
  const std::size_t n = sizeof(kLevels) / sizeof(kLevels[0]);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += isa_name(kLevels[i]);
  }
  return out;
}

Isa choose_isa() {
  const CpuFeatures& f = cpu_features();
  const char* env = std::getenv("CPUFORMER_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  const std::string want(env);
  const Isa* found = nullptr;
  for (const Isa& level : kLevels)
    if (want == isa_name(level)) found = &level;
  if (found == nullptr) {
    throw std::invalid_argument("CPUFORMER_ISA='" + want + "' is not a level; use " + level_list() +
                                " (this CPU supports up to " + isa_name(best_isa()) + ")");
  }
  if (!f.supports(*found)) {
    throw std::invalid_argument(std::string("CPUFORMER_ISA=") + want +
                                " asks for a level this CPU lacks; it supports up to " + isa_name(best_isa()));
  }
  return *found;
}

}  // namespace

bool CpuFeatures::supports(Isa isa) const {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return avx2 && fma && f16c;
    case Isa::kAvx512: return supports(Isa::kAvx2) && avx512f && avx512bw && avx512dq && avx512vl;
    case Isa::kNeon: return asimd;
    case Isa::kDotprod: return asimd && asimddp;
    case Isa::kI8mm: return asimd && asimddp && i8mm;
  }
  return false;
}

std::vector<std::string> CpuFeatures::names() const {
  std::vector<std::string> out;
  const std::pair<bool, const char*> all[] = {
      {avx2, "avx2"},
      {fma, "fma"},
      {f16c, "f16c"},
      {avx512f, "avx512f"},
      {avx512bw, "avx512bw"},
      {avx512dq, "avx512dq"},
      {avx512vl, "avx512vl"},
      {avx512vnni, "avx512_vnni"},
      {avx512bf16, "avx512_bf16"},
      {avx512fp16, "avx512_fp16"},
      {avx_vnni, "avx_vnni"},
      {amx_int8, "amx_int8"},
      {amx_bf16, "amx_bf16"},
      {asimd, "asimd"},
      {asimddp, "asimddp"},
      {i8mm, "i8mm"},
      {bf16, "bf16"},
      {fphp, "fphp"},
      {asimdhp, "asimdhp"},
  };
  for (const auto& [has, name] : all)
    if (has) out.emplace_back(name);
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

Isa best_isa() {
  const CpuFeatures& f = cpu_features();
  Isa best = Isa::kScalar;
  for (Isa level : kLevels)
    if (f.supports(level)) best = level;
  return best;
}

std::vector<Isa> architecture_levels() { return std::vector<Isa>(std::begin(kLevels), std::end(kLevels)); }

Isa active_isa() {
  static const Isa isa = choose_isa();  // a throw leaves it unset; the next call throws again
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kNeon: return "neon";
    case Isa::kDotprod: return "dotprod";
    case Isa::kI8mm: return "i8mm";
  }
  return "unknown";
}

}  // namespace cpuformer
