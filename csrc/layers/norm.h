// The norms of a model: weights copied at load, applied as LayerNorm (with bias) or RMSNorm.
#pragma once

#include <vector>

#include "models/transformer_config.h"

namespace cpuformer {

// A [n] weight (and bias, empty for RMSNorm and bias-free LayerNorms), copied at load.
struct NormWeights {
  std::vector<float> weight;
  std::vector<float> bias;
  float eps = 1e-5f;

  NormWeights() = default;
  // weight [n] (null: an unused norm), bias [n] or null; RMSNorm ignores a bias.
  NormWeights(const TransformerConfig& c, const float* weight, const float* bias, long n);
  bool empty() const { return weight.empty(); }

  // y = norm(x) over rows of n = weight.size() (y may be x).
  void apply(const TransformerConfig& c, const float* x, float* y, long rows) const;
};

}  // namespace cpuformer
