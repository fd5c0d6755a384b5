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
  // Only rows whose source differs are rewritten, and only the sources they read are snapshotted
  // (the first length() slots of each head): beams that kept their own history cost nothing.
  std::vector<long> needed(rows_, -1);  // old row -> its slot in the snapshot, or -1
  long snapshots = 0;
  for (long r = 0; r < rows_; ++r) {
    if (source[r] != r && needed[source[r]] < 0) needed[source[r]] = snapshots++;
  }
  if (snapshots == 0) return;
  const long per_row = stride_row();
  const long used = length_ * head_dim_;  // floats per head in use
  const std::size_t slab = static_cast<std::size_t>(snapshots) * kv_heads_ * used;
  if (scratch_.size() < slab) scratch_.resize(slab);
  for (long layer = 0; layer < layers_; ++layer) {
    for (float* base : {k(layer), v(layer)}) {
      for (long r = 0; r < rows_; ++r) {
        if (needed[r] < 0) continue;
        for (long h = 0; h < kv_heads_; ++h) {
          std::memcpy(scratch_.data() + (needed[r] * kv_heads_ + h) * used, base + r * per_row + h * stride_head(),
                      used * sizeof(float));
        }
      }
      for (long r = 0; r < rows_; ++r) {
        if (source[r] == r) continue;
        for (long h = 0; h < kv_heads_; ++h) {
          std::memcpy(base + r * per_row + h * stride_head(),
                      scratch_.data() + (needed[source[r]] * kv_heads_ + h) * used, used * sizeof(float));
        }
      }
    }
  }
  std::vector<float> mask(mask_.data(), mask_.data() + rows_ * max_len_);
  for (long r = 0; r < rows_; ++r) {
    if (source[r] == r) continue;
    std::memcpy(mask_.data() + r * max_len_, mask.data() + source[r] * max_len_, max_len_ * sizeof(float));
  }
}

}  // namespace cpuformer
