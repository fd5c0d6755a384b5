// A plain Hugging Face directory (config.json + model.safetensors or its shards) as a graph manifest, computed by
// the architecture registry (models/arch/arch.h): the same manifest `cpuformer convert` writes for a
// converted directory (docs/c-api.md), with every entry naming a float32 (or float16 / bfloat16)
// checkpoint tensor that the C++ model packs into the requested dtype at load. The C API
// (models/graph_loader.h) opens plain directories of the families declared in C++ through it.
//
// What it checks, as the Python loader (python/cpuformer/weights.py, Checkpoint) does: the family
// from config.json ("architectures", then "model_type"); the body's tensor prefix; a tied head
// (lm_head.weight then ignored) or an untied one that must be present; each tensor's shape against
// the canonical shape; every checkpoint tensor accounted for (declared, or matched by the family's
// `ignored` patterns). Errors are std::invalid_argument naming the directory, or NotSupported.
#pragma once

#include <string>
#include <vector>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/transformer_config.h"

namespace cpuformer {
namespace arch {

// The weight format of a model in `dtype` with the default quantization settings (docs/precision.md,
// "Which tensors are quantized"): int4 groups of 32 without zero points, the LM head in int8 and the
// token-embedding table in int8 rows for int4, the model's dtype and float32 otherwise. Sets
// weight_type, head_dtype, group_size, zero_point and embedding_dtype; std::invalid_argument for an
// unknown dtype.
void set_default_format(TransformerConfig& config, const std::string& dtype);

// A floating-point checkpoint tensor (F32, F16 or BF16) as float32 into `out` (its element count);
// std::invalid_argument naming the tensor for another dtype.
void widen_to_float32(const io::SafetensorsFile::Entry& entry, float* out);

// The shape of canonical weight `name` (python/cpuformer/arch/spec.py's canonical_shape reads it);
// std::invalid_argument for a name that is not one.
std::vector<long> canonical_shape(const std::string& name, const TransformerConfig& hp);

// The graph manifest of the plain checkpoint in `directory`, for `dtype` ("" : float32). `config`
// is its parsed config.json, `generation_config` its generation_config.json (a null Json when the
// file is absent).
io::Json plain_manifest(const std::string& directory, const io::Json& config, const io::Json& generation_config,
                        const std::string& dtype);

}  // namespace arch
}  // namespace cpuformer
