#include "models/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <unordered_set>

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

// MinNewTokensLengthLogitsProcessor: EOS is impossible before min_new_tokens.
void suppress_eos(const GenerationOptions& o, long generated, float* scores) {
  if (generated >= o.min_new_tokens) return;
  for (int64_t t : o.eos_token_ids) scores[t] = kNegInf;
}

long argmax(const float* x, long n) {
  long best = 0;
  for (long i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
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

// Temperature, top-k and top-p warpers in transformers' order and semantics, in place.
void warp(const GenerationOptions& o, float* scores, long V, std::vector<float>& tmp) {
  if (o.temperature != 1.0f) {
    for (long i = 0; i < V; ++i) scores[i] /= o.temperature;
  }
  if (o.top_k > 0 && o.top_k < V) {
    tmp.assign(scores, scores + V);
    std::nth_element(tmp.begin(), tmp.begin() + (o.top_k - 1), tmp.end(), std::greater<float>());
    const float kth = tmp[o.top_k - 1];
    for (long i = 0; i < V; ++i) {
      if (scores[i] < kth) scores[i] = kNegInf;
    }
  }
  if (o.top_p < 1.0f) {
    // Ascending order; drop the tokens whose cumulative probability (from the least likely up) is
    // ≤ 1 - top_p, always keeping the most likely one.
    std::vector<long> order(V);
    std::iota(order.begin(), order.end(), 0L);
    std::stable_sort(order.begin(), order.end(), [&](long a, long b) { return scores[a] < scores[b]; });
    double m = scores[order[V - 1]];
    double total = 0.0;
    for (long i = 0; i < V; ++i) total += std::exp(static_cast<double>(scores[i]) - m);
    double cumulative = 0.0;
    const double limit = 1.0 - static_cast<double>(o.top_p);
    for (long j = 0; j < V - 1; ++j) {
      cumulative += std::exp(static_cast<double>(scores[order[j]]) - m) / total;
      if (cumulative > limit) break;
      scores[order[j]] = kNegInf;
    }
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
long pad_prompts(const std::vector<std::vector<int64_t>>& prompts, long copies, int64_t pad,
                 std::vector<int64_t>& ids, std::vector<int64_t>& mask) {
  long T = 0;
  for (const auto& p : prompts) T = std::max(T, static_cast<long>(p.size()));
  const long rows = static_cast<long>(prompts.size()) * copies;
  ids.assign(rows * T, pad);
  mask.assign(rows * T, 0);
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

GenerationResult greedy_or_sample(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                  const GenerationOptions& o, const TokenCallback& on_token) {
  const long B = static_cast<long>(prompts.size()), V = model.vocab_size();
  std::vector<int64_t> ids, mask;
  const long T = pad_prompts(prompts, 1, o.pad_token_id, ids, mask);
  std::vector<float> logits(static_cast<size_t>(B) * V), tmp, lp(o.return_log_probs ? V : 0);
  GenerationResult result;
  result.tokens.resize(B);
  if (o.return_log_probs) result.log_probs.resize(B);
  std::vector<char> finished(B, 0);
  std::vector<int64_t> next(B, o.pad_token_id);
  std::mt19937_64 rng(o.seed);
  model.prefill(ids.data(), mask.data(), B, T, o.max_new_tokens, logits.data());
  for (long step = 0; step < o.max_new_tokens; ++step) {
    if (step > 0) model.step(next.data(), logits.data());
    long running = 0;
    for (long b = 0; b < B; ++b) {
      if (finished[b]) {
        next[b] = o.pad_token_id;
        continue;
      }
      float* s = logits.data() + b * V;
      repetition_penalty(o.repetition_penalty, prompts[b], result.tokens[b], s);
      suppress_eos(o, step, s);
      long token;
      if (o.do_sample) {
        warp(o, s, V, tmp);
        token = sample(s, V, rng);
      } else {
        token = argmax(s, V);
      }
      if (o.return_log_probs) {
        log_softmax(s, lp.data(), V);
        result.log_probs[b].push_back(lp[token]);
      }
      result.tokens[b].push_back(token);
      next[b] = token;
      if (on_token) on_token(b, token);
      if (is_eos(o, token)) {
        finished[b] = 1;
      } else {
        ++running;
      }
    }
    if (running == 0) break;
  }
  return result;
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

// transformers' vectorised _beam_search (top 2·beams continuations per prompt, finished
// hypotheses kept in a num_beams-sized pool, the early-stopping heuristic), one prompt at a time
// for the bookkeeping and all prompts' beams at once through the model.
GenerationResult beam_search(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                             const GenerationOptions& o, const TokenCallback& on_token) {
  const long B = static_cast<long>(prompts.size()), nb = o.num_beams, V = model.vocab_size(), rows = B * nb;
  const long keep = std::max<long>(2, 1 + static_cast<long>(o.eos_token_ids.size())) * nb;
  std::vector<int64_t> ids, mask;
  const long T = pad_prompts(prompts, nb, o.pad_token_id, ids, mask);
  std::vector<float> logits(static_cast<size_t>(rows) * V), lp(V), all(static_cast<size_t>(nb) * V);
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
  model.prefill(ids.data(), mask.data(), rows, T, o.max_new_tokens, logits.data());
  for (long generated = 0;; ++generated) {
    if (generated > 0) model.step(next.data(), logits.data());
    const bool at_max = generated + 1 >= o.max_new_tokens;
    bool all_hit = true;
    for (long b = 0; b < B; ++b) {
      for (long k = 0; k < nb; ++k) {
        float* s = logits.data() + (b * nb + k) * V;
        float* a = all.data() + k * V;
        log_softmax(s, a, V);
        repetition_penalty(o.repetition_penalty, prompts[b], running[b][k].tokens, a);
        suppress_eos(o, generated, a);
        const float base = running[b][k].score;
        for (long t = 0; t < V; ++t) a[t] += base;
      }
      order.resize(nb * V);
      std::iota(order.begin(), order.end(), 0L);
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](long x, long y) {
        return all[x] > all[y] || (all[x] == all[y] && x < y);
      });
      std::vector<Candidate> cands(keep);
      std::vector<char> hits(keep);
      for (long i = 0; i < keep; ++i) {
        const long beam = order[i] / V;
        const int64_t token = order[i] % V;
        cands[i] = {all[order[i]], beam, token, all[order[i]] - running[b][beam].score};
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
  GenerationResult result;
  result.tokens.resize(B);
  if (o.return_log_probs) result.log_probs.resize(B);
  for (long b = 0; b < B; ++b) {
    const Hypothesis& best = done[b][0].finished ? done[b][0] : running[b][0];
    result.tokens[b] = best.tokens;
    if (o.return_log_probs) result.log_probs[b] = best.log_probs;
    if (on_token) {
      for (int64_t t : best.tokens) on_token(b, t);
    }
  }
  return result;
}

}  // namespace

GenerationResult generate(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, const TokenCallback& on_token) {
  if (prompts.empty()) throw std::invalid_argument("generate() needs at least one prompt");
  if (options.max_new_tokens < 1) {
    GenerationResult empty;
    empty.tokens.resize(prompts.size());
    if (options.return_log_probs) empty.log_probs.resize(prompts.size());
    return empty;
  }
  if (options.num_beams > 1) return beam_search(model, prompts, options, on_token);
  return greedy_or_sample(model, prompts, options, on_token);
}

}  // namespace cpuformer
