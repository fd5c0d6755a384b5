// The checks of a model call's inputs that every front end makes (the Python extension's
// bindings and the C API): token ids within the vocabulary, masks of 0 and 1, lengths within the
// model's limits, generation options the C++ loop relies on. Each failure is a
// std::invalid_argument naming the argument (ValueError in Python, CF_ERROR_INVALID_ARGUMENT in C).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/generation.h"
#include "models/transformer_config.h"

namespace cpuformer {

// "[b, t]" of flat index r in rows of seq_len.
std::string at_index(long r, long seq_len);

// An encoder call on ids [B, T] (B, T >= 1): T within max_seq_len(), ids in [0, V), the mask (may
// be null) 0/1, token types (may be null) in [0, type_vocab_size) and only for models that have them.
void check_encoder_inputs(const TransformerConfig& c, const int64_t* ids, const int64_t* mask, const int64_t* types,
                          long B, long T);

// Every id of ids [n] in [0, V); what names them ("prompt token ids").
void check_token_ids(const TransformerConfig& c, const int64_t* ids, long n, const char* what);

// A decoder's generate(): non-empty prompts of valid ids, EOS ids in range, prompt + max_new_tokens
// within max_positions. An out-of-range pad id becomes 0 (it is only fed for finished rows).
void check_decoder_generation(const TransformerConfig& c, const std::vector<std::vector<int64_t>>& prompts,
                              GenerationOptions& o);

// An encoder-decoder's generate() from `start` (the decoder start token): non-empty sources of
// valid ids within max_positions, special ids in range, num_return_sequences, the target length.
void check_seq2seq_generation(const TransformerConfig& c, const std::vector<std::vector<int64_t>>& sources,
                              GenerationOptions& o, int64_t start);

}  // namespace cpuformer
