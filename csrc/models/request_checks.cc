#include "models/request_checks.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace cpuformer {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip (as Python's repr), laid out by Python's rule: positional
  // when the decimal point falls within [-4, 16) places of the first digit, else d.ddde±XX.
  char buffer[64];
  const auto written = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string text(buffer, written.ptr);  // e.g. "-1.5e+00", "1e-300"
  const bool negative = text[0] == '-';
  const std::size_t e = text.find('e');
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (text[i] != '.') digits += text[i];
  }
  const int exponent = std::atoi(text.c_str() + e + 1);
  const int point = exponent + 1;  // the decimal point sits after `point` digits
  std::string out;
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out = "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
    } else if (point >= static_cast<int>(digits.size())) {
      out = digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<std::size_t>(point)) + "." + digits.substr(static_cast<std::size_t>(point));
    }
  } else {
    char tail[16];
    std::snprintf(tail, sizeof(tail), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") + tail;
  }
  return negative ? "-" + out : out;
}

std::string generation_option_rule(const std::string& name) {
  if (name == "max_new_tokens" || name == "min_new_tokens" || name == "no_repeat_ngram_size") {
    return "an integer >= 0";
  }
  if (name == "top_k") return "an integer >= 0 (0 disables it)";
  if (name == "presence_penalty" || name == "frequency_penalty") return "a number in [-2, 2]";
  if (name == "num_beams") return "an integer >= 1";
  if (name == "temperature" || name == "top_p" || name == "repetition_penalty" || name == "length_penalty") {
    return "a finite number";
  }
  throw std::invalid_argument("no generation option named '" + name + "'");
}

void check_generation_request(const GenerationRequest& r) {
  const auto integer = [](const char* name, long value, long minimum) {
    if (value < minimum) {
      throw std::invalid_argument(std::string(name) + " must be " + generation_option_rule(name) + ", got " +
                                  std::to_string(value));
    }
  };
  const auto finite = [](const char* name, double value) {
    if (!std::isfinite(value)) {
      throw std::invalid_argument(std::string(name) + " must be " + generation_option_rule(name) + ", got " +
                                  python_float_repr(value));
    }
  };
  integer("max_new_tokens", r.max_new_tokens, 0);
  integer("min_new_tokens", r.min_new_tokens, 0);
  finite("temperature", r.temperature);
  finite("top_p", r.top_p);
  finite("repetition_penalty", r.repetition_penalty);
  finite("length_penalty", r.length_penalty);
  integer("top_k", r.top_k, 0);
  integer("num_beams", r.num_beams, 1);
  integer("no_repeat_ngram_size", r.no_repeat_ngram_size, 0);
  if (r.do_sample && r.temperature <= 0) {
    throw std::invalid_argument("temperature must be > 0 when sampling, got " + python_float_repr(r.temperature));
  }
  if (!(r.top_p > 0 && r.top_p <= 1)) {
    throw std::invalid_argument("top_p must be in (0, 1], got " + python_float_repr(r.top_p));
  }
  if (r.repetition_penalty <= 0) {
    throw std::invalid_argument("repetition_penalty must be > 0, got " + python_float_repr(r.repetition_penalty));
  }
  if (r.do_sample && r.num_beams > 1) {
    throw NotSupported("beam sampling (do_sample with num_beams > 1) is not supported");
  }
}

std::string at_index(long r, long seq_len) {
  return "[" + std::to_string(r / seq_len) + ", " + std::to_string(r % seq_len) + "]";
}

void check_encoder_inputs(const TransformerConfig& c, const int64_t* id, const int64_t* m, const int64_t* tt, long B,
                          long T) {
  if (T > c.max_seq_len()) {
    throw std::invalid_argument("sequence length " + std::to_string(T) + " exceeds the model's maximum of " +
                                std::to_string(c.max_seq_len()) + " tokens " +
                                (c.transformer_xl_attention ? "(cpuformer's longest XLNet segment; read longer texts "
                                                              "in segments that carry their memory: encode_with_memory)"
                                                            : "(max_position_embeddings)"));
  }
  const long rows = B * T;
  for (long r = 0; r < rows; ++r) {
    if (id[r] < 0 || id[r] >= c.vocab_size) {
      throw std::invalid_argument("input_ids" + at_index(r, T) + " = " + std::to_string(id[r]) +
                                  " is out of range; token ids must be in [0, " + std::to_string(c.vocab_size) +
                                  ") (vocab_size)");
    }
  }
  for (long r = 0; m && r < rows; ++r) {
    if (m[r] != 0 && m[r] != 1) {
      throw std::invalid_argument("attention_mask" + at_index(r, T) + " = " + std::to_string(m[r]) +
                                  "; attention_mask entries must be 0 (padding) or 1 (token)");
    }
  }
  if (tt && c.type_vocab_size == 0 && !c.transformer_xl_attention) {
    throw std::invalid_argument("this model has no token type embeddings; token_type_ids must be None");
  }
  // (Transformer-XL compares token types for equality: any value is a segment id)
  for (long r = 0; tt && r < rows && c.type_vocab_size > 0; ++r) {
    if (tt[r] < 0 || tt[r] >= c.type_vocab_size) {
      throw std::invalid_argument("token_type_ids" + at_index(r, T) + " = " + std::to_string(tt[r]) +
                                  " is out of range; token type ids must be in [0, " +
                                  std::to_string(c.type_vocab_size) + ") (type_vocab_size)");
    }
  }
}

void check_token_ids(const TransformerConfig& c, const int64_t* ids, long n, const char* what) {
  const long V = c.vocab_size;
  for (long i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      throw std::invalid_argument(std::string(what) + ": token id " + std::to_string(ids[i]) +
                                  " is out of range; token ids must be in [0, " + std::to_string(V) + ") (vocab_size)");
    }
  }
}

void check_penalties_and_bias(const GenerationOptions& o, long V) {
  for (const auto& [name, value] : {std::pair<const char*, float>{"presence_penalty", o.presence_penalty},
                                    std::pair<const char*, float>{"frequency_penalty", o.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f)) {
      throw std::invalid_argument(std::string(name) + " must be " + generation_option_rule(name) + ", got " +
                                  python_float_repr(value));
    }
  }
  if (o.logit_bias_ids.size() != o.logit_bias_values.size()) {
    throw std::invalid_argument("logit_bias: " + std::to_string(o.logit_bias_ids.size()) + " token ids but " +
                                std::to_string(o.logit_bias_values.size()) + " values");
  }
  for (size_t i = 0; i < o.logit_bias_ids.size(); ++i) {
    const int64_t t = o.logit_bias_ids[i];
    if (t < 0 || t >= V) {
      throw std::invalid_argument("logit_bias token id " + std::to_string(t) +
                                  " is out of range; token ids must be in [0, " + std::to_string(V) + ") (vocab_size)");
    }
    const float b = o.logit_bias_values[i];
    if (!(b >= -100.0f && b <= 100.0f)) {
      throw std::invalid_argument("logit_bias of token " + std::to_string(t) +
                                  " must be a number in [-100, 100], got " + python_float_repr(b));
    }
  }
}

void check_decoder_generation(const TransformerConfig& c, const std::vector<std::vector<int64_t>>& prompts,
                              GenerationOptions& o) {
  check_penalties_and_bias(o, c.vocab_size);
  if (prompts.empty()) throw std::invalid_argument("generate() needs at least one prompt");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw std::invalid_argument("prompt " + std::to_string(i) + " is empty");
    check_token_ids(c, prompts[i].data(), static_cast<long>(prompts[i].size()), "prompt token ids");
  }
  for (int64_t e : o.eos_token_ids) {
    if (e < 0 || e >= c.vocab_size) {
      throw std::invalid_argument("eos_token_id " + std::to_string(e) + " is out of range; token ids must be in [0, " +
                                  std::to_string(c.vocab_size) + ") (vocab_size)");
    }
  }
  if (o.pad_token_id < 0 || o.pad_token_id >= c.vocab_size) o.pad_token_id = 0;
  long longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<long>(p.size()));
  if (o.max_new_tokens > c.max_positions - longest) {  // (longest + max_new_tokens could overflow)
    throw std::invalid_argument("prompt length " + std::to_string(longest) + " + max_new_tokens " +
                                std::to_string(o.max_new_tokens) + " exceeds the model's maximum of " +
                                std::to_string(c.max_positions) + " tokens (max_position_embeddings)");
  }
}

void check_seq2seq_generation(const TransformerConfig& c, const std::vector<std::vector<int64_t>>& sources,
                              GenerationOptions& o, int64_t start) {
  if (sources.empty()) throw std::invalid_argument("generate() needs at least one source");
  check_penalties_and_bias(o, c.vocab_size);
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].empty()) throw std::invalid_argument("source " + std::to_string(i) + " is empty");
    check_token_ids(c, sources[i].data(), static_cast<long>(sources[i].size()), "source token ids");
    if (c.max_positions > 0 && static_cast<long>(sources[i].size()) > c.max_positions) {
      throw std::invalid_argument("source " + std::to_string(i) + " has " + std::to_string(sources[i].size()) +
                                  " tokens; the model allows at most " + std::to_string(c.max_positions) +
                                  " (max_position_embeddings)");
    }
  }
  std::vector<int64_t> special = o.eos_token_ids;
  special.insert(special.end(), o.suppress_token_ids.begin(), o.suppress_token_ids.end());
  special.push_back(start);
  if (o.forced_bos_token_id >= 0) special.push_back(o.forced_bos_token_id);
  if (o.forced_eos_token_id >= 0) special.push_back(o.forced_eos_token_id);
  check_token_ids(c, special.data(), static_cast<long>(special.size()), "special token ids");
  if (o.pad_token_id < 0 || o.pad_token_id >= c.vocab_size) o.pad_token_id = 0;
  if (o.num_return_sequences < 1 || (o.num_beams > 1 && o.num_return_sequences > o.num_beams)) {
    throw std::invalid_argument("num_return_sequences (" + std::to_string(o.num_return_sequences) +
                                ") must be between 1 and num_beams (" + std::to_string(o.num_beams) + ")");
  }
  if (c.max_positions > 0 && o.max_new_tokens > c.max_positions - 1) {  // (1 + max_new_tokens could overflow)
    throw std::invalid_argument("1 decoder start token + max_new_tokens " + std::to_string(o.max_new_tokens) +
                                " exceeds the model's maximum of " + std::to_string(c.max_positions) +
                                " target tokens (max_position_embeddings)");
  }
}

}  // namespace cpuformer
