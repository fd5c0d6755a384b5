// Attention over a fused QKV projection, shared by every model kind.
//
// The fused projection writes qkv [B, T, 3, H, D] (one GEMM row per token: q heads, k heads, v
// heads). The attention kernel reads q, k and v as strided views straight into that buffer and
// writes the context as [B, T, H, D] = [B·T, H·D], the row layout the output projection consumes,
// so no head transpose is ever materialised.
#pragma once

namespace cpuformer {

struct SelfAttentionShape {
  long batch = 0, seq_len = 0, heads = 0, head_dim = 0;
};

// qkv [B, T, 3, H, D] → context [B, T, H, D]. key_mask: additive [B, T] (0 keeps a key, -inf
// removes it), or null. scale multiplies q·kᵀ. context must not alias qkv.
void self_attention_fused_qkv(const SelfAttentionShape& shape, const float* qkv, const float* key_mask, float scale,
                              bool causal, float* context);

}  // namespace cpuformer
