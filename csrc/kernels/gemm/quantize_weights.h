// The weight quantizers of each SIMD level (quantize_weights_inl.h): quantize_weights_s8,
// quantize_weights_s4 and the float16 / bfloat16 conversion of pack_weights (gemm.h) split the rows
// across the threads and call these on each range.
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
  // Rows [j0, j1) of w as float16 (half) or bfloat16 bits, h [rows, k]: float_to_half /
  // float_to_bfloat16 (gemm.h) of each weight.
  void (*rows_16)(const float* w, long j0, long j1, long k, long ldw, bool half, uint16_t* h);
};

// The running level's (every level computes the same bits).
const WeightQuantizers& weight_quantizers();

}  // namespace cpuformer
