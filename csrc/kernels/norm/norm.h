// Layer normalisation and RMS normalisation over the last dimension, float32, each with a fused
// residual add (post-LN BERT: LN(x + sublayer(x)); pre-LN Llama: h += sublayer; y = RMS(h)).
//
// Layout: x, residual, sum_out, y are [rows, n] contiguous; weight, bias are [n].
// Aliasing: y may alias x or residual; sum_out may alias x or residual.
//   s = x + residual      (residual may be null: s = x)
//   sum_out = s           (if sum_out is not null)
//   layer_norm: y = (s - mean(s)) / sqrt(var(s) + eps) · weight + bias   (bias may be null)
//   rms_norm:   y = s / sqrt(mean(s²) + eps) · weight                    (T5/Llama RMSNorm)
// Statistics are accumulated in float32 with a two-pass (mean, then centred variance) scheme.
// The SIMD rows keep 4 vectors of partial sums (64 on AVX-512, 32 on AVX2), so they are closer to
// the exact result than the sequential reference; all agree to 1e-5·max(1, |y|) (test_norm.py).
// No alignment required; any n ≥ 1.
#pragma once

namespace cpuformer {

struct NormKernels {
  // One row each; the public functions below loop over rows and threads.
  void (*layer_norm_row)(const float* x, const float* residual, float* sum_out, const float* weight, const float* bias,
                         float eps, float* y, long n);
  void (*rms_norm_row)(const float* x, const float* residual, float* sum_out, const float* weight, float eps, float* y,
                       long n);
};

const NormKernels& norm_kernels();

void layer_norm(const float* x, const float* residual, float* sum_out, const float* weight, const float* bias,
                float eps, float* y, long rows, long n);
void rms_norm(const float* x, const float* residual, float* sum_out, const float* weight, float eps, float* y,
              long rows, long n);

namespace scalar { extern const NormKernels kNormKernels; }
namespace avx2 { extern const NormKernels kNormKernels; }
namespace avx512 { extern const NormKernels kNormKernels; }
// AArch64
namespace neon { extern const NormKernels kNormKernels; }

}  // namespace cpuformer
