#include "models/kv_cache.h"

#include <cstring>

namespace cpuformer {

void KvCache::reset(long layers, long rows, long kv_heads, long max_len, long head_dim) {
  layers_ = layers;
  rows_ = rows;
  kv_heads_ = kv_heads;
  max_len_ = max_len;
  head_dim_ = head_dim;
  length_ = 0;
  const std::size_t count = static_cast<std::size_t>(layers) * rows * kv_heads * max_len * head_dim;
  if (k_.size() < count) {
    k_.resize(count);
    v_.resize(count);
  }
  if (mask_.size() < static_cast<std::size_t>(rows * max_len)) mask_.resize(rows * max_len);
}

void KvCache::reorder(const long* source) {
  bool identity = true;
  for (long r = 0; r < rows_; ++r) identity = identity && source[r] == r;
  if (identity) return;
  // One layer at a time through a scratch copy: a row may be both a source and a destination.
  const long per_row = stride_row();
  const std::size_t slab = static_cast<std::size_t>(rows_) * per_row;
  if (scratch_.size() < slab) scratch_.resize(slab);
  const std::size_t used = static_cast<std::size_t>(length_) * head_dim_ * sizeof(float);
  for (long layer = 0; layer < layers_; ++layer) {
    for (float* base : {k(layer), v(layer)}) {
      std::memcpy(scratch_.data(), base, slab * sizeof(float));
      for (long r = 0; r < rows_; ++r) {
        if (source[r] == r) continue;
        for (long h = 0; h < kv_heads_; ++h) {
          std::memcpy(base + r * per_row + h * stride_head(), scratch_.data() + source[r] * per_row + h * stride_head(),
                      used);
        }
      }
    }
  }
  std::vector<float> mask(mask_.data(), mask_.data() + rows_ * max_len_);
  for (long r = 0; r < rows_; ++r) {
    std::memcpy(mask_.data() + r * max_len_, mask.data() + source[r] * max_len_, max_len_ * sizeof(float));
  }
}

}  // namespace cpuformer
