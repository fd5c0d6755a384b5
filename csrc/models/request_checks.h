// The checks of a model call's inputs that every front end makes (the Python extension's
// bindings and the C API): token ids within the vocabulary, masks of 0 and 1, lengths within the
// model's limits, generation options the C++ loop relies on. Each failure is a
// std::invalid_argument naming the argument (ValueError in Python, CF_ERROR_INVALID_ARGUMENT in C).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/generation.h"
#include "models/transformer_config.h"

namespace cpuformer {

// A valid request the C++ core does not implement (beam sampling): NotImplementedError in Python,
// CF_ERROR_INVALID_ARGUMENT in C (it is a std::invalid_argument).
struct NotSupported : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The option values of one generate() call as the caller gave them, before the loop's defaults
// apply (temperature, top_k and top_p are ignored without sampling, but still checked).
struct GenerationRequest {
  long max_new_tokens = 20;
  long min_new_tokens = 0;
  bool do_sample = false;
  double temperature = 1.0;
  long top_k = 0;
  double top_p = 1.0;
  double repetition_penalty = 1.0;
  long num_beams = 1;
  double length_penalty = 1.0;
  long no_repeat_ngram_size = 0;
};

// The one copy of the generation-option rules and messages, for the Python API (through
// _core.check_generation_request) and the C API (cf_generate), e.g. "top_p must be in (0, 1], got
// 2.0" (values as Python's repr() writes them). Each failure is a std::invalid_argument; beam
// sampling is NotSupported.
void check_generation_request(const GenerationRequest& r);

// What the option `name` of GenerationRequest must be, as its messages say it: "an integer >= 0",
// "an integer >= 0 (0 disables it)", "a finite number". Python's own type checks (a str, a bool,
// an int beyond int64 or beyond float) use it, so their messages match ("top_k must be an integer
// >= 0 (0 disables it), got '3'"). std::invalid_argument for another name.
std::string generation_option_rule(const std::string& name);

// A double as Python's repr() writes it: "0.0", "-1e-300", "2.5", "1e+16", "inf", "nan".
std::string python_float_repr(double value);

// "[b, t]" of flat index r in rows of seq_len.
std::string at_index(long r, long seq_len);

// An encoder call on ids [B, T] (B, T >= 1): T within max_seq_len(), ids in [0, V), the mask (may
// be null) 0/1, token types (may be null) in [0, type_vocab_size) and only for models that have them.
void check_encoder_inputs(const TransformerConfig& c, const int64_t* ids, const int64_t* mask, const int64_t* types,
                          long B, long T);

// Every id of ids [n] in [0, V); what names them ("prompt token ids").
void check_token_ids(const TransformerConfig& c, const int64_t* ids, long n, const char* what);

// presence_penalty and frequency_penalty in [-2, 2] (OpenAI's range), and logit_bias: as many
// values as ids, ids in [0, V), values in [-100, 100]. Every generating front end calls it
// (check_decoder_generation, check_seq2seq_generation, the continuous batcher's requests).
void check_penalties_and_bias(const GenerationOptions& o, long V);

// A decoder's generate(): non-empty prompts of valid ids, EOS ids in range, prompt + max_new_tokens
// within max_positions. An out-of-range pad id becomes 0 (it is only fed for finished rows).
void check_decoder_generation(const TransformerConfig& c, const std::vector<std::vector<int64_t>>& prompts,
                              GenerationOptions& o);

// An encoder-decoder's generate() from `start` (the decoder start token): non-empty sources of
// valid ids within max_positions, special ids in range, num_return_sequences, the target length.
void check_seq2seq_generation(const TransformerConfig& c, const std::vector<std::vector<int64_t>>& sources,
                              GenerationOptions& o, int64_t start);

}  // namespace cpuformer
