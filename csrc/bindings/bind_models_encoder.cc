// cpuformer._core.EncoderModel: the BERT-family encoder graph over NumPy arrays.
//
// Ownership: the C++ model keeps raw pointers into the embedding tables (zero-copy views of the
// mmapped weights). This class holds Python references to those arrays for as long as the C++
// model exists, so the pointers can never dangle. Everything else is packed/copied at construction.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings/arrays.h"
#include "bindings/config.h"
#include "bindings/gil.h"
#include "bindings/sized_output.h"
#include "bindings/tensor_dict.h"
#include "models/encoder.h"
#include "models/request_checks.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

class PyEncoderModel : private ModelBuilder {
 public:
  // config: the TransformerConfig fields (bindings/config.h); tensors: the model-level tensors
  // under canonical names (models/model_builder.h).
  // packed: a converted directory's packed weights (io/packed_file.h) or a writer recording them, or None.
  PyEncoderModel(const py::dict& config, const py::dict& tensors, std::shared_ptr<PackedWeightsStore> packed)
      : ModelBuilder("encoder") {
    use_packed(std::move(packed));
    const TransformerConfig c = transformer_config(config);
    if (c.kind != ModelKind::kEncoder) throw py::value_error("EncoderModel needs a config of kind 'encoder'");
    const GlobalTensors g = global_tensors(PyDictSource(tensors), c);
    model_ = std::make_unique<EncoderModel>(c, g);
  }

  std::shared_ptr<PackedWeightsStore> packed() const { return packed_store(); }

  // One layer's tensors under canonical names; packed (or copied) before this returns.
  void add_layer(const std::string& stack, const py::dict& tensors) {
    const TransformerConfig& c = model_->config();
    if (stack != "encoder") throw py::value_error("an encoder has one stack, 'encoder'; got '" + stack + "'");
    if (model_->complete()) {
      throw py::value_error("the encoder already has its " + std::to_string(c.distinct_layers()) + " layers");
    }
    const BlockTensors b =
        block_tensors(PyDictSource(tensors), c, /*cross=*/false,
                      packed_store() ? stack + ".layers." + std::to_string(model_->num_layers_added()) : "");
    GilReleased release;  // packing is the slow part of loading
    model_->add_layer(b);
  }

  py::object forward(const py::object& input_ids, const py::object& attention_mask, const py::object& token_type_ids,
                     bool return_pooler, int num_threads, bool skip_padding, bool first_only,
                     const py::object& pick) const {
    const Inputs in = inputs(input_ids, attention_mask, token_type_ids, num_threads);
    const TransformerConfig& c = model_->config();
    if (return_pooler && !model_->has_pooler()) {
      throw py::value_error("this checkpoint has no pooler (pooler.dense weights); return_pooler needs one");
    }
    // pick: int64 [batch], each sequence's one row to compute (EncoderModel::forward).
    std::vector<long> picks;
    if (!pick.is_none()) {
      if (return_pooler) throw py::value_error("pick cannot go with return_pooler (the pooler reads row 0)");
      const py::array_t<int64_t, py::array::c_style | py::array::forcecast> p(pick);
      if (p.ndim() != 1 || p.shape(0) != in.batch) {
        throw py::value_error("pick must have shape [batch " + std::to_string(in.batch) + "], got " + shape_string(p));
      }
      for (py::ssize_t b = 0; b < p.shape(0); ++b) {
        if (p.at(b) < 0 || p.at(b) >= in.seq_len) {
          throw py::value_error("pick[" + std::to_string(b) + "] = " + std::to_string(p.at(b)) +
                                " is not a position of input_ids' " + std::to_string(in.seq_len) + " per row");
        }
        picks.push_back(static_cast<long>(p.at(b)));
      }
    }
    const std::string request = "input_ids of shape " + shape_string(in.ids);
    py::array_t<float> out = sized_output({in.batch, in.seq_len, c.hidden_size}, request, "the hidden states");
    py::array_t<float> pooled;
    if (return_pooler) pooled = py::array_t<float>({in.batch, c.hidden_size});
    float* op = out.mutable_data();
    float* pp = return_pooler ? pooled.mutable_data() : nullptr;
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      with_size_context([&] { return request; },
                        [&] {
                          model_->forward(in.id, in.mask, in.types, in.batch, in.seq_len, op, pp, nullptr, skip_padding,
                                          first_only, picks.empty() ? nullptr : picks.data());
                        });
    }
    if (return_pooler) return py::make_tuple(out, pooled);
    return std::move(out);
  }

  // The stack on input embeddings [B, T, embedding width] (no token or position embedding added):
  // the hidden states, or (hidden states, pooled output) with return_pooler.
  py::object forward_embeddings(const py::object& embeddings, const py::object& attention_mask, bool return_pooler,
                                int num_threads, bool skip_padding, bool first_only) const {
    const TransformerConfig& c = model_->config();
    if (!model_->complete()) {
      throw py::value_error("the encoder has " + std::to_string(model_->num_layers_added()) + " of its " +
                            std::to_string(c.distinct_layers()) + " layers; add_layer() the rest before calling it");
    }
    if (c.transformer_xl_attention) {
      throw py::value_error("forward_embeddings cannot run Transformer-XL attention (XLNet): it needs token ids");
    }
    if (return_pooler && !model_->has_pooler()) {
      throw py::value_error("this checkpoint has no pooler (pooler.dense weights); return_pooler needs one");
    }
    if (num_threads < 0)
      throw py::value_error("num_threads must be >= 1 (or 0 for the default), got " + std::to_string(num_threads));
    const FloatArray e = as_float32(embeddings, "embeddings");
    require_ndim(e, 3, "embeddings", "[batch, seq_len, hidden]");
    const long B = static_cast<long>(e.shape(0)), T = static_cast<long>(e.shape(1)), E = c.embedding_width();
    if (B == 0 || T == 0) {
      throw py::value_error("embeddings must hold at least one sequence of at least one position, got shape " +
                            shape_string(e));
    }
    if (e.shape(2) != E) {
      throw py::value_error("embeddings must have shape [batch, seq_len, " + std::to_string(E) +
                            "] (the model's embedding width), got " + shape_string(e));
    }
    IdArray mask;
    if (!attention_mask.is_none()) {
      mask = as_ids(attention_mask, "attention_mask");
      if (mask.shape(0) != B || mask.shape(1) != T) {
        throw py::value_error("attention_mask must have shape [batch, seq_len] = [" + std::to_string(B) + ", " +
                              std::to_string(T) + "] (of embeddings), got " + shape_string(mask));
      }
      const int64_t* m = mask.data();
      for (long r = 0; r < B * T; ++r) {
        if (m[r] != 0 && m[r] != 1) {
          throw py::value_error("attention_mask" + at_index(r, T) + " = " + std::to_string(m[r]) +
                                "; attention_mask entries must be 0 (padding) or 1 (attended)");
        }
      }
    }
    const std::string request = "embeddings of shape " + shape_string(e);
    py::array_t<float> out = sized_output({B, T, c.hidden_size}, request, "the hidden states");
    py::array_t<float> pooled;
    if (return_pooler) pooled = py::array_t<float>({B, c.hidden_size});
    float* op = out.mutable_data();
    float* pp = return_pooler ? pooled.mutable_data() : nullptr;
    const float* ep = e.data();
    const int64_t* mp = attention_mask.is_none() ? nullptr : mask.data();
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());
      with_size_context([&] { return request; },
                        [&] { model_->forward_embeddings(ep, mp, B, T, op, pp, skip_padding, first_only); });
    }
    if (return_pooler) return py::make_tuple(out, pooled);
    return std::move(out);
  }

  // Transformer-XL models: (hidden states [B, T, H], every layer's input [layers, B, T, H]) with
  // the keys and values of layer l extended by memory[l] [B, M, H] (None or an empty M: none).
  py::tuple forward_memory(const py::object& input_ids, const py::object& attention_mask,
                           const py::object& token_type_ids, const py::object& memory, int num_threads) const {
    const TransformerConfig& c = model_->config();
    if (!c.transformer_xl_attention) {
      throw py::value_error("forward_memory needs a model with Transformer-XL attention (XLNet)");
    }
    const Inputs in = inputs(input_ids, attention_mask, token_type_ids, num_threads);
    const long H = c.hidden_size, L = c.num_layers;
    std::vector<FloatArray> layers;
    std::vector<const float*> pointers;
    long length = 0;
    if (!memory.is_none()) {
      if (!py::isinstance<py::list>(memory) && !py::isinstance<py::tuple>(memory)) {
        throw py::type_error("memory must be None or a list of " + std::to_string(L) + " arrays, got " +
                             type_name(memory));
      }
      const py::sequence items = py::reinterpret_borrow<py::sequence>(memory);
      if (static_cast<long>(items.size()) != L) {
        throw py::value_error("memory must hold one array per layer (" + std::to_string(L) + "), got " +
                              std::to_string(items.size()));
      }
      for (long l = 0; l < L; ++l) {
        const std::string name = "memory[" + std::to_string(l) + "]";
        FloatArray a = as_float32(items[l], name.c_str());
        require_ndim(a, 3, name.c_str(), "[batch, memory_len, hidden]");
        if (l == 0) length = static_cast<long>(a.shape(1));
        if (a.shape(0) != in.batch || a.shape(1) != length || a.shape(2) != H) {
          throw py::value_error(name + " must have shape [" + std::to_string(in.batch) + ", " + std::to_string(length) +
                                ", " + std::to_string(H) + "] (batch, the memory length of memory[0], hidden), got " +
                                shape_string(a));
        }
        layers.push_back(a);
      }
      for (const FloatArray& a : layers) pointers.push_back(a.data());
    }
    const std::string request =
        "input_ids of shape " + shape_string(in.ids) + " with a memory of " + std::to_string(length) + " tokens";
    py::array_t<float> out = sized_output({in.batch, in.seq_len, H}, request, "the hidden states");
    py::array_t<float> layer_inputs = sized_output({L, in.batch, in.seq_len, H}, request, "the layer inputs");
    EncoderMemory m;
    m.layers = length > 0 ? pointers.data() : nullptr;
    m.length = length;
    m.layer_inputs = layer_inputs.mutable_data();
    float* op = out.mutable_data();
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());
      with_size_context([&] { return request; },
                        [&] { model_->forward(in.id, in.mask, in.types, in.batch, in.seq_len, op, nullptr, &m); });
    }
    return py::make_tuple(out, layer_inputs);
  }

  long hidden_size() const { return model_->config().hidden_size; }
  std::size_t kept_memory_bytes() const { return model_->kept_memory_bytes(); }
  long max_seq_len() const { return model_->config().max_seq_len(); }
  bool has_pooler() const { return model_->has_pooler(); }

 private:
  // Checked inputs of a forward call (the arrays keep the data alive).
  struct Inputs {
    IdArray ids, mask_array, type_array;
    long batch = 0, seq_len = 0;
    const int64_t* id = nullptr;
    const int64_t* mask = nullptr;
    const int64_t* types = nullptr;
  };

  Inputs inputs(const py::object& input_ids, const py::object& attention_mask, const py::object& token_type_ids,
                int num_threads) const {
    const TransformerConfig& c = model_->config();
    if (!model_->complete()) {
      throw py::value_error("the encoder has " + std::to_string(model_->num_layers_added()) + " of its " +
                            std::to_string(c.distinct_layers()) + " layers; add_layer() the rest before calling it");
    }
    IdArray ids = as_ids(input_ids, "input_ids");
    const long B = static_cast<long>(ids.shape(0)), T = static_cast<long>(ids.shape(1));
    if (B == 0 || T == 0) {
      throw py::value_error("input_ids must hold at least one sequence of at least one token, got shape " +
                            shape_string(ids));
    }
    IdArray mask, types;
    if (!attention_mask.is_none()) {
      mask = as_ids(attention_mask, "attention_mask");
      if (mask.shape(0) != B || mask.shape(1) != T) {
        throw py::value_error("attention_mask must have the shape of input_ids " + shape_string(ids) + ", got " +
                              shape_string(mask));
      }
    }
    if (!token_type_ids.is_none()) {
      types = as_ids(token_type_ids, "token_type_ids");
      if (types.shape(0) != B || types.shape(1) != T) {
        throw py::value_error("token_type_ids must have the shape of input_ids " + shape_string(ids) + ", got " +
                              shape_string(types));
      }
    }
    if (num_threads < 0)
      throw py::value_error("num_threads must be >= 1 (or 0 for the default), got " + std::to_string(num_threads));
    const int64_t* id = ids.data();
    check_encoder_inputs(c, id, attention_mask.is_none() ? nullptr : mask.data(),
                         token_type_ids.is_none() ? nullptr : types.data(), B, T);

    Inputs in;
    in.ids = ids;
    in.mask_array = mask;
    in.type_array = types;
    in.batch = B;
    in.seq_len = T;
    in.id = id;
    // (A default-constructed array_t is an empty array, not null: test the arguments instead.)
    in.mask = attention_mask.is_none() ? nullptr : mask.data();
    in.types = token_type_ids.is_none() ? nullptr : types.data();
    return in;
  }

  std::unique_ptr<EncoderModel> model_;
};

}  // namespace

void register_models_encoder(py::module_& m) {
  py::class_<PyEncoderModel>(m, "EncoderModel")
      .def(py::init<const py::dict&, const py::dict&, std::shared_ptr<PackedWeightsStore>>(), py::arg("config"),
           py::arg("tensors"), py::arg("packed") = py::none())
      .def_property_readonly("packed_weights", [](const PyEncoderModel& m) { return m.packed(); })
      .def("add_layer", &PyEncoderModel::add_layer, py::arg("stack"), py::arg("tensors"))
      .def("forward", &PyEncoderModel::forward, py::arg("input_ids"), py::arg("attention_mask") = py::none(),
           py::arg("token_type_ids") = py::none(), py::arg("return_pooler") = false, py::arg("num_threads") = 0,
           py::arg("skip_padding") = false, py::arg("first_only") = false, py::arg("pick") = py::none())
      .def("forward_embeddings", &PyEncoderModel::forward_embeddings, py::arg("embeddings"),
           py::arg("attention_mask") = py::none(), py::arg("return_pooler") = false, py::arg("num_threads") = 0,
           py::arg("skip_padding") = false, py::arg("first_only") = false)
      .def("forward_memory", &PyEncoderModel::forward_memory, py::arg("input_ids"),
           py::arg("attention_mask") = py::none(), py::arg("token_type_ids") = py::none(),
           py::arg("memory") = py::none(), py::arg("num_threads") = 0)
      .def_property_readonly("_kept_memory_bytes", &PyEncoderModel::kept_memory_bytes)
      .def_property_readonly("hidden_size", &PyEncoderModel::hidden_size)
      .def_property_readonly("max_seq_len", &PyEncoderModel::max_seq_len)
      .def_property_readonly("has_pooler", &PyEncoderModel::has_pooler);
}

}  // namespace bindings
}  // namespace cpuformer
