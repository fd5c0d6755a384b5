#include "layers/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/gemm/gemm.h"
#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {

void KvCache::reset(long layers, long rows, long kv_heads, long max_len, long head_dim, KvType type) {
  // Every size is checked before anything changes: a refused request leaves the cache as it was.
  if (max_len > kAttentionMaxKeys) {
    throw SizeError("the KV cache length of " + std::to_string(max_len) + " positions exceeds the " +
                    std::to_string(kAttentionMaxKeys) + " keys (2^31 - 1) the attention kernel supports");
  }
  const long size = kv_type_size(type);
  // k and v: [layers][rows][kv_heads][max_len][head_dim] each, checked together.
  const std::size_t bytes =
      checked_bytes({2, layers, rows, kv_heads, max_len, head_dim}, size, "the KV cache (keys and values)") / 2;
  const std::size_t scale_count = type == KvType::kInt8 ? checked_bytes({2, layers, rows, kv_heads, max_len},
                                                                        sizeof(float), "the KV cache's int8 scales") /
                                                              sizeof(float) / 2
                                                        : 0;
  const std::size_t mask_count =
      checked_bytes({rows, max_len}, sizeof(float), "the KV cache's key mask") / sizeof(float);
  type_ = type;
  size_ = size;
  layers_ = layers;
  rows_ = rows;
  kv_heads_ = kv_heads;
  max_len_ = max_len;
  head_dim_ = head_dim;
  length_ = 0;
  // Each buffer grows on its own: a cache that a model keeps for its next run (models/kept_memory.h)
  // may have had one grown and the next refused (std::bad_alloc) in an earlier reset.
  if (k_.size() < bytes) k_.resize(bytes);
  if (v_.size() < bytes) v_.resize(bytes);
  if (k_scale_.size() < scale_count) k_scale_.resize(scale_count);
  if (v_scale_.size() < scale_count) v_scale_.resize(scale_count);
  if (mask_.size() < mask_count) mask_.resize(mask_count);
}

namespace {

// One row converted to the cache's type at dst (scale: the int8 row's scale).
void convert_row(KvType type, const float* x, long n, unsigned char* dst, float* scale) {
  switch (type) {
    case KvType::kFloat32: std::memcpy(dst, x, n * sizeof(float)); return;
    case KvType::kFloat16:
    case KvType::kBFloat16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(dst);
      for (long i = 0; i < n; ++i) out[i] = type == KvType::kFloat16 ? float_to_half(x[i]) : float_to_bfloat16(x[i]);
      return;
    }
    case KvType::kInt8: {
      int8_t* out = reinterpret_cast<int8_t*>(dst);
      float peak = 0.0f;
      bool finite = true;
      for (long i = 0; i < n; ++i) {
        finite = finite && std::isfinite(x[i]);
        peak = std::max(peak, std::fabs(x[i]));
      }
      if (!finite) {  // the row reads back as NaN: a non-finite key or value stays visible
        std::memset(out, 0, n);
        *scale = std::numeric_limits<float>::quiet_NaN();
        return;
      }
      *scale = peak / 127.0f;
      const float inverse = peak > 0.0f ? 127.0f / peak : 0.0f;
      for (long i = 0; i < n; ++i) {
        const long q = std::lrint(x[i] * inverse);
        out[i] = static_cast<int8_t>(q > 127 ? 127 : (q < -127 ? -127 : q));
      }
      return;
    }
  }
}

}  // namespace

void KvCache::store(long layer, long row, long head, long slot, const float* key, const float* value) {
  const std::size_t at = element_offset(layer, row, head, slot) * size_;
  const std::size_t s = scale_offset(layer, row, head, slot);
  const bool int8 = type_ == KvType::kInt8;
  convert_row(type_, key, head_dim_, k_.data() + at, int8 ? k_scale_.data() + s : nullptr);
  convert_row(type_, value, head_dim_, v_.data() + at, int8 ? v_scale_.data() + s : nullptr);
}

void KvCache::view(long layer, AttentionArgs& a, long first_row) {
  a.kv_type = type_;
  a.k_stride_b = a.v_stride_b = stride_row();
  a.k_stride_h = a.v_stride_h = stride_head();
  a.k_stride_t = a.v_stride_t = head_dim_;
  if (type_ == KvType::kFloat32) {
    a.k = k(layer) + first_row * stride_row();
    a.v = v(layer) + first_row * stride_row();
    return;
  }
  a.k = a.v = nullptr;
  a.k_data = k_.data() + element_offset(layer, first_row, 0, 0) * size_;
  a.v_data = v_.data() + element_offset(layer, first_row, 0, 0) * size_;
  if (type_ == KvType::kInt8) {
    a.k_scale = k_scale_.data() + scale_offset(layer, first_row, 0, 0);
    a.v_scale = v_scale_.data() + scale_offset(layer, first_row, 0, 0);
    a.scale_stride_b = kv_heads_ * max_len_;
    a.scale_stride_h = max_len_;
  }
}

void KvCache::copy_slot(const KvCache& src, long src_row, long dst_row, long slot) {
  const std::size_t row_bytes = static_cast<std::size_t>(head_dim_) * size_;
  for (long l = 0; l < layers_; ++l) {
    for (long h = 0; h < kv_heads_; ++h) {
      const std::size_t from = src.element_offset(l, src_row, h, slot) * size_;
      const std::size_t to = element_offset(l, dst_row, h, slot) * size_;
      std::memcpy(k_.data() + to, src.k_.data() + from, row_bytes);
      std::memcpy(v_.data() + to, src.v_.data() + from, row_bytes);
      if (type_ == KvType::kInt8) {
        k_scale_.data()[scale_offset(l, dst_row, h, slot)] = src.k_scale_.data()[src.scale_offset(l, src_row, h, slot)];
        v_scale_.data()[scale_offset(l, dst_row, h, slot)] = src.v_scale_.data()[src.scale_offset(l, src_row, h, slot)];
      }
    }
  }
}

void KvCache::commit() {
  const std::size_t bytes = rows_total() * static_cast<std::size_t>(head_dim_ * size_);
  const std::size_t scales = type_ == KvType::kInt8 ? rows_total() : 0;
  constexpr std::size_t kBlock = std::size_t{1} << 21;  // one huge page at a time
  const long blocks = static_cast<long>((bytes + kBlock - 1) / kBlock);
  parallel_ranges(blocks, 1, [&](long b0, long b1) {
    for (long b = b0; b < b1; ++b) {
      const std::size_t at = static_cast<std::size_t>(b) * kBlock, n = std::min(kBlock, bytes - at);
      std::memset(k_.data() + at, 0, n);
      std::memset(v_.data() + at, 0, n);
    }
  });
  if (scales > 0) {
    std::memset(k_scale_.data(), 0, scales * sizeof(float));
    std::memset(v_scale_.data(), 0, scales * sizeof(float));
  }
}

void KvCache::copy_slots(long src_row, long dst_row, long begin, long end) {
  if (end <= begin || src_row == dst_row) return;
  const long count = end - begin;
  const std::size_t bytes = static_cast<std::size_t>(count * head_dim_) * size_;
  for (long l = 0; l < layers_; ++l) {
    for (long h = 0; h < kv_heads_; ++h) {
      const std::size_t from = element_offset(l, src_row, h, begin) * size_;
      const std::size_t to = element_offset(l, dst_row, h, begin) * size_;
      std::memcpy(k_.data() + to, k_.data() + from, bytes);
      std::memcpy(v_.data() + to, v_.data() + from, bytes);
      if (type_ == KvType::kInt8) {
        const std::size_t sf = scale_offset(l, src_row, h, begin), st = scale_offset(l, dst_row, h, begin);
        std::memcpy(k_scale_.data() + st, k_scale_.data() + sf, count * sizeof(float));
        std::memcpy(v_scale_.data() + st, v_scale_.data() + sf, count * sizeof(float));
      }
    }
  }
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

  // Buffers: each layer's K and V (elements), and with int8 their scales; threads take whole buffers.
  const bool int8 = type_ == KvType::kInt8;
  const long buffers = (int8 ? 4 : 2) * layers_;
  const std::size_t used_bytes = static_cast<std::size_t>(length_ * head_dim_) * size_;  // per head, elements
  const std::size_t used_scales = static_cast<std::size_t>(length_) * sizeof(float);
  const std::size_t parked_per_buffer = static_cast<std::size_t>(kv_heads_) * std::max(used_bytes, used_scales);
  if (parks && scratch_.size() < buffers * parked_per_buffer) scratch_.resize(buffers * parked_per_buffer);
  const long bytes =
      static_cast<long>(plan.size() * kv_heads_ * (2 * used_bytes + (int8 ? 2 * used_scales : 0))) * layers_;
  const long min_buffers_per_thread = bytes < (1L << 18) ? buffers : 1;
  parallel_ranges(buffers, min_buffers_per_thread, [&](long begin, long end) {
    for (long item = begin; item < end; ++item) {
      const long layer = item / (int8 ? 4 : 2), which = item % (int8 ? 4 : 2);  // 0 k, 1 v, 2 k scales, 3 v scales
      unsigned char* base;
      std::size_t row_stride, head_stride, used;
      if (which < 2) {
        base = (which == 0 ? k_ : v_).data() + element_offset(layer, 0, 0, 0) * size_;
        row_stride = static_cast<std::size_t>(stride_row()) * size_;
        head_stride = static_cast<std::size_t>(stride_head()) * size_;
        used = used_bytes;
      } else {
        base =
            reinterpret_cast<unsigned char*>((which == 2 ? k_scale_ : v_scale_).data() + scale_offset(layer, 0, 0, 0));
        row_stride = static_cast<std::size_t>(kv_heads_ * max_len_) * sizeof(float);
        head_stride = static_cast<std::size_t>(max_len_) * sizeof(float);
        used = used_scales;
      }
      unsigned char* parked = parks ? scratch_.data() + item * parked_per_buffer : nullptr;
      for (const Copy& c : plan) {
        for (long h = 0; h < kv_heads_; ++h) {
          unsigned char* to = c.dst == kParked ? parked + h * used : base + c.dst * row_stride + h * head_stride;
          const unsigned char* from =
              c.src == kParked ? parked + h * used : base + c.src * row_stride + h * head_stride;
          std::memcpy(to, from, used);
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
