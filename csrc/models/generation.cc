#include "models/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "kernels/vector_math/vector_math.h"
#include "runtime/checked_size.h"
#include "runtime/interrupt.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// transformers' beam search marks impossible candidates by adding -1e9 in float32.
constexpr float kBeamNegLarge = -1.0e9f;

bool is_eos(const GenerationOptions& o, int64_t token) {
  return std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), token) != o.eos_token_ids.end();
}

// Hugging Face RepetitionPenaltyLogitsProcessor: each distinct previous token's score is divided
// by the penalty when positive and multiplied by it when negative.
void repetition_penalty(float penalty, const std::vector<int64_t>& prompt, const std::vector<int64_t>& generated,
                        float* scores) {
  if (penalty == 1.0f) return;
  std::unordered_set<int64_t> seen(prompt.begin(), prompt.end());
  seen.insert(generated.begin(), generated.end());
  for (int64_t t : seen) scores[t] = scores[t] < 0 ? scores[t] * penalty : scores[t] / penalty;
}

// OpenAI's logit_bias: a fixed amount added to chosen tokens' scores (transformers'
// SequenceBiasLogitsProcessor with one-token sequences).
void logit_bias(const GenerationOptions& o, float* scores) {
  for (size_t i = 0; i < o.logit_bias_ids.size(); ++i) scores[o.logit_bias_ids[i]] += o.logit_bias_values[i];
}

// OpenAI's presence and frequency penalties over the generated tokens (vLLM's reading: the
// prompt does not count): score -= count × frequency_penalty + (count > 0) × presence_penalty.
void presence_frequency_penalties(const GenerationOptions& o, const std::vector<int64_t>& generated, float* scores,
                                  std::vector<int64_t>& seq) {
  if ((o.presence_penalty == 0.0f && o.frequency_penalty == 0.0f) || generated.empty()) return;
  seq.assign(generated.begin(), generated.end());
  std::sort(seq.begin(), seq.end());
  for (size_t i = 0; i < seq.size();) {
    size_t j = i;
    while (j < seq.size() && seq[j] == seq[i]) ++j;
    scores[seq[i]] -= static_cast<float>(j - i) * o.frequency_penalty + o.presence_penalty;
    i = j;
  }
}

// NoRepeatNGramLogitsProcessor over history + generated: a token that would repeat an n-gram
// already present gets -inf.
void no_repeat_ngram(long n, const std::vector<int64_t>& history, const std::vector<int64_t>& generated, float* scores,
                     std::vector<int64_t>& seq) {
  if (n <= 0) return;
  seq.assign(history.begin(), history.end());
  seq.insert(seq.end(), generated.begin(), generated.end());
  const long len = static_cast<long>(seq.size());
  if (len + 1 < n) return;
  const int64_t* tail = seq.data() + len - (n - 1);
  for (long i = 0; i + n <= len; ++i) {
    if (std::equal(tail, tail + (n - 1), seq.data() + i)) scores[seq[i + n - 1]] = kNegInf;
  }
}

// suppress_token_ids, then bad_words_ids (transformers' NoBadWordsLogitsProcessor): a sequence's
// last token gets -inf where history + generated ends with the sequence's other tokens.
void suppress_tokens(const GenerationOptions& o, const std::vector<int64_t>& history,
                     const std::vector<int64_t>& generated, float* scores) {
  for (int64_t t : o.suppress_token_ids) scores[t] = kNegInf;
  const long h = static_cast<long>(history.size()), have = h + static_cast<long>(generated.size());
  for (const std::vector<int64_t>& word : o.bad_words_ids) {
    const long prefix = static_cast<long>(word.size()) - 1;
    if (prefix > have) continue;
    bool match = true;
    for (long i = 0; i < prefix && match; ++i) {
      const long at = have - prefix + i;
      match = (at < h ? history[at] : generated[at - h]) == word[i];
    }
    if (match) scores[word.back()] = kNegInf;
  }
}

// ForcedBOSTokenLogitsProcessor / ForcedEOSTokenLogitsProcessor: every other token gets -inf and
// the forced one 0, at the first step / the last allowed step.
void force_tokens(const GenerationOptions& o, long generated, float* scores, long V) {
  int64_t forced = -1;
  if (generated == 0 && o.forced_bos_token_id >= 0) forced = o.forced_bos_token_id;
  if (generated == o.max_new_tokens - 1 && o.forced_eos_token_id >= 0) forced = o.forced_eos_token_id;
  if (forced < 0) return;
  for (long i = 0; i < V; ++i) scores[i] = kNegInf;
  scores[forced] = 0.0f;
}

// MinNewTokensLengthLogitsProcessor: EOS is impossible before min_new_tokens.
void suppress_eos(const GenerationOptions& o, long generated, float* scores) {
  if (generated >= o.min_new_tokens) return;
  for (int64_t t : o.eos_token_ids) scores[t] = kNegInf;
}

// log_softmax in double; writes float32 (as the models' float32 pipeline would round).
void log_softmax(const float* x, float* y, long n) {
  double m = -std::numeric_limits<double>::infinity();
  for (long i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  double s = 0.0;
  for (long i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i]) - m);
  const double lse = m + std::log(s);
  for (long i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<double>(x[i]) - lse);
}

// Temperature, top-k and top-p warpers with transformers' semantics, in place.
//
// Dividing by the temperature is done last and as (score - max) / temperature in double, written
// back as float32: the most likely token maps to 0 and every other to a finite negative number or
// -inf, for any finite temperature > 0. The plain score / temperature overflows float32 below
// ~1e-38 (inf - inf = NaN in the softmax) and rounds distinct scores into ties near 1e38; this way
// a tiny temperature samples the argmax (uniformly among exact ties) and a huge one samples
// uniformly from the tokens top-k / top-p keep. Top-k and top-p decide on the untempered scores:
// dividing by a positive temperature keeps their order, so the same tokens survive as in
// transformers' order (temperature, then top-k, then top-p) computed exactly, and top-p weighs
// them with the tempered probabilities exp((score - max) / temperature) in double.
void warp(const GenerationOptions& o, float* scores, long V, std::vector<float>& tmp) {
  if (o.top_k > 0 && o.top_k < V) {
    tmp.assign(scores, scores + V);
    std::nth_element(tmp.begin(), tmp.begin() + (o.top_k - 1), tmp.end(), std::greater<float>());
    const float kth = tmp[o.top_k - 1];
    for (long i = 0; i < V; ++i) {
      if (scores[i] < kth) scores[i] = kNegInf;
    }
  }
  double m = -std::numeric_limits<double>::infinity();
  for (long i = 0; i < V; ++i) m = std::max(m, static_cast<double>(scores[i]));
  if (!std::isfinite(m)) return;  // nothing allowed (all -inf) or non-finite logits: sample() decides
  const double temperature = o.temperature;
  if (o.top_p < 1.0f) {
    // Ascending order; drop the tokens whose cumulative probability (from the least likely up) is
    // ≤ 1 - top_p, always keeping the most likely one.
    std::vector<long> order(V);
    std::iota(order.begin(), order.end(), 0L);
    std::stable_sort(order.begin(), order.end(), [&](long a, long b) { return scores[a] < scores[b]; });
    double total = 0.0;
    for (long i = 0; i < V; ++i) total += std::exp((static_cast<double>(scores[i]) - m) / temperature);
    double cumulative = 0.0;
    const double limit = 1.0 - static_cast<double>(o.top_p);
    for (long j = 0; j < V - 1; ++j) {
      cumulative += std::exp((static_cast<double>(scores[order[j]]) - m) / temperature) / total;
      if (cumulative > limit) break;
      scores[order[j]] = kNegInf;
    }
  }
  if (temperature != 1.0) {
    for (long i = 0; i < V; ++i) scores[i] = static_cast<float>((static_cast<double>(scores[i]) - m) / temperature);
  }
}

// Draws from softmax(scores) with a uniform from rng.
long sample(const float* scores, long V, std::mt19937_64& rng) {
  double m = -std::numeric_limits<double>::infinity();
  for (long i = 0; i < V; ++i) m = std::max(m, static_cast<double>(scores[i]));
  double total = 0.0;
  for (long i = 0; i < V; ++i) total += std::exp(static_cast<double>(scores[i]) - m);
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0) * total;
  double cumulative = 0.0;
  long last = 0;
  for (long i = 0; i < V; ++i) {
    if (scores[i] == kNegInf) continue;
    cumulative += std::exp(static_cast<double>(scores[i]) - m);
    last = i;
    if (u < cumulative) return i;
  }
  return last;
}

// Left-pads the prompts (each repeated `copies` times) into ids/mask [rows, T].
long pad_prompts(const std::vector<std::vector<int64_t>>& prompts, long copies, int64_t pad, std::vector<int64_t>& ids,
                 std::vector<int64_t>& mask) {
  long T = 0;
  for (const auto& p : prompts) T = std::max(T, static_cast<long>(p.size()));
  const long rows = static_cast<long>(prompts.size()) * copies;  // copies > 1: checked by the caller (Request::rows)
  const std::size_t count = checked_count({rows, T}, "the padded inputs");
  ids.assign(count, pad);
  mask.assign(count, 0);
  for (long r = 0; r < rows; ++r) {
    const auto& p = prompts[r / copies];
    const long offset = T - static_cast<long>(p.size());
    for (long t = 0; t < static_cast<long>(p.size()); ++t) {
      ids[r * T + offset + t] = p[t];
      mask[r * T + offset + t] = 1;
    }
  }
  return T;
}

// What a run asks for, to name the arguments when a size it implies is refused (SizeError).
struct Request {
  const std::vector<std::vector<int64_t>>& prompts;
  const GenerationOptions& options;

  // Rows per prompt: its beams, or its samples (sampling with num_return_sequences).
  long copies() const {
    if (options.num_beams > 1) return options.num_beams;
    return options.do_sample ? options.num_return_sequences : 1;
  }
  long rows() const {
    return checked_multiply(
        static_cast<long>(prompts.size()), copies(),
        options.num_beams > 1 ? "the beams (inputs × num_beams)" : "the samples (inputs × num_return_sequences)");
  }
  long longest() const {
    long n = 0;
    for (const auto& p : prompts) n = std::max(n, static_cast<long>(p.size()));
    return n;
  }
  std::string inputs() const {
    return std::to_string(prompts.size()) + (prompts.size() == 1 ? " input" : " inputs") + " of up to " +
           std::to_string(longest()) + " tokens";
  }
  // Buffers with one row per beam: blame the batch and num_beams.
  std::string batch() const {
    const std::string per_input = options.num_beams == 1 && copies() > 1
                                      ? "num_return_sequences " + std::to_string(copies())
                                      : "num_beams " + std::to_string(options.num_beams);
    return per_input + " × " + std::to_string(prompts.size()) + (prompts.size() == 1 ? " input" : " inputs");
  }
  // The model's state for the whole run (KV cache): blame the length first.
  std::string length() const {
    return "max_new_tokens " + std::to_string(options.max_new_tokens) + " (with num_beams " +
           std::to_string(options.num_beams) + " and " + inputs() + ")";
  }
  // The prefill's work on the inputs (an encoder pass over long sources): blame the inputs.
  std::string prefill() const { return inputs() + " (with num_beams " + std::to_string(options.num_beams) + ")"; }
};

// The logits processors in transformers' order (logit bias as its sequence_bias, repetition
// penalty, then OpenAI's presence / frequency penalties, no-repeat n-grams, bad words, min new
// tokens, forced BOS/EOS), on raw logits (greedy, sampling) or log-probabilities (beam search).
void process(const GenerationOptions& o, const std::vector<int64_t>& history, const std::vector<int64_t>& generated,
             long step, float* scores, long V, std::vector<int64_t>& seq) {
  logit_bias(o, scores);
  repetition_penalty(o.repetition_penalty, history, generated, scores);
  presence_frequency_penalties(o, generated, scores, seq);
  no_repeat_ngram(o.no_repeat_ngram_size, history, generated, scores, seq);
  suppress_tokens(o, history, generated, scores);
  suppress_eos(o, step, scores);
  force_tokens(o, step, scores, V);
}

GenerationResult greedy_or_sample(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                  const std::vector<std::vector<int64_t>>& histories, const GenerationOptions& o,
                                  const TokenCallback& on_token) {
  // One row per prompt, or per sample (num_return_sequences consecutive rows per prompt).
  const Request request{prompts, o};
  const long copies = request.copies(), B = static_cast<long>(prompts.size()) * copies, V = model.vocab_size();
  std::vector<int64_t> ids, mask;
  const long T = pad_prompts(prompts, copies, o.pad_token_id, ids, mask);
  std::vector<float> logits(static_cast<size_t>(B) * V);  // checked by row_buffers
  TokenChooser chooser;
  GenerationResult result;
  result.tokens.resize(B);
  result.finish_reasons.assign(B, FinishReason::kLength);
  if (o.return_log_probs) result.log_probs.resize(B);
  std::vector<char> finished(B, 0);
  std::vector<int64_t> next(B, o.pad_token_id);
  std::mt19937_64 rng(o.seed);
  with_size_context([&] { return request.prefill(); },
                    [&] { model.prefill(ids.data(), mask.data(), B, T, copies, o.max_new_tokens, logits.data()); });
  for (long step = 0; step < o.max_new_tokens; ++step) {
    throw_if_interrupted();  // Ctrl-C between steps (runtime/interrupt.h)
    if (step > 0) model.step(next.data(), logits.data());
    long running = 0;
    for (long b = 0; b < B; ++b) {
      if (finished[b]) {
        next[b] = o.pad_token_id;
        continue;
      }
      float log_prob = 0.0f;
      const int64_t token = chooser.choose(o, histories[b / copies], result.tokens[b], step, logits.data() + b * V, V,
                                           rng, o.return_log_probs ? &log_prob : nullptr);
      if (o.return_log_probs) result.log_probs[b].push_back(log_prob);
      result.tokens[b].push_back(token);
      next[b] = token;
      const bool stop = on_token && on_token(b, token);
      if (stop || is_eos(o, token)) {
        finished[b] = 1;
        result.finish_reasons[b] = is_eos(o, token) ? FinishReason::kEos : FinishReason::kStop;
      } else {
        ++running;
      }
    }
    if (running == 0) break;
  }
  return result;
}

// log_softmax in float32 with the SIMD max / exp (a double sum): beam search runs it over every
// beam's full vocabulary each step. y may alias x.
void log_softmax_fast(const float* x, float* y, long n) {
  const VectorMathKernels& vm = vector_math_kernels();
  const float m = vm.max_value(x, n);
  if (m == -std::numeric_limits<float>::infinity()) {
    if (y != x) std::copy(x, x + n, y);
    return;
  }
  const float lse = m + static_cast<float>(std::log(vm.sum_exp(x, n, m)));
  for (long i = 0; i < n; ++i) y[i] = x[i] - lse;
}

struct ScoredIndex {
  float score;
  long index;  // beam · V + token within the prompt's beams
};

// Higher score first; equal scores by lower index (a deterministic, stable tie rule).
bool better(const ScoredIndex& x, const ScoredIndex& y) {
  return x.score > y.score || (x.score == y.score && x.index < y.index);
}

// The `keep` best of a[t] + offset over t in [0, V) (as better() orders them, indices offset by
// `base`) into out, in any order. A running worst-of-the-kept makes this one pass over V, and the
// vectorised find_greater skips the (vast majority of) tokens that cannot displace it: a later
// token with a score equal to the worst is never better (its index is larger).
void add_and_top_candidates(const float* a, float offset, long V, long keep, long base, ScoredIndex* out) {
  const VectorMathKernels& vm = vector_math_kernels();
  long count = 0, worst = 0;
  for (long t = 0; t < V && count < keep; ++t) out[count++] = ScoredIndex{a[t] + offset, base + t};
  if (count < keep) return;
  for (long i = 1; i < keep; ++i)
    if (better(out[worst], out[i])) worst = i;
  for (long t = keep; t < V; ++t) {
    t += vm.find_greater(a + t, V - t, offset, out[worst].score);
    if (t >= V) break;
    out[worst] = ScoredIndex{a[t] + offset, base + t};
    worst = 0;
    for (long i = 1; i < keep; ++i)
      if (better(out[worst], out[i])) worst = i;
  }
}

struct Hypothesis {
  std::vector<int64_t> tokens;
  std::vector<float> log_probs;
  float score = kBeamNegLarge;
  bool finished = false;
};

struct Candidate {
  float score;
  long beam;
  int64_t token;
  float log_prob;
};

// Candidates beam search keeps per prompt and step: 2·beams (more with several EOS ids), at most
// every token of every beam.
long beam_candidates(const GenerationOptions& o, long V) {
  const long stops = checked_add(1, static_cast<long>(o.eos_token_ids.size()), "the stop tokens");
  return std::min(checked_multiply(std::max<long>(2, stops), o.num_beams, "the beam candidates"),
                  checked_multiply(o.num_beams, V, "the beam candidates"));
}

// Checks the sizes of the loop's buffers with one row per beam (without allocating them) and
// returns the row count, prompts × num_beams.
long row_buffers(const Request& request, long V) {
  const GenerationOptions& o = request.options;
  const long rows = request.rows();
  checked_bytes({rows, V}, sizeof(float), "the logits");
  checked_bytes({rows, request.longest()}, 2 * sizeof(int64_t), "the padded inputs and their mask");
  if (o.num_beams > 1) {
    checked_bytes({rows, std::min(beam_candidates(o, V), V)}, sizeof(ScoredIndex), "the beam candidates");
    checked_bytes({rows, 2}, sizeof(Hypothesis), "the beam hypotheses");
  }
  return rows;
}

// transformers' vectorised _beam_search (top 2·beams continuations per prompt, finished
// hypotheses kept in a num_beams-sized pool, the early-stopping heuristic), one prompt at a time
// for the bookkeeping and all prompts' beams at once through the model.
GenerationResult beam_search(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                             const std::vector<std::vector<int64_t>>& histories, const GenerationOptions& o,
                             const TokenCallback& on_token) {
  const long B = static_cast<long>(prompts.size()), nb = o.num_beams, V = model.vocab_size();
  const Request request{prompts, o};
  const long rows = B * nb;  // checked, with every buffer below, by generate() (row_buffers)
  const long keep = beam_candidates(o, V), per_row = std::min(keep, V);  // candidates kept per beam row
  std::vector<int64_t> ids, mask;
  const long T = pad_prompts(prompts, nb, o.pad_token_id, ids, mask);
  std::vector<float> logits(static_cast<size_t>(rows) * V);
  std::vector<ScoredIndex> best(static_cast<size_t>(rows) * per_row);
  std::vector<std::vector<Hypothesis>> running(B, std::vector<Hypothesis>(nb));
  std::vector<std::vector<Hypothesis>> done(B, std::vector<Hypothesis>(nb));
  for (long b = 0; b < B; ++b) {
    for (long k = 0; k < nb; ++k) running[b][k].score = k == 0 ? 0.0f : kBeamNegLarge;
  }
  std::vector<char> improvable(B, 1);
  std::vector<int64_t> next(rows);
  std::vector<long> source(rows);
  std::vector<long> order;
  auto length_factor = [&](long length) {
    return static_cast<float>(std::pow(static_cast<double>(length), static_cast<double>(o.length_penalty)));
  };
  with_size_context([&] { return request.prefill(); },
                    [&] { model.prefill(ids.data(), mask.data(), rows, T, nb, o.max_new_tokens, logits.data()); });
  for (long generated = 0;; ++generated) {
    throw_if_interrupted();
    if (generated > 0) model.step(next.data(), logits.data());
    const bool at_max = generated + 1 >= o.max_new_tokens;
    bool all_hit = true;
    // Per row (in parallel): log-probabilities, processors, + beam score, and the row's best
    // `keep` candidates. The best `keep` of a prompt are among its rows' best `keep`.
    parallel_ranges(rows, 1, [&](long r0, long r1) {
      std::vector<int64_t> seq;
      for (long r = r0; r < r1; ++r) {
        const long b = r / nb, k = r % nb;
        float* a = logits.data() + r * V;
        log_softmax_fast(a, a, V);
        process(o, histories[b], running[b][k].tokens, generated, a, V, seq);
        add_and_top_candidates(a, running[b][k].score, V, per_row, k * V, best.data() + r * per_row);
      }
    });
    for (long b = 0; b < B; ++b) {
      ScoredIndex* pool = best.data() + b * nb * per_row;
      std::partial_sort(pool, pool + keep, pool + nb * per_row, better);
      order.resize(keep);
      for (long i = 0; i < keep; ++i) order[i] = pool[i].index;
      const float* all = logits.data() + b * nb * V;
      std::vector<Candidate> cands(keep);
      std::vector<char> hits(keep);
      for (long i = 0; i < keep; ++i) {
        const long beam = order[i] / V;
        const int64_t token = order[i] % V;
        const float score = all[order[i]] + running[b][beam].score;  // as add_and_top_candidates scored it
        cands[i] = {score, beam, token, score - running[b][beam].score};
        hits[i] = at_max || is_eos(o, token);
        all_hit = all_hit && hits[i];
      }
      // Finished pool: the first nb candidates that hit a stop, scored with the length penalty.
      bool pool_full = true;
      for (const Hypothesis& h : done[b]) pool_full = pool_full && h.finished;
      std::vector<Hypothesis> merged = done[b];
      if (improvable[b] && !(pool_full && o.early_stopping == 1)) {
        for (long i = 0; i < nb; ++i) {
          if (!hits[i]) continue;
          Hypothesis h = running[b][cands[i].beam];
          h.tokens.push_back(cands[i].token);
          h.log_probs.push_back(cands[i].log_prob);
          h.score = cands[i].score / length_factor(generated + 1);
          h.finished = true;
          merged.push_back(std::move(h));
        }
      }
      std::stable_sort(merged.begin(), merged.end(),
                       [](const Hypothesis& x, const Hypothesis& y) { return x.score > y.score; });
      merged.resize(nb);
      done[b] = std::move(merged);
      // Running beams: the best nb candidates that did not stop.
      std::vector<long> picked;
      for (long i = 0; i < keep && static_cast<long>(picked.size()) < nb; ++i) {
        if (!hits[i]) picked.push_back(i);
      }
      for (long i = 0; i < keep && static_cast<long>(picked.size()) < nb; ++i) {
        if (hits[i]) picked.push_back(i);  // (only at the last step, when every candidate stops)
      }
      std::vector<Hypothesis> next_running(nb);
      for (long k = 0; k < nb; ++k) {
        const Candidate& c = cands[picked[k]];
        next_running[k] = running[b][c.beam];
        next_running[k].tokens.push_back(c.token);
        next_running[k].log_probs.push_back(c.log_prob);
        next_running[k].score = hits[picked[k]] ? c.score + kBeamNegLarge : c.score;
        source[b * nb + k] = b * nb + c.beam;
        next[b * nb + k] = c.token;
      }
      running[b] = std::move(next_running);
      // Early-stopping heuristic: can the best running beam still beat the worst finished one?
      bool all_finished = true;
      float worst = std::numeric_limits<float>::infinity();
      for (const Hypothesis& h : done[b]) {
        all_finished = all_finished && h.finished;
        worst = std::min(worst, h.score);
      }
      const long best_length = (o.early_stopping == 2 && o.length_penalty > 0.0f) ? o.max_new_tokens : generated + 1;
      const float best_possible = running[b][0].score / length_factor(best_length);
      if (all_finished && !(best_possible > worst)) improvable[b] = 0;
    }
    bool any_improvable = false, every_pool_full = true;
    for (long b = 0; b < B; ++b) {
      any_improvable = any_improvable || improvable[b];
      for (const Hypothesis& h : done[b]) every_pool_full = every_pool_full && h.finished;
    }
    if (all_hit || !any_improvable || (every_pool_full && o.early_stopping == 1)) break;
    model.reorder(source.data());
  }
  const long n = o.num_return_sequences;
  GenerationResult result;
  result.tokens.resize(B * n);
  result.finish_reasons.resize(B * n);
  result.scores.resize(B * n);
  if (o.return_log_probs) result.log_probs.resize(B * n);
  for (long b = 0; b < B; ++b) {
    for (long k = 0; k < n; ++k) {
      // (The pool is full when the loop ends; a running beam stands in only if it were not.)
      const bool finished = done[b][k].finished;
      const Hypothesis& best = finished ? done[b][k] : running[b][k];
      result.tokens[b * n + k] = best.tokens;
      result.finish_reasons[b * n + k] =
          !best.tokens.empty() && is_eos(o, best.tokens.back()) ? FinishReason::kEos : FinishReason::kLength;
      result.scores[b * n + k] =
          finished ? best.score : best.score / length_factor(std::max<long>(1, static_cast<long>(best.tokens.size())));
      if (o.return_log_probs) result.log_probs[b * n + k] = best.log_probs;
      if (on_token && k == 0) {
        for (int64_t t : best.tokens) on_token(b, t);
      }
    }
  }
  return result;
}

// ---- speculative decoding ----------------------------------------------------------------

// softmax(scores) in double (the distribution sample() draws from).
void softmax(const float* scores, long V, std::vector<double>& p) {
  p.resize(V);
  double m = -std::numeric_limits<double>::infinity();
  for (long i = 0; i < V; ++i) m = std::max(m, static_cast<double>(scores[i]));
  double total = 0.0;
  for (long i = 0; i < V; ++i) total += (p[i] = std::isfinite(m) ? std::exp(static_cast<double>(scores[i]) - m) : 0.0);
  for (long i = 0; i < V; ++i) p[i] = total > 0.0 ? p[i] / total : 0.0;
}

double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0); }

// Draws from a distribution given as (not necessarily normalised) non-negative weights.
long sample_weights(const std::vector<double>& w, std::mt19937_64& rng) {
  double total = 0.0;
  for (double x : w) total += x;
  const double u = uniform(rng) * total;
  double cumulative = 0.0;
  long last = 0;
  for (long i = 0; i < static_cast<long>(w.size()); ++i) {
    if (w[i] <= 0.0) continue;
    cumulative += w[i];
    last = i;
    if (u < cumulative) return i;
  }
  return last;
}

// Prompt-lookup drafting (transformers' PromptLookupCandidateGenerator): the last n tokens of
// seq (n from max_ngram down to 1) are looked up earlier in seq; the first match's continuation,
// up to k tokens, is the draft.
long lookup_draft(const std::vector<int64_t>& seq, long max_ngram, long k, std::vector<int64_t>& draft) {
  const long len = static_cast<long>(seq.size());
  for (long n = std::min(max_ngram, len - 1); n >= 1; --n) {
    const int64_t* tail = seq.data() + len - n;
    for (long i = 0; i + n < len; ++i) {
      if (!std::equal(tail, tail + n, seq.data() + i)) continue;
      const long count = std::min(k, len - (i + n));
      draft.assign(seq.begin() + i + n, seq.begin() + i + n + count);
      return count;
    }
  }
  draft.clear();
  return 0;
}

// Draft-model state: the tokens of the output it has consumed, its logits after the last one.
struct DraftModel {
  StepModel& model;
  long consumed = 0;  // new tokens (of the output) in its cache
  long k;  // the draft length, adapted after each verification
  long k_max;
  std::vector<float> logits;  // [count, V] scratch
};

// One speculative run (one prompt, greedy or sampling): prefill, then rounds of (draft m tokens,
// verify the last token and the drafts in one pass of `model`, keep the longest accepted prefix
// plus the model's own next token, roll the rejected tail out of the caches).
GenerationResult speculative(StepModel& model, StepModel* assistant, const std::vector<int64_t>& prompt,
                             const std::vector<int64_t>& history, const GenerationOptions& o,
                             const TokenCallback& on_token) {
  const long V = model.vocab_size();
  const std::vector<std::vector<int64_t>> prompts{prompt};
  const Request request{prompts, o};
  std::vector<int64_t> ids, mask;
  const long T = pad_prompts(prompts, 1, o.pad_token_id, ids, mask);
  const long k_first = assistant ? o.num_assistant_tokens : o.prompt_lookup_num_tokens;
  const long k_max = assistant ? std::max<long>(k_first, 16) : k_first;
  std::vector<float> logits(checked_count({k_max + 1, V}, "the logits of the draft tokens")), tmp, lp;
  std::vector<double> p, residual;
  std::vector<std::vector<double>> q;  // the draft model's distributions (sampling)
  GenerationResult result;
  result.tokens.resize(1);
  result.finish_reasons.assign(1, FinishReason::kLength);
  if (o.return_log_probs) result.log_probs.resize(1);
  std::vector<int64_t>& out = result.tokens[0];
  std::vector<int64_t> seq, draft, with_draft, lookup(prompt);
  std::mt19937_64 rng(o.seed);
  bool finished = false;

  // Appends a chosen token; true when the run ends with it.
  auto emit = [&](int64_t token, const float* scores) {
    if (o.return_log_probs) {
      lp.resize(V);
      log_softmax(scores, lp.data(), V);
      result.log_probs[0].push_back(lp[token]);
    }
    out.push_back(token);
    const bool stop = on_token && on_token(0, token);
    finished = stop || is_eos(o, token) || static_cast<long>(out.size()) >= o.max_new_tokens;
    if (stop || is_eos(o, token))
      result.finish_reasons[0] = is_eos(o, token) ? FinishReason::kEos : FinishReason::kStop;
  };
  // The processed (and, sampling, warped) scores at a position whose output so far is `out`.
  auto scores_at = [&](float* s) {
    process(o, history, out, static_cast<long>(out.size()), s, V, seq);
    if (o.do_sample) warp(o, s, V, tmp);
  };
  auto choose = [&](float* s) -> int64_t { return o.do_sample ? sample(s, V, rng) : greedy_argmax(s, V); };

  with_size_context([&] { return request.prefill(); },
                    [&] { model.prefill(ids.data(), mask.data(), 1, T, 1, o.max_new_tokens, logits.data()); });
  std::unique_ptr<DraftModel> dm;
  if (assistant) {
    dm.reset(new DraftModel{*assistant, 0, k_first, k_max, std::vector<float>(static_cast<size_t>(V))});
    with_size_context(
        [&] { return request.prefill(); },
        [&] { assistant->prefill(ids.data(), mask.data(), 1, T, 1, o.max_new_tokens, dm->logits.data()); });
  }
  scores_at(logits.data());
  emit(choose(logits.data()), logits.data());
  SpeculationCostGuard guard(dm && o.adaptive_draft && !o.do_sample);

  while (!finished) {
    throw_if_interrupted();
    const long remaining = o.max_new_tokens - static_cast<long>(out.size());
    const SpeculationCostGuard::Clock::time_point round_start = SpeculationCostGuard::Clock::now();
    const long emitted_before = static_cast<long>(out.size());
    // Draft m ≤ k tokens (never past max_new_tokens: the model's own token follows them).
    long m = 0;
    draft.clear();
    if (guard.plain()) {
      // a plain step (measured, or speculation is not paying off): m stays 0
    } else if (dm) {
      const long k = std::min(dm->k, remaining - 1);
      if (k > 0) {
        const long lag = static_cast<long>(out.size()) - dm->consumed;  // ≥ 1: at least the last token
        if (static_cast<long>(dm->logits.size()) < lag * V) dm->logits.resize(static_cast<size_t>(lag) * V);
        if (lag == 1) {
          dm->model.step(&out.back(), dm->logits.data());
        } else {
          dm->model.extend(out.data() + dm->consumed, lag, dm->logits.data());
        }
        dm->consumed = static_cast<long>(out.size());
        float* s = dm->logits.data() + (lag - 1) * V;
        if (o.do_sample) q.resize(k);
        // The draft sees the output with its own draft so far, processed as the model will be.
        with_draft.assign(out.begin(), out.end());
        for (long i = 0; i < k; ++i) {
          process(o, history, with_draft, static_cast<long>(with_draft.size()), s, V, seq);
          int64_t d;
          if (o.do_sample) {
            warp(o, s, V, tmp);
            softmax(s, V, q[i]);
            d = sample_weights(q[i], rng);
          } else {
            d = greedy_argmax(s, V);
          }
          draft.push_back(d);
          with_draft.push_back(d);
          ++m;
          if (i + 1 == k || is_eos(o, d)) break;
          dm->model.step(&d, s);  // (fed tokens: the first m - 1 drafts)
        }
      }
    } else if (remaining > 1) {
      lookup.insert(lookup.end(), out.begin() + (lookup.size() - prompt.size()), out.end());  // prompt + out
      m = lookup_draft(lookup, o.max_matching_ngram_size, std::min(o.prompt_lookup_num_tokens, remaining - 1), draft);
    }
    if (m == 0) {
      const SpeculationCostGuard::Clock::time_point step_start = SpeculationCostGuard::Clock::now();
      model.step(&out.back(), logits.data());
      guard.plain_step(SpeculationCostGuard::since(step_start));
      ++result.target_passes;
      scores_at(logits.data());
      emit(choose(logits.data()), logits.data());
      continue;
    }
    // Verify: the last token and the m drafts in one pass; logits row j follows draft j - 1.
    draft.insert(draft.begin(), out.back());
    const SpeculationCostGuard::Clock::time_point verify_start = SpeculationCostGuard::Clock::now();
    model.extend(draft.data(), m + 1, logits.data());
    const double verify_seconds = SpeculationCostGuard::since(verify_start);
    ++result.target_passes;
    result.draft_tokens += m;
    long accepted = 0;
    for (long j = 0; j <= m && !finished; ++j) {
      float* s = logits.data() + j * V;
      scores_at(s);
      if (j == m) {  // every draft kept: the model's own next token comes free
        emit(choose(s), s);
        break;
      }
      const int64_t d = draft[j + 1];
      if (!o.do_sample) {
        const int64_t token = greedy_argmax(s, V);
        emit(token, s);
        if (token != d) break;
        ++accepted;
        continue;
      }
      // Speculative sampling: keep d with probability min(1, p(d) / q(d)); otherwise draw from
      // max(0, p - q) renormalised (q: the draft model's distribution, or all mass on d).
      softmax(s, V, p);
      const double qd = dm ? q[j][d] : 1.0;
      if (uniform(rng) * qd < p[d]) {
        emit(d, s);
        ++accepted;
        continue;
      }
      residual.assign(p.begin(), p.end());
      if (dm) {
        for (long i = 0; i < V; ++i) residual[i] = std::max(0.0, p[i] - q[j][i]);
      } else {
        residual[d] = 0.0;
      }
      double total = 0.0;
      for (double x : residual) total += x;
      emit(total > 0.0 ? sample_weights(residual, rng) : sample_weights(p, rng), s);
      break;
    }
    result.accepted_tokens += accepted;
    guard.round(SpeculationCostGuard::since(round_start), static_cast<long>(out.size()) - emitted_before,
                verify_seconds, m + 1);
    if (finished) break;
    model.rollback(m - accepted);  // the rejected drafts' cache entries
    if (dm) {
      const long kept = std::min(accepted, m - 1);  // of the m - 1 drafts the draft model consumed
      dm->model.rollback((m - 1) - kept);
      dm->consumed += kept;
      // transformers' "heuristic" schedule: longer drafts after a full match, shorter otherwise.
      if (o.adaptive_draft) dm->k = accepted == m ? std::min(dm->k + 2, dm->k_max) : std::max<long>(1, dm->k - 1);
    }
  }
  return result;
}

}  // namespace

int64_t TokenChooser::choose(const GenerationOptions& o, const std::vector<int64_t>& history,
                             const std::vector<int64_t>& generated, long step, float* scores, long V,
                             std::mt19937_64& rng, float* log_prob) {
  process(o, history, generated, step, scores, V, seq_);
  long token;
  if (o.do_sample) {
    warp(o, scores, V, tmp_);
    token = sample(scores, V, rng);
  } else {
    token = greedy_argmax(scores, V);
  }
  if (log_prob) {
    lp_.resize(V);
    log_softmax(scores, lp_.data(), V);
    *log_prob = lp_[token];
  }
  return token;
}

bool is_eos_token(const GenerationOptions& o, int64_t token) { return is_eos(o, token); }

float log_sum_exp(const float* x, long n) {
  const VectorMathKernels& vm = vector_math_kernels();
  const float m = vm.max_value(x, n);
  if (!std::isfinite(m)) return m;  // every logit -inf (or +inf somewhere): nothing to normalise
  return m + static_cast<float>(std::log(vm.sum_exp(x, n, m)));
}

void top_log_probs(const float* x, long V, long n, float lse, TokenLogProbs* out) {
  std::vector<std::pair<int64_t, float>>& top = out->top;
  top.clear();
  if (n <= 0) return;
  const long keep = std::min(n, V);
  top.reserve(static_cast<std::size_t>(keep) + 1);
  // One pass keeping the best `keep` in order: a logit enters only above the current last (a
  // strict > keeps the lower id first among equal values).
  for (long i = 0; i < V; ++i) {
    const float v = x[i];
    if (!(v == v)) continue;  // NaN
    if (static_cast<long>(top.size()) == keep && !(v > top.back().second)) continue;
    auto at = std::upper_bound(top.begin(), top.end(), v,
                               [](float value, const std::pair<int64_t, float>& e) { return value > e.second; });
    top.insert(at, {static_cast<int64_t>(i), v});
    if (static_cast<long>(top.size()) > keep) top.pop_back();
  }
  for (auto& e : top) e.second -= lse;
}

// The first index of the largest score, NaN never winning (0 when x[0] is NaN): the result of
// `if (x[i] > x[best]) best = i` over i, found with the vectorised row reductions (a max, then
// the first element that reaches it) instead of that dependent scalar loop. Greedy decoding runs
// it over the whole vocabulary of every row at every step.
long greedy_argmax(const float* x, long n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
  const VectorMathKernels& vm = vector_math_kernels();
  const float m = vm.max_value(x, n);  // ignores NaN; >= x[0]
  if (!(m > x[0])) return 0;           // x[0] is a maximum (the first one)
  // x[i] > the float just below m  <=>  x[i] >= m  <=>  x[i] == m (+0 and -0 alike, as `>` sees them).
  const long first = vm.find_greater(x, n, 0.0f, std::nextafter(m, -std::numeric_limits<float>::infinity()));
  if (first < n) return first;
  // Not found: only when the CPU treats subnormals as zero (a threshold of -0 for m = 0) — the loop.
  long best = 0;
  for (long i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

GenerationResult generate(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, const TokenCallback& on_token,
                          const std::vector<std::vector<int64_t>>* histories, StepModel* assistant) {
  if (prompts.empty()) throw std::invalid_argument("generate() needs at least one prompt");
  if (histories && histories->size() != prompts.size()) {
    throw std::invalid_argument("generate() needs one history per prompt");
  }
  if (options.num_return_sequences < 1) throw std::invalid_argument("num_return_sequences must be >= 1");
  if (options.num_beams > 1 && options.num_return_sequences > options.num_beams) {
    throw std::invalid_argument("num_return_sequences must be in [1, num_beams]");
  }
  if (options.num_beams == 1 && !options.do_sample && options.num_return_sequences > 1) {
    throw std::invalid_argument("num_return_sequences > 1 needs beam search or sampling");
  }
  const long returned = options.num_beams > 1 || options.do_sample ? options.num_return_sequences : 1;
  if (options.max_new_tokens < 1) {
    GenerationResult empty;
    empty.tokens.resize(prompts.size() * returned);
    empty.finish_reasons.assign(prompts.size() * returned, FinishReason::kLength);
    if (options.num_beams > 1) empty.scores.assign(prompts.size() * returned, 0.0f);
    if (options.return_log_probs) empty.log_probs.resize(prompts.size() * returned);
    return empty;
  }
  for (const std::vector<int64_t>& word : options.bad_words_ids) {
    if (word.empty()) throw std::invalid_argument("bad_words_ids must hold non-empty token-id lists");
    for (int64_t t : word) {
      if (t < 0 || t >= model.vocab_size()) {
        throw std::invalid_argument("bad_words_ids: token id " + std::to_string(t) + " is out of range [0, " +
                                    std::to_string(model.vocab_size()) + ")");
      }
    }
  }
  const std::vector<std::vector<int64_t>>& h = histories ? *histories : prompts;
  // Sizes first, allocations after: the per-row buffers (checked, blaming the batch and num_beams),
  // then the model's state for the whole length (allocated, blaming max_new_tokens), then the rest.
  const Request request{prompts, options};
  const long rows =
      with_size_context([&] { return request.batch(); }, [&] { return row_buffers(request, model.vocab_size()); });
  with_size_context([&] { return request.length(); },
                    [&] { model.reserve(rows, request.longest(), options.max_new_tokens); });
  const bool speculate = assistant != nullptr || options.prompt_lookup_num_tokens > 0;
  if (speculate) {
    if (prompts.size() != 1) {
      throw std::invalid_argument(
          "speculative decoding (assistant_model, prompt_lookup_num_tokens) takes one prompt, got " +
          std::to_string(prompts.size()));
    }
    if (options.num_beams > 1) {
      throw std::invalid_argument(
          "speculative decoding (assistant_model, prompt_lookup_num_tokens) does not combine "
          "with beam search (num_beams > 1)");
    }
    if (returned > 1) {
      throw std::invalid_argument(
          "speculative decoding (assistant_model, prompt_lookup_num_tokens) does not combine "
          "with num_return_sequences > 1");
    }
    if (!model.can_extend() || (assistant && !assistant->can_extend())) {
      throw std::invalid_argument("this model does not support speculative decoding");
    }
    if (assistant && assistant->vocab_size() != model.vocab_size()) {
      throw std::invalid_argument("the assistant model's vocabulary (" + std::to_string(assistant->vocab_size()) +
                                  " tokens) differs from the model's (" + std::to_string(model.vocab_size()) + ")");
    }
    if (assistant) {
      with_size_context([&] { return request.length(); },
                        [&] { assistant->reserve(rows, request.longest(), options.max_new_tokens); });
    }
    return speculative(model, assistant, prompts[0], h[0], options, on_token);
  }
  if (options.num_beams > 1) return beam_search(model, prompts, h, options, on_token);
  return greedy_or_sample(model, prompts, h, options, on_token);
}

void StepModel::extend(const int64_t* /*tokens*/, long /*count*/, float* /*logits*/) {
  throw std::logic_error("this model does not support speculative decoding");
}

void StepModel::rollback(long /*count*/) { throw std::logic_error("this model does not support speculative decoding"); }

}  // namespace cpuformer
