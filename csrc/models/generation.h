// The token-generation loop, independent of the model: greedy search, sampling (temperature,
// top-k, top-p), repetition penalty, presence / frequency penalties and logit bias, min/max new
// tokens, several EOS ids, beam search, per-token log-probabilities and a per-token callback
// (streaming). Semantics follow Hugging Face's generate() (logits processors in its order; beam
// search as transformers' _beam_search).
//
// The loop drives a StepModel: anything that turns "the current tokens" into next-token logits
// while keeping its own state (a decoder's KV cache; later an encoder-decoder's self- and
// cross-attention caches).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

namespace cpuformer {

class StepModel {
 public:
  virtual ~StepModel() = default;
  virtual long vocab_size() const = 0;
  // Starts a run over `rows` sequences given left-padded as ids/mask [rows, T] (mask 1 = token,
  // 0 = padding; every row ends with a token). Room is reserved for max_new more tokens per row.
  // logits [rows, V]: next-token logits after the last position. Rows come in groups of `copies`
  // identical consecutive rows (the beams of one prompt), so a model may do per-prompt work
  // (an encoder pass, cross-attention keys) once per group.
  virtual void prefill(const int64_t* ids, const int64_t* mask, long rows, long T, long copies, long max_new,
                       float* logits) = 0;
  // Optional, before prefill with the same rows, T and max_new: allocates the state the run will
  // need (the KV cache), so a run too large to fit fails (SizeError) before the loop allocates
  // its own per-row buffers.
  virtual void reserve(long /*rows*/, long /*T*/, long /*max_new*/) {}
  // Appends one token per row (tokens [rows]); logits [rows, V] as above.
  virtual void step(const int64_t* tokens, float* logits) = 0;
  // Beam bookkeeping: afterwards row r holds the state row source[r] held before (rows entries).
  virtual void reorder(const long* source) = 0;

  // Speculative decoding (a run of one row): extend() appends `count` tokens and writes the
  // next-token logits after each of them [count, V]; rollback() forgets the last `count` tokens
  // appended. A model that cannot do this keeps the defaults (can_extend() false).
  virtual bool can_extend() const { return false; }
  virtual void extend(const int64_t* tokens, long count, float* logits);
  virtual void rollback(long count);
};

struct GenerationOptions {
  long max_new_tokens = 20;
  long min_new_tokens = 0;
  bool do_sample = false;
  double temperature = 1.0;  // any finite value > 0 (sampling only); see warp() in generation.cc
  long top_k = 0;         // 0: off
  float top_p = 1.0f;     // 1: off
  float repetition_penalty = 1.0f;
  // OpenAI's penalties, over the tokens generated so far (not the prompt): a token's score loses
  // frequency_penalty for each time it was generated and presence_penalty once if it was.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // OpenAI's logit_bias: scores[logit_bias_ids[i]] += logit_bias_values[i] (same lengths, ids in
  // [0, V), values in [-100, 100]: check_penalties_and_bias in models/request_checks.h).
  std::vector<int64_t> logit_bias_ids;
  std::vector<float> logit_bias_values;
  long no_repeat_ngram_size = 0;  // 0: off
  long num_beams = 1;
  // beam search: the best n finished hypotheses per prompt; sampling: n samples per prompt
  long num_return_sequences = 1;
  float length_penalty = 1.0f;
  int early_stopping = 0;  // beam search: 0 = False (heuristic), 1 = True, 2 = "never"
  std::vector<int64_t> eos_token_ids;
  int64_t forced_bos_token_id = -1;  // ≥ 0: the first new token (transformers' forced_bos_token_id)
  int64_t forced_eos_token_id = -1;  // ≥ 0: the token at the max_new_tokens-th step
  std::vector<int64_t> suppress_token_ids;  // never generated
  // bad_words_ids: a sequence's last token is banned where the output so far (history included)
  // ends with the rest of it (transformers' NoBadWordsLogitsProcessor); one-token sequences are
  // banned everywhere. Non-empty, ids in [0, V): checked by generate().
  std::vector<std::vector<int64_t>> bad_words_ids;
  int64_t pad_token_id = 0;  // fed for finished rows / prompt padding; any valid id
  uint64_t seed = 0;
  bool return_log_probs = false;
  // Speculative decoding (greedy or sampling, one prompt): draft tokens verified in one pass.
  long num_assistant_tokens = 5;      // a draft model's first draft length
  bool adaptive_draft = true;         // adapt it as it runs (transformers' "heuristic" schedule)
  long prompt_lookup_num_tokens = 0;  // > 0: draft by n-gram lookup in the prompt and the output
  long max_matching_ngram_size = 2;   // prompt lookup: the longest n-gram matched
  long kv_cache_dtype = 0;  // the KV cache's element type: a KvType (0 float32, 1 float16, 2 bfloat16, 3 int8)

  // Every option once: v(name, field) (the Python names; bindings/config.h reads them).
  template <class Visitor>
  void fields(Visitor&& v) {
    v("max_new_tokens", max_new_tokens);
    v("min_new_tokens", min_new_tokens);
    v("do_sample", do_sample);
    v("temperature", temperature);
    v("top_k", top_k);
    v("top_p", top_p);
    v("repetition_penalty", repetition_penalty);
    v("presence_penalty", presence_penalty);
    v("frequency_penalty", frequency_penalty);
    v("logit_bias_ids", logit_bias_ids);
    v("logit_bias_values", logit_bias_values);
    v("no_repeat_ngram_size", no_repeat_ngram_size);
    v("num_beams", num_beams);
    v("num_return_sequences", num_return_sequences);
    v("length_penalty", length_penalty);
    v("early_stopping", early_stopping);
    v("eos_token_ids", eos_token_ids);
    v("forced_bos_token_id", forced_bos_token_id);
    v("forced_eos_token_id", forced_eos_token_id);
    v("suppress_token_ids", suppress_token_ids);
    v("bad_words_ids", bad_words_ids);
    v("pad_token_id", pad_token_id);
    v("seed", seed);
    v("return_log_probs", return_log_probs);
    v("num_assistant_tokens", num_assistant_tokens);
    v("adaptive_draft", adaptive_draft);
    v("prompt_lookup_num_tokens", prompt_lookup_num_tokens);
    v("max_matching_ngram_size", max_matching_ngram_size);
    v("kv_cache_dtype", kv_cache_dtype);
  }
};

// Why a sequence ended: its last token is an EOS id, the token callback found a stop (a stop
// string), or it ran out of room (max_new_tokens).
enum class FinishReason : int8_t { kLength = 0, kEos = 1, kStop = 2 };

struct GenerationResult {
  // New tokens per prompt (EOS included when produced); beam search or sampling with
  // num_return_sequences = n gives n entries per prompt (beams best first), prompt i's at
  // [i·n, i·n + n).
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> log_probs;  // per new token, if requested
  std::vector<FinishReason> finish_reasons;   // per entry of tokens
  // Beam search: per entry, the hypothesis' final score (sum of its log-probabilities divided by
  // length^length_penalty: transformers' sequences_scores). Empty otherwise.
  std::vector<float> scores;
  // Speculative decoding: the model's forward passes after the prefill, the draft tokens it
  // checked and how many of them it kept.
  long target_passes = 0, draft_tokens = 0, accepted_tokens = 0;
};

// The cost-aware part of the adaptive schedule (greedy with a draft model): a round of
// speculation pays for the draft's steps and a verification pass over m + 1 positions, which
// saves time only when enough drafts are kept. Measured per round (running averages over rounds):
// the time per emitted token and the verification pass's time per position. A plain step costs at
// least that much (one pass over m + 1 positions is never slower than m + 1 steps), so rounds no
// dearer per token than a verified position win and nothing else is measured. Otherwise one plain
// step is timed, and while rounds cost more per emitted token than a plain step the run decodes
// plainly for a while (8 tokens, doubling while speculation keeps losing, at most 64), timing
// those steps too, then tries speculation again. Greedy output does not depend on the choice, so
// timing may decide it; sampling keeps the schedule fixed (a seed gives one output).
struct SpeculationCostGuard {
  using Clock = std::chrono::steady_clock;
  static constexpr long kMeasureSteps = 1, kRoundsToJudge = 3, kFirstBackoff = 8, kMaxBackoff = 64;
  bool enabled;
  long plain_left = 0;      // plain steps to take before speculating (again)
  bool measuring = false;   // those steps only measure a plain step (speculation was not judged losing)
  long backoff = kFirstBackoff;
  double step_seconds = 0.0, round_seconds_per_token = 0.0, verify_seconds_per_position = 0.0;
  long steps_measured = 0, rounds_measured = 0;

  explicit SpeculationCostGuard(bool on) : enabled(on) {}
  static double average(double mean, long n, double x) { return n == 0 ? x : 0.7 * mean + 0.3 * x; }
  static double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
  bool plain() const { return plain_left > 0; }
  void plain_step(double seconds) {
    if (!enabled) return;
    step_seconds = average(step_seconds, steps_measured++, seconds);
    if (plain_left > 0 && --plain_left == 0) {
      if (!measuring) rounds_measured = 0;  // after a fallback: judge the next rounds afresh
      measuring = false;
    }
  }
  // A speculative round: its time, the tokens it emitted, its verification pass's time and positions.
  void round(double seconds, long emitted, double verify, long positions) {
    if (!enabled || emitted < 1 || positions < 1) return;
    verify_seconds_per_position = average(verify_seconds_per_position, rounds_measured, verify / positions);
    round_seconds_per_token = average(round_seconds_per_token, rounds_measured++, seconds / emitted);
    if (rounds_measured < kRoundsToJudge) return;
    if (round_seconds_per_token <= verify_seconds_per_position) {  // no dearer than any plain step
      backoff = kFirstBackoff;
    } else if (steps_measured == 0) {
      plain_left = kMeasureSteps;
      measuring = true;
    } else if (round_seconds_per_token > step_seconds) {
      plain_left = backoff;
      backoff = std::min(2 * backoff, kMaxBackoff);
    } else {
      backoff = kFirstBackoff;
    }
  }
};

// One sequence's next token as greedy search and sampling choose it: the logits processors in
// transformers' order over scores [V] (modified in place; history: the tokens before the first
// new one, generated: the new ones so far, step = generated.size()), then the argmax, or warping
// (temperature, top-k, top-p) and a draw from rng. log_prob, if not null, receives the chosen
// token's log-probability under the processed distribution. Keeps its scratch between calls.
class TokenChooser {
 public:
  int64_t choose(const GenerationOptions& o, const std::vector<int64_t>& history, const std::vector<int64_t>& generated,
                 long step, float* scores, long V, std::mt19937_64& rng, float* log_prob);

 private:
  std::vector<float> tmp_, lp_;
  std::vector<int64_t> seq_;
};

// Whether token is one of o's EOS ids.
bool is_eos_token(const GenerationOptions& o, int64_t token);

// A token's log-probability under the model's own distribution (log_softmax of the raw logits,
// before any processor or warper) and the n most likely tokens of that distribution: what an
// OpenAI-style `logprobs` reports.
struct TokenLogProbs {
  int64_t token = -1;
  float log_prob = 0.0f;
  std::vector<std::pair<int64_t, float>> top;  // highest first; equal values: lower id first
};

// log(Σ exp(x[i])) over x[0, n), n >= 1 (SIMD max and exp, a double sum); -inf when every x[i]
// is -inf.
float log_sum_exp(const float* x, long n);

// Fills out->top with the n most likely tokens of raw logits x[0, V) (log_sum_exp lse), as
// (token, x[token] - lse); NaN logits are never listed. Does not set out->token / log_prob.
void top_log_probs(const float* x, long V, long n, float lse, TokenLogProbs* out);

// Greedy decoding's choice: the first index of the largest of scores[0, n), NaN never chosen (0 when
// scores[0] is NaN) — exactly `best = 0; for i: if (scores[i] > scores[best]) best = i`, computed
// with the vectorised row reductions of vector_math.h. n >= 1.
long greedy_argmax(const float* scores, long n);

// Called with (sequence index, token) as each token is chosen (greedy / sampling only; beam search
// reports each prompt's best sequence's tokens after the search). The sequence index is the
// prompt's; with sampling and num_return_sequences = n, prompt i's k-th sample is i·n + k.
// Returning true ends that sequence after this token, as an EOS would (a stop string was found;
// its finish reason is then kStop); beam search ignores it.
using TokenCallback = std::function<bool(long, int64_t)>;

// Prompts must be non-empty with ids in [0, V); options validated by the caller.
// assistant: a draft model's fresh session (same vocabulary) for speculative decoding, or null;
// with it, or with options.prompt_lookup_num_tokens > 0, the run drafts and verifies (one prompt,
// num_beams 1; the model must can_extend()). Greedy output is the plain loop's, token for token;
// sampling keeps the model's distribution (the speculative sampling acceptance rule).
//
// histories: the tokens the repetition penalty and no_repeat_ngram_size see before the first new
// token, one list per prompt; null means the prompts themselves (decoder-only LMs). An
// encoder-decoder passes its decoder start tokens: its prompt is the source, not the history.
GenerationResult generate(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, const TokenCallback& on_token = nullptr,
                          const std::vector<std::vector<int64_t>>* histories = nullptr, StepModel* assistant = nullptr);

}  // namespace cpuformer
