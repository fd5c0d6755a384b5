// Element-wise activations and row softmax, float32.
//
// Layout: contiguous float arrays. `y` may alias `x` (in-place). No alignment required.
// The public functions split the work over current_num_threads() OpenMP threads; the per-ISA
// tables hold single-threaded functions over one contiguous range.
#pragma once

namespace cpuformer {

enum class Activation : int {
  kNone = 0,
  kRelu = 1,
  kGeluErf = 2,   // x·Φ(x) with the exact erf: BERT, HF "gelu"
  kGeluTanh = 3,  // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): GPT-2, HF "gelu_new"/"gelu_pytorch_tanh"
  kSilu = 4,      // x·σ(x): Llama family
};

struct ActivationKernels {
  // y[i] = act(x[i]) for i in [0, n)
  void (*apply)(Activation act, const float* x, float* y, long n);
  // One row of length n: y = softmax(x), max-subtracted, -inf entries give 0.
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

}  // namespace cpuformer
