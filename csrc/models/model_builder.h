// The tensors of every model, under cpuformer's canonical names (docs/architecture.md), read from
// a TensorSource (models/tensor_source.h): one parser for the model-level tensors (GlobalTensors)
// and one for a layer (BlockTensors), shared by the Python extension's EncoderModel, DecoderModel
// and Seq2SeqModel and by the C API's loader (models/graph_loader.h).
//
// A layer source holds "attn.q", "attn.q.bias", "attn_norm", "ffn.up", ... (an int8 weight's
// scales as "<name>_scale", an int4 weight's as "<name>_scale" and "<name>_zero"); the model
// source holds "embed.tokens", "lm_head", "pooler", ... and each stack's tensors as
// "<stack>.embed.positions", "<stack>.final_norm", ... A key the config does not use is an error
// naming it, so a front end and the graph cannot drift apart.
//
// After load nothing the model computes with refers to the source: projection weights are packed,
// small vectors copied by the model, and the tables it reads by pointer (embeddings, position
// tables) are copied here into memory this builder owns. A checkpoint file truncated, overwritten
// or deleted while the model lives can therefore neither crash it (SIGBUS on a mapped page past
// the new end of the file) nor change its results. The one exception is a converted directory's
// packed-weights file (use_packed, io/packed_file.h): the model maps it, on purpose (no packing at
// load); replacing or deleting it is safe, truncating it in place is not (docs/reliability.md).
// The model must not outlive its builder.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "layers/transformer_block.h"
#include "models/model_tensors.h"
#include "models/tensor_source.h"
#include "models/transformer_config.h"
#include "runtime/aligned_buffer.h"

namespace cpuformer {

const char* weight_type_name(WeightType t);

class ModelBuilder {
 public:
  // what: the model kind in errors ("encoder tensor 'attn.q' ...").
  explicit ModelBuilder(std::string what) : what_(std::move(what)) {}

  // The model-level tensors; the tables the model reads by pointer are copied.
  GlobalTensors global_tensors(const TensorSource& tensors, const TransformerConfig& c);
  // One layer's tensors (cross: a seq2seq decoder layer); valid while `tensors` lives. layer: its
  // key in the packed-weights store ("decoder.layers.3"; "" with no store).
  BlockTensors block_tensors(const TensorSource& tensors, const TransformerConfig& c, bool cross,
                             const std::string& layer = "");
  // Packed weights for the Linears built from what global_tensors / block_tensors return next (a
  // converted directory's packed-weights file, or a writer recording them); null: none.
  void use_packed(std::shared_ptr<PackedWeightsStore> store) { packed_ = std::move(store); }
  const std::shared_ptr<PackedWeightsStore>& packed_store() const { return packed_; }

 private:
  StackTensors stack_tensors(const TensorSource& tensors, const TransformerConfig& c, const std::string& stack,
                             std::set<std::string>& used);
  LinearTensors linear(const TensorSource& tensors, const std::string& key, long n, long k, bool required,
                       const TransformerConfig& c, std::set<std::string>& used);
  NormTensors norm(const TensorSource& tensors, const std::string& key, long n, bool required,
                   std::set<std::string>& used);
  const float* vector(const TensorSource& tensors, const std::string& key, const std::vector<long>& shape,
                      bool required, std::set<std::string>& used, bool copy = false);
  void reject_unused(const TensorSource& tensors, const std::set<std::string>& used, const char* what) const;

  // The float32 C-contiguous tensor `key` of shape `shape`; with `copy`, copied into memory the
  // builder owns (tables the model reads by pointer).
  const float* get(const TensorSource& tensors, const std::string& key, const std::vector<long>& shape, bool copy);
  // A projection weight [n, k] stored in `format`: float32 (rounded or quantized while packing),
  // or already converted — int8 with "<key>_scale" float32 [n], int4 nibble pairs (int4_weight) or
  // 16-bit words (float16 / bfloat16).
  WeightRef matmul(const TensorSource& tensors, const std::string& key, long n, long k,
                   const WeightFormat& format) const;
  WeightRef int4_weight(const TensorSource& tensors, const std::string& key, long n, long k,
                        const WeightFormat& format) const;
  // tensors[key] checked for shape and contiguity.
  TensorView checked(const TensorSource& tensors, const std::string& key, const std::vector<long>& shape) const;
  std::string name(const std::string& key) const { return what_ + " tensor '" + key + "'"; }

  std::string what_;
  std::vector<AlignedBuffer<float>> owned_;  // the tables copied by get(..., copy=true)
  std::shared_ptr<PackedWeightsStore> packed_;
};

}  // namespace cpuformer
