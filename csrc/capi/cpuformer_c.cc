// The C API (include/cpuformer.h) over the C++ core: models opened by models/graph_loader.h, inputs
// checked by models/request_checks.h (the Python extension's checks and messages), every C++
// exception turned into a cf_status and a message here.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpuformer.h"
#include "kernels/gemm/gemm.h"
#include "layers/kv_cache.h"
#include "models/graph_loader.h"
#include "models/request_checks.h"
#include "runtime/checked_size.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

#ifndef CPUFORMER_VERSION
#define CPUFORMER_VERSION "unknown"
#endif

struct cf_model {
  std::mutex mutex;  // one call at a time (try_lock: a concurrent call gets CF_ERROR_BUSY)
  std::unique_ptr<cpuformer::GraphModel> graph;
  int num_threads = 0;
};

namespace {

constexpr int kMaxThreads = 1024;

// An error with its status, thrown inside the API functions and caught at the boundary.
struct Failure {
  cf_status status;
  std::string message;
};

[[noreturn]] void fail(cf_status status, const std::string& message) { throw Failure{status, message}; }

void set_error(cf_error* error, cf_status status, const std::string& message) {
  if (!error) return;
  error->status = status;
  std::snprintf(error->message, sizeof(error->message), "%s", message.c_str());
}

// Runs f, mapping every exception to a status: `invalid` is the status of std::invalid_argument
// (a bad argument in a call, a bad model at open).
template <class F>
cf_status guarded(cf_error* error, cf_status invalid, F&& f) {
  try {
    f();
    set_error(error, CF_OK, "");
    return CF_OK;
  } catch (const Failure& e) {
    set_error(error, e.status, e.message);
    return e.status;
  } catch (const cpuformer::FileError& e) {
    set_error(error, CF_ERROR_IO, e.what());
    return CF_ERROR_IO;
  } catch (const std::bad_alloc&) {
    set_error(error, CF_ERROR_OUT_OF_MEMORY, "out of memory");
    return CF_ERROR_OUT_OF_MEMORY;
  } catch (const cpuformer::SizeError& e) {
    set_error(error, CF_ERROR_INVALID_ARGUMENT, e.what());
    return CF_ERROR_INVALID_ARGUMENT;
  } catch (const std::invalid_argument& e) {
    set_error(error, invalid, e.what());
    return invalid;
  } catch (const std::exception& e) {
    set_error(error, CF_ERROR_INTERNAL, e.what());
    return CF_ERROR_INTERNAL;
  } catch (...) {
    set_error(error, CF_ERROR_INTERNAL, "unknown C++ exception");
    return CF_ERROR_INTERNAL;
  }
}

void require(const void* pointer, const char* name) {
  if (!pointer) fail(CF_ERROR_INVALID_ARGUMENT, std::string(name) + " is NULL");
}

void check_threads(int n, const char* what) {
  if (n < 0 || n > kMaxThreads) {
    fail(CF_ERROR_INVALID_ARGUMENT, std::string(what) + " must be 0 (the default) or 1.." +
                                        std::to_string(kMaxThreads) + ", got " + std::to_string(n));
  }
}

// The model's lock for one call: CF_ERROR_BUSY when another thread holds it, CF_ERROR_CLOSED
// after cf_model_close.
std::unique_lock<std::mutex> enter(cf_model* model) {
  require(model, "model");
  std::unique_lock<std::mutex> lock(model->mutex, std::try_to_lock);
  if (!lock.owns_lock()) fail(CF_ERROR_BUSY, "another thread is inside a call on this model");
  if (!model->graph) fail(CF_ERROR_CLOSED, "the model is closed");
  return lock;
}

const char* kind_text(cpuformer::ModelKind kind) {
  switch (kind) {
    case cpuformer::ModelKind::kEncoder: return "an encoder";
    case cpuformer::ModelKind::kDecoder: return "a decoder";
    case cpuformer::ModelKind::kSeq2Seq: return "an encoder-decoder";
  }
  return "?";
}

long product(std::size_t a, std::size_t b, const char* what) {
  std::size_t out = 0;
  if (__builtin_mul_overflow(a, b, &out) || out > static_cast<std::size_t>(std::numeric_limits<long>::max())) {
    fail(CF_ERROR_INVALID_ARGUMENT, std::string(what) + " is too large");
  }
  return static_cast<long>(out);
}

// Shared by cf_encode and cf_embed: the checked inputs and the hidden states (skip_padding: the
// padded rows zero and, where the encoder can, never computed; first_only: row 0 of each sequence
// alone; EncoderModel::forward).
void encode(cf_model* model, const int64_t* ids, const int64_t* mask, const int64_t* types, std::size_t batch,
            std::size_t seq_len, float* out, bool skip_padding = false, bool first_only = false) {
  const cpuformer::GraphModel& g = *model->graph;
  if (!g.encoder) {
    fail(CF_ERROR_WRONG_KIND, std::string("this model is ") + kind_text(g.config.kind) +
                                  "; cf_encode and cf_embed "
                                  "run encoders (use cf_generate)");
  }
  if (batch == 0 || seq_len == 0) fail(CF_ERROR_INVALID_ARGUMENT, "batch and seq_len must be >= 1");
  const long B = static_cast<long>(batch), T = static_cast<long>(seq_len);
  cpuformer::check_encoder_inputs(g.config, ids, mask, types, B, T);
  cpuformer::ScopedNumThreads threads(model->num_threads);
  cpuformer::ComputeSlots slots(cpuformer::current_num_threads());
  g.encoder->forward(ids, mask, types, B, T, out, nullptr, nullptr, skip_padding, first_only);
}

}  // namespace

extern "C" {

const char* cf_version(void) { return CPUFORMER_VERSION; }

const char* cf_status_name(cf_status status) {
  switch (status) {
    case CF_OK: return "CF_OK";
    case CF_ERROR_INVALID_ARGUMENT: return "CF_ERROR_INVALID_ARGUMENT";
    case CF_ERROR_IO: return "CF_ERROR_IO";
    case CF_ERROR_INVALID_MODEL: return "CF_ERROR_INVALID_MODEL";
    case CF_ERROR_WRONG_KIND: return "CF_ERROR_WRONG_KIND";
    case CF_ERROR_BUFFER_TOO_SMALL: return "CF_ERROR_BUFFER_TOO_SMALL";
    case CF_ERROR_OUT_OF_MEMORY: return "CF_ERROR_OUT_OF_MEMORY";
    case CF_ERROR_BUSY: return "CF_ERROR_BUSY";
    case CF_ERROR_CLOSED: return "CF_ERROR_CLOSED";
    case CF_ERROR_INTERNAL: return "CF_ERROR_INTERNAL";
  }
  return "CF_ERROR_UNKNOWN";
}

void cf_open_options_init(cf_open_options* options) {
  if (!options) return;
  options->dtype = nullptr;
  options->num_threads = 0;
}

cf_status cf_model_open(const char* path, const cf_open_options* options, cf_model** model, cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_MODEL, [&] {
    require(model, "model (the output pointer)");
    *model = nullptr;
    require(path, "path");
    cf_open_options o;
    cf_open_options_init(&o);
    if (options) o = *options;
    check_threads(o.num_threads, "num_threads");
    if (o.dtype) {
      const std::string d = o.dtype;
      if (d != "float32" && d != "float16" && d != "bfloat16" && d != "int8" && d != "int4") {
        fail(CF_ERROR_INVALID_ARGUMENT,
             "dtype must be NULL, 'float32', 'float16', 'bfloat16', 'int8' or 'int4', got '" + d + "'");
      }
    }
    auto handle = std::make_unique<cf_model>();
    try {  // (a converted directory in another dtype is refused before its weights are read)
      handle->graph = cpuformer::load_graph(path, o.dtype ? o.dtype : "");
    } catch (const cpuformer::ConvertedDtype& e) {
      fail(CF_ERROR_INVALID_ARGUMENT, e.what());
    }
    handle->num_threads = o.num_threads;
    *model = handle.release();
  });
}

cf_status cf_model_close(cf_model* model, cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    require(model, "model");
    std::unique_lock<std::mutex> lock(model->mutex, std::try_to_lock);
    if (!lock.owns_lock()) fail(CF_ERROR_BUSY, "another thread is inside a call on this model");
    model->graph.reset();
  });
}

void cf_model_free(cf_model* model) {
  if (!model) return;
  {
    std::lock_guard<std::mutex> lock(model->mutex);
  }  // a call still running finishes first
  delete model;
}

cf_status cf_model_get_info(const cf_model* model, cf_model_info* info, cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    require(info, "info");
    auto lock = enter(const_cast<cf_model*>(model));
    const cpuformer::GraphModel& g = *model->graph;
    const cpuformer::TransformerConfig& c = g.config;
    std::memset(info, 0, sizeof(*info));
    info->kind = c.kind == cpuformer::ModelKind::kEncoder   ? CF_ENCODER
                 : c.kind == cpuformer::ModelKind::kDecoder ? CF_DECODER
                                                            : CF_SEQ2SEQ;
    info->vocab_size = c.vocab_size;
    info->hidden_size = c.hidden_size;
    info->num_layers = c.num_layers;
    info->max_positions = c.kind == cpuformer::ModelKind::kEncoder ? c.max_seq_len() : c.max_positions;
    std::snprintf(info->dtype, sizeof(info->dtype), "%s", g.dtype.c_str());
    std::snprintf(info->architecture, sizeof(info->architecture), "%s", g.architecture.c_str());
  });
}

cf_status cf_encode(cf_model* model, const int64_t* input_ids, const int64_t* attention_mask,
                    const int64_t* token_type_ids, size_t batch, size_t seq_len, float* out, size_t out_len,
                    cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    auto lock = enter(model);
    require(input_ids, "input_ids");
    require(out, "out");
    const long rows = product(batch, seq_len, "batch × seq_len");
    const long needed = product(static_cast<std::size_t>(rows), model->graph->config.hidden_size, "the output");
    if (static_cast<std::size_t>(needed) > out_len) {
      fail(CF_ERROR_BUFFER_TOO_SMALL, "out holds " + std::to_string(out_len) + " floats; the hidden states need " +
                                          std::to_string(needed) + " (batch × seq_len × hidden_size)");
    }
    encode(model, input_ids, attention_mask, token_type_ids, batch, seq_len, out);
  });
}

cf_status cf_embed(cf_model* model, const int64_t* input_ids, const int64_t* attention_mask, size_t batch,
                   size_t seq_len, int pooling, int normalize, float* out, size_t out_len, cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    auto lock = enter(model);
    require(input_ids, "input_ids");
    require(out, "out");
    if (pooling < CF_POOL_MEAN || pooling > CF_POOL_LAST) {
      fail(CF_ERROR_INVALID_ARGUMENT, "pooling must be CF_POOL_MEAN, CF_POOL_CLS, CF_POOL_MAX or CF_POOL_LAST, got " +
                                          std::to_string(static_cast<int>(pooling)));
    }
    const long H = model->graph->config.hidden_size;
    const long needed = product(batch, static_cast<std::size_t>(H), "the output");
    if (static_cast<std::size_t>(needed) > out_len) {
      fail(CF_ERROR_BUFFER_TOO_SMALL, "out holds " + std::to_string(out_len) + " floats; the embeddings need " +
                                          std::to_string(needed) + " (batch × hidden_size)");
    }
    const long T = static_cast<long>(seq_len);
    std::vector<float> hidden(
        static_cast<std::size_t>(product(static_cast<std::size_t>(product(batch, seq_len, "batch × seq_len")),
                                         static_cast<std::size_t>(H), "the hidden states")));
    // Pooling reads unpadded rows only, except CLS of a sequence without any (row 0, as computed).
    bool skip_padding = attention_mask != nullptr;
    for (std::size_t b = 0; b < batch && skip_padding && pooling == CF_POOL_CLS; ++b) {
      bool any = false;
      for (long t = 0; t < T && !any; ++t) any = attention_mask[b * T + t] > 0;
      skip_padding = any;
    }
    // CLS reads row 0 alone when every sequence's row 0 is a token: the last layer runs for it only.
    bool first_only = pooling == CF_POOL_CLS;
    for (std::size_t b = 0; b < batch && first_only && attention_mask; ++b) first_only = attention_mask[b * T] > 0;
    encode(model, input_ids, attention_mask, nullptr, batch, seq_len, hidden.data(), skip_padding, first_only);
    // The pooling of cpuformer._sentence.pool: padded positions are selected out, not multiplied by 0.
    for (std::size_t b = 0; b < batch; ++b) {
      const float* h = hidden.data() + b * T * H;
      const int64_t* m = attention_mask ? attention_mask + b * T : nullptr;
      auto kept = [&](long t) { return !m || m[t] > 0; };
      float* e = out + b * H;
      if (pooling == CF_POOL_CLS || pooling == CF_POOL_LAST) {
        long pick = pooling == CF_POOL_CLS ? 0 : T - 1;
        bool any = false;
        if (pooling == CF_POOL_CLS) {
          for (long t = 0; t < T && !any; ++t) any = kept(t) && ((pick = t), true);
        } else {
          for (long t = T - 1; t >= 0 && !any; --t) any = kept(t) && ((pick = t), true);
        }
        for (long j = 0; j < H; ++j) e[j] = (any || pooling == CF_POOL_CLS) ? h[pick * H + j] : 0.0f;
      } else if (pooling == CF_POOL_MAX) {
        for (long j = 0; j < H; ++j) e[j] = -std::numeric_limits<float>::infinity();
        for (long t = 0; t < T; ++t) {
          if (!kept(t)) continue;
          for (long j = 0; j < H; ++j) e[j] = std::max(e[j], h[t * H + j]);
        }
      } else {
        float count = 0.0f;
        for (long j = 0; j < H; ++j) e[j] = 0.0f;
        for (long t = 0; t < T; ++t) {
          if (!kept(t)) continue;
          count += 1.0f;
          for (long j = 0; j < H; ++j) e[j] += h[t * H + j];
        }
        count = std::max(count, 1e-9f);
        for (long j = 0; j < H; ++j) e[j] /= count;
      }
      if (normalize) {
        double sum = 0.0;
        for (long j = 0; j < H; ++j) sum += static_cast<double>(e[j]) * e[j];
        const float norm = std::max(static_cast<float>(std::sqrt(sum)), 1e-12f);
        for (long j = 0; j < H; ++j) e[j] /= norm;
      }
    }
  });
}

void cf_generate_options_init(cf_generate_options* options) {
  if (!options) return;
  std::memset(options, 0, sizeof(*options));
  options->max_new_tokens = 20;
  options->temperature = 1.0;
  options->top_p = 1.0;
  options->repetition_penalty = 1.0;
  options->num_beams = 1;
  options->length_penalty = 1.0;
}

cf_status cf_generate(cf_model* model, const int64_t* prompt, size_t prompt_len, const cf_generate_options* options,
                      cf_token_callback callback, void* user_data, int64_t* out_tokens, size_t capacity,
                      size_t* out_count, cf_finish_reason* finish, cf_error* error) {
  if (out_count) *out_count = 0;
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    auto lock = enter(model);
    const cpuformer::GraphModel& g = *model->graph;
    if (g.encoder)
      fail(CF_ERROR_WRONG_KIND, "this model is an encoder; cf_generate runs decoders and encoder-decoders");
    require(prompt, "prompt");
    require(out_tokens, "out_tokens");
    if (prompt_len == 0) fail(CF_ERROR_INVALID_ARGUMENT, "prompt_len must be >= 1");
    cf_generate_options opt;
    cf_generate_options_init(&opt);
    if (options) opt = *options;
    // The option rules and messages of the Python API (models/request_checks.h).
    cpuformer::GenerationRequest request;
    request.max_new_tokens = opt.max_new_tokens;
    request.min_new_tokens = opt.min_new_tokens;
    request.do_sample = opt.do_sample != 0;
    request.temperature = opt.temperature;
    request.top_k = opt.top_k;
    request.top_p = opt.top_p;
    request.repetition_penalty = opt.repetition_penalty;
    request.num_beams = opt.num_beams;
    request.length_penalty = opt.length_penalty;
    request.no_repeat_ngram_size = opt.no_repeat_ngram_size;
    cpuformer::check_generation_request(request);
    if (opt.eos_count > 0) require(opt.eos_token_ids, "eos_token_ids (with eos_count > 0)");

    cpuformer::GenerationOptions o = g.generation;  // the model's defaults: eos, pad, forced tokens, banned words
    o.max_new_tokens = opt.max_new_tokens;
    o.min_new_tokens = opt.min_new_tokens;
    o.do_sample = opt.do_sample != 0;
    o.temperature = o.do_sample ? opt.temperature : 1.0;
    o.top_k = o.do_sample ? opt.top_k : 0;
    o.top_p = o.do_sample ? static_cast<float>(opt.top_p) : 1.0f;
    o.repetition_penalty = static_cast<float>(opt.repetition_penalty);
    o.num_beams = opt.num_beams;
    o.length_penalty = static_cast<float>(opt.length_penalty);
    o.no_repeat_ngram_size = opt.no_repeat_ngram_size;
    o.seed = opt.seed;
    o.num_return_sequences = 1;
    if (opt.eos_token_ids) o.eos_token_ids.assign(opt.eos_token_ids, opt.eos_token_ids + opt.eos_count);

    const std::vector<std::vector<int64_t>> prompts{std::vector<int64_t>(prompt, prompt + prompt_len)};
    if (g.decoder) {
      cpuformer::check_decoder_generation(g.config, prompts, o);
    } else {
      cpuformer::check_seq2seq_generation(g.config, prompts, o, g.decoder_start_token_id);
    }
    cpuformer::TokenCallback on_token;
    if (callback) {
      on_token = [&](long index, int64_t token) { return callback(user_data, static_cast<size_t>(index), token) != 0; };
    }
    const cpuformer::KvType kv_type = static_cast<cpuformer::KvType>(o.kv_cache_dtype);
    cpuformer::GenerationResult result;
    {
      cpuformer::ScopedNumThreads threads(model->num_threads);
      cpuformer::ComputeSlots slots(cpuformer::current_num_threads());
      if (g.decoder) {
        cpuformer::DecoderSession session(*g.decoder, kv_type);
        result = cpuformer::generate(session, prompts, o, on_token);
      } else {
        const std::vector<std::vector<int64_t>> histories{{g.decoder_start_token_id}};
        cpuformer::Seq2SeqSession session(*g.seq2seq, g.decoder_start_token_id, kv_type);
        result = cpuformer::generate(session, prompts, o, on_token, &histories);
      }
    }
    const std::vector<int64_t>& tokens = result.tokens.at(0);
    if (out_count) *out_count = tokens.size();
    if (finish) {
      const cpuformer::FinishReason r = result.finish_reasons.at(0);
      *finish = r == cpuformer::FinishReason::kEos    ? CF_FINISH_EOS
                : r == cpuformer::FinishReason::kStop ? CF_FINISH_STOPPED
                                                      : CF_FINISH_LENGTH;
    }
    if (tokens.size() > capacity) {
      std::copy(tokens.begin(), tokens.begin() + static_cast<long>(capacity), out_tokens);
      fail(CF_ERROR_BUFFER_TOO_SMALL, "out_tokens holds " + std::to_string(capacity) + " tokens; the generation made " +
                                          std::to_string(tokens.size()) + " (*out_count); give max_new_tokens or more");
    }
    std::copy(tokens.begin(), tokens.end(), out_tokens);
  });
}

cf_status cf_set_num_threads(int num_threads, cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    if (num_threads < 1 || num_threads > kMaxThreads) {
      fail(CF_ERROR_INVALID_ARGUMENT,
           "num_threads must be 1.." + std::to_string(kMaxThreads) + ", got " + std::to_string(num_threads));
    }
    cpuformer::set_default_num_threads(num_threads);
  });
}

cf_status cf_set_float32_matmul_precision(const char* precision, cf_error* error) {
  return guarded(error, CF_ERROR_INVALID_ARGUMENT, [&] {
    if (precision == nullptr)
      fail(CF_ERROR_INVALID_ARGUMENT, "float32 matmul precision must be 'highest' or 'high', got NULL");
    cpuformer::set_float32_matmul_precision(std::string(precision));  // invalid_argument: the message
  });
}

}  // extern "C"
