// Rotary position embedding (RoPE) in the rotate-half convention of Hugging Face's Llama family.
//
// For a head vector x [D] at position p and inv_freq [D/2] (θ^(-2i/D), possibly rescaled by
// rope_scaling — the caller computes it):
//   a = float(p) · inv_freq[i]   (float32 product, as PyTorch computes it)
//   x'[i]       = x[i]·cos a − x[i + D/2]·sin a
//   x'[i + D/2] = x[i + D/2]·cos a + x[i]·sin a
// Applied in place to `heads` consecutive head vectors of one token (stride D).
#pragma once

namespace cpuformer {

// cos_sin [D]: cos of the D/2 angles followed by their sin, for position `position`.
void rope_angles(const float* inv_freq, long half, long position, float* cos_sin);

// x [heads, 2·half] contiguous, rotated in place with the angles of rope_angles().
void rope_apply(const float* cos_sin, long half, long heads, float* x);

}  // namespace cpuformer
