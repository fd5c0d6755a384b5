#include "layers/relative_position.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/checked_size.h"
#include "runtime/threading.h"

namespace cpuformer {

long relative_position_bucket(long relative_position, bool bidirectional, long num_buckets, long max_distance) {
  long bucket = 0;
  long distance;
  if (bidirectional) {
    num_buckets /= 2;
    if (relative_position > 0) bucket += num_buckets;
    distance = relative_position < 0 ? -relative_position : relative_position;
  } else {
    distance = relative_position < 0 ? -relative_position : 0;
  }
  const long max_exact = num_buckets / 2;
  if (distance < max_exact) return bucket + distance;
  // transformers computes this in float32: log(d / max_exact) / log(max_distance / max_exact)
  // (the second log in double, then rounded), times (num_buckets - max_exact), truncated.
  const float ratio = std::log(static_cast<float>(distance) / static_cast<float>(max_exact));
  const float denominator = static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact));
  const float scaled = ratio / denominator * static_cast<float>(num_buckets - max_exact);
  const long large = std::min(max_exact + static_cast<long>(scaled), num_buckets - 1);
  return bucket + large;
}

void relative_position_bias(const float* table, long heads, long num_buckets, long max_distance, bool bidirectional,
                            long q_start, long q_len, long k_len, float* bias) {
  // One bucket per relative position in [-(q_start + q_len - 1), k_len - 1 - q_start].
  const long lowest = -(q_start + q_len - 1), highest = k_len - 1 - q_start;
  std::vector<long> buckets(highest - lowest + 1);
  for (long r = lowest; r <= highest; ++r) {
    buckets[r - lowest] = relative_position_bucket(r, bidirectional, num_buckets, max_distance);
  }
  for (long h = 0; h < heads; ++h) {
    for (long i = 0; i < q_len; ++i) {
      float* row = bias + (h * q_len + i) * k_len;
      for (long j = 0; j < k_len; ++j) row[j] = table[buckets[j - (q_start + i) - lowest] * heads + h];
    }
  }
}

void set_bidirectional_relative_mask(const float* table, long heads, long num_buckets, long max_distance,
                                     const float* key_mask, long batch, long seq_len, ScratchBuffer& scratch,
                                     AttentionArgs& args) {
  const long T = seq_len;
  const long per = static_cast<long>(checked_count({heads, T, T}, "the relative position bias"));
  // [0]: the bias; [1 + b]: the bias plus sequence b's key mask (with a key mask only).
  float* bias = scratch.reserve({key_mask ? batch + 1 : 1, per});
  relative_position_bias(table, heads, num_buckets, max_distance, /*bidirectional=*/true, 0, T, T, bias);
  if (key_mask) {
    parallel_ranges(batch, 1, [&](long b0, long b1) {
      for (long b = b0; b < b1; ++b) {
        float* out = bias + (b + 1) * per;
        for (long i = 0; i < heads * T; ++i) {
          for (long j = 0; j < T; ++j) out[i * T + j] = bias[i * T + j] + key_mask[b * T + j];
        }
      }
    });
    bias += per;
  }
  args.mask = bias;
  args.mask_stride_b = key_mask ? per : 0;
  args.mask_stride_h = T * T;
  args.mask_stride_q = T;
  args.mask_stride_k = 1;
}

}  // namespace cpuformer
