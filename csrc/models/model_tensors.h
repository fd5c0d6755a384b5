// The canonical tensors of a model outside its layers (docs/architecture.md), borrowed from the
// caller while a model is built: what the embeddings, positions and head need.
#pragma once

#include "layers/transformer_block.h"

namespace cpuformer {

// One stack's (the encoder's or the decoder's) own tensors.
struct StackTensors {
  const float* positions = nullptr;      // embed.positions [position_offset + max_positions, embedding width]
  NormTensors embed_norm;                // embed.norm [embedding width] (embedding_norm)
  NormTensors final_norm;                // final_norm
  const float* relative_bias = nullptr;  // relative_bias [num_buckets, num_heads] (has_relative_bias())
  const float* rope_inv_freq = nullptr;  // rope.inv_freq [head_dim / 2] (RoPE)
  // rope.local_inv_freq [head_dim / 2]: the windowed layers' own (RoPE encoders with global_attention_every)
  const float* rope_local_inv_freq = nullptr;
  const float* relative_embeddings = nullptr;  // [2 · relative_span(), hidden] (disentangled attention)
  NormTensors relative_norm;                   // relative_embedding_norm
};

struct GlobalTensors {
  const float* tokens = nullptr;       // embed.tokens [vocab_size, embedding width]
  const float* token_types = nullptr;  // embed.token_types [type_vocab_size, embedding width] (encoders)
  LinearTensors embed_project;         // embed.project [hidden, embedding width] + bias (encoders), or null
  LinearTensors lm_head;               // lm_head [vocab_size, hidden] + lm_head.bias; null weight: tied
  LinearTensors pooler;                // pooler [hidden, hidden] + bias (BERT), or null
  StackTensors encoder, decoder;       // a decoder-only model has only `decoder`, an encoder only `encoder`
  // Where the packed lm_head, pooler and embed.project may come from (layers/linear.h), or null.
  PackedWeightsStore* packed = nullptr;
};

}  // namespace cpuformer
