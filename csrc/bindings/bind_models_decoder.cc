// cpuformer._core.DecoderModel: the decoder-only causal LM graph and the C++ generation loop.
//
// Ownership: the C++ model keeps raw pointers into the embedding tables (zero-copy views of the
// mmapped weights); this class holds Python references to those arrays for the model's lifetime.
// Generation runs with the GIL released; a Python token callback (streaming) re-acquires it only
// to hand over each token.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/config.h"
#include "bindings/gil.h"
#include "bindings/interrupt.h"
#include "bindings/sized_output.h"
#include "bindings/tensor_dict.h"
#include "layers/kv_cache.h"
#include "models/batch_decoder.h"
#include "models/decoder.h"
#include "models/generation.h"
#include "models/kept_memory.h"
#include "models/request_checks.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

class PyDecoderModel : private ModelBuilder {
 public:
  // config: the TransformerConfig fields (bindings/config.h); tensors: the model-level tensors
  // under canonical names, the head included (models/model_builder.h).
  // packed: a converted directory's packed weights (io/packed_file.h) or a writer recording them, or None.
  PyDecoderModel(const py::dict& config, const py::dict& tensors, std::shared_ptr<PackedWeightsStore> packed)
      : ModelBuilder("decoder") {
    use_packed(std::move(packed));
    const TransformerConfig c = transformer_config(config);
    if (c.kind != ModelKind::kDecoder) throw py::value_error("DecoderModel needs a config of kind 'decoder'");
    const GlobalTensors g = global_tensors(PyDictSource(tensors), c);
    GilReleased release;  // packs the LM head
    model_ = std::make_unique<DecoderModel>(c, g);
  }

  std::shared_ptr<PackedWeightsStore> packed() const { return packed_store(); }

  // One layer's tensors under canonical names; packed (or copied) before this returns.
  void add_layer(const std::string& stack, const py::dict& t) {
    const TransformerConfig& c = model_->config();
    if (stack != "decoder") throw py::value_error("a decoder has one stack, 'decoder'; got '" + stack + "'");
    if (model_->num_layers_added() >= c.num_layers) {
      throw py::value_error("the decoder already has its " + std::to_string(c.num_layers) + " layers");
    }
    const BlockTensors b =
        block_tensors(PyDictSource(t), c, /*cross=*/false,
                      packed_store() ? stack + ".layers." + std::to_string(model_->num_layers_added()) : "");
    GilReleased release;
    model_->add_layer(b);
  }

  py::array_t<float> logits(const py::object& input_ids, const py::object& attention_mask, int num_threads) const {
    check_complete();
    const TransformerConfig& c = model_->config();
    IdArray ids = as_ids(input_ids, "input_ids");
    const long B = static_cast<long>(ids.shape(0)), T = static_cast<long>(ids.shape(1));
    if (B == 0 || T == 0) {
      throw py::value_error("input_ids must hold at least one sequence of at least one token, got shape " +
                            shape_string(ids));
    }
    if (T > c.max_positions) {
      throw py::value_error("sequence length " + std::to_string(T) + " exceeds the model's maximum of " +
                            std::to_string(c.max_positions) + " tokens (max_position_embeddings)");
    }
    check_ids(ids.data(), B * T, "input_ids");
    IdArray mask;
    if (!attention_mask.is_none()) {
      mask = as_ids(attention_mask, "attention_mask");
      if (mask.shape(0) != B || mask.shape(1) != T) {
        throw py::value_error("attention_mask must have the shape of input_ids " + shape_string(ids) + ", got " +
                              shape_string(mask));
      }
      for (long i = 0; i < B * T; ++i) {
        if (mask.data()[i] != 0 && mask.data()[i] != 1) {
          throw py::value_error("attention_mask entries must be 0 (padding) or 1 (token)");
        }
      }
    }
    const std::string request = "input_ids of shape " + shape_string(ids);
    py::array_t<float> out = sized_output({B, T, c.vocab_size}, request, "the logits");
    const int64_t* mp = attention_mask.is_none() ? nullptr : mask.data();
    const int64_t* ip = ids.data();
    float* op = out.mutable_data();
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      with_size_context([&] { return request; }, [&] { model_->logits(ip, mp, B, T, op); });
    }
    return out;
  }

  // prompts: token-id lists (validated here); options: the GenerationOptions fields by name,
  // already validated by the Python layer. Returns generation_output() (bindings/config.h).
  py::tuple generate(const std::vector<std::vector<int64_t>>& prompts, const py::dict& options,
                     const py::object& callback, int num_threads, const py::object& assistant) const {
    check_complete();
    const PyDecoderModel* draft = nullptr;
    if (!assistant.is_none()) {
      draft = assistant.cast<const PyDecoderModel*>();
      draft->check_complete();
    }
    GenerationOptions o = generation_options(options);
    check_decoder_generation(model_->config(), prompts, o);
    TokenCallback on_token;
    if (!callback.is_none()) {
      on_token = [&callback](long index, int64_t token) { return call_python(callback, index, token); };
    }
    const KvType kv_type = kv_cache_type(o);
    GenerationResult result;
    const bool watch_sigint = on_python_main_thread();
    try {
      GilReleased release;  // first: parks instead of retaking the GIL at interpreter exit (bindings/gil.h)
      SigintWatch watch(watch_sigint);  // Ctrl-C stops the loop between steps
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      DecoderSession session(*model_, kv_type);
      std::unique_ptr<DecoderSession> draft_session;
      if (draft) draft_session = std::make_unique<DecoderSession>(*draft->model_, kv_type);
      result = cpuformer::generate(session, prompts, o, on_token, nullptr, draft_session.get());
    } catch (const Interrupted&) {
      raise_interrupted();
    }
    return generation_output(result, o, draft != nullptr || o.prompt_lookup_num_tokens > 0);
  }

  long vocab_size() const { return model_->config().vocab_size; }
  std::size_t kept_memory_bytes() const { return model_->kept_memory_bytes(); }
  long max_positions() const { return model_->config().max_positions; }
  const DecoderModel& model() const { return *model_; }

  void check_complete() const {
    if (!model_->complete()) {
      throw py::value_error("the decoder has " + std::to_string(model_->num_layers_added()) + " of its " +
                            std::to_string(model_->config().num_layers) + " layers; add them first");
    }
  }

  void check_ids(const int64_t* ids, long n, const char* what) const {
    check_token_ids(model_->config(), ids, n, what);
  }

 private:
  std::unique_ptr<DecoderModel> model_;
};

// cpuformer._core.BatchDecoder: continuous batching over one DecoderModel (models/batch_decoder.h).
// The Python layer validates the options (Generator.batcher()); this class checks what the C++
// loop relies on. Keeps the model object alive. Thread-safe: calls take turns (a mutex), so
// another thread's add() or cancel() waits for a running step.
class PyBatchDecoder {
 public:
  PyBatchDecoder(const py::object& model, long capacity, long max_len, long prefill_chunk, long kv_cache_dtype,
                 bool prefix_reuse, int num_threads, double prefill_slowdown)
      : owner_(model), model_(model.cast<const PyDecoderModel*>()), num_threads_(num_threads) {
    model_->check_complete();
    if (capacity < 1) throw py::value_error("capacity must be >= 1, got " + std::to_string(capacity));
    if (max_len < 1 || max_len > model_->max_positions()) {
      throw py::value_error("max_length must be in [1, " + std::to_string(model_->max_positions()) +
                            "] (max_position_embeddings), got " + std::to_string(max_len));
    }
    if (prefill_chunk < 1) throw py::value_error("prefill_chunk must be >= 1, got " + std::to_string(prefill_chunk));
    GenerationOptions o;
    o.kv_cache_dtype = kv_cache_dtype;
    const KvType kv_type = kv_cache_type(o);
    const std::string request = "capacity " + std::to_string(capacity) + " × max_length " + std::to_string(max_len);
    GilReleased release;
    with_size_context([&] { return request; },
                      [&] {
                        batch_ = std::make_unique<BatchDecoder>(model_->model(), capacity, max_len, prefill_chunk,
                                                                kv_type, prefix_reuse);
                        batch_->set_prefill_slowdown(prefill_slowdown);
                      });
  }

  void add(long id, const std::vector<int64_t>& prompt, const py::dict& options, long logprobs, long prompt_logprobs) {
    if (prompt.empty()) throw py::value_error("the prompt is empty");
    if (logprobs < -1 || prompt_logprobs < -1) throw py::value_error("logprobs must be >= -1 (-1: none)");
    model_->check_ids(prompt.data(), static_cast<long>(prompt.size()), "prompt token ids");
    GenerationOptions o = generation_options(options);
    const long V = model_->vocab_size();
    check_penalties_and_bias(o, V);
    for (int64_t e : o.eos_token_ids) {
      if (e < 0 || e >= V) throw py::value_error("eos_token_id " + std::to_string(e) + " is out of range");
    }
    if (o.num_beams != 1 || o.num_return_sequences != 1 || o.prompt_lookup_num_tokens > 0) {
      throw py::value_error("continuous batching runs greedy search or sampling of one sequence per request");
    }
    if (o.max_new_tokens < 1) throw py::value_error("max_new_tokens must be >= 1");
    if (o.max_new_tokens > batch_->max_len() - static_cast<long>(prompt.size())) {
      throw py::value_error("prompt length " + std::to_string(prompt.size()) + " + max_new_tokens " +
                            std::to_string(o.max_new_tokens) + " exceeds the batcher's max_length of " +
                            std::to_string(batch_->max_len()) + " tokens");
    }
    locked([&] {
      batch_->add(id, prompt, o, logprobs, prompt_logprobs);
      return 0L;
    });
  }

  bool cancel(long id) {
    return locked([&] { return static_cast<long>(batch_->cancel(id)); }) != 0;
  }

  // [(id, token, log_prob, finish reason "eos" | "length" | None, logprobs, prompt_logprobs)] of
  // one forward pass; logprobs: (raw log-prob, [(token, log-prob)] most likely first) or None;
  // prompt_logprobs: [(token, log-prob, [(token, log-prob)])] for prompt tokens 1.. or None.
  py::list step() {
    std::vector<BatchEvent> events;
    {
      GilReleased release;
      std::lock_guard<std::mutex> lock(mutex_);  // other threads' add() / cancel() wait for the step
      ScopedNumThreads threads(num_threads_);
      ComputeSlots slots(current_num_threads());
      events = batch_->step();
    }
    py::list out;
    for (const BatchEvent& e : events) {
      py::object reason = py::none();
      if (e.finished)
        reason = py::str(e.reason == FinishReason::kEos ? "eos" : e.reason == FinishReason::kStop ? "stop" : "length");
      py::object logprobs = py::none(), prompt = py::none();
      if (e.has_logprobs) logprobs = py::make_tuple(e.logprobs.log_prob, e.logprobs.top);
      if (!e.prompt_logprobs.empty()) {
        py::list scored;
        for (const TokenLogProbs& s : e.prompt_logprobs) scored.append(py::make_tuple(s.token, s.log_prob, s.top));
        prompt = std::move(scored);
      }
      out.append(py::make_tuple(e.id, e.token, e.log_prob, reason, logprobs, prompt));
    }
    return out;
  }

  py::dict stats() const {
    BatchStats s;
    locked([&] {
      s = batch_->stats();
      return 0L;
    });
    py::dict d;
    d["steps"] = s.steps;
    d["decode_tokens"] = s.decode_tokens;
    d["prefill_tokens"] = s.prefill_tokens;
    d["reused_tokens"] = s.reused_tokens;
    d["copied_tokens"] = s.copied_tokens;
    d["last_batch"] = s.last_batch;
    d["prefill_budget"] = s.prefill_budget;
    return d;
  }
  long waiting() const {
    return locked([&] { return batch_->waiting(); });
  }
  long running() const {
    return locked([&] { return batch_->running(); });
  }
  long capacity() const { return batch_->capacity(); }
  long max_len() const { return batch_->max_len(); }
  std::size_t kv_bytes() const { return batch_->kv_bytes(); }

 private:
  // f() under the mutex. Uncontended (the usual case: one thread drives the batcher) the GIL is
  // kept: releasing it would let another Python thread take it and make this quick call wait out
  // the interpreter's switch interval. Contended (another thread's step is running), the GIL is
  // released while waiting. f must not need the GIL.
  template <class F>
  long locked(F&& f) const {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) return f();
    GilReleased release;
    lock.lock();
    return f();
  }

  py::object owner_;
  const PyDecoderModel* model_;
  int num_threads_;
  std::unique_ptr<BatchDecoder> batch_;
  mutable std::mutex mutex_;  // one call at a time: a step runs with the GIL released
};

// Testing hook: a KvCache holding k and v ([layers, rows, kv_heads, length, head_dim] float32,
// C-contiguous, in a cache one slot longer than length so that the unused tail is exercised),
// reordered by source ([rows] int64: row r becomes old row source[r]) on num_threads threads, read
// back as (k, v). Beam search reorders the cache this way after every step.
py::tuple kv_cache_reorder(const py::array& k_in, const py::array& v_in, const py::array& source_in, int num_threads) {
  using Array = py::array_t<float, py::array::c_style | py::array::forcecast>;
  const Array k = Array::ensure(k_in), v = Array::ensure(v_in);
  if (!k || !v || k.ndim() != 5 || v.ndim() != 5) throw py::type_error("k and v must be 5-D float32 arrays");
  for (int d = 0; d < 5; ++d) {
    if (k.shape(d) != v.shape(d)) throw py::value_error("k and v must have the same shape");
    if (k.shape(d) == 0) throw py::value_error("k and v must not have an empty dimension");
  }
  const auto source = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(source_in);
  const long layers = k.shape(0), rows = k.shape(1), heads = k.shape(2), length = k.shape(3), dim = k.shape(4);
  if (!source || source.ndim() != 1 || source.shape(0) != rows)
    throw py::value_error("source must hold one index per row");
  std::vector<long> src(rows);
  for (long r = 0; r < rows; ++r) {
    src[r] = static_cast<long>(source.at(r));
    if (src[r] < 0 || src[r] >= rows) throw py::value_error("source indices must be in [0, rows)");
  }
  if (num_threads < 1) throw py::value_error("num_threads must be >= 1");
  KvCache cache;
  cache.reset(layers, rows, heads, length + 1, dim);
  cache.set_length(length);
  // fn(cache slot of (layer, row, head), offset of the same [length, dim] block in the arrays)
  auto each_slot = [&](bool values, auto&& fn) {
    for (long l = 0; l < layers; ++l) {
      float* base = values ? cache.v(l) : cache.k(l);
      for (long r = 0; r < rows; ++r) {
        for (long h = 0; h < heads; ++h) {
          fn(base + r * cache.stride_row() + h * cache.stride_head(), ((l * rows + r) * heads + h) * length * dim);
        }
      }
    }
  };
  const std::size_t block = sizeof(float) * static_cast<std::size_t>(length * dim);
  for (bool values : {false, true}) {
    const float* from = (values ? v : k).data();
    each_slot(values, [&](float* slot, long offset) {
      std::memcpy(slot, from + offset, block);
      for (long x = length * dim; x < cache.stride_head(); ++x) slot[x] = -1.0f;  // the unused slot
    });
  }
  {
    GilReleased release;
    ScopedNumThreads threads(num_threads);
    cache.reorder(src.data());
  }
  py::array_t<float> k_out({layers, rows, heads, length, dim}), v_out({layers, rows, heads, length, dim});
  for (bool values : {false, true}) {
    float* to = (values ? v_out : k_out).mutable_data();
    each_slot(values, [&](float* slot, long offset) { std::memcpy(to + offset, slot, block); });
  }
  return py::make_tuple(k_out, v_out);
}

// Testing hook: the cost-aware draft schedule (SpeculationCostGuard) fed a sequence of measured
// events — ("step", seconds, 1, 0, 0) for a plain decode step, ("round", seconds, emitted tokens,
// verification seconds, verified positions) for a speculative round — returns after each event the
// plain steps it wants before speculating again.
std::vector<long> speculation_cost_guard(
    const std::vector<std::tuple<std::string, double, long, double, long>>& events) {
  SpeculationCostGuard guard(true);
  std::vector<long> out;
  for (const auto& [kind, seconds, emitted, verify, positions] : events) {
    if (kind == "step") {
      guard.plain_step(seconds);
    } else if (kind == "round") {
      guard.round(seconds, emitted, verify, positions);
    } else {
      throw py::value_error("event kinds are 'step' and 'round', got '" + kind + "'");
    }
    out.push_back(guard.plain_left);
  }
  return out;
}

}  // namespace

void register_models_decoder(py::module_& m) {
  // The generation-option rules shared with the C API (models/request_checks.h); Generator and
  // Seq2Seq call it once their own type checks have made Python values of these C++ types.
  m.def(
      "check_generation_request",
      [](long max_new_tokens, long min_new_tokens, bool do_sample, double temperature, long top_k, double top_p,
         double repetition_penalty, long num_beams, double length_penalty, long no_repeat_ngram_size) {
        check_generation_request({max_new_tokens, min_new_tokens, do_sample, temperature, top_k, top_p,
                                  repetition_penalty, num_beams, length_penalty, no_repeat_ngram_size});
      },
      py::arg("max_new_tokens") = 20, py::arg("min_new_tokens") = 0, py::arg("do_sample") = false,
      py::arg("temperature") = 1.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("repetition_penalty") = 1.0,
      py::arg("num_beams") = 1, py::arg("length_penalty") = 1.0, py::arg("no_repeat_ngram_size") = 0);
  m.def("generation_option_rule", &generation_option_rule, py::arg("name"));
  m.def(
      "check_penalties_and_bias",
      [](double presence_penalty, double frequency_penalty, const std::vector<int64_t>& logit_bias_ids,
         const std::vector<double>& logit_bias_values, long vocab_size) {
        GenerationOptions o;
        o.presence_penalty = static_cast<float>(presence_penalty);
        o.frequency_penalty = static_cast<float>(frequency_penalty);
        o.logit_bias_ids = logit_bias_ids;
        o.logit_bias_values.assign(logit_bias_values.begin(), logit_bias_values.end());
        check_penalties_and_bias(o, vocab_size);
      },
      py::arg("presence_penalty"), py::arg("frequency_penalty"), py::arg("logit_bias_ids"),
      py::arg("logit_bias_values"), py::arg("vocab_size"));
  m.def("_kv_cache_reorder", &kv_cache_reorder, py::arg("k"), py::arg("v"), py::arg("source"), py::arg("num_threads"));
  m.def("_speculation_cost_guard", &speculation_cost_guard, py::arg("events"));
  m.def("_set_kept_memory_limit", &set_kept_memory_limit, py::arg("bytes"));
  py::class_<PyDecoderModel>(m, "DecoderModel")
      .def(py::init<const py::dict&, const py::dict&, std::shared_ptr<PackedWeightsStore>>(), py::arg("config"),
           py::arg("tensors"), py::arg("packed") = py::none())
      .def_property_readonly("packed_weights", [](const PyDecoderModel& m) { return m.packed(); })
      .def("add_layer", &PyDecoderModel::add_layer, py::arg("stack"), py::arg("tensors"))
      .def("logits", &PyDecoderModel::logits, py::arg("input_ids"), py::arg("attention_mask") = py::none(),
           py::arg("num_threads") = 0)
      .def("generate", &PyDecoderModel::generate, py::arg("prompts"), py::arg("options"),
           py::arg("callback") = py::none(), py::arg("num_threads") = 0, py::arg("assistant") = py::none())
      .def_property_readonly("_kept_memory_bytes", &PyDecoderModel::kept_memory_bytes)
      .def_property_readonly("vocab_size", &PyDecoderModel::vocab_size)
      .def_property_readonly("max_positions", &PyDecoderModel::max_positions);
  py::class_<PyBatchDecoder>(m, "BatchDecoder")
      .def(py::init<const py::object&, long, long, long, long, bool, int, double>(), py::arg("model"),
           py::arg("capacity"), py::arg("max_len"), py::arg("prefill_chunk"), py::arg("kv_cache_dtype") = 0,
           py::arg("prefix_reuse") = true, py::arg("num_threads") = 0, py::arg("prefill_slowdown") = 0.0)
      .def("add", &PyBatchDecoder::add, py::arg("id"), py::arg("prompt"), py::arg("options"), py::arg("logprobs") = -1,
           py::arg("prompt_logprobs") = -1)
      .def("cancel", &PyBatchDecoder::cancel, py::arg("id"))
      .def("step", &PyBatchDecoder::step)
      .def("stats", &PyBatchDecoder::stats)
      .def_property_readonly("waiting", &PyBatchDecoder::waiting)
      .def_property_readonly("running", &PyBatchDecoder::running)
      .def_property_readonly("capacity", &PyBatchDecoder::capacity)
      .def_property_readonly("max_len", &PyBatchDecoder::max_len)
      .def_property_readonly("kv_bytes", &PyBatchDecoder::kv_bytes);
}

}  // namespace bindings
}  // namespace cpuformer
