#include "models/arch/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>

#include "io/safetensors.h"
#include "kernels/gemm/gemm.h"
#include "models/arch/arch.h"
#include "models/config_reader.h"
#include "models/request_checks.h"

namespace cpuformer {
namespace arch {
namespace {

using io::SafetensorsFile;

Json number(long v) { return Json::make_number(static_cast<double>(v), std::to_string(v)); }
Json number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  return Json::make_number(v, std::string(buf, r.ptr));
}
Json shape_json(const std::vector<long>& shape) {
  Json::Array a;
  for (long d : shape) a.push_back(number(d));
  return Json::make_array(std::move(a));
}
Json ids_json(const std::vector<long>& ids) { return shape_json(ids); }

std::string shape_text(const std::vector<long>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The family config.json names, as python/cpuformer/arch/__init__.py's find(): the first
// "architectures" entry a family claims, else its "model_type"; (family, the name chosen from).
std::pair<const Arch*, std::string> find_family(const Json& config) {
  const Config c{config};
  std::vector<std::string> names;
  if (c.truthy("architectures")) {
    const Json& a = *c.get("architectures");
    bool ok = a.type() == Json::Type::kArray;
    if (ok) {
      for (const Json& n : a.array()) {
        ok = ok && n.type() == Json::Type::kString;
        if (ok) names.push_back(n.string());
      }
    }
    if (!ok) {
      throw std::invalid_argument("config.json: 'architectures' must be a list of class names, got " + describe(a));
    }
  }
  for (const std::string& name : names)
    for (const auto& arch : registry())
      if (std::find(arch->architectures.begin(), arch->architectures.end(), name) != arch->architectures.end())
        return {arch.get(), name};
  const Json* model_type = c.get("model_type");
  if (model_type && model_type->type() == Json::Type::kString) {
    for (const auto& arch : registry())
      if (std::find(arch->model_types.begin(), arch->model_types.end(), model_type->string()) !=
          arch->model_types.end())
        return {arch.get(), names.empty() ? model_type->string() : names[0]};
  }
  std::string titles;
  for (const auto& arch : registry())
    if (titles.find(arch->title) == std::string::npos) titles += (titles.empty() ? "" : ", ") + arch->title;
  const std::string described =
      names.empty() ? (model_type ? "model_type " + describe(*model_type) : "no architecture") : names[0];
  throw std::invalid_argument("config.json: " + described +
                              " is not an architecture the C API opens (it opens the text families " + titles +
                              "; image and CLIP models run in the Python package only: docs/c-api.md)");
}

// config_token_ids (python/cpuformer/_model_dir.py): a token id or a list of them (one only when
// `single`), each a JSON integer in [0, vocab_size) (vocab_size > 0) or within int64; `present`
// says whether the key was set (an empty list is a setting too).
std::vector<long> token_ids(const Config& settings, const std::string& key, long vocab_size = 0, bool single = false,
                            bool* present = nullptr) {
  const Json* value = settings.get(key);
  std::vector<long> out;
  if (present) *present = value != nullptr;
  if (!value) return out;
  std::vector<const Json*> values;
  if (value->type() == Json::Type::kArray && !single) {
    for (const Json& v : value->array()) values.push_back(&v);
  } else {
    values.push_back(value);
  }
  for (const Json* v : values) {
    bool ok = v->is_integer_number();
    if (ok) {
      try {
        const long id = v->integer();
        ok = vocab_size <= 0 || (id >= 0 && id < vocab_size);
        out.push_back(id);
      } catch (const std::invalid_argument&) {
        ok = false;
      }
    }
    if (!ok) {
      const std::string where = vocab_size > 0 ? "in [0, " + std::to_string(vocab_size) + ")" : "within int64";
      throw std::invalid_argument(
          settings.source + ": " + python_string(key) + " must be " +
          (single ? "a token id (an integer " : "a token id or a list of token ids (integers ") + where + "), got " +
          describe(*value));
    }
  }
  return out;
}

std::string list_text(const std::vector<long>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

// Which file supplies generation default `key`: generation_config.json when it sets it (non-null).
Config generation_setting(const Json& config, const Json& generation, const std::string& key) {
  if (generation.type() == Json::Type::kObject && Config{generation}.get(key))
    return Config{generation, "generation_config.json"};
  return Config{config, "config.json"};
}

// The options a plain generate() passes (see generation_defaults in checkpoint.h).
Json default_options(const Json& config, const Json& generation, long vocab_size, const Arch& arch,
                     const std::string& directory) {
  const std::vector<long> eos = token_ids(generation_setting(config, generation, "eos_token_id"), "eos_token_id");
  const std::vector<long> pads = token_ids(generation_setting(config, generation, "pad_token_id"), "pad_token_id");
  const long pad = !pads.empty() ? pads[0] : !eos.empty() ? eos[0] : 0;
  const Config bad_source = generation_setting(config, generation, "bad_words_ids");
  Json::Array bad_words;
  if (const Json* bad = bad_source.get("bad_words_ids")) {
    bool ok = bad->type() == Json::Type::kArray;
    for (std::size_t i = 0; ok && i < bad->array().size(); ++i) {
      const Json& word = bad->array()[i];
      ok = word.type() == Json::Type::kArray && !word.array().empty();
      Json::Array ids;
      for (std::size_t j = 0; ok && j < word.array().size(); ++j) {
        const Json& t = word.array()[j];
        ok = t.is_integer_number();
        long id = -1;
        if (ok) {
          try {
            id = t.integer();
          } catch (const std::invalid_argument&) {
            ok = false;
          }
        }
        ok = ok && id >= 0 && id < vocab_size;
        if (ok) ids.push_back(number(id));
      }
      if (ok) bad_words.push_back(Json::make_array(std::move(ids)));
    }
    if (!ok) {
      throw std::invalid_argument(bad_source.source +
                                  ": 'bad_words_ids' must be a list of non-empty lists of token ids (integers in [0, " +
                                  std::to_string(vocab_size) + ")), got " + describe(*bad));
    }
  }
  Json::Object o;
  o.emplace_back("max_new_tokens", number(20L));
  o.emplace_back("min_new_tokens", number(0L));
  o.emplace_back("do_sample", Json::make_bool(false));
  o.emplace_back("temperature", number(1.0));
  o.emplace_back("top_k", number(0L));
  o.emplace_back("top_p", number(1.0));
  o.emplace_back("repetition_penalty", number(1.0));
  o.emplace_back("presence_penalty", number(0.0));
  o.emplace_back("frequency_penalty", number(0.0));
  o.emplace_back("logit_bias_ids", Json::make_array({}));
  o.emplace_back("logit_bias_values", Json::make_array({}));
  o.emplace_back("num_beams", number(1L));
  o.emplace_back("length_penalty", number(1.0));
  o.emplace_back("early_stopping", number(0L));
  o.emplace_back("eos_token_ids", ids_json(eos));
  o.emplace_back("pad_token_id", number(pad));
  o.emplace_back("seed", number(0L));
  o.emplace_back("return_log_probs", Json::make_bool(false));
  o.emplace_back("num_return_sequences", number(1L));
  o.emplace_back("no_repeat_ngram_size", number(0L));
  o.emplace_back("kv_cache_dtype", number(0L));
  o.emplace_back("bad_words_ids", Json::make_array(std::move(bad_words)));
  if (arch.kind == "seq2seq") {
    // transformers: decoder_start_token_id, else bos_token_id; T5 checkpoints start from pad.
    std::string key = "decoder_start_token_id";
    std::string start_source = generation_setting(config, generation, key).source;
    std::vector<long> start = token_ids(generation_setting(config, generation, key), key, vocab_size);
    if (start.empty()) {
      key = "bos_token_id";
      start_source = generation_setting(config, generation, key).source;
      start = token_ids(generation_setting(config, generation, key), key, vocab_size);
    }
    if (start.empty() && arch.start_from_pad) start = {pad};
    if (start.empty()) {
      throw std::invalid_argument(directory +
                                  ": the config has neither decoder_start_token_id nor bos_token_id; "
                                  "encoder-decoder generation needs one");
    }
    for (long id : start) {
      if (id != start[0]) {  // transformers' per-row start tokens
        throw NotSupported(start_source + ": " + python_string(key) + " lists different start tokens " +
                           list_text(start) + "; one start token for every row is supported");
      }
    }
    const std::vector<long> bos = token_ids(generation_setting(config, generation, "forced_bos_token_id"),
                                            "forced_bos_token_id", vocab_size, true);
    bool forced_eos_set = false;
    const Config eos_source = generation_setting(config, generation, "forced_eos_token_id");
    const std::vector<long> forced_eos =
        token_ids(eos_source, "forced_eos_token_id", vocab_size, false, &forced_eos_set);
    if (forced_eos_set && forced_eos.size() != 1) {
      // An empty list would force no token at all (transformers then masks every logit).
      const std::string message = eos_source.source +
                                  ": 'forced_eos_token_id' must be one token id (or a list "
                                  "of one), got " +
                                  list_text(forced_eos);
      if (forced_eos.empty()) throw std::invalid_argument(message);
      throw NotSupported(message);
    }
    o.emplace_back("decoder_start_token_id", number(start[0]));
    o.emplace_back("forced_bos_token_id", number(bos.empty() ? -1L : bos[0]));
    o.emplace_back("forced_eos_token_id", number(forced_eos.empty() ? -1L : forced_eos[0]));
  }
  return Json::make_object(std::move(o));
}

// TransformerConfig as the manifest's "config" object.
struct JsonWriter {
  Json::Object& out;
  void operator()(const char* name, long v) { out.emplace_back(name, number(v)); }
  void operator()(const char* name, float v) { out.emplace_back(name, number(static_cast<double>(v))); }
  void operator()(const char* name, bool v) { out.emplace_back(name, Json::make_bool(v)); }
  template <class Enum, class = std::enable_if_t<std::is_enum<Enum>::value>>
  void operator()(const char* name, Enum v) {
    out.emplace_back(name, Json::make_string(config_choice_name(v)));
  }
};

// The canonical weights of one checkpoint, as Python's weights.Checkpoint reads a plain one.
class Reader {
 public:
  // `converted`: the weight format of a `cpuformer convert`ed directory (its matrix weights are
  // read as stored), or nullptr for a plain checkpoint.
  // `shapes`: the shapes of canonical names canonical_shape does not know (a head's).
  Reader(const std::string& directory, const Family& family, const TransformerConfig& hp,
         const io::SafetensorsSet& file, const TransformerConfig* converted,
         const std::map<std::string, std::vector<long>>& shapes)
      : directory_(directory), arch_(family), hp_(hp), file_(file), converted_(converted), shapes_(shapes) {}

  // The first prefix under which `embed` (the token table's declaration) is stored; without one
  // found (or `embed` null), "" when that is a candidate, else the first.
  void set_prefix(const TensorDecl* embed) {
    const auto& prefixes = arch_.prefixes;
    prefix_ = prefixes.empty() || std::find(prefixes.begin(), prefixes.end(), "") != prefixes.end() ? "" : prefixes[0];
    if (!embed) return;
    for (const std::string& p : prefixes) {
      bool found = file_.find(p + embed->name) != nullptr;
      for (const std::string& f : embed->fallbacks) found = found || file_.find(p + f) != nullptr;
      if (found) {
        prefix_ = p;
        return;
      }
    }
  }

  const std::string& prefix() const { return prefix_; }

  std::string full(const TensorDecl& t, const std::string& name) const { return t.root ? name : prefix_ + name; }

  // The tensor's name in this checkpoint (its first present fallback), or "" when absent.
  std::string checkpoint_name(const TensorDecl& t) const {
    if (file_.find(full(t, t.name))) return full(t, t.name);
    for (const std::string& f : t.fallbacks)
      if (file_.find(full(t, f))) return full(t, f);
    return "";
  }

  // Manifest entries of `sources` (canonical name, prefixed by `prefix`, -> entry).
  void entries(const Sources& sources, const std::string& prefix, Json::Object& out) {
    for (const auto& item : sources.items()) {
      if (!item.second.computed) continue;
      Json::Array values;
      values.reserve(item.second.values.size());
      for (float v : item.second.values) values.push_back(number(static_cast<double>(v)));
      Json::Object e;
      e.emplace_back("shape", shape_json(item.second.shape));
      e.emplace_back("dtype", Json::make_string("float32"));
      e.emplace_back("values", Json::make_array(std::move(values)));
      out.emplace_back(prefix + item.first, Json::make_object(std::move(e)));
    }
    // Weights before biases; a bias whose weight is absent is left out with it.
    std::vector<const std::pair<std::string, Source>*> order;
    for (const auto& item : sources.items())
      if (!item.second.computed && !ends_with(item.first, ".bias")) order.push_back(&item);
    for (const auto& item : sources.items())
      if (!item.second.computed && ends_with(item.first, ".bias")) order.push_back(&item);
    std::set<std::string> absent;
    std::vector<std::pair<std::string, std::vector<const std::pair<std::string, Source>*>>> plan;
    for (const auto* item : order) {
      const std::string& canonical = item->first;
      const TensorDecl& t = item->second.tensor;
      if (ends_with(canonical, ".bias") && absent.count(canonical.substr(0, canonical.size() - 5))) continue;
      std::string name = checkpoint_name(t);
      if (name.empty()) {
        if (t.optional) {
          absent.insert(canonical);
          continue;
        }
        name = full(t, t.fallbacks.empty() ? t.name : t.fallbacks.back());
      }
      auto group = std::find_if(plan.begin(), plan.end(), [&](const auto& g) { return g.first == name; });
      if (group == plan.end()) {
        plan.push_back({name, {}});
        group = plan.end() - 1;
      }
      group->second.push_back(item);
    }
    for (const auto& group : plan) add_group(group.first, group.second, prefix, out);
  }

  // The checkpoint tensors no declaration reads and `ignored` does not match: an error naming them.
  // Then the shapes and dtypes of the tensors read (a missing tensor is named first, then a stray
  // one, then a wrong shape).
  void check_accounted(const std::string& head_ignored, bool tied) const {
    std::vector<std::regex> ignored;
    for (const std::string& pattern : arch_.ignored) ignored.emplace_back(pattern, std::regex::ECMAScript);
    std::vector<std::string> stray;
    for (const SafetensorsFile::Entry* e : file_.entries()) {
      if (used_.count(e->name) || e->name == head_ignored) continue;
      bool part = false;  // a quantized weight's scales or zero points
      for (const char* suffix : {"_scale", "_zero"})
        part = part || (ends_with(e->name, suffix) && used_.count(e->name.substr(0, e->name.size() - strlen(suffix))));
      if (part) continue;
      bool known = false;
      for (const std::regex& r : ignored) known = known || std::regex_match(e->name, r);
      if (!known) stray.push_back(e->name);
    }
    if (!tied) check_tied_copies();
    if (stray.empty()) return verify();
    std::string shown;
    for (std::size_t i = 0; i < stray.size() && i < 5; ++i) shown += (i ? ", " : "") + stray[i];
    if (stray.size() > 5) shown += " and " + std::to_string(stray.size() - 5) + " more";
    throw std::invalid_argument(directory_ + ": the checkpoint has tensors that " + arch_.title +
                                " models do not use: " + shown + "; config.json names the " + arch_.title +
                                " architecture, so either it does not match the weights, or this is a variant (a "
                                "task head, a checkpoint format) that cpuformer does not support yet");
  }

 private:
  // The shape and dtype of every tensor read (after the stray check when there is one).
 public:
  void verify() const {
    for (const Pending& p : pending_) check_stored(p);
  }

 private:
  // A checkpoint tensor's expected stored shape, checked once every tensor is accounted for.
  struct Pending {
    const SafetensorsFile::Entry* entry;
    std::vector<long> stored, shape;
    std::string rows_key;
    WeightType matrix = WeightType::kFloat32;  // a converted matrix weight: its stored dtype
    bool converted_matrix = false;
  };

  static const char* stored_name(WeightType t) {
    switch (t) {
      case WeightType::kInt8: return "I8";
      case WeightType::kInt4: return "U8";
      case WeightType::kFloat16: return "F16";
      case WeightType::kBFloat16: return "BF16";
      default: return "F32";
    }
  }

  // A converted directory's matrix weight: the dtype and shape its format stores, and its scales
  // (and zero points) beside it.
  void check_converted(const Pending& p) const {
    const SafetensorsFile::Entry& e = *p.entry;
    const std::string dtype = config_choice_name(p.matrix);
    const std::string where = directory_ + " (converted to " + config_choice_name(converted_->weight_type) + ")";
    const std::string expected = stored_name(p.matrix);
    if (e.dtype != expected) {
      throw std::invalid_argument(where + ": tensor " + python_string(e.name) + " is stored as " + e.dtype + "; a " +
                                  dtype + " weight is stored as " + expected);
    }
    if (e.shape != p.stored) {
      throw std::invalid_argument(where + ": tensor " + python_string(e.name) + " has shape " + shape_text(e.shape) +
                                  ", expected " + shape_text(p.stored));
    }
    auto part = [&](const std::string& suffix, const char* part_dtype, const std::vector<long>& shape,
                    const char* what) {
      const SafetensorsFile::Entry* x = file_.find(e.name + suffix);
      if (!x) {
        throw std::invalid_argument(where + ": " + dtype + " tensor " + python_string(e.name) + " has no " + what +
                                    " tensor " + python_string(e.name + suffix));
      }
      if (x->dtype != part_dtype || x->shape != shape) {
        throw std::invalid_argument(where + ": " + what + " tensor " + python_string(e.name + suffix) + " must be " +
                                    part_dtype + " of shape " + shape_text(shape) + ", got " + x->dtype + " of shape " +
                                    shape_text(x->shape));
      }
    };
    const long rows = p.shape[0];
    if (p.matrix == WeightType::kInt8) part("_scale", "F32", {rows}, "scale");
    if (p.matrix == WeightType::kInt4) {
      const long groups = (p.shape[1] + converted_->group_size - 1) / converted_->group_size;
      part("_scale", "F16", {rows, groups}, "scale");
      if (converted_->zero_point) part("_zero", "U8", {rows, groups}, "zero-point");
    }
  }

  void check_stored(const Pending& p) const {
    if (p.converted_matrix) return check_converted(p);
    const SafetensorsFile::Entry& e = *p.entry;
    if (!p.rows_key.empty() && (e.shape.empty() || e.shape[0] != p.shape[0] ||
                                !std::equal(e.shape.begin() + 1, e.shape.end(), p.shape.begin() + 1, p.shape.end()))) {
      const std::string expected =
          p.shape.size() == 1 ? "[" + p.rows_key + "]"
                              : p.rows_key + " × " + shape_text(std::vector<long>(p.shape.begin() + 1, p.shape.end()));
      throw std::invalid_argument("config.json: '" + p.rows_key + "' gives " + std::to_string(p.shape[0]) +
                                  " rows, but the checkpoint's " + e.name + " has shape " + shape_text(e.shape) +
                                  " (expected " + expected + ")");
    }
    if (e.shape != p.stored) {
      throw std::invalid_argument(file_.source() + ": tensor '" + e.name + "' has shape " + shape_text(e.shape) +
                                  ", expected " + shape_text(p.stored));
    }
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64") {
      throw std::invalid_argument(file_.source() + ": tensor '" + e.name + "' is stored as " + e.dtype +
                                  "; a plain checkpoint's weights are F32, F16, BF16 or F64");
    }
  }

  // With tie_word_embeddings false, a stored copy of a table (Arch::tied_copies) must hold the
  // table's values: transformers 5 then uses the copy itself, which cpuformer's one table cannot
  // represent (NotSupported).
  void check_tied_copies() const {
    for (const auto& [copy, table] : arch_.tied_copies) {
      const SafetensorsFile::Entry* a = file_.find(prefix_ + copy);
      const SafetensorsFile::Entry* b = file_.find(prefix_ + table);
      if (!a || !b) continue;
      bool same = a->shape == b->shape;
      if (same) {
        const std::vector<float> x = widened(*a), y = widened(*b);
        for (std::size_t i = 0; same && i < x.size(); ++i) same = x[i] == y[i] || (x[i] != x[i] && y[i] != y[i]);
      }
      if (!same) {
        throw NotSupported(directory_ + ": " + prefix_ + copy + " differs from " + prefix_ + table +
                           " and config.json has tie_word_embeddings=false, so transformers uses separate tables "
                           "there; cpuformer reads one table (" +
                           prefix_ + table + ") and does not support separate ones");
      }
    }
  }

  // A floating-point tensor's values as float32.
  static std::vector<float> widened(const SafetensorsFile::Entry& e) {
    std::size_t n = 1;
    for (long d : e.shape) n *= static_cast<std::size_t>(d);
    std::vector<float> out(n);
    widen_to_float32(e, out.data());
    return out;
  }

  static bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  }

  void add_group(const std::string& name, const std::vector<const std::pair<std::string, Source>*>& members,
                 const std::string& prefix, Json::Object& out) {
    used_.insert(name);
    const TensorDecl& first = members[0]->second.tensor;
    const auto given = shapes_.find(members[0]->first);
    std::vector<long> shape = given != shapes_.end() ? given->second : canonical_shape(members[0]->first, hp_);
    if (first.rows_start >= 0) {  // a fused tensor: its rows are the blocks declared from it
      long rows = 0;
      for (const auto* m : members)
        if (m->second.tensor.rows_start >= 0) rows = std::max(rows, m->second.tensor.rows_stop);
      shape[0] = rows;
    }
    const SafetensorsFile::Entry* e = file_.find(name);
    if (!e) throw std::invalid_argument(file_.source() + " has no tensor '" + name + "'");
    Pending pending{e, shape, shape, first.rows_key};
    // A converted directory stores its matrix weights in their format, [out, in] (docs/precision.md).
    pending.converted_matrix = converted_ && is_matrix_weight(members[0]->first);
    // (The model dtype, for the LM head its own.)
    if (pending.converted_matrix)
      pending.matrix = members[0]->first == "lm_head" ? converted_->head_dtype : converted_->weight_type;
    if (pending.converted_matrix && pending.matrix == WeightType::kInt4) {
      const long groups = (shape[1] + converted_->group_size - 1) / converted_->group_size;
      pending.stored[1] = groups * converted_->group_size / 2;  // nibble pairs, padded to whole groups
    }
    if (!pending.converted_matrix) {
      std::vector<long>& stored = pending.stored;
      if (first.transpose) std::reverse(stored.begin(), stored.end());
      if (first.as_row) stored.insert(stored.begin(), 1);  // a vector stored as one row [1, n]
      // Head axes split ([d_model, n_head, d_head]): read as stored, reshaped row-major (the loader
      // transposes over the first axis against the rest).
      if (!first.stored_shape.empty()) stored = first.stored_shape;
    }
    pending_.push_back(pending);
    // The NumPy dtype each part is read as (the 16-bit words of float16 / bfloat16 as uint16).
    const char* dtype = "float32";
    if (pending.converted_matrix) {
      switch (pending.matrix) {
        case WeightType::kInt8: dtype = "int8"; break;
        case WeightType::kInt4: dtype = "uint8"; break;
        case WeightType::kFloat16:
        case WeightType::kBFloat16: dtype = "uint16"; break;
        default: break;
      }
    }
    for (const auto* m : members) {
      const TensorDecl& t = m->second.tensor;
      std::vector<long> part = pending.converted_matrix ? pending.stored : shape;
      if (t.rows_start >= 0) part[0] = t.rows_stop - t.rows_start;
      auto add = [&](const std::string& suffix, const char* part_dtype, std::vector<long> part_shape) {
        Json::Object entry;
        entry.emplace_back("shape", shape_json(part_shape));
        entry.emplace_back("dtype", Json::make_string(part_dtype));
        entry.emplace_back("name", Json::make_string(name + suffix));
        if (t.rows_start >= 0) entry.emplace_back("rows", shape_json({t.rows_start, t.rows_stop}));
        if (t.transpose && !pending.converted_matrix) entry.emplace_back("transpose", Json::make_bool(true));
        if (t.plus_one) entry.emplace_back("plus_one", Json::make_bool(true));
        out.emplace_back(prefix + m->first + suffix, Json::make_object(std::move(entry)));
      };
      add("", dtype, part);
      if (pending.converted_matrix && pending.matrix == WeightType::kInt8) add("_scale", "float32", {part[0]});
      if (pending.converted_matrix && pending.matrix == WeightType::kInt4) {
        const long groups = (shape[1] + converted_->group_size - 1) / converted_->group_size;
        add("_scale", "float16", {part[0], groups});
        if (converted_->zero_point) add("_zero", "uint8", {part[0], groups});
      }
    }
  }

  const std::string& directory_;
  const Family& arch_;
  const TransformerConfig& hp_;
  const io::SafetensorsSet& file_;
  const TransformerConfig* converted_;
  const std::map<std::string, std::vector<long>>& shapes_;
  std::string prefix_;
  std::set<std::string> used_;
  std::vector<Pending> pending_;
};

}  // namespace

void widen_to_float32(const SafetensorsFile::Entry& e, float* out) {
  std::size_t n = 1;
  for (long d : e.shape) n *= static_cast<std::size_t>(d);
  if (e.dtype == "F32") {
    std::memcpy(out, e.data, n * 4);
  } else if (e.dtype == "F16") {
    const uint16_t* in = static_cast<const uint16_t*>(e.data);
    for (std::size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
  } else if (e.dtype == "BF16") {
    const uint16_t* in = static_cast<const uint16_t*>(e.data);
    for (std::size_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  } else if (e.dtype == "F64") {  // IEEE rounding: beyond float32's range is +-inf
    const char* in = static_cast<const char*>(e.data);
    for (std::size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, in + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    throw std::invalid_argument("'" + e.name + "' is stored as " + e.dtype +
                                "; a plain checkpoint's floating-point tensors are F32, F16, BF16 or F64");
  }
}

void set_default_format(TransformerConfig& c, const std::string& dtype) {
  c.weight_type = parse_config_choice<WeightType>(dtype, "dtype");
  c.head_dtype = c.weight_type == WeightType::kInt4 ? WeightType::kInt8 : c.weight_type;
  c.embedding_dtype = c.weight_type == WeightType::kInt4 ? WeightType::kInt8 : WeightType::kFloat32;
  c.group_size = 32;
  c.zero_point = false;
}

const std::vector<std::string>& matrix_weights() {
  static const std::vector<std::string> names = {
      "attn.q",   "attn.k", "attn.v",   "attn.o",  "cross.q", "cross.k",       "cross.v",         "cross.o",
      "ffn.gate", "ffn.up", "ffn.down", "lm_head", "pooler",  "embed.project", "attn.position_q", "attn.position_k"};
  return names;
}

bool is_matrix_weight(const std::string& canonical) {
  const auto& names = matrix_weights();
  return std::find(names.begin(), names.end(), canonical) != names.end();
}

std::vector<long> canonical_shape(const std::string& name, const TransformerConfig& hp) {
  const long H = hp.hidden_size, D = hp.head_dim, F = hp.intermediate_size, E = hp.embedding_width();
  const long heads = hp.num_heads, kv = hp.num_kv_heads > 0 ? hp.num_kv_heads : hp.num_heads;
  auto ends = [&](const char* s) {
    const std::string suffix(s);
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends(".bias") && name != "lm_head.bias") return {canonical_shape(name.substr(0, name.size() - 5), hp)[0]};
  if (name == "embed.norm") return {E};
  if (name == "attn.q_norm" || name == "attn.k_norm") return {D};
  static const std::set<std::string> norms = {"attn_norm", "cross_norm", "ffn_norm", "final_norm", "relative_norm"};
  if (norms.count(name)) return {H};
  const std::map<std::string, std::vector<long>> shapes = {
      {"attn.q", {heads * D, H}},
      {"attn.k", {kv * D, H}},
      {"attn.v", {kv * D, H}},
      {"attn.o", {H, heads * D}},
      {"cross.q", {heads * D, H}},
      {"cross.k", {heads * D, H}},
      {"cross.v", {heads * D, H}},
      {"cross.o", {H, heads * D}},
      {"ffn.gate", {F, H}},
      {"ffn.up", {F, H}},
      {"ffn.down", {H, F}},
      {"embed.tokens", {hp.vocab_size, E}},
      {"embed.token_types", {hp.type_vocab_size, E}},
      {"embed.positions", {hp.max_positions + hp.position_offset, E}},
      {"embed.project", {H, E}},
      {"lm_head", {hp.vocab_size, H}},
      {"lm_head.bias", {hp.vocab_size}},
      {"pooler", {H, H}},
      {"relative_bias", {hp.num_buckets, heads}},
      {"relative_embeddings", {2 * hp.relative_span(), H}},
      {"attn.position_q", {heads * D, H}},
      {"attn.position_k", {heads * D, H}},
      {"attn.content_bias", {heads * D}},
      {"attn.position_bias", {heads * D}},
      {"attn.segment_bias", {heads * D}},
      {"attn.segment_embed", {2, heads * D}},
  };
  const auto found = shapes.find(name);
  if (found == shapes.end()) throw std::invalid_argument("unknown canonical weight '" + name + "'");
  return found->second;
}

namespace {

// The family's hyperparameters as the manifests state them: the widths Python's Hparams spells out
// (0 means "the same as").
TransformerConfig manifest_hparams(const Arch& arch, const Json& config) {
  TransformerConfig hp = arch.hparams(Config{config});
  if (hp.num_kv_heads == 0) hp.num_kv_heads = hp.num_heads;
  if (hp.embedding_size == 0) hp.embedding_size = hp.hidden_size;
  return hp;
}

}  // namespace

DeclaredTensors declared_tensors(const std::string& directory, Declared d, const TransformerConfig* converted) {
  if (!exists(directory + "/model.safetensors") && !exists(directory + "/model.safetensors.index.json")) {
    throw std::invalid_argument(directory +
                                ": has no model.safetensors or model.safetensors.index.json (the C API reads "
                                "safetensors checkpoints)");
  }
  const io::SafetensorsSet file = io::SafetensorsSet::open_directory(directory);
  Reader reader(directory, d.family, d.hp, file, converted, d.shapes);
  DeclaredTensors out;
  const Source* embed = d.groups.empty() ? nullptr : d.groups[0].find("embed.tokens");
  reader.set_prefix(embed && !embed->computed ? &embed->tensor : nullptr);
  out.prefix = reader.prefix();
  Source* head = d.groups.empty() ? nullptr : d.groups[0].find("lm_head");
  if (head && !head->computed) {
    const std::string head_name = reader.checkpoint_name(head->tensor);
    if (converted) {  // always stored, a quantized copy when tied
      TensorDecl stored(head->tensor.name);
      stored.root = head->tensor.root;
      head->tensor = stored;
    } else if (d.hp.tie_word_embeddings) {
      out.head_ignored = head_name;
      Sources without;
      for (const auto& item : d.groups[0].items()) {
        if (item.first == "lm_head") continue;
        if (item.second.computed) {
          without.add(item.first, item.second.shape, item.second.values);
        } else {
          without.add(item.first, item.second.tensor);
        }
      }
      d.groups[0] = without;
    } else if (head_name.empty()) {
      throw std::invalid_argument(directory +
                                  ": the checkpoint has no lm_head.weight and tie_word_embeddings is false");
    }
  }
  for (const Sources& group : d.groups) {
    Json::Object entries;
    reader.entries(group, "", entries);
    out.groups.push_back(Json::make_object(std::move(entries)));
  }
  if (d.account) {
    reader.check_accounted(out.head_ignored, d.hp.tie_word_embeddings || converted);
  } else {
    reader.verify();
  }
  return out;
}

CheckpointTensors checkpoint_tensors(const std::string& directory, const Json& config,
                                     const TransformerConfig* converted) {
  const Arch* arch = find_family(config).first;
  Declared d;
  d.family = {arch->title, arch->prefixes, arch->ignored, arch->tied_copies};
  d.hp = manifest_hparams(*arch, config);
  const Config c{config};
  d.groups.push_back(arch->model_tensors(c, d.hp));
  const std::vector<std::pair<std::string, long>> stacks =
      arch->kind == "seq2seq" ? std::vector<std::pair<std::string, long>>{{"encoder", d.hp.num_layers},
                                                                          {"decoder", d.hp.num_decoder_layers}}
                              : std::vector<std::pair<std::string, long>>{{arch->kind, d.hp.distinct_layers()}};
  for (const auto& [stack, count] : stacks) {
    d.groups.push_back(arch->stack_tensors(c, d.hp, stack));
    for (long l = 0; l < count; ++l) d.groups.push_back(arch->layer_tensors(d.hp, stack, l));
  }
  DeclaredTensors read = declared_tensors(directory, std::move(d), converted);
  // {"model": the model's and each stack's entries (those under "<stack>."), "<stack>": [layers]}.
  Json::Object model = read.groups[0].object();
  Json::Object tensors;
  std::size_t next = 1;
  std::vector<std::pair<std::string, Json>> stack_layers;
  for (const auto& [stack, count] : stacks) {
    for (const auto& item : read.groups[next].object()) model.emplace_back(stack + "." + item.first, item.second);
    ++next;
    Json::Array layers(read.groups.begin() + next, read.groups.begin() + next + count);
    next += count;
    stack_layers.emplace_back(stack, Json::make_array(std::move(layers)));
  }
  tensors.emplace_back("model", Json::make_object(std::move(model)));
  for (auto& item : stack_layers) tensors.push_back(std::move(item));
  return {Json::make_object(std::move(tensors)), read.prefix, read.head_ignored};
}

GenerationDefaults generation_defaults(const std::string& directory, const Json& config, const Json& generation) {
  const Arch* arch = find_family(config).first;
  const TransformerConfig hp = arch->hparams(Config{config});
  return {default_options(config, generation, hp.vocab_size, *arch, directory),
          generation_setting(config, generation, "eos_token_id").source};
}

Json plain_manifest(const std::string& directory, const Json& config, const Json& generation,
                    const std::string& dtype) {
  TransformerConfig format;
  set_default_format(format, dtype.empty() ? "float32" : dtype);
  return checkpoint_manifest(directory, config, generation, format, false);
}

Json checkpoint_manifest(const std::string& directory, const Json& config, const Json& generation,
                         const TransformerConfig& format, bool converted) {
  const auto [arch, name] = find_family(config);
  TransformerConfig hp = manifest_hparams(*arch, config);
  hp.weight_type = format.weight_type;
  hp.head_dtype = format.head_dtype;
  hp.group_size = format.group_size;
  hp.zero_point = format.zero_point;
  hp.embedding_dtype = format.embedding_dtype;
  CheckpointTensors plain = checkpoint_tensors(directory, config, converted ? &format : nullptr);

  Json::Object fields;
  hp.fields(JsonWriter{fields});
  Json::Object manifest;
  manifest.emplace_back("format_version", number(1L));
  manifest.emplace_back("kind", Json::make_string(arch->kind));
  manifest.emplace_back("architecture", Json::make_string(name));
  manifest.emplace_back("config", Json::make_object(std::move(fields)));
  if (arch->kind != "encoder")
    manifest.emplace_back("generation", default_options(config, generation, hp.vocab_size, *arch, directory));
  manifest.emplace_back("tensors", std::move(plain.tensors));
  return Json::make_object(std::move(manifest));
}

}  // namespace arch
}  // namespace cpuformer
