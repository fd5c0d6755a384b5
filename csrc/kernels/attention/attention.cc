#include "kernels/attention/attention.h"

#include <cstdint>
#include <cstring>

#include "kernels/gemm/gemm.h"
#include "runtime/aligned_buffer.h"
#include "runtime/cpu_features.h"
#include "runtime/dispatch.h"

namespace cpuformer {

const AttentionKernels& attention_kernels() {
#if CPUFORMER_X86_64
  static const AttentionKernels& table =
      select_for_isa(scalar::kAttentionKernels, avx2::kAttentionKernels, avx512::kAttentionKernels);
#else
  static const AttentionKernels& table = select_for_isa(scalar::kAttentionKernels, neon::kAttentionKernels);
#endif
  return table;
}

float* attention_scratch(std::size_t floats) {
  // Per calling thread: Python threads that run attention concurrently never share it.
  thread_local AlignedBuffer<float> buffer;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

void widen_kv_row(const AttentionArgs& a, bool values, long b, long h, long t, float* dst) {
  const long offset = values ? b * a.v_stride_b + h * a.v_stride_h + t * a.v_stride_t
                             : b * a.k_stride_b + h * a.k_stride_h + t * a.k_stride_t;
  const long dim = a.head_dim;
  switch (a.kv_type) {
    case KvType::kFloat32: std::memcpy(dst, (values ? a.v : a.k) + offset, dim * sizeof(float)); return;
    case KvType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(values ? a.v_data : a.k_data) + offset;
      for (long d = 0; d < dim; ++d) dst[d] = half_to_float(src[d]);
      return;
    }
    case KvType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(values ? a.v_data : a.k_data) + offset;
      for (long d = 0; d < dim; ++d) dst[d] = bfloat16_to_float(src[d]);
      return;
    }
    case KvType::kInt8: {
      const int8_t* src = static_cast<const int8_t*>(values ? a.v_data : a.k_data) + offset;
      const float scale = (values ? a.v_scale : a.k_scale)[b * a.scale_stride_b + h * a.scale_stride_h + t];
      for (long d = 0; d < dim; ++d) dst[d] = scale * static_cast<float>(src[d]);
      return;
    }
  }
}

namespace {

// The kernels that run `args`: bf16_products takes the avx512 kernel compiled with AVX512-BF16
// (the same kernel plus the vdpbf16ps engine), only inside the avx512 level (CPUFORMER_ISA=avx2 or
// scalar never sees it). With AMX-BF16 and head_dim a multiple of 32 both products run on
// TDPBF16PS tiles instead (attention_avx512amx.cc: the same operands, float32 sums in the tiles'
// order).
const AttentionKernels& kernels_for(const AttentionArgs& args) {
#if CPUFORMER_X86_64
  static const bool bf16 = &attention_kernels() == &avx512::kAttentionKernels && cpu_features().avx512bf16;
  static const bool amx = bf16 && cpu_features().amx_bf16;
  if (args.bf16_products && amx && args.head_dim % 32 == 0) return avx512amx::kAttentionKernels;
  if (args.bf16_products && bf16) return avx512bf16::kAttentionKernels;
#else
  (void)args;
#endif
  return attention_kernels();
}

}  // namespace

void attention(const AttentionArgs& args) {
  if (args.batch <= 0 || args.heads <= 0 || args.q_len <= 0) return;
  kernels_for(args).attention(args);
}

void attention_many(const AttentionArgs* calls, long count) {
  // Together when every call has the level's own kernels (no bf16 engine) and one head_dim.
  bool together = count > 1;
  for (long c = 0; c < count && together; ++c) {
    together = &kernels_for(calls[c]) == &attention_kernels() && calls[c].head_dim == calls[0].head_dim;
  }
  if (!together) {
    for (long c = 0; c < count; ++c) attention(calls[c]);
    return;
  }
  attention_kernels().attention_many(calls, count);
}

}  // namespace cpuformer
