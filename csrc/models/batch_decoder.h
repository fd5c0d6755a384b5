// Continuous batching for a decoder (docs/serving.md, "Continuous batching"): requests of
// different lengths and arrival times share every forward pass.
//
// The KV cache is allocated once for `capacity` slots of `max_len` positions (slot-based: each
// slot is one row of a KvCache, and a sequence owns one slot from its admission to its end). Each
// step() runs ONE forward pass over a ragged batch (layers/transformer_block.h, RaggedEntry):
//   - one token for every sequence that is decoding (its last chosen token);
//   - then up to `prefill_chunk` prompt tokens of sequences being prefilled, first come first
//     served (chunked prefill: a long prompt takes several steps, so the running streams keep
//     their latency). With a prefill slowdown s > 0 (set_prefill_slowdown) and sequences
//     decoding, the step takes fewer: as many as the measured cost of a prompt token lets the
//     step last s times a decode-only step of every request present (at least
//     kMinPrefillTokens);
// and chooses the next token of every sequence whose pass reached its last token, with that
// sequence's own options and random generator (seeded as generate() seeds a one-prompt run), so a
// request's output is the one generate() gives it alone: greedy token for token, and sampling with
// the same seed.
//
// Waiting requests are admitted first come first served when a slot is free. Prefix reuse: a slot
// keeps the keys and values of its last sequence after it ends; a new request takes the free slot
// whose cached tokens share the longest prefix with its prompt and starts its prefill after that
// prefix, and when a running sequence's slot shares a longer one (a system prompt of concurrent
// requests), the prefix's keys and values are copied from it instead of being computed; a
// request admitted while an earlier one is still computing a prefix they share (16 tokens or
// more) waits for it and copies. At least the prompt's last token is always computed (its
// logits choose the first new token).
//
// Not thread-safe: one thread drives a BatchDecoder (the server's worker).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "layers/kv_cache.h"
#include "models/decoder.h"
#include "models/generation.h"

namespace cpuformer {

// What one step produced for one request: a token (token ≥ 0) with its log-probability (when the
// request asked for them), and whether the request ended with it. With logprobs ≥ 0 (add()):
// the token's log-probability under the model's raw distribution and its `logprobs` most likely
// tokens (logprobs.token == token); with prompt_logprobs ≥ 0, the request's first event also
// carries prompt tokens 1 .. P-1, each under the distribution of the positions before it.
struct BatchEvent {
  long id = 0;
  int64_t token = -1;
  float log_prob = 0.0f;
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  bool has_logprobs = false;
  TokenLogProbs logprobs;
  std::vector<TokenLogProbs> prompt_logprobs;
};

struct BatchStats {
  long steps = 0;              // forward passes
  long decode_tokens = 0;      // tokens of decoding sequences fed
  long prefill_tokens = 0;     // prompt tokens computed
  long reused_tokens = 0;      // prompt tokens taken from a cached prefix instead
  long copied_tokens = 0;      // of those, copied from another slot
  long last_batch = 0;         // sequences in the last pass
  long prefill_budget = 0;     // prompt tokens the last step could take
};

class BatchDecoder {
 public:
  BatchDecoder(const DecoderModel& model, long capacity, long max_len, long prefill_chunk, KvType kv_type,
               bool prefix_reuse = true);

  long capacity() const { return capacity_; }
  long max_len() const { return max_len_; }
  std::size_t kv_bytes() const { return cache_.bytes(); }  // the KV cache, committed at creation
  // Queues a request: prompt ids in [0, V), prompt.size() + o.max_new_tokens ≤ max_len, options
  // as generate() takes them for greedy search or sampling of one sequence (num_beams 1, one
  // return sequence, no speculation): checked by the caller. ids are the caller's (unique among
  // the requests not yet ended). logprobs / prompt_logprobs ≥ 0: the raw log-probabilities of
  // the chosen tokens / of the prompt's tokens, with that many most likely alternatives
  // (BatchEvent); a request with prompt_logprobs computes its whole prompt (no prefix reuse).
  void add(long id, std::vector<int64_t> prompt, const GenerationOptions& o, long logprobs = -1,
           long prompt_logprobs = -1);
  // Ends a request now (waiting or running): true if it was there. Its slot is free at once.
  bool cancel(long id);
  // One forward pass and the tokens it chose (none when nothing is queued or running).
  std::vector<BatchEvent> step();
  // s > 0: while sequences are decoding, a step takes only as many prompt tokens as keep it
  // within about s times a decode-only step of every request present (running or waiting, up to
  // the capacity), from running estimates of the time of a decode-only step and of one more
  // prompt token (both measured on this machine as steps run): (s - 1) × decode step ÷ token
  // cost + s × (present requests not decoding), at least kMinPrefillTokens, at most
  // prefill_chunk. The second term keeps prompts flowing when few sequences decode (a budget
  // that shrank with the decode step would starve admission: fewer decoders, a faster step, fewer
  // prompt tokens). 0 (the default): up to prefill_chunk every step.
  // Only the schedule changes: every request's tokens stay those of generate() alone. Any other
  // value is safe (below 1: the floor; negative or NaN: off); Generator.batcher() accepts 0 or ≥ 1.
  void set_prefill_slowdown(double s) { prefill_slowdown_ = s; }
  static constexpr long kMinPrefillTokens = 4;

  long waiting() const { return static_cast<long>(waiting_.size()); }
  long running() const;
  const BatchStats& stats() const { return stats_; }

 private:
  struct Sequence {
    long id = 0;
    long slot = -1;
    std::vector<int64_t> prompt, generated;
    long computed = 0;  // tokens of prompt + generated whose keys and values are in the slot
    GenerationOptions options;
    std::mt19937_64 rng;
    long logprobs = -1, prompt_logprobs = -1;  // add()'s
    std::vector<TokenLogProbs> prompt_scores;  // prompt_logprobs so far (until the first token)
    long token(long i) const {
      const long p = static_cast<long>(prompt.size());
      return i < p ? prompt[i] : generated[i - p];
    }
    long length() const { return static_cast<long>(prompt.size() + generated.size()); }
  };
  struct Slot {
    bool busy = false;               // a running sequence owns it
    std::vector<int64_t> tokens;     // the tokens whose keys and values the slot holds, in order
    unsigned long last_used = 0;     // for choosing which cached prefix to overwrite
  };

  void admit();
  // Prefix reuse for running_[index] while it is prefilling: copies the keys and values of the
  // longest prefix another slot has computed beyond its own; true when an earlier request is
  // still computing a prefix of at least kMinSharedPrefix more tokens that this one shares (it
  // then waits a step instead of computing them twice).
  bool catch_up(long index);
  static constexpr long kMinSharedPrefix = 16;
  void finish(long index, FinishReason reason, std::vector<BatchEvent>* events);
  // Tokens that seq's prompt shares with the first cached tokens of slot s (at most prompt - 1).
  long shared_prefix(const Sequence& seq, long s) const;

  const DecoderModel& model_;
  long capacity_, max_len_, prefill_chunk_;
  bool prefix_reuse_;
  double prefill_slowdown_ = 0;
  double decode_step_seconds_ = 0;    // running mean of decode-only steps (0: none seen yet)
  double prefill_token_seconds_ = 0;  // running mean of a prompt token's share of a mixed step
  long prefill_budget(long decoding) const;
  KvCache cache_;
  DecoderModel::Workspace ws_;
  std::vector<Slot> slots_;
  std::vector<Sequence> waiting_;  // first come first served
  std::vector<Sequence> running_;  // admitted (prefilling or decoding)
  unsigned long clock_ = 0;
  TokenChooser chooser_;
  BatchStats stats_;
  // Scratch of a pass.
  std::vector<int64_t> ids_;
  std::vector<long> positions_, token_entry_, logit_tokens_, logit_sequences_;
  std::vector<long> logit_prompt_;  // per logit row: the prompt token it scores, -1: choose the next
  std::vector<float> raw_;           // a logit row before the chooser processes it
  std::vector<long> fed_;  // the running_ index of each entry
  std::vector<RaggedEntry> entries_;
  std::vector<float> logits_;
};

}  // namespace cpuformer
