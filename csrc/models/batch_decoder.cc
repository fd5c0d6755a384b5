#include "models/batch_decoder.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "runtime/checked_size.h"

namespace cpuformer {

long BatchDecoder::prefill_budget(long decoding) const {
  if (prefill_slowdown_ <= 0 || decode_step_seconds_ <= 0 || prefill_token_seconds_ <= 0) return prefill_chunk_;
  // A step may last about s times a decode-only step of every request present (running or
  // waiting, up to the capacity): the measured decode-only step, plus one token's time for each
  // present request that is not decoding yet. Prompt tokens use that room, so that when few
  // sequences decode (a burst of arrivals) the prompts get more of each step instead of less.
  const long present = std::min(capacity_, static_cast<long>(running_.size() + waiting_.size()));
  const double tokens = (prefill_slowdown_ - 1) * decode_step_seconds_ / prefill_token_seconds_ +
                        prefill_slowdown_ * static_cast<double>(std::max(present - decoding, 0L));
  const long floor = std::min(kMinPrefillTokens, prefill_chunk_);
  if (!(tokens < static_cast<double>(prefill_chunk_))) return prefill_chunk_;
  return std::max(floor, static_cast<long>(tokens));
}

BatchDecoder::BatchDecoder(const DecoderModel& model, long capacity, long max_len, long prefill_chunk, KvType kv_type,
                           bool prefix_reuse)
    : model_(model),
      capacity_(capacity),
      max_len_(max_len),
      prefill_chunk_(prefill_chunk),
      prefix_reuse_(prefix_reuse) {
  const TransformerConfig& c = model.config();
  if (!model.complete()) throw std::logic_error("the decoder is missing layers or its head");
  if (capacity < 1) throw std::invalid_argument("capacity must be >= 1");
  if (max_len < 1 || max_len > c.max_positions) throw std::invalid_argument("max_len must be in [1, max_positions]");
  if (prefill_chunk < 1) throw std::invalid_argument("prefill_chunk must be >= 1");
  cache_.reset(c.num_layers, capacity, c.num_kv_heads, max_len, c.head_dim, kv_type);
  cache_.commit();  // page faults now, not in the steps that first reach each slot
  slots_.resize(capacity);
}

void BatchDecoder::add(long id, std::vector<int64_t> prompt, const GenerationOptions& o, long logprobs,
                       long prompt_logprobs) {
  if (prompt.empty() || static_cast<long>(prompt.size()) + o.max_new_tokens > max_len_ || o.max_new_tokens < 1) {
    throw std::logic_error("BatchDecoder::add: a request that does not fit (checked by the caller)");
  }
  Sequence seq;
  seq.id = id;
  seq.prompt = std::move(prompt);
  seq.options = o;
  seq.rng.seed(o.seed);
  seq.logprobs = logprobs;
  seq.prompt_logprobs = prompt_logprobs;
  waiting_.push_back(std::move(seq));
}

long BatchDecoder::running() const { return static_cast<long>(running_.size()); }

bool BatchDecoder::cancel(long id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->id == id) {
      waiting_.erase(it);
      return true;
    }
  }
  for (long i = 0; i < static_cast<long>(running_.size()); ++i) {
    if (running_[i].id == id) {
      finish(i, FinishReason::kStop, nullptr);
      return true;
    }
  }
  return false;
}

long BatchDecoder::shared_prefix(const Sequence& seq, long s) const {
  const std::vector<int64_t>& cached = slots_[s].tokens;
  const long n = std::min(static_cast<long>(cached.size()), static_cast<long>(seq.prompt.size()) - 1);
  long i = 0;
  while (i < n && cached[i] == seq.prompt[i]) ++i;
  return i;
}

void BatchDecoder::admit() {
  while (!waiting_.empty()) {
    Sequence& seq = waiting_.front();
    // The free slot to take: the longest cached prefix; else a slot used before, the one unused
    // the longest (its cached prefix is the stalest); a never-used slot last: the first writes
    // to its memory fault its pages in, which on some hosts stalls a step for tens of ms.
    auto age = [&](long s) { return slots_[s].last_used == 0 ? ~0UL : slots_[s].last_used; };
    long slot = -1, reused = -1;
    for (long s = 0; s < capacity_; ++s) {
      if (slots_[s].busy) continue;
      const long n = prefix_reuse_ && seq.prompt_logprobs < 0 ? shared_prefix(seq, s) : 0;
      if (n > reused || (n == reused && age(s) < age(slot))) {
        slot = s;
        reused = n;
      }
    }
    if (slot < 0) return;  // full: it waits
    Slot& mine = slots_[slot];
    mine.tokens.resize(reused);
    mine.busy = true;
    mine.last_used = ++clock_;
    seq.slot = slot;
    seq.computed = reused;
    stats_.reused_tokens += reused;
    running_.push_back(std::move(seq));  // (step() copies longer prefixes from running slots: catch_up)
    waiting_.erase(waiting_.begin());
  }
}

bool BatchDecoder::catch_up(long index) {
  Sequence& seq = running_[index];
  long from = -1, longest = seq.computed;
  for (long s = 0; s < capacity_; ++s) {
    if (s == seq.slot || !slots_[s].busy) continue;
    const long n = shared_prefix(seq, s);
    if (n > longest) {
      from = s;
      longest = n;
    }
  }
  if (from >= 0) {
    cache_.copy_slots(from, seq.slot, seq.computed, longest);
    std::vector<int64_t>& mine = slots_[seq.slot].tokens;
    mine.resize(seq.computed);
    mine.insert(mine.end(), slots_[from].tokens.begin() + seq.computed, slots_[from].tokens.begin() + longest);
    stats_.copied_tokens += longest - seq.computed;
    stats_.reused_tokens += longest - seq.computed;
    seq.computed = longest;
  }
  // An earlier request still computing a prefix this one shares: wait for it, then copy.
  for (long j = 0; j < index; ++j) {
    const Sequence& other = running_[j];
    if (!other.generated.empty()) continue;
    const long limit = std::min(static_cast<long>(other.prompt.size()), static_cast<long>(seq.prompt.size()) - 1);
    long n = 0;
    while (n < limit && other.prompt[n] == seq.prompt[n]) ++n;
    if (n >= seq.computed + kMinSharedPrefix && other.computed < n) return true;
  }
  return false;
}

void BatchDecoder::finish(long index, FinishReason reason, std::vector<BatchEvent>* events) {
  Sequence& seq = running_[index];
  if (events) {
    for (BatchEvent& e : *events) {
      if (e.id == seq.id) {
        e.finished = true;
        e.reason = reason;
      }
    }
  }
  Slot& slot = slots_[seq.slot];
  slot.busy = false;
  slot.last_used = ++clock_;
  running_.erase(running_.begin() + index);
}

std::vector<BatchEvent> BatchDecoder::step() {
  admit();
  std::vector<BatchEvent> events;
  if (running_.empty()) return events;
  const long V = model_.config().vocab_size;
  ids_.clear();
  positions_.clear();
  token_entry_.clear();
  logit_tokens_.clear();
  logit_sequences_.clear();
  logit_prompt_.clear();
  entries_.clear();
  fed_.clear();
  auto feed = [&](long i, long count, bool decoding) {
    (decoding ? stats_.decode_tokens : stats_.prefill_tokens) += count;
    Sequence& seq = running_[i];
    const long offset = static_cast<long>(ids_.size());
    for (long t = 0; t < count; ++t) {
      ids_.push_back(seq.token(seq.computed + t));
      positions_.push_back(seq.computed + t);
      token_entry_.push_back(static_cast<long>(entries_.size()));
    }
    entries_.push_back({seq.slot, seq.computed, count, offset});
    fed_.push_back(i);
    if (!decoding && seq.prompt_logprobs >= 0) {  // each prompt token after these positions
      const long P = static_cast<long>(seq.prompt.size());
      for (long t = 0; t < count && seq.computed + t + 1 < P; ++t) {
        logit_tokens_.push_back(offset + t);
        logit_sequences_.push_back(i);
        logit_prompt_.push_back(seq.computed + t + 1);
      }
    }
    if (seq.computed + count == seq.length()) {  // its last token: the next one is chosen
      logit_tokens_.push_back(offset + count - 1);
      logit_sequences_.push_back(i);
      logit_prompt_.push_back(-1);
    }
  };
  const long n = static_cast<long>(running_.size());
  for (long i = 0; i < n; ++i) {  // decoding sequences: their last chosen token
    if (!running_[i].generated.empty()) feed(i, 1, true);
  }
  const long decoding = static_cast<long>(entries_.size());
  long budget = decoding > 0 ? prefill_budget(decoding) : prefill_chunk_;
  stats_.prefill_budget = budget;
  for (long i = 0; i < n && budget > 0; ++i) {  // prompts, first come first served
    Sequence& seq = running_[i];
    if (!seq.generated.empty() || (prefix_reuse_ && seq.prompt_logprobs < 0 && catch_up(i))) continue;
    const long count = std::min(budget, seq.length() - seq.computed);
    feed(i, count, false);
    budget -= count;
  }
  const long N = static_cast<long>(ids_.size()), count = static_cast<long>(logit_tokens_.size());
  logits_.resize(static_cast<std::size_t>(checked_count({count, V}, "the logits of a batch step")));
  const auto start = std::chrono::steady_clock::now();
  model_.forward_ragged(cache_, ws_, ids_.data(), positions_.data(), N, entries_.data(),
                        static_cast<long>(entries_.size()), token_entry_.data(), logit_tokens_.data(), count,
                        logits_.data());
  if (decoding > 0) {
    // The cost model of prefill_budget(): a step costs a decode-only step plus a share per prompt
    // token. Running means (weight 1/4 for the newest step) follow a machine whose speed drifts.
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const long prompt_tokens = N - decoding;
    auto update = [](double* mean, double x) { *mean = *mean > 0 ? 0.75 * *mean + 0.25 * x : x; };
    if (prompt_tokens == 0) {
      update(&decode_step_seconds_, seconds);
    } else if (decode_step_seconds_ > 0) {
      update(&prefill_token_seconds_, std::max(seconds - decode_step_seconds_, 0.0) / prompt_tokens);
    }
  }
  for (std::size_t e = 0; e < entries_.size(); ++e) {
    Sequence& seq = running_[fed_[e]];
    std::vector<int64_t>& cached = slots_[seq.slot].tokens;
    for (long t = 0; t < entries_[e].count; ++t) cached.push_back(seq.token(seq.computed + t));
    seq.computed += entries_[e].count;
  }
  std::vector<std::pair<long, FinishReason>> ended;
  for (long j = 0; j < count; ++j) {
    Sequence& seq = running_[logit_sequences_[j]];
    float* row = logits_.data() + j * V;
    if (logit_prompt_[j] >= 0) {  // a prompt token's log-probability
      TokenLogProbs scored;
      scored.token = seq.prompt[logit_prompt_[j]];
      const float lse = log_sum_exp(row, V);
      scored.log_prob = row[scored.token] - lse;
      top_log_probs(row, V, seq.prompt_logprobs, lse, &scored);
      seq.prompt_scores.push_back(std::move(scored));
      continue;
    }
    const GenerationOptions& o = seq.options;
    BatchEvent event;
    event.id = seq.id;
    float lse = 0.0f;
    if (seq.logprobs >= 0) {  // the raw distribution, before the chooser processes the row
      lse = log_sum_exp(row, V);
      top_log_probs(row, V, seq.logprobs, lse, &event.logprobs);
      raw_.assign(row, row + V);
    }
    event.token = chooser_.choose(o, seq.prompt, seq.generated, static_cast<long>(seq.generated.size()), row, V,
                                  seq.rng, o.return_log_probs ? &event.log_prob : nullptr);
    if (seq.logprobs >= 0) {
      event.has_logprobs = true;
      event.logprobs.token = event.token;
      event.logprobs.log_prob = raw_[event.token] - lse;
    }
    if (seq.prompt_logprobs >= 0 && seq.generated.empty()) event.prompt_logprobs = std::move(seq.prompt_scores);
    seq.generated.push_back(event.token);
    const int64_t token = event.token;
    events.push_back(std::move(event));
    if (is_eos_token(o, token)) {
      ended.push_back({logit_sequences_[j], FinishReason::kEos});
    } else if (static_cast<long>(seq.generated.size()) >= o.max_new_tokens) {
      ended.push_back({logit_sequences_[j], FinishReason::kLength});
    }
  }
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [index, reason] : ended) finish(index, reason, &events);
  ++stats_.steps;
  stats_.last_batch = static_cast<long>(entries_.size());
  return events;
}

}  // namespace cpuformer
