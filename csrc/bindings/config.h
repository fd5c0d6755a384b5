// TransformerConfig from a Python dict, by visiting TransformerConfig::fields(): the one config
// parser of every model binding. The dict must hold exactly the fields (the Python layer passes
// cpuformer.arch.Hparams plus "dtype"); a missing or unknown key is a ValueError naming it.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "kernels/attention/attention.h"
#include "models/generation.h"
#include "models/transformer_config.h"

namespace cpuformer {
namespace bindings {

// Every field name, in declaration order (_core.transformer_config_fields()).
std::vector<std::string> transformer_config_fields();

// The config a model binding is built from; ValueError for a missing, unknown or invalid field
// (TransformerConfig::validate()).
TransformerConfig transformer_config(const pybind11::dict& config);

// The fields `fields` has (cpuformer.arch.Hparams as a dict), the others at their defaults; not
// validated (the architecture registry's tensor declarations read the widths).
TransformerConfig partial_transformer_config(const pybind11::dict& fields);

// The generation options of every generating binding, from the dict the Python layer checked
// (GenerationOptions::fields()): a missing option keeps its default; a key that is neither an
// option nor in `extra` (a model kind's own, e.g. decoder_start_token_id) is a ValueError.
GenerationOptions generation_options(const pybind11::dict& options, const std::vector<std::string>& extra = {});

// The KV cache type options.kv_cache_dtype names (ValueError outside the KvType codes).
KvType kv_cache_type(const GenerationOptions& options);

// A speculative run's counts as a dict (target_passes, draft_tokens, accepted_tokens); None for
// a plain run.
pybind11::object speculation_stats(const GenerationResult& result, bool speculative);

// What a generating binding's generate() returns: (tokens, log_probs or None, speculation_stats,
// finish reasons ["eos" | "stop" | "length"] per sequence, beam scores per sequence or None).
pybind11::tuple generation_output(const GenerationResult& result, const GenerationOptions& options, bool speculative);

// "encoder" / "decoder" / "seq2seq".
const char* kind_name(ModelKind kind);

}  // namespace bindings
}  // namespace cpuformer
