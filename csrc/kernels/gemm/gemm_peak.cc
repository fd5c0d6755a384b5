// Measures the compute peak of the matmul kernels (gemm_peak.h): picks the probe of the
// instruction the selected kernel uses (matmul_instruction) and times it on the current threads.
#include "kernels/gemm/gemm_peak.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace scalar {
namespace {
#include "kernels/gemm/gemm_peak_inl.h"

#if defined(__x86_64__)
// The scalar level's kernels are plain C++ for baseline x86-64, which the compiler may vectorize
// with SSE2 at best: float multiply and add on 4 lanes; int8 products widened to int16, pmaddwd
// on 8 pairs and an add.
int64_t peak_float(long steps) {
  return peak_probe<8, 4>(
      steps, _mm_setzero_ps(), [](__m128 c, __m128 a, __m128 b) { return _mm_add_ps(_mm_mul_ps(a, b), c); },
      _mm_set1_ps(0.999f), _mm_set1_ps(1e-3f));
}

int64_t peak_int(long steps) {
  return peak_probe<8, 8>(
      steps, _mm_setzero_si128(),
      [](__m128i c, __m128i a, __m128i w) { return _mm_add_epi32(c, _mm_madd_epi16(a, w)); }, _mm_set1_epi16(3),
      _mm_set1_epi16(-5));
}
#elif defined(__aarch64__)
// The scalar level's kernels are plain C++ for baseline AArch64, which the compiler may vectorize
// with NEON (always present) and contract into fused multiply-adds: fmla on 4 float lanes; int8
// products widened to int16 and accumulated with smlal on 4 int32 lanes.
int64_t peak_float(long steps) {
  return peak_probe<8, 4>(
      steps, vdupq_n_f32(0.0f), [](float32x4_t c, float32x4_t a, float32x4_t b) { return vfmaq_f32(c, a, b); },
      vdupq_n_f32(0.999f), vdupq_n_f32(1e-3f));
}

int64_t peak_int(long steps) {
  return peak_probe<8, 4>(
      steps, vdupq_n_s32(0), [](int32x4_t c, int16x4_t a, int16x4_t w) { return vmlal_s16(c, a, w); }, vdup_n_s16(3),
      vdup_n_s16(-5));
}
#endif
}  // namespace
}  // namespace scalar

namespace {

PeakProbe probe_for(WeightType type) {
  switch (matmul_instruction(type)) {
    case MatmulInstruction::kScalar:
      return type == WeightType::kInt8 || type == WeightType::kInt4 ? scalar::peak_int : scalar::peak_float;
#if defined(__x86_64__)
    case MatmulInstruction::kFma256: return avx2::peak_fma;
    case MatmulInstruction::kFma512: return avx512::peak_fma;
    case MatmulInstruction::kMaddubs256: return avx2::peak_maddubs;
    case MatmulInstruction::kMaddubs512: return avx512::peak_maddubs;
    case MatmulInstruction::kDpbusd256: return avxvnni::peak_dpbusd;
    case MatmulInstruction::kDpbusd512: return avx512vnni::peak_dpbusd;
    case MatmulInstruction::kDpbf16x512: return avx512bf16::peak_dpbf16;
    case MatmulInstruction::kAmxInt8: return avx512amx::peak_tdpbusd;
    case MatmulInstruction::kAmxBf16: return avx512amx::peak_tdpbf16ps;
    // Three tile products per float32 multiply-add (gemm_f32_avx512amx.cc).
    case MatmulInstruction::kAmxBf16x3: return [](long steps) { return avx512amx::peak_tdpbf16ps(steps) / 3; };
#elif defined(__aarch64__)
    case MatmulInstruction::kNeonFma128: return scalar::peak_float;  // the same fmla on 4 lanes (gemm_neon.cc)
    case MatmulInstruction::kSdot128: return dotprod::peak_sdot;
    case MatmulInstruction::kSmmla128: return i8mm::peak_smmla;
#endif
    default: break;
  }
  throw std::logic_error("no peak probe for this matmul instruction");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double gemm_peak_macs(WeightType type, double seconds) {
  const PeakProbe probe = probe_for(type);
  // Calibrate on this thread: grow the step count until one call lasts >= 2 ms.
  long steps = 256;
  double once = 0.0;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    probe(steps);
    once = seconds_since(start);
    if (once >= 2e-3 || steps >= (1L << 40)) break;
    steps *= 4;
  }
  constexpr int kPasses = 3;
  const int nt = current_num_threads();
  // More threads than CPUs share them: each then gets CPUs/threads of the single-thread rate.
  const double share = std::min(1.0, static_cast<double>(compute_capacity()) / nt);
  const double per_pass = seconds / kPasses;
  steps = std::max(1L, static_cast<long>(static_cast<double>(steps) * per_pass / once * share));
  double best = 0.0;
  for (int pass = 0; pass < kPasses; ++pass) {
    std::vector<int64_t> per_thread(static_cast<std::size_t>(nt), 0);
    const auto start = std::chrono::steady_clock::now();
    run_team(nt, [&](const Team& team) { per_thread[team.index()] = probe(steps); });
    int64_t macs = 0;
    for (int64_t m : per_thread) macs += m;
    const double elapsed = seconds_since(start);
    if (elapsed > 0.0) best = std::max(best, static_cast<double>(macs) / elapsed);
  }
  return best;
}

}  // namespace cpuformer
