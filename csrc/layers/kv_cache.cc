#include "layers/kv_cache.h"

#include <cstring>
#include <string>

#include "kernels/attention/attention.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {

void KvCache::reset(long layers, long rows, long kv_heads, long max_len, long head_dim) {
  // Every size is checked before anything changes: a refused request leaves the cache as it was.
  if (max_len > kAttentionMaxKeys) {
    throw SizeError("the KV cache length of " + std::to_string(max_len) + " positions exceeds the " +
                    std::to_string(kAttentionMaxKeys) + " keys (2^31 - 1) the attention kernel supports");
  }
  // k and v: [layers][rows][kv_heads][max_len][head_dim] each, checked together.
  const std::size_t count =
      checked_bytes({2, layers, rows, kv_heads, max_len, head_dim}, sizeof(float), "the KV cache (keys and values)") /
      sizeof(float) / 2;
  const std::size_t mask_count =
      checked_bytes({rows, max_len}, sizeof(float), "the KV cache's key mask") / sizeof(float);
  layers_ = layers;
  rows_ = rows;
  kv_heads_ = kv_heads;
  max_len_ = max_len;
  head_dim_ = head_dim;
  length_ = 0;
  if (k_.size() < count) {
    k_.resize(count);
    v_.resize(count);
  }
  if (mask_.size() < mask_count) mask_.resize(mask_count);
}

void KvCache::reorder(const long* source) {
  // The copy plan, the same for every layer's K and V: row r takes old row source[r] only once no
  // row still to be written reads r. Rows whose source differs form chains (copied from the reader
  // end, so every row is read before it is overwritten, no snapshot) and cycles (one row of the
  // cycle parked in a spare buffer first). Each changed row is read once and written once; rows
  // that keep their own history cost nothing.
  struct Copy {
    long dst, src;  // kParked: the spare buffer
  };
  constexpr long kParked = -1;
  std::vector<long> readers(rows_, 0);
  for (long r = 0; r < rows_; ++r) {
    if (source[r] != r) ++readers[source[r]];
  }
  std::vector<Copy> plan;
  std::vector<char> written(rows_, 0);
  std::vector<long> ready;
  for (long r = 0; r < rows_; ++r) {
    if (source[r] != r && readers[r] == 0) ready.push_back(r);
  }
  while (!ready.empty()) {
    const long r = ready.back();
    ready.pop_back();
    plan.push_back({r, source[r]});
    written[r] = 1;
    const long s = source[r];
    if (--readers[s] == 0 && source[s] != s) ready.push_back(s);  // s's last reader: s may go now
  }
  // What is left are cycles (each left row has one left reader and a left source): park the
  // first row, walk the cycle along the sources, and give the last row the parked one.
  bool parks = false;
  for (long r = 0; r < rows_; ++r) {
    if (source[r] == r || written[r]) continue;
    parks = true;
    plan.push_back({kParked, r});
    long cur = r;
    while (source[cur] != r) {
      plan.push_back({cur, source[cur]});
      written[cur] = 1;
      cur = source[cur];
    }
    plan.push_back({cur, kParked});
    written[cur] = 1;
  }
  if (plan.empty()) return;

  const long per_row = stride_row(), head = stride_head();
  const long used = length_ * head_dim_;  // floats per head in use
  const long row_floats = kv_heads_ * used;
  const long buffers = 2 * layers_;
  if (parks && scratch_.size() < static_cast<std::size_t>(buffers * row_floats)) scratch_.resize(buffers * row_floats);
  // Each layer's K and V is a separate buffer with its own spare row: threads take whole buffers.
  const long bytes = static_cast<long>(plan.size()) * row_floats * static_cast<long>(sizeof(float)) * buffers;
  const long min_buffers_per_thread = bytes < (1L << 18) ? buffers : 1;
  parallel_ranges(buffers, min_buffers_per_thread, [&](long begin, long end) {
    for (long item = begin; item < end; ++item) {
      float* base = (item % 2 == 0) ? k(item / 2) : v(item / 2);
      float* parked = parks ? scratch_.data() + item * row_floats : nullptr;
      for (const Copy& c : plan) {
        for (long h = 0; h < kv_heads_; ++h) {
          float* to = c.dst == kParked ? parked + h * used : base + c.dst * per_row + h * head;
          const float* from = c.src == kParked ? parked + h * used : base + c.src * per_row + h * head;
          std::memcpy(to, from, static_cast<std::size_t>(used) * sizeof(float));
        }
      }
    }
  });
  // Only the first length() mask slots are defined (later ones are written as tokens arrive), so
  // only they move: a long max_len (a large max_new_tokens) costs nothing here.
  std::vector<float> mask(static_cast<std::size_t>(rows_) * length_);
  for (long r = 0; r < rows_; ++r)
    std::memcpy(mask.data() + r * length_, mask_.data() + r * max_len_, length_ * sizeof(float));
  for (long r = 0; r < rows_; ++r) {
    if (source[r] == r) continue;
    std::memcpy(mask_.data() + r * max_len_, mask.data() + source[r] * length_, length_ * sizeof(float));
  }
}

}  // namespace cpuformer
