// The token-embedding table a model reads rows of: float32 as given (the model owns a copy), or
// int8 rows with a float32 scale per row (quantize_weights_s8's rule), a quarter of the memory.
// Which one follows the model config's embedding_dtype (the loader's policy: int8 when the
// projections are int4, docs/precision.md).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "runtime/aligned_buffer.h"

namespace cpuformer {

class EmbeddingTable {
 public:
  EmbeddingTable() = default;
  // table [rows, width]: kept by pointer when `type` is float32 (it must outlive the table), read
  // once and quantized when `type` is int8 (it may go away afterwards).
  EmbeddingTable(const float* table, long rows, long width, WeightType type);

  // Row `id` as float32: a pointer into the table, or `out` (width floats) holding the dequantized
  // row. The callers write the embedding into `out` element by element, each from the same index
  // of the row, so reading the row from `out` itself is fine.
  const float* row(long id, float* out) const {
    if (!quantized()) return rows_ + id * width_;
    const int8_t* q = q_.data() + id * width_;
    const float s = scales_[id];
    for (long j = 0; j < width_; ++j) out[j] = static_cast<float>(q[j]) * s;
    return out;
  }
  bool quantized() const { return rows_ == nullptr; }

 private:
  const float* rows_ = nullptr;  // float32 rows; null when quantized
  long width_ = 0;
  AlignedBuffer<int8_t> q_;
  std::vector<float> scales_;
};

}  // namespace cpuformer
