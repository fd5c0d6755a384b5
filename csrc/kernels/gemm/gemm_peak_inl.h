// The probe loop of gemm_peak_<isa>.cc: kChains independent accumulators, each updated once per
// step by step(acc, operands...), fully unrolled so the accumulators live in registers. The
// operands go through an empty asm before every update, so the compiler can neither hoist, share
// between chains nor fold any part of the work (each update issues the whole sequence).
//
// Include inside the ISA namespace (in an anonymous namespace) of a per-ISA translation unit, like
// the GEMM *_inl.h files, after <cstdint> and <cstring>; no include guard on purpose.

template <class T>
__attribute__((always_inline)) inline void peak_pin(T& x) {
#if defined(__aarch64__)
  asm volatile("" : "+w"(x));  // any FP/SIMD register
#else
  asm volatile("" : "+v"(x));  // any SSE/AVX register
#endif
}

volatile uint32_t peak_sink;  // the accumulators' bytes end here, so the work is observable

// Runs `steps` steps of kChains accumulators starting at `start`; returns the multiply-adds done
// (kMacs per update).
template <int kChains, long kMacs, class V, class Step, class... Operands>
int64_t peak_probe(long steps, V start, const Step& step, Operands... operands) {
  V c[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) c[i] = start;
  for (long s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) {
      (peak_pin(operands), ...);
      c[i] = step(c[i], operands...);
    }
  }
  unsigned char bytes[sizeof(c)];
  std::memcpy(bytes, c, sizeof(c));
  uint32_t sum = 0;
  for (unsigned char b : bytes) sum += b;
  peak_sink = sum;
  return static_cast<int64_t>(steps) * kChains * kMacs;
}
