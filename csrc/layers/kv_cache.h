// Key/value cache of a decoder, allocated once per generation run and written in place.
//
// Layout: k and v each [layer][rows][kv_heads][max_len][head_dim] float32, so the attention kernel
// reads one layer's keys as a strided view (batch stride kv_heads·max_len·D, head stride
// max_len·D, time stride D) with Tk = the current length. All rows share one time axis: prompts
// are left-padded, and padded slots are removed by an additive key mask [rows, max_len].
#pragma once

#include <vector>

#include "runtime/aligned_buffer.h"

namespace cpuformer {

class KvCache {
 public:
  KvCache() = default;
  // Grows (never shrinks) the storage; the contents are undefined afterwards and length() = 0.
  void reset(long layers, long rows, long kv_heads, long max_len, long head_dim);

  long rows() const { return rows_; }
  long max_len() const { return max_len_; }
  long length() const { return length_; }
  void set_length(long n) { length_ = n; }

  long stride_row() const { return kv_heads_ * max_len_ * head_dim_; }
  long stride_head() const { return max_len_ * head_dim_; }
  float* k(long layer) { return k_.data() + layer * rows_ * stride_row(); }
  float* v(long layer) { return v_.data() + layer * rows_ * stride_row(); }
  float* key_mask() { return mask_.data(); }  // [rows, max_len]: 0 keeps the slot, -inf drops it

  // Row r becomes the old row source[r] (the first length() slots of every layer).
  void reorder(const long* source);

 private:
  long layers_ = 0, rows_ = 0, kv_heads_ = 0, max_len_ = 0, head_dim_ = 0, length_ = 0;
  AlignedBuffer<float> k_, v_, mask_, scratch_;
};

}  // namespace cpuformer
