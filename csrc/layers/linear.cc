#include "layers/linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/load_scratch.h"

namespace cpuformer {

namespace {

// The parts' rows one after another, contiguous, in the load scratch `slot` (the packers read one
// strided matrix): `width` elements per row of what `field` picks from each part's WeightRef.
template <typename T, typename Field>
const T* join_rows(const std::vector<LinearPart>& parts, long n, long width, LoadSlot slot, Field field) {
  T* joined = load_scratch<T>(slot, static_cast<std::size_t>(n) * width);
  long row = 0;
  for (const LinearPart& p : parts) {
    const T* src = static_cast<const T*>(field(p.weight));
    std::copy(src, src + p.rows * width, joined + row * width);
    row += p.rows;
  }
  return joined;
}

template <typename T>
const T* join_rows(const std::vector<LinearPart>& parts, long n, long k) {
  return join_rows<T>(parts, n, k, LoadSlot::kJoined, [](const WeightRef& w) { return w.data; });
}

}  // namespace

void require_in_features(WeightType type, std::initializer_list<InFeatures> widths) {
  if (type != WeightType::kInt8) return;
  for (const InFeatures& w : widths) {
    if (w.value > kInt8GemmMaxK) {
      throw std::invalid_argument(std::string(w.name) + " " + std::to_string(w.value) +
                                  " is too large for int8 weights: the int8 GEMM sums at most " +
                                  std::to_string(kInt8GemmMaxK) +
                                  " (2^17) products per output in int32; use dtype float32, float16 or bfloat16");
    }
  }
}

Linear::Linear(const std::vector<LinearPart>& parts, long k, const WeightFormat& format, const PackedSlot& slot) {
  const WeightType type = format.type;
  long n = 0;
  bool any_bias = false;
  for (const LinearPart& p : parts) {
    n += p.rows;
    any_bias = any_bias || p.bias != nullptr;
  }
  if (n <= 0 || k <= 0) throw std::invalid_argument("Linear needs a non-empty weight");
  require_in_features(type, {{"the input features (K) of a weight", k}});
  const WeightType stored = parts[0].weight.stored;
  for (const LinearPart& p : parts) {
    if (!p.weight) throw std::invalid_argument("Linear: a weight part is missing");
    if (p.weight.stored != stored || (stored != WeightType::kFloat32 && stored != type)) {
      throw std::invalid_argument("Linear: weights must all be float32 or all be stored in the Linear's type");
    }
    if (stored == WeightType::kInt8 && p.weight.scales == nullptr) {
      throw std::invalid_argument("Linear: int8 weights need their per-row scales");
    }
    if (stored == WeightType::kInt4 &&
        (p.weight.group_scales == nullptr || (p.weight.zeros != nullptr) != format.zero_point)) {
      throw std::invalid_argument(
          "Linear: int4 weights need their group scales, and zero points exactly when "
          "the format has them");
    }
  }
  if (any_bias) {
    bias_.assign(n, 0.0f);
    long row = 0;
    for (const LinearPart& p : parts) {
      if (p.bias) std::copy(p.bias, p.bias + p.rows, bias_.begin() + row);
      row += p.rows;
    }
  }
  if (slot.store != nullptr && slot.store->find(slot.key, n, k, format, packed_)) return;
  // The packers read one strided matrix; row blocks living in separate tensors are gathered once
  // here (load time only), in scratch that the next Linear of a model build reuses.
  LoadScratchScope scratch;
  const bool single = parts.size() == 1;
  if (stored == WeightType::kFloat32) {
    std::vector<const float*> blocks;
    std::vector<long> rows;
    for (const LinearPart& p : parts) {
      blocks.push_back(static_cast<const float*>(p.weight.data));
      rows.push_back(p.rows);
    }
    packed_ = pack_weights_blocks(blocks.data(), rows.data(), parts.size(), format, k, k);
  } else if (stored == WeightType::kInt4) {
    const long groups = int4_groups(k, format.group_size), half_kp = groups * format.group_size / 2;
    const uint8_t* u =
        join_rows<uint8_t>(parts, n, half_kp, LoadSlot::kJoined, [](const WeightRef& w) { return w.data; });
    const uint16_t* scales = join_rows<uint16_t>(parts, n, groups, LoadSlot::kJoinedScales,
                                                 [](const WeightRef& w) { return w.group_scales; });
    const uint8_t* zeros = format.zero_point ? join_rows<uint8_t>(parts, n, groups, LoadSlot::kJoinedZeros,
                                                                  [](const WeightRef& w) { return w.zeros; })
                                             : nullptr;
    packed_ = pack_weights_s4(u, scales, zeros, n, k, format.group_size);
  } else if (stored == WeightType::kInt8) {
    if (single) {
      packed_ = pack_weights_s8(static_cast<const int8_t*>(parts[0].weight.data), parts[0].weight.scales, n, k, k);
    } else {
      const float* scales =
          join_rows<float>(parts, n, 1, LoadSlot::kJoinedScales, [](const WeightRef& w) { return w.scales; });
      packed_ = pack_weights_s8(join_rows<int8_t>(parts, n, k), scales, n, k, k);
    }
  } else {
    if (single) {
      packed_ = pack_weights_16(static_cast<const uint16_t*>(parts[0].weight.data), type, n, k, k);
    } else {
      packed_ = pack_weights_16(join_rows<uint16_t>(parts, n, k), type, n, k, k);
    }
  }
  if (slot.store != nullptr) slot.store->packed(slot.key, packed_);
}

Linear::Linear(PackedWeights packed, const float* bias) : packed_(std::move(packed)) {
  if (packed_.n <= 0 || packed_.k <= 0) throw std::invalid_argument("Linear needs a non-empty weight");
  require_in_features(packed_.type, {{"the input features (K) of a weight", packed_.k}});
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
