#include "models/linear.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace cpuformer {

Linear::Linear(const std::vector<LinearPart>& parts, long k, WeightType type) {
  long n = 0;
  bool any_bias = false;
  for (const LinearPart& p : parts) {
    n += p.rows;
    any_bias = any_bias || p.bias != nullptr;
  }
  if (n <= 0 || k <= 0) throw std::invalid_argument("Linear needs a non-empty weight");
  if (parts.size() == 1) {
    packed_ = pack_weights(parts[0].weight, type, n, k, k);
  } else {
    // The packer reads one strided matrix; the row blocks live in separate tensors, so they are
    // gathered once here (load time only).
    std::vector<float> joined(static_cast<size_t>(n) * k);
    long row = 0;
    for (const LinearPart& p : parts) {
      std::copy(p.weight, p.weight + p.rows * k, joined.begin() + row * k);
      row += p.rows;
    }
    packed_ = pack_weights(joined.data(), type, n, k, k);
  }
  if (any_bias) {
    bias_.assign(n, 0.0f);
    long row = 0;
    for (const LinearPart& p : parts) {
      if (p.bias) std::copy(p.bias, p.bias + p.rows, bias_.begin() + row);
      row += p.rows;
    }
  }
}

Linear::Linear(PackedWeights packed, const float* bias) : packed_(std::move(packed)) {
  if (packed_.n <= 0 || packed_.k <= 0) throw std::invalid_argument("Linear needs a non-empty weight");
  if (bias) bias_.assign(bias, bias + packed_.n);
}

void Linear::apply(const float* x, long m, long ldx, float* y, long ldy, Activation activation, const float* residual,
                   long ldr) const {
  GemmEpilogue epilogue;
  epilogue.bias = bias();
  epilogue.activation = activation;
  epilogue.residual = residual;
  epilogue.ldr = ldr;
  gemm(x, m, ldx, packed_, y, ldy, epilogue);
}

}  // namespace cpuformer
