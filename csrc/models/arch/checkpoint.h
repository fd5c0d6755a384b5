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

#include <map>
#include <string>
#include <vector>

#include "io/json.h"
#include "io/safetensors.h"
#include "models/arch/arch.h"
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

// The canonical weights the model multiplies with (quantized in the weight dtype; a converted
// directory stores them in that format). python/cpuformer/arch/spec.py's MATMUL reads the list.
const std::vector<std::string>& matrix_weights();
bool is_matrix_weight(const std::string& canonical);

// The shape of canonical weight `name` (python/cpuformer/arch/spec.py's canonical_shape reads it);
// std::invalid_argument for a name that is not one.
std::vector<long> canonical_shape(const std::string& name, const TransformerConfig& hp);

// The tensor entries of the checkpoint in `directory` (the manifest's "tensors": {"model":
// {canonical: entry}, "<stack>": [{canonical: entry} per layer]}), every check above done; `prefix`:
// the body's tensor prefix found; `head_ignored`: the stored lm_head.weight a tied head leaves
// unread ("" : none). `config`: its parsed config.json. `converted`: the weight format of a
// `cpuformer convert`ed directory (weight_type, head_dtype, group_size, zero_point): its matrix
// weights are read as that format stores them (docs/precision.md: I8 + F32 per-row "_scale", U8
// nibble pairs + F16 group "_scale" (+ U8 "_zero"), F16 / BF16 words as uint16, in [out, in]
// layout) and its LM head is always stored; nullptr: a plain checkpoint.
struct CheckpointTensors {
  io::Json tensors;
  std::string prefix, head_ignored;
};
CheckpointTensors checkpoint_tensors(const std::string& directory, const io::Json& config,
                                     const TransformerConfig* converted = nullptr);

// The generation options a plain generate() passes to a decoder or seq2seq model of `config` (the
// manifest's "generation"; python/cpuformer/models/generator.py and seq2seq.py read them too): greedy,
// 20 new tokens, seed 0, and from generation_config.json where it sets a key (non-null), else
// config.json: eos_token_ids, pad_token_id (else the first EOS id, else 0), bad_words_ids and, for
// seq2seq, decoder_start_token_id (else bos_token_id; T5-style families start from pad),
// forced_bos_token_id and forced_eos_token_id (-1: none). Every id is checked (type, range) with a
// message naming the file and key. `eos_source`: the file the EOS ids come from.
struct GenerationDefaults {
  io::Json options;
  std::string eos_source;
};
GenerationDefaults generation_defaults(const std::string& directory, const io::Json& config,
                                       const io::Json& generation_config);

// What the procedure needs to know of a family: its name in prose (named by the stray-tensor
// error), the body prefixes tried in order, the patterns of tensors knowingly unused, the stored
// copies of a table (Arch::tied_copies).
struct Family {
  std::string title;
  std::vector<std::string> prefixes{""};
  std::vector<std::string> ignored;
  std::vector<std::pair<std::string, std::string>> tied_copies;
};

// checkpoint_tensors' procedure over declarations given by the caller: the Python package's image
// and CLIP families (declared in Python: the C API does not run them), task heads, and single reads
// under a known prefix. `groups[0]` may hold embed.tokens (it selects the prefix among
// family.prefixes) and lm_head (tied, untied or converted as above); `shapes`: the shapes of
// canonical names canonical_shape does not know; `account`: check that every checkpoint tensor is
// read or ignored (and the tied copies). Returns each group's entries, the prefix and head_ignored.
struct Declared {
  Family family;
  TransformerConfig hp;
  std::map<std::string, std::vector<long>> shapes;
  std::vector<Sources> groups;
  bool account = true;
};
struct DeclaredTensors {
  std::vector<io::Json> groups;
  std::string prefix, head_ignored;
};
DeclaredTensors declared_tensors(const std::string& directory, Declared declared, const TransformerConfig* converted);

// The graph manifest of the checkpoint in `directory` in weight format `format` (weight_type,
// head_dtype, group_size, zero_point, embedding_dtype), the generation defaults from `config` and
// `generation_config` (a null Json when absent); `converted`: as checkpoint_tensors'.
io::Json checkpoint_manifest(const std::string& directory, const io::Json& config, const io::Json& generation_config,
                             const TransformerConfig& format, bool converted);

// The graph manifest of the plain checkpoint in `directory`, for `dtype` ("" : float32). `config`
// is its parsed config.json, `generation_config` its generation_config.json (a null Json when the
// file is absent).
io::Json plain_manifest(const std::string& directory, const io::Json& config, const io::Json& generation_config,
                        const std::string& dtype);

}  // namespace arch
}  // namespace cpuformer
