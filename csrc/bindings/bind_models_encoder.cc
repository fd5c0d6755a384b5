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
#include "bindings/gil.h"
#include "bindings/sized_output.h"
#include "bindings/weight_type.h"
#include "models/encoder.h"
#include "runtime/compute_slots.h"
#include "runtime/threading.h"

namespace cpuformer {
namespace bindings {
namespace {

std::string at_index(long r, long seq_len) {
  return "[" + std::to_string(r / seq_len) + ", " + std::to_string(r % seq_len) + "]";
}

Activation parse_encoder_activation(const std::string& s) {
  if (s == "gelu") return Activation::kGeluErf;
  if (s == "gelu_tanh") return Activation::kGeluTanh;
  if (s == "relu") return Activation::kRelu;
  throw py::value_error("activation must be 'gelu', 'gelu_tanh' or 'relu', got '" + s + "'");
}

class PyEncoderModel : private ModelTensors {
 public:
  PyEncoderModel(const py::dict& config, const py::dict& embeddings) : ModelTensors("encoder") {
    EncoderConfig c;
    c.vocab_size = config["vocab_size"].cast<long>();
    c.hidden_size = config["hidden_size"].cast<long>();
    c.num_layers = config["num_layers"].cast<long>();
    c.num_heads = config["num_heads"].cast<long>();
    c.intermediate_size = config["intermediate_size"].cast<long>();
    c.max_positions = config["max_positions"].cast<long>();
    c.type_vocab_size = config["type_vocab_size"].cast<long>();
    c.pad_token_id = config["pad_token_id"].cast<long>();
    const std::string positions = config["position_ids"].cast<std::string>();
    if (positions == "arange") {
      c.position_ids = PositionIds::kArange;
    } else if (positions == "padding_cumsum") {
      c.position_ids = PositionIds::kPaddingCumsum;
    } else {
      throw py::value_error("position_ids must be 'arange' or 'padding_cumsum', got '" + positions + "'");
    }
    c.layer_norm_eps = config["layer_norm_eps"].cast<float>();
    c.activation = parse_encoder_activation(config["activation"].cast<std::string>());
    c.weight_type = config_weight_type(config);
    if (c.vocab_size < 1 || c.hidden_size < 1 || c.num_layers < 0 || c.num_heads < 1 || c.intermediate_size < 1 ||
        c.max_positions < 1 || c.type_vocab_size < 0) {
      throw py::value_error("encoder config sizes must be positive");
    }
    if (c.hidden_size % c.num_heads != 0) {
      throw py::value_error("hidden_size (" + std::to_string(c.hidden_size) +
                            ") must be a multiple of num_attention_heads (" + std::to_string(c.num_heads) + ")");
    }
    if (c.max_seq_len() < 1 || c.pad_token_id < 0 || (c.pad_token_id >= c.vocab_size)) {
      throw py::value_error("pad_token_id (" + std::to_string(c.pad_token_id) + ") must be in [0, vocab_size) and " +
                            "leave room in the position table");
    }
    const long H = c.hidden_size;
    EmbeddingTensors e;
    e.word_embeddings = get(embeddings, "word_embeddings", {c.vocab_size, H}, true);
    e.position_embeddings = get(embeddings, "position_embeddings", {c.max_positions, H}, true);
    if (c.type_vocab_size > 0) {
      e.token_type_embeddings = get(embeddings, "token_type_embeddings", {c.type_vocab_size, H}, true);
    }
    e.norm_weight = get(embeddings, "norm.weight", {H});
    e.norm_bias = get(embeddings, "norm.bias", {H});
    model_ = std::make_unique<EncoderModel>(c, e);
  }

  // One layer's tensors under the keys q/k/v/out/intermediate/output .weight/.bias and
  // attention_norm/output_norm .weight/.bias; packed (or copied) before this returns.
  void add_layer(const py::dict& tensors) {
    const EncoderConfig& c = model_->config();
    if (model_->complete()) {
      throw py::value_error("the encoder already has its " + std::to_string(c.num_layers) + " layers");
    }
    const long H = c.hidden_size, I = c.intermediate_size;
    EncoderLayerTensors l;
    l.q_weight = weight(tensors, "q.weight", H, H);
    l.q_bias = get(tensors, "q.bias", {H});
    l.k_weight = weight(tensors, "k.weight", H, H);
    l.k_bias = get(tensors, "k.bias", {H});
    l.v_weight = weight(tensors, "v.weight", H, H);
    l.v_bias = get(tensors, "v.bias", {H});
    l.out_weight = weight(tensors, "out.weight", H, H);
    l.out_bias = get(tensors, "out.bias", {H});
    l.attention_norm_weight = get(tensors, "attention_norm.weight", {H});
    l.attention_norm_bias = get(tensors, "attention_norm.bias", {H});
    l.intermediate_weight = weight(tensors, "intermediate.weight", I, H);
    l.intermediate_bias = get(tensors, "intermediate.bias", {I});
    l.output_weight = weight(tensors, "output.weight", H, I);
    l.output_bias = get(tensors, "output.bias", {H});
    l.output_norm_weight = get(tensors, "output_norm.weight", {H});
    l.output_norm_bias = get(tensors, "output_norm.bias", {H});
    GilReleased release;  // packing is the slow part of loading
    model_->add_layer(l);
  }

  // weight_scale: the per-row scales of an int8 weight (converted directories), else None.
  void set_pooler(const py::object& weight, const py::object& bias, const py::object& weight_scale) {
    const long H = model_->config().hidden_size;
    py::dict d;
    d["weight"] = weight;
    d["bias"] = bias;
    d["weight_scale"] = weight_scale;
    const WeightRef w = this->weight(d, "weight", H, H);
    const float* b = get(d, "bias", {H});
    GilReleased release;
    model_->set_pooler(w, b);
  }

  py::object forward(const py::object& input_ids, const py::object& attention_mask, const py::object& token_type_ids,
                     bool return_pooler, int num_threads) const {
    const EncoderConfig& c = model_->config();
    if (!model_->complete()) {
      throw py::value_error("the encoder has " + std::to_string(model_->num_layers_added()) + " of its " +
                            std::to_string(c.num_layers) + " layers; add_layer() the rest before calling it");
    }
    IdArray ids = as_ids(input_ids, "input_ids");
    const long B = static_cast<long>(ids.shape(0)), T = static_cast<long>(ids.shape(1));
    if (B == 0 || T == 0) {
      throw py::value_error("input_ids must hold at least one sequence of at least one token, got shape " +
                            shape_string(ids));
    }
    if (T > c.max_seq_len()) {
      throw py::value_error("sequence length " + std::to_string(T) + " exceeds the model's maximum of " +
                            std::to_string(c.max_seq_len()) + " tokens (max_position_embeddings)");
    }
    const int64_t* id = ids.data();
    const long rows = B * T;
    for (long r = 0; r < rows; ++r) {
      if (id[r] < 0 || id[r] >= c.vocab_size) {
        throw py::value_error("input_ids" + at_index(r, T) + " = " + std::to_string(id[r]) +
                              " is out of range; token ids must be in [0, " + std::to_string(c.vocab_size) +
                              ") (vocab_size)");
      }
    }
    IdArray mask, types;
    if (!attention_mask.is_none()) {
      mask = as_ids(attention_mask, "attention_mask");
      if (mask.shape(0) != B || mask.shape(1) != T) {
        throw py::value_error("attention_mask must have the shape of input_ids " + shape_string(ids) + ", got " +
                              shape_string(mask));
      }
      const int64_t* m = mask.data();
      for (long r = 0; r < rows; ++r) {
        if (m[r] != 0 && m[r] != 1) {
          throw py::value_error("attention_mask" + at_index(r, T) + " = " + std::to_string(m[r]) +
                                "; attention_mask entries must be 0 (padding) or 1 (token)");
        }
      }
    }
    if (!token_type_ids.is_none()) {
      if (c.type_vocab_size == 0) {
        throw py::value_error("this model has no token type embeddings; token_type_ids must be None");
      }
      types = as_ids(token_type_ids, "token_type_ids");
      if (types.shape(0) != B || types.shape(1) != T) {
        throw py::value_error("token_type_ids must have the shape of input_ids " + shape_string(ids) + ", got " +
                              shape_string(types));
      }
      const int64_t* tt = types.data();
      for (long r = 0; r < rows; ++r) {
        if (tt[r] < 0 || tt[r] >= c.type_vocab_size) {
          throw py::value_error("token_type_ids" + at_index(r, T) + " = " + std::to_string(tt[r]) +
                                " is out of range; token type ids must be in [0, " +
                                std::to_string(c.type_vocab_size) + ") (type_vocab_size)");
        }
      }
    }
    if (return_pooler && !model_->has_pooler()) {
      throw py::value_error("this checkpoint has no pooler (pooler.dense weights); return_pooler needs one");
    }
    if (num_threads < 0) throw py::value_error("num_threads must be >= 1 (or 0 for the default), got " + std::to_string(num_threads));

    const std::string request = "input_ids of shape " + shape_string(ids);
    py::array_t<float> out = sized_output({B, T, c.hidden_size}, request, "the hidden states");
    py::array_t<float> pooled;
    if (return_pooler) pooled = py::array_t<float>({B, c.hidden_size});
    // (A default-constructed array_t is an empty array, not null: test the arguments instead.)
    const int64_t* mp = attention_mask.is_none() ? nullptr : mask.data();
    const int64_t* tp = token_type_ids.is_none() ? nullptr : types.data();
    float* op = out.mutable_data();
    float* pp = return_pooler ? pooled.mutable_data() : nullptr;
    {
      GilReleased release;
      ScopedNumThreads threads(num_threads);
      ComputeSlots slots(current_num_threads());  // bounds threads × num_threads across Python threads
      with_size_context([&] { return request; }, [&] { model_->forward(id, mp, tp, B, T, op, pp); });
    }
    if (return_pooler) return py::make_tuple(out, pooled);
    return std::move(out);
  }

  long hidden_size() const { return model_->config().hidden_size; }
  long max_seq_len() const { return model_->config().max_seq_len(); }
  bool has_pooler() const { return model_->has_pooler(); }

 private:
  WeightRef weight(const py::dict& tensors, const std::string& key, long n, long k) const {
    return matmul(tensors, key, n, k, model_->config().weight_type);
  }

  std::unique_ptr<EncoderModel> model_;
};

}  // namespace

void register_models_encoder(py::module_& m) {
  py::class_<PyEncoderModel>(m, "EncoderModel")
      .def(py::init<const py::dict&, const py::dict&>(), py::arg("config"), py::arg("embeddings"))
      .def("add_layer", &PyEncoderModel::add_layer, py::arg("tensors"))
      .def("set_pooler", &PyEncoderModel::set_pooler, py::arg("weight"), py::arg("bias"),
           py::arg("weight_scale") = py::none())
      .def("forward", &PyEncoderModel::forward, py::arg("input_ids"), py::arg("attention_mask") = py::none(),
           py::arg("token_type_ids") = py::none(), py::arg("return_pooler") = false, py::arg("num_threads") = 0)
      .def_property_readonly("hidden_size", &PyEncoderModel::hidden_size)
      .def_property_readonly("max_seq_len", &PyEncoderModel::max_seq_len)
      .def_property_readonly("has_pooler", &PyEncoderModel::has_pooler);
}

}  // namespace bindings
}  // namespace cpuformer
