// Key/value cache of a decoder, allocated once per generation run and written in place.
//
// Layout: k and v each [layer][rows][kv_heads][max_len][head_dim] elements of the cache's type
// (float32, float16, bfloat16 or int8; KvType in kernels/attention/attention.h), so the attention
// kernel reads one layer's keys as a strided view (batch stride kv_heads·max_len·D, head stride
// max_len·D, time stride D) with Tk = the current length. An int8 cache also keeps one float32
// scale per key and value row, [layer][rows][kv_heads][max_len] each (the row's largest magnitude
// / 127, rounded to nearest). All rows share one time axis: prompts are left-padded, and padded
// slots are removed by an additive key mask [rows, max_len].
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention/attention.h"
#include "runtime/aligned_buffer.h"

namespace cpuformer {

class KvCache {
 public:
  KvCache() = default;
  // Grows (never shrinks) the storage; the contents are undefined afterwards and length() = 0.
  void reset(long layers, long rows, long kv_heads, long max_len, long head_dim, KvType type = KvType::kFloat32);

  // Writes every page of the storage once (zeros), so that no later write faults a page in: a
  // long-lived cache (continuous batching) pays the page faults up front instead of in the steps
  // that first reach each part of it. Multi-threaded.
  void commit();

  KvType type() const { return type_; }
  // Bytes of storage held (what reset() grew to), whatever the current shape uses.
  std::size_t capacity_bytes() const {
    return k_.size() + v_.size() + scratch_.size() + (k_scale_.size() + v_scale_.size() + mask_.size()) * sizeof(float);
  }
  // Bytes of the keys, values and (int8) scales of the current shape.
  std::size_t bytes() const {
    return 2 * rows_total() *
           (static_cast<std::size_t>(head_dim_ * size_) + (type_ == KvType::kInt8 ? sizeof(float) : 0));
  }
  long rows() const { return rows_; }
  long max_len() const { return max_len_; }
  long length() const { return length_; }
  void set_length(long n) { length_ = n; }

  long stride_row() const { return kv_heads_ * max_len_ * head_dim_; }  // elements
  long stride_head() const { return max_len_ * head_dim_; }
  // A float32 cache's keys and values of one layer.
  float* k(long layer) { return reinterpret_cast<float*>(k_.data()) + layer * rows_ * stride_row(); }
  float* v(long layer) { return reinterpret_cast<float*>(v_.data()) + layer * rows_ * stride_row(); }
  float* key_mask() { return mask_.data(); }  // [rows, max_len]: 0 keeps the slot, -inf drops it

  // Writes the key and value rows (head_dim floats each) of (layer, row, kv head) at `slot`,
  // converted to the cache's type: float16 / bfloat16 rounded to nearest even (overflow to ±inf),
  // int8 with the row's scale. An int8 row holding NaN or ±inf is stored as NaN (scale NaN).
  void store(long layer, long row, long head, long slot, const float* key, const float* value);
  // Points a's k / v (and kv_type, element data, scales) at a layer's cache, batch entry 0 at
  // row `first_row` (a ragged batch views one row at a time).
  void view(long layer, AttentionArgs& a, long first_row = 0);

  // Row r becomes the old row source[r] (the first length() slots of every layer).
  void reorder(const long* source);
  // Slot `slot` of every layer and head of row dst_row becomes slot `slot` of src's row src_row
  // (src: a cache of the same type, layers, heads and head_dim).
  void copy_slot(const KvCache& src, long src_row, long dst_row, long slot);
  // Slots [begin, end) of every layer and head of row dst_row become those of row src_row
  // (prefix reuse between the rows of one cache).
  void copy_slots(long src_row, long dst_row, long begin, long end);

 private:
  // Key (or value) rows of every layer, row, head and position.
  std::size_t rows_total() const { return static_cast<std::size_t>(layers_ * rows_ * kv_heads_ * max_len_); }
  std::size_t element_offset(long layer, long row, long head, long slot) const {
    return static_cast<std::size_t>(((layer * rows_ + row) * kv_heads_ + head) * max_len_ + slot) * head_dim_;
  }
  std::size_t scale_offset(long layer, long row, long head, long slot) const {
    return static_cast<std::size_t>(((layer * rows_ + row) * kv_heads_ + head) * max_len_ + slot);
  }

  KvType type_ = KvType::kFloat32;
  long size_ = 4;  // bytes per element
  long layers_ = 0, rows_ = 0, kv_heads_ = 0, max_len_ = 0, head_dim_ = 0, length_ = 0;
  AlignedBuffer<unsigned char> k_, v_, scratch_;
  AlignedBuffer<float> k_scale_, v_scale_, mask_;
};

}  // namespace cpuformer
