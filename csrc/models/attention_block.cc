#include "models/attention_block.h"

#include "kernels/attention/attention.h"

namespace cpuformer {

void self_attention_fused_qkv(const SelfAttentionShape& s, const float* qkv, const float* key_mask, float scale,
                              bool causal, float* context) {
  const long hd = s.heads * s.head_dim;  // H·D: width of one of q, k, v in a token's row
  const long row = 3 * hd;               // one token's qkv row
  AttentionArgs a;
  a.batch = s.batch;
  a.heads = s.heads;
  a.kv_heads = s.heads;
  a.q_len = s.seq_len;
  a.kv_len = s.seq_len;
  a.head_dim = s.head_dim;
  a.q = qkv;
  a.k = qkv + hd;
  a.v = qkv + 2 * hd;
  a.q_stride_b = a.k_stride_b = a.v_stride_b = s.seq_len * row;
  a.q_stride_h = a.k_stride_h = a.v_stride_h = s.head_dim;
  a.q_stride_t = a.k_stride_t = a.v_stride_t = row;
  a.out = context;
  a.out_stride_b = s.seq_len * hd;
  a.out_stride_h = s.head_dim;
  a.out_stride_t = hd;
  a.scale = scale;
  a.causal = causal;
  if (key_mask) {
    // [B, 1, 1, T]: one row of key biases per sequence, broadcast over heads and queries.
    a.mask = key_mask;
    a.mask_stride_b = s.seq_len;
    a.mask_stride_h = 0;
    a.mask_stride_q = 0;
    a.mask_stride_k = 1;
  }
  attention(a);
}

}  // namespace cpuformer
