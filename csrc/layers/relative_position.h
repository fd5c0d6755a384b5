// T5 relative position buckets and the additive attention bias built from them.
//
// A key at position j seen from a query at position i has relative position j - i. Small
// distances get one bucket each; larger ones share logarithmically wider buckets up to
// max_distance. Bidirectional (encoder) attention spends half the buckets on keys after the
// query; causal (decoder) attention only ever sees j ≤ i. Exactly transformers'
// T5Attention._relative_position_bucket, including its float32 logarithm and truncation.
#pragma once

#include "kernels/attention/attention.h"
#include "layers/workspace.h"

namespace cpuformer {

long relative_position_bucket(long relative_position, bool bidirectional, long num_buckets, long max_distance);

// bias [heads, q_len, k_len] contiguous: bias[h, i, j] = table[bucket(j - (q_start + i)), h], with
// table [num_buckets, heads] (the checkpoint's relative_attention_bias.weight). Keys sit at
// positions 0 .. k_len-1, queries at q_start .. q_start+q_len-1.
void relative_position_bias(const float* table, long heads, long num_buckets, long max_distance, bool bidirectional,
                            long q_start, long q_len, long k_len, float* bias);

// The additive mask of bidirectional self-attention over seq_len tokens per sequence with a
// relative position bias (T5's encoder, MPNet): sets args.mask and its strides to the bias
// [heads, T, T] of `table` [num_buckets, heads], one block shared by every sequence, or, when
// key_mask [batch, T] (0 or -inf per key) is given, to one block per sequence holding the bias plus
// that sequence's key mask ([batch, heads, T, T]). The blocks live in `scratch`.
void set_bidirectional_relative_mask(const float* table, long heads, long num_buckets, long max_distance,
                                     const float* key_mask, long batch, long seq_len, ScratchBuffer& scratch,
                                     AttentionArgs& args);

}  // namespace cpuformer
