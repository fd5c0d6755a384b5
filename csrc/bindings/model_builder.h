// The tensors of every model binding, under cpuformer's canonical names (docs/architecture.md):
// one parser for the model-level tensors (GlobalTensors) and one for a layer (BlockTensors),
// shared by EncoderModel, DecoderModel and Seq2SeqModel.
//
// A layer dict holds "attn.q", "attn.q.bias", "attn_norm", "ffn.up", ... (an int8 weight's scales
// as "<name>_scale"); the model dict holds "embed.tokens", "lm_head", "pooler", ... and each
// stack's tensors as "<stack>.embed.positions", "<stack>.final_norm", ... A key the config does
// not use is a ValueError naming it, so the Python layer and the graph cannot drift apart.
#pragma once

#include <pybind11/pybind11.h>

#include <set>
#include <string>

#include "bindings/weight_type.h"
#include "layers/transformer_block.h"
#include "models/model_tensors.h"
#include "models/transformer_config.h"

namespace cpuformer {
namespace bindings {

class ModelBuilder : protected ModelTensors {
 protected:
  explicit ModelBuilder(std::string what) : ModelTensors(what), what_(std::move(what)) {}

  // The model-level tensors; the tables the model reads by pointer are copied (ModelTensors::get).
  GlobalTensors global_tensors(const pybind11::dict& tensors, const TransformerConfig& c);
  // One layer's tensors (cross: a seq2seq decoder layer); valid while `tensors` lives.
  BlockTensors block_tensors(const pybind11::dict& tensors, const TransformerConfig& c, bool cross);

 private:
  StackTensors stack_tensors(const pybind11::dict& tensors, const TransformerConfig& c, const std::string& stack,
                             std::set<std::string>& used);
  LinearTensors linear(const pybind11::dict& tensors, const std::string& key, long n, long k, bool required,
                       const TransformerConfig& c, std::set<std::string>& used);
  NormTensors norm(const pybind11::dict& tensors, const std::string& key, long n, bool required,
                   std::set<std::string>& used);
  const float* vector(const pybind11::dict& tensors, const std::string& key, const std::vector<long>& shape,
                      bool required, std::set<std::string>& used, bool copy = false);
  void reject_unused(const pybind11::dict& tensors, const std::set<std::string>& used, const char* what) const;

  std::string what_;
};

}  // namespace bindings
}  // namespace cpuformer
