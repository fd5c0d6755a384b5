// The weight quantizers of each SIMD level (quantize_weights_inl.h): quantize_weights_s8 and
// quantize_weights_s4 (gemm.h) split the rows across the threads and call these on each range.
#pragma once

#include <cstdint>

namespace cpuformer {

struct WeightQuantizers {
  // Rows [j0, j1) of quantize_weights_s8.
  void (*rows_s8)(const float* w, long j0, long j1, long k, long ldw, int8_t* q, float* scales);
  // Rows [j0, j1) of quantize_weights_s4 (group_size valid); std::invalid_argument for a group no
  // float16 scale can hold.
  void (*rows_s4)(const float* w, long j0, long j1, long k, long ldw, long group_size, bool zero_point, uint8_t* u,
                  uint16_t* scales, uint8_t* zeros);
};

// The running level's (every level computes the same bits).
const WeightQuantizers& weight_quantizers();

}  // namespace cpuformer
