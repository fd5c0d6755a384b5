// cpuformer._core.Seq2SeqModel: the encoder-decoder graph and the shared C++ generation loop.
//
// Ownership: the C++ model keeps raw pointers into the word embeddings and position tables
// (zero-copy views of the mmapped weights); this class holds Python references to those arrays
// for the model's lifetime. Compute runs with the GIL released.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/config.h"
#include "bindings/gil.h"
#include "bindings/interrupt.h"
#include "bindings/sized_output.h"
#include "bindings/tensor_dict.h"
#include "models/generation.h"
#include "models/request_checks.h"
#include "models/seq2seq.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

class PySeq2SeqModel : private ModelBuilder {
 public:
  // config: the TransformerConfig fields (bindings/config.h); tensors: the model-level tensors
  // under canonical names, both stacks' and the head included (models/model_builder.h).
  // packed: a converted directory's packed weights (io/packed_file.h) or a writer recording them, or None.
  PySeq2SeqModel(const py::dict& config, const py::dict& tensors, std::shared_ptr<PackedWeightsStore> packed)
      : ModelBuilder("seq2seq") {
    use_packed(std::move(packed));
    const TransformerConfig c = transformer_config(config);
    if (c.kind != ModelKind::kSeq2Seq) throw py::value_error("Seq2SeqModel needs a config of kind 'seq2seq'");
    const GlobalTensors g = global_tensors(PyDictSource(tensors), c);
    GilReleased release;  // packs the LM head
    model_ = std::make_unique<Seq2SeqModel>(c, g);
  }

  std::shared_ptr<PackedWeightsStore> packed() const { return packed_store(); }

  // One layer of stack "encoder" or "decoder", under canonical names; packed before this returns.
  void add_layer(const std::string& stack, const py::dict& t) {
    const TransformerConfig& c = model_->config();
    if (stack != "encoder" && stack != "decoder") {
      throw py::value_error("a seq2seq model's stacks are 'encoder' and 'decoder'; got '" + stack + "'");
    }
    const bool decoder = stack == "decoder";
    const long count = decoder ? c.num_decoder_layers : c.num_layers;
    long& added = decoder ? decoder_added_ : encoder_added_;
    if (added >= count) throw py::value_error("the " + stack + " already has its " + std::to_string(count) + " layers");
    const BlockTensors b = block_tensors(PyDictSource(t), c, /*cross=*/decoder,
                                         packed_store() ? stack + ".layers." + std::to_string(added) : "");
    {
      GilReleased release;
      if (decoder) {
        model_->add_decoder_layer(b);
      } else {
        model_->add_encoder_layer(b);
      }
    }
    ++added;
  }

  py::array_t<float> encode(const py::object& input_ids, const py::object& attention_mask, int num_threads) const {
    check_complete();
    IdArray ids = as_ids(input_ids, "input_ids");
    IdArray mask;
    const long B = static_cast<long>(ids.shape(0)), T = static_cast<long>(ids.shape(1));
    check_source(ids, attention_mask, mask);
    const std::string request = "input_ids of shape " + shape_string(ids);
    py::array_t<float> out = sized_output({B, T, model_->config().hidden_size}, request, "the encoder output");
    const int64_t* ip = ids.data();
    const int64_t* mp = attention_mask.is_none() ? nullptr : mask.data();
    float* op = out.mutable_data();
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      with_size_context([&] { return request; }, [&] { model_->encode(ip, mp, B, T, op); });
    }
    return out;
  }

  py::array_t<float> logits(const py::object& input_ids, const py::object& decoder_input_ids,
                            const py::object& attention_mask, int num_threads) const {
    check_complete();
    const TransformerConfig& c = model_->config();
    IdArray ids = as_ids(input_ids, "input_ids");
    IdArray mask;
    check_source(ids, attention_mask, mask);
    IdArray tgt = as_ids(decoder_input_ids, "decoder_input_ids");
    const long B = static_cast<long>(ids.shape(0)), T = static_cast<long>(ids.shape(1));
    const long Tt = static_cast<long>(tgt.shape(1));
    if (tgt.shape(0) != B || Tt == 0) {
      throw py::value_error("decoder_input_ids must have shape [batch, target_len] with batch " + std::to_string(B) +
                            " (the batch of input_ids) and target_len >= 1, got " + shape_string(tgt));
    }
    if (c.max_positions > 0 && Tt > c.max_positions) {
      throw py::value_error("decoder_input_ids length " + std::to_string(Tt) + " exceeds the model's maximum of " +
                            std::to_string(c.max_positions) + " tokens (max_position_embeddings)");
    }
    check_ids(tgt.data(), B * Tt, "decoder_input_ids");
    const std::string request =
        "input_ids of shape " + shape_string(ids) + " with decoder_input_ids of shape " + shape_string(tgt);
    py::array_t<float> out = sized_output({B, Tt, c.vocab_size}, request, "the logits");
    const int64_t* ip = ids.data();
    const int64_t* mp = attention_mask.is_none() ? nullptr : mask.data();
    const int64_t* tp = tgt.data();
    float* op = out.mutable_data();
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      with_size_context([&] { return request; }, [&] { model_->logits(ip, mp, B, T, tp, Tt, op); });
    }
    return out;
  }

  // sources: token-id lists; options: GenerationOptions fields by name (validated by the Python
  // layer) plus decoder_start_token_id. Returns generation_output() (bindings/config.h).
  py::tuple generate(const std::vector<std::vector<int64_t>>& sources, const py::dict& options,
                     const py::object& callback, int num_threads, const py::object& assistant) const {
    check_complete();
    const PySeq2SeqModel* draft = nullptr;
    if (!assistant.is_none()) {
      draft = assistant.cast<const PySeq2SeqModel*>();
      draft->check_complete();
    }
    GenerationOptions o = generation_options(options, {"decoder_start_token_id"});
    if (!options.contains("decoder_start_token_id")) throw py::value_error("missing option 'decoder_start_token_id'");
    const int64_t start = options["decoder_start_token_id"].cast<int64_t>();
    check_seq2seq_generation(model_->config(), sources, o, start);
    TokenCallback on_token;
    if (!callback.is_none()) {
      on_token = [&callback](long index, int64_t token) { return call_python(callback, index, token); };
    }
    const std::vector<std::vector<int64_t>> histories(sources.size(), std::vector<int64_t>{start});
    const KvType kv_type = kv_cache_type(o);
    GenerationResult result;
    const bool watch_sigint = on_python_main_thread();
    try {
      GilReleased release;  // first: parks instead of retaking the GIL at interpreter exit (bindings/gil.h)
      SigintWatch watch(watch_sigint);  // Ctrl-C stops the loop between steps
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      Seq2SeqSession session(*model_, start, kv_type);
      std::unique_ptr<Seq2SeqSession> draft_session;
      if (draft) draft_session = std::make_unique<Seq2SeqSession>(*draft->model_, start, kv_type);
      result = cpuformer::generate(session, sources, o, on_token, &histories, draft_session.get());
    } catch (const Interrupted&) {
      raise_interrupted();
    }
    return generation_output(result, o, draft != nullptr || o.prompt_lookup_num_tokens > 0);
  }

  long vocab_size() const { return model_->config().vocab_size; }
  std::size_t kept_memory_bytes() const { return model_->kept_memory_bytes(); }
  long max_positions() const { return model_->config().max_positions; }

 private:
  long layers_added(bool decoder) const { return decoder ? decoder_added_ : encoder_added_; }

  void check_complete() const {
    if (!model_->complete()) {
      throw py::value_error("the seq2seq model is missing layers or its head; add them first");
    }
  }

  // Sources: [B, T] with B, T ≥ 1, T within the position table, ids in range; the mask (if any)
  // 0/1 of the same shape with at least one token per row.
  void check_source(const IdArray& ids, const py::object& attention_mask, IdArray& mask) const {
    const TransformerConfig& c = model_->config();
    const long B = static_cast<long>(ids.shape(0)), T = static_cast<long>(ids.shape(1));
    if (B == 0 || T == 0) {
      throw py::value_error("input_ids must hold at least one sequence of at least one token, got shape " +
                            shape_string(ids));
    }
    if (c.max_positions > 0 && T > c.max_positions) {
      throw py::value_error("source length " + std::to_string(T) + " exceeds the model's maximum of " +
                            std::to_string(c.max_positions) + " tokens (max_position_embeddings)");
    }
    check_ids(ids.data(), B * T, "input_ids");
    if (attention_mask.is_none()) return;
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
    for (long b = 0; b < B; ++b) {
      long tokens = 0;
      for (long t = 0; t < T; ++t) tokens += mask.data()[b * T + t];
      if (tokens == 0) throw py::value_error("attention_mask row " + std::to_string(b) + " has no token (all 0)");
    }
  }

  void check_ids(const int64_t* ids, long n, const char* what) const {
    check_token_ids(model_->config(), ids, n, what);
  }

  std::unique_ptr<Seq2SeqModel> model_;
  long encoder_added_ = 0, decoder_added_ = 0;
};

}  // namespace

void register_models_seq2seq(py::module_& m) {
  py::class_<PySeq2SeqModel>(m, "Seq2SeqModel")
      .def(py::init<const py::dict&, const py::dict&, std::shared_ptr<PackedWeightsStore>>(), py::arg("config"),
           py::arg("tensors"), py::arg("packed") = py::none())
      .def_property_readonly("packed_weights", [](const PySeq2SeqModel& m) { return m.packed(); })
      .def("add_layer", &PySeq2SeqModel::add_layer, py::arg("stack"), py::arg("tensors"))
      .def("encode", &PySeq2SeqModel::encode, py::arg("input_ids"), py::arg("attention_mask") = py::none(),
           py::arg("num_threads") = 0)
      .def("logits", &PySeq2SeqModel::logits, py::arg("input_ids"), py::arg("decoder_input_ids"),
           py::arg("attention_mask") = py::none(), py::arg("num_threads") = 0)
      .def("generate", &PySeq2SeqModel::generate, py::arg("sources"), py::arg("options"),
           py::arg("callback") = py::none(), py::arg("num_threads") = 0, py::arg("assistant") = py::none())
      .def_property_readonly("_kept_memory_bytes", &PySeq2SeqModel::kept_memory_bytes)
      .def_property_readonly("vocab_size", &PySeq2SeqModel::vocab_size)
      .def_property_readonly("max_positions", &PySeq2SeqModel::max_positions);
}

}  // namespace bindings
}  // namespace cpuformer
