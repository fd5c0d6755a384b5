// The probe loop of gemm_peak_<isa>.cc: kChains independent accumulators, each updated once per
// step by step(acc, operands...), fully unrolled so the accumulators live in registers. The
// operands go through an empty asm before every update, so the compiler can neither hoist, share
// between chains nor fold any part of the work (each update issues the whole sequence).
//
// Include inside the ISA namespace of a per-ISA translation unit, like the GEMM *_inl.h files; no
// include guard on purpose.

template <class T>
__attribute__((always_inline)) inline void peak_pin(T& x) {
  asm volatile("" : "+v"(x));
}

// acc[0, kChains) are read, advanced `steps` times and written back.
template <int kChains, class V, class Step, class... Operands>
__attribute__((always_inline)) inline void peak_chains(long steps, V* acc, const Step& step, Operands... operands) {
  V c[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) c[i] = acc[i];
  for (long s = 0; s < steps; ++s) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) {
      (peak_pin(operands), ...);
      c[i] = step(c[i], operands...);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) acc[i] = c[i];
}
