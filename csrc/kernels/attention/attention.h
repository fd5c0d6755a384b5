// Fused scaled-dot-product attention, float32: out = softmax(scale · q·kᵀ + mask) · v, computed
// with an online (streaming) softmax so the [Tq, Tk] score matrix is never materialised.
//
// Shapes (element strides; the last dimension, head_dim D, is contiguous in every tensor):
//   q   [B, H,   Tq, D]   k, v [B, Hkv, Tk, D]   out [B, H, Tq, D]
// Grouped-query attention: Hkv divides H; query head h reads kv head h / (H / Hkv). Heads are
// never copied. Strides let the models pass views straight into a fused QKV buffer
// ([B, T, 3, H, D]) or into a preallocated KV cache ([B, Hkv, Tmax, D] with Tk ≤ Tmax).
// Masking, all optional and combinable:
//   causal: query i sees key j iff j ≤ i + causal_offset (decode with a cache: Tk - Tq)
//   window > 0: with causal, additionally j > i + causal_offset - window (sliding window,
//               Mistral); without causal, |j - (i + causal_offset)| < window (a bidirectional
//               window, ModernBERT's local layers)
//   mask: additive float mask, element (b, h, i, j) at b·mask_stride_b + h·mask_stride_h +
//         i·mask_stride_q + j·mask_stride_k; stride 0 broadcasts (a key-padding mask is
//         [B, 1, 1, Tk]: strides (Tk, 0, 0, 1)). -inf removes a key.
// A key outside a row's causal/window range or removed by the mask does not affect that row, even
// when its k or v hold NaN or ±inf; for the keys a row sees, NaN and ±inf follow the float rules
// (docs/reliability.md, "Non-finite values"). A query row that sees no key at all gets zeros.
// Limits: kv_len ≤ kAttentionMaxKeys = 2^31 - 1 (key positions are compared as int32 lanes);
// callers check it (the bindings for ops.attention, KvCache::reset for the models).
// Alignment: none required (row starts may be anywhere).
// Aliasing: out must not alias q, k, v or mask. Threads: current_num_threads().
#pragma once

#include <cstddef>

namespace cpuformer {

constexpr long kAttentionMaxKeys = 2147483647L;  // 2^31 - 1

// Element type of k and v. float32: `k`, `v`. The others (a reduced-precision KV cache): `k_data`,
// `v_data` hold the elements with the same element strides; int8 also has one float scale per key
// row (value = scale · q): element (b, h, t) at b·scale_stride_b + h·scale_stride_h + t of
// `k_scale` / `v_scale`. The kernels widen a block of keys at a time into float32 scratch (never the
// whole cache), then compute as for float32. Writers: layers/kv_cache.h.
enum class KvType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kInt8 = 3 };
constexpr long kv_type_size(KvType t) { return t == KvType::kFloat32 ? 4 : t == KvType::kInt8 ? 1 : 2; }

struct AttentionArgs {
  long batch = 0, heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  const float* q = nullptr;
  long q_stride_b = 0, q_stride_h = 0, q_stride_t = 0;
  const float* k = nullptr;
  long k_stride_b = 0, k_stride_h = 0, k_stride_t = 0;
  const float* v = nullptr;
  long v_stride_b = 0, v_stride_h = 0, v_stride_t = 0;
  float* out = nullptr;
  long out_stride_b = 0, out_stride_h = 0, out_stride_t = 0;
  float scale = 1.0f;
  bool causal = false;
  long causal_offset = 0;
  long window = 0;
  const float* mask = nullptr;
  long mask_stride_b = 0, mask_stride_h = 0, mask_stride_q = 0, mask_stride_k = 0;
  KvType kv_type = KvType::kFloat32;
  const void* k_data = nullptr;
  const void* v_data = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  long scale_stride_b = 0, scale_stride_h = 0;
  // The caller accepts both products (q·kᵀ and P·V) from operands rounded to bfloat16 (nearest
  // even) and summed in float32: set by models whose dtype is lossy already (int8 / int4 weights,
  // docs/precision.md). Where the CPU has AVX512-BF16, the avx512 level then runs the query-block
  // engine on vdpbf16ps (attention_avx512bf16.cc) for float32 k/v, head_dim a multiple of 16 and
  // at least kLanes query rows per (batch, kv head); everything else (the softmax, masks, the
  // other levels, decode-sized calls) is unchanged float32. With AMX-BF16 and head_dim a multiple
  // of 32 the two products run on TDPBF16PS tiles instead (attention_avx512amx.cc), same operands.
  bool bf16_products = false;
};

// Key (or value) row t of (b, kv head h) widened to float32: dst[0, head_dim). For any kv_type.
void widen_kv_row(const AttentionArgs& a, bool values, long b, long h, long t, float* dst);

struct AttentionKernels {
  // Multi-threaded over (batch, head, query blocks) and, for short queries, over key splits.
  void (*attention)(const AttentionArgs& args);
  // calls[0, count) with outputs of those calls one after another, in one parallel region where the
  // level can (the same head_dim in every call; no bf16_products engine).
  void (*attention_many)(const AttentionArgs* calls, long count);
};

const AttentionKernels& attention_kernels();
void attention(const AttentionArgs& args);
// attention() of each of calls[0, count), their outputs those of the calls one after another (the
// outputs must not overlap any call's inputs). The sequences of a ragged batch (one call each:
// their own cache rows and lengths) run in one parallel region instead of one each.
void attention_many(const AttentionArgs* calls, long count);

// Scratch for the SIMD kernels: at least `floats` floats, 64-byte aligned, owned by the calling
// thread and reused by its later calls, so a decode step allocates nothing once warmed up.
// Valid until the next call on the same thread. Throws std::bad_alloc.
float* attention_scratch(std::size_t floats);

namespace scalar { extern const AttentionKernels kAttentionKernels; }
namespace avx2 { extern const AttentionKernels kAttentionKernels; }
namespace avx512 { extern const AttentionKernels kAttentionKernels; }
namespace avx512bf16 { extern const AttentionKernels kAttentionKernels; }
namespace avx512amx { extern const AttentionKernels kAttentionKernels; }
namespace neon { extern const AttentionKernels kAttentionKernels; }

}  // namespace cpuformer
