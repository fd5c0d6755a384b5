#include "layers/norm.h"

#include "kernels/norm/norm.h"

namespace cpuformer {

NormWeights::NormWeights(const TransformerConfig& c, const float* w, const float* b, long n) : eps(c.norm_eps) {
  if (w) weight.assign(w, w + n);
  if (b && c.norm == NormKind::kLayer) bias.assign(b, b + n);
}

void NormWeights::apply(const TransformerConfig& c, const float* x, float* y, long rows) const {
  const long n = static_cast<long>(weight.size());
  if (c.norm == NormKind::kRms) {
    rms_norm(x, nullptr, nullptr, weight.data(), eps, y, rows, n);
  } else {
    layer_norm(x, nullptr, nullptr, weight.data(), bias.empty() ? nullptr : bias.data(), eps, y, rows, n);
  }
}

}  // namespace cpuformer
