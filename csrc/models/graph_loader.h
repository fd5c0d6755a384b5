// Opens a model directory without Python. A converted directory: its graph manifest (cpuformer_graph.json,
// written by `cpuformer convert`: python/cpuformer/models/_graph_file.py) gives the model config,
// where each canonical tensor lives in model.safetensors (with the row block, transpose and 1 + w
// edits the architecture registry declared) and the default generation options; the tensors go
// through the same ModelBuilder as the Python extension's, so both load a model identically. A
// plain Hugging Face directory of a family the C++ architecture registry declares: the manifest is
// computed from its config.json (models/arch/checkpoint.h). The C API (include/cpuformer.h) is built on it. Format:
// docs/c-api.md.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "io/json.h"
#include "models/decoder.h"
#include "models/encoder.h"
#include "models/generation.h"
#include "models/model_builder.h"
#include "models/seq2seq.h"
#include "models/transformer_config.h"

namespace cpuformer {

// The manifest's file name and the format version this loader reads.
constexpr const char* kGraphFile = "cpuformer_graph.json";
constexpr long kGraphFormatVersion = 1;

// A loaded model: exactly one of encoder / decoder / seq2seq is set (config.kind's).
struct GraphModel {
  std::string architecture;  // config.json's class name ("GPT2LMHeadModel")
  std::string dtype;         // the weights' dtype ("float32", "int8", ...)
  TransformerConfig config;
  GenerationOptions generation;         // what a plain generate() passes (decoders, seq2seq)
  int64_t decoder_start_token_id = -1;  // seq2seq
  // Owns the tables the model reads by pointer: declared before the models, destroyed after them.
  std::unique_ptr<ModelBuilder> builder;
  std::unique_ptr<EncoderModel> encoder;
  std::unique_ptr<DecoderModel> decoder;
  std::unique_ptr<Seq2SeqModel> seq2seq;
};

// Thrown for a path that does not exist or cannot be read (the C API's CF_ERROR_IO); a damaged or
// unsupported directory is std::invalid_argument (CF_ERROR_INVALID_MODEL).
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown, before any weight is read, for a converted directory asked for in another dtype than the
// one it stores (the C API's CF_ERROR_INVALID_ARGUMENT).
class ConvertedDtype : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Loads the model directory `directory`: a converted one by its manifest, or a plain Hugging Face
// directory of a family the C++ registry declares (models/arch/checkpoint.h) in `dtype` ("" :
// float32; a converted directory loads in its stored dtype, and a `dtype` that differs from it is
// ConvertedDtype). Every
// weight is packed or copied, or mapped from the directory's packed-weights file for this ISA level
// when it has a valid one (io/packed_file.h); model.safetensors is closed when this returns.
std::unique_ptr<GraphModel> load_graph(const std::string& directory, const std::string& dtype = "");

// The manifest load_graph follows for `directory`: its cpuformer_graph.json, or the one computed for
// a plain directory in `dtype`; `where` receives what messages name (the file, or the directory).
io::Json directory_manifest(const std::string& directory, const std::string& dtype, std::string& where);

}  // namespace cpuformer
