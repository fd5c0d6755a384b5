// Linear: y = act(x · Wᵀ + bias) + residual, with W packed once at load. The weight may be given
// as several row blocks (q, k, v → one fused [3H, H] projection) so one GEMM serves them all.
// Biases are copied (they are small); W is packed, so neither keeps a pointer to the source.
// The weight format (float32 / float16 / bfloat16 / int8 / int4 with its group size) is chosen at
// construction: the float32 source is rounded or quantized (quantize_weights_s8 per output row,
// quantize_weights_s4 per group) while it is packed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/activation/activation.h"
#include "kernels/gemm/gemm.h"

namespace cpuformer {

// A borrowed weight matrix [rows, k] (contiguous, nn.Linear layout) in one of the storage types:
// float32 (quantized / rounded to the Linear's type while packing), or already in the Linear's
// type — int8 q in [-127, 127] with per-row scales [rows] (W ≈ q·scale), int4 nibble pairs
// [rows, Kp / 2] with float16 group scales [rows, groups] and, asymmetric, zero points [rows,
// groups] (quantize_weights_s4), or 16-bit words (float16 / bfloat16 bit patterns), as `cpuformer
// convert` stores them. Pre-converted data is packed as is (no float32 round trip), so it gives
// exactly what quantize-at-load gives.
struct WeightRef {
  const void* data = nullptr;
  WeightType stored = WeightType::kFloat32;
  const float* scales = nullptr;               // [rows] when stored == kInt8
  const uint16_t* group_scales = nullptr;      // [rows, groups] float16 bits when stored == kInt4
  const uint8_t* zeros = nullptr;              // [rows, groups] when stored == kInt4 with zero points

  WeightRef() = default;
  WeightRef(const float* w) : data(w) {}  // NOLINT(google-explicit-constructor): float32 is the common case
  WeightRef(const void* d, WeightType type, const float* s = nullptr) : data(d), stored(type), scales(s) {}
  // int4
  WeightRef(const uint8_t* u, const uint16_t* s, const uint8_t* z)
      : data(u), stored(WeightType::kInt4), group_scales(s), zeros(z) {}
  explicit operator bool() const { return data != nullptr; }
};

// One row block of a weight matrix: w [rows, k], bias [rows] or null.
struct LinearPart {
  WeightRef weight;
  const float* bias = nullptr;
  long rows = 0;
};

// Where a model build takes packed weights from instead of packing them (a converted directory's
// packed-weights file, io/packed_file.h), or records what it packed (`cpuformer convert` writing
// that file). Keys name a Linear after fusion: "decoder.layers.3.qkv", "lm_head", ...
class PackedWeightsStore {
 public:
  virtual ~PackedWeightsStore() = default;
  // The weights stored under `key` as a view for the running level, or nothing (pack as usual: no
  // such key, or stored in another format). std::invalid_argument when the stored matrix's shape
  // is not [n, k] (a damaged file).
  virtual bool find(const std::string& key, long n, long k, const WeightFormat& format, PackedWeights& out) = 0;
  // Every Linear packed under a key (not found above) is shown here once packed.
  virtual void packed(const std::string& key, const PackedWeights& w) = 0;
};

// A Linear's key in a store; no store: pack as usual.
struct PackedSlot {
  PackedWeightsStore* store = nullptr;
  std::string key;
};

class Linear {
 public:
  Linear() = default;
  // Packs W = concat(parts' weights) of shape [Σ rows, k]; bias = concat(parts' biases), zeros for
  // parts without one (no bias at all if no part has one). Parts are all float32, or all stored
  // in `format` already (std::invalid_argument otherwise).
  // With a slot, the store's weights for slot.key are used instead of packing when it has them
  // (the parts are still checked and give the bias), and what is packed is shown to it.
  Linear(const std::vector<LinearPart>& parts, long k, const WeightFormat& format = WeightFormat(),
         const PackedSlot& slot = PackedSlot());
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

// A projection's input width (K) under the name the model's config gives it.
struct InFeatures {
  const char* name;  // e.g. "intermediate_size"
  long value;
};

// Checked once when a model is built, so a config the kernels cannot serve is refused at load:
// with int8 weights every K must be ≤ kInt8GemmMaxK (the int8 GEMM's int32 sums would wrap beyond
// it). std::invalid_argument naming the config key and the limit otherwise.
void require_in_features(WeightType type, std::initializer_list<InFeatures> widths);

}  // namespace cpuformer
