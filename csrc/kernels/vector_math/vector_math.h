// Array forms of the vectorised elementary functions (vector_math_avx2.h, vector_math_avx512.h,
// vector_math_neon.h), one table per ISA like every kernel family. The kernels use the inline
// vector functions directly; these tables exist so the tests can check each function's accuracy
// and special values at every ISA level (cpuformer._core._vector_math on x86-64,
// tests/native/kernel_tests.cc on both architectures).
//
// Layout: x, y contiguous float arrays of n elements; y may alias x. No alignment required.
// The scalar table is the definition: the <cmath> functions in float.
#pragma once

namespace cpuformer {

enum class VectorFunction : int {
  kExp = 0,                // exp_ps: NaN gives a tiny number, +inf a finite one (see the headers)
  kExpNanPropagating = 1,  // exp_ps_nan_propagating
  kErf = 2,
  kTanh = 3,
  kSigmoid = 4,
};

struct VectorMathKernels {
  void (*apply)(VectorFunction f, const float* x, float* y, long n);  // single-threaded
  // Row reductions for log-softmax and top-k over a vocabulary (beam search), single-threaded.
  // max_value: the largest x[i], ignoring NaN; -inf when n == 0 or every element is NaN.
  float (*max_value)(const float* x, long n);
  // sum_exp: Σ exp(x[i] - shift), each term computed in float with kExp's function and summed in
  // double (the order of the double sum is the level's own).
  double (*sum_exp)(const float* x, long n, float shift);
  // find_greater: the first i in [0, n) with float(x[i] + offset) > threshold (the float sum
  // rounded exactly as a scalar add), else n. NaN never compares greater.
  long (*find_greater)(const float* x, long n, float offset, float threshold);
};

const VectorMathKernels& vector_math_kernels();

namespace scalar { extern const VectorMathKernels kVectorMathKernels; }
namespace avx2 { extern const VectorMathKernels kVectorMathKernels; }
namespace avx512 { extern const VectorMathKernels kVectorMathKernels; }
namespace neon { extern const VectorMathKernels kVectorMathKernels; }

}  // namespace cpuformer
