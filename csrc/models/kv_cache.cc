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
  // One layer at a time through a scratch copy of the used slots: a row may be both a source and
  // a destination. Scratch layout [rows][kv_heads][length][D].
  const long used = length_ * head_dim_;
  const std::size_t slab = static_cast<std::size_t>(rows_) * kv_heads_ * used;
  if (scratch_.size() < slab) scratch_.resize(slab);
  for (long layer = 0; layer < layers_; ++layer) {
    for (float* base : {k(layer), v(layer)}) {
      for (long r = 0; r < rows_; ++r) {
        for (long h = 0; h < kv_heads_; ++h) {
          std::memcpy(scratch_.data() + (r * kv_heads_ + h) * used, base + r * stride_row() + h * stride_head(),
                      used * sizeof(float));
        }
      }
      for (long r = 0; r < rows_; ++r) {
        if (source[r] == r) continue;
        for (long h = 0; h < kv_heads_; ++h) {
          std::memcpy(base + r * stride_row() + h * stride_head(), scratch_.data() + (source[r] * kv_heads_ + h) * used,
                      used * sizeof(float));
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
