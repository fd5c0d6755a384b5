// Building blocks shared by the model graphs (encoder now; decoder and seq2seq reuse them).
//
// Linear: y = act(x · Wᵀ + bias) + residual, with W packed once at load. The weight may be given
// as several row blocks (q, k, v → one fused [3H, H] projection) so one GEMM serves them all.
// Biases are copied (they are small); W is packed, so neither keeps a pointer to the source.
// The weight type (float32 / float16 / bfloat16 / int8) is chosen at construction: the float32
// source is rounded or quantized (per output row, see quantize_weights_s8) while it is packed.
#pragma once

#include <vector>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"

namespace cpuformer {

// One row block of a weight matrix in PyTorch nn.Linear layout: w [rows, k] contiguous, bias [rows] or null.
struct LinearPart {
  const float* weight = nullptr;
  const float* bias = nullptr;
  long rows = 0;
};

class Linear {
 public:
  Linear() = default;
  // Packs W = concat(parts' weights) of shape [Σ rows, k]; bias = concat(parts' biases), zeros for
  // parts without one (no bias at all if no part has one).
  Linear(const std::vector<LinearPart>& parts, long k, WeightType type = WeightType::kFloat32);
  // From weights already packed (e.g. pack_weights_s8 over int8 read from a converted directory);
  // bias [n] or null, copied.
  Linear(PackedWeights packed, const float* bias);

  WeightType weight_type() const { return packed_.type; }

  long out_features() const { return packed_.n; }
  long in_features() const { return packed_.k; }
  const float* bias() const { return bias_.empty() ? nullptr : bias_.data(); }

  // x [m, k] (row stride ldx) -> y [m, n] (row stride ldy); residual [m, n] (row stride ldr) may be
  // y itself. Multi-threaded (current_num_threads()).
  void apply(const float* x, long m, long ldx, float* y, long ldy, Activation activation = Activation::kNone,
             const float* residual = nullptr, long ldr = 0) const;

 private:
  PackedWeights packed_;
  std::vector<float> bias_;  // [n] or empty
};

// A [n] vector pair of a LayerNorm, copied at load. bias may be empty (RMSNorm-style models).
struct NormWeights {
  std::vector<float> weight;
  std::vector<float> bias;
  float eps = 1e-5f;
};

}  // namespace cpuformer
