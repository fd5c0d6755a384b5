// Element-wise activations and row softmax, float32.
//
// Layout: contiguous float arrays. `y` may alias `x` (in-place; no partial overlap). No alignment
// required. The public functions split the work over current_num_threads() pool threads; the
// per-ISA tables hold single-threaded functions over one contiguous range, fast for short ranges
// too (the GEMM epilogue calls `apply` on each finished tile row) and never reading past x + n.
//
// Results: the scalar reference defines them, including special values. NaN gives NaN; +inf
// gives +inf (relu, GELUs, SiLU); -inf gives NaN for the GELUs (quick GELU included) and SiLU (x·Φ(x) evaluates as
// -inf·0, as in PyTorch) and 0 for relu; large negative inputs give ±0. The SIMD versions agree
// with the reference to 2e-6 absolute + 1e-6 relative (tests/kernels/test_activation.py).
#pragma once

namespace cpuformer {

enum class Activation : int {
  kNone = 0,
  kRelu = 1,
  kGeluErf = 2,   // x·Φ(x) with the exact erf: BERT, HF "gelu"
  kGeluTanh = 3,  // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): GPT-2, HF "gelu_new"/"gelu_pytorch_tanh"
  kSilu = 4,      // x·σ(x): Llama family
  kQuickGelu = 5,  // x·σ(1.702·x): CLIP, HF "quick_gelu"
};

struct ActivationKernels {
  // y[i] = act(x[i]) for i in [0, n)
  void (*apply)(Activation act, const float* x, float* y, long n);
  // One row of length n ≥ 1: y = softmax(x), max-subtracted. -inf entries give 0 and a row with
  // no entry above -inf gives zeros; otherwise a NaN or +inf entry makes the whole row NaN.
  void (*softmax_row)(const float* x, float* y, long n);
  // y[i] = silu(gate[i]) · up[i]  (SwiGLU); y may alias gate or up.
  void (*silu_mul)(const float* gate, const float* up, float* y, long n);
};

const ActivationKernels& activation_kernels();

// Multi-threaded entry points.
void apply_activation(Activation act, const float* x, float* y, long n);
void softmax_rows(const float* x, float* y, long rows, long n);  // x, y: [rows, n]
void silu_mul(const float* gate, const float* up, float* y, long n);

namespace scalar { extern const ActivationKernels kActivationKernels; }
namespace avx2 { extern const ActivationKernels kActivationKernels; }
namespace avx512 { extern const ActivationKernels kActivationKernels; }
namespace neon { extern const ActivationKernels kActivationKernels; }

}  // namespace cpuformer
