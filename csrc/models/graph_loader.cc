#include "models/graph_loader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "io/json.h"
#include "io/packed_file.h"
#include "io/safetensors.h"
#include "kernels/gemm/gemm.h"
#include "models/arch/checkpoint.h"
#include "models/config_reader.h"
#include "runtime/load_scratch.h"

namespace cpuformer {
namespace {

using io::Json;
using io::SafetensorsFile;
using io::SafetensorsSet;

// A JSON object as a ConfigReader source.
struct JsonValues {
  const Json& object;

  bool has(const char* name) const { return object.find(name) != nullptr; }
  std::string string(const char* name) const { return object.at(name).string(); }
  long integer(const char* name) const { return object.at(name).integer(); }
  double number(const char* name) const { return object.at(name).number(); }
  bool boolean(const char* name) const { return object.at(name).boolean(); }
};

// Reads GenerationOptions fields from a JSON object (all of them optional).
struct OptionValues {
  const Json& object;
  std::set<std::string>& names;

  const Json* value(const char* name) {
    names.insert(name);
    return object.find(name);
  }
  template <class T, class = std::enable_if_t<std::is_integral<T>::value && !std::is_same<T, bool>::value>>
  void operator()(const char* name, T& field) {
    if (const Json* v = value(name)) field = static_cast<T>(v->integer());
  }
  void operator()(const char* name, bool& field) {
    if (const Json* v = value(name)) field = v->boolean();
  }
  void operator()(const char* name, float& field) {
    if (const Json* v = value(name)) field = static_cast<float>(v->number());
  }
  void operator()(const char* name, double& field) {
    if (const Json* v = value(name)) field = v->number();
  }
  void operator()(const char* name, std::vector<int64_t>& field) {
    if (const Json* v = value(name)) {
      field.clear();
      for (const Json& x : v->array()) field.push_back(x.integer());
    }
  }
  void operator()(const char* name, std::vector<float>& field) {
    if (const Json* v = value(name)) {
      field.clear();
      for (const Json& x : v->array()) field.push_back(static_cast<float>(x.number()));
    }
  }
  void operator()(const char* name, std::vector<std::vector<int64_t>>& field) {
    if (const Json* v = value(name)) {
      field.clear();
      for (const Json& row : v->array()) {
        field.emplace_back();
        for (const Json& x : row.array()) field.back().push_back(x.integer());
      }
    }
  }
};

struct TypeRule {
  const char* dtype;  // the manifest's (NumPy's) name
  ElementType type;
  std::size_t size;
  std::vector<std::string> stored;  // safetensors dtypes that hold it
};

const std::vector<TypeRule>& type_rules() {
  static const std::vector<TypeRule> rules = {
      {"float32", ElementType::kFloat32, 4, {"F32", "F16", "BF16", "F64"}},  // a plain checkpoint's, widened
      {"float16", ElementType::kFloat16, 2, {"F16"}},
      {"uint16", ElementType::kUInt16, 2, {"F16", "BF16", "U16"}},
      {"int8", ElementType::kInt8, 1, {"I8"}},
      {"uint8", ElementType::kUInt8, 1, {"U8"}},
  };
  return rules;
}

// One object of manifest entries (the model's, or one layer's) as a TensorSource. Entries are
// resolved on first use; edited tensors (transposed, 1 + w) and computed ones are owned here.
class ManifestSource : public TensorSource {
 public:
  ManifestSource(const Json& entries, const SafetensorsSet& file, std::string where)
      : entries_(entries), file_(file), where_(std::move(where)) {}

  bool contains(const std::string& key) const override { return entries_.find(key) != nullptr; }
  std::vector<std::string> keys() const override {
    std::vector<std::string> out;
    for (const auto& item : entries_.object()) out.push_back(item.first);
    return out;
  }
  TensorView get(const std::string& key, const std::string& name) const override {
    auto found = views_.find(key);
    if (found != views_.end()) return found->second;
    TensorView v = resolve(key);
    views_.emplace(key, v);
    return v;
  }
  // The checkpoint tensors this object reads (to release their pages once the model has them).
  std::vector<const SafetensorsFile::Entry*> stored() const {
    std::vector<const SafetensorsFile::Entry*> out;
    for (const auto& item : entries_.object()) {
      if (const Json* n = item.second.find("name")) {
        if (const SafetensorsFile::Entry* e = file_.find(n->string())) out.push_back(e);
      }
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::invalid_argument(where_ + " tensor '" + key + "': " + what);
  }

  TensorView resolve(const std::string& key) const {
    const Json& entry = entries_.at(key);
    const std::string dtype = entry.at("dtype").string();
    const TypeRule* rule = nullptr;
    for (const TypeRule& r : type_rules()) {
      if (dtype == r.dtype) rule = &r;
    }
    if (!rule) fail(key, "unknown dtype '" + dtype + "'");
    TensorView v;
    v.type = rule->type;
    v.type_name = rule->dtype;
    long count = 1;
    for (const Json& d : entry.at("shape").array()) {
      const long n = d.integer();
      if (n < 0 || (n > 0 && count > (1L << 40) / n)) fail(key, "invalid shape");
      v.shape.push_back(n);
      count *= n;
    }
    if (const Json* values = entry.find("values")) {  // computed from the config (RoPE frequencies)
      if (rule->type != ElementType::kFloat32) fail(key, "computed values must be float32");
      if (static_cast<long>(values->array().size()) != count) fail(key, "holds the wrong number of values");
      std::vector<float>& out = own(count);
      for (long i = 0; i < count; ++i) out[i] = static_cast<float>(values->array()[i].number());
      v.data = out.data();
      return v;
    }
    const std::string stored_name = entry.at("name").string();
    const SafetensorsFile::Entry* s = file_.find(stored_name);
    if (!s) fail(key, "model.safetensors has no tensor '" + stored_name + "'");
    bool stored_ok = false;
    for (const std::string& t : rule->stored) stored_ok = stored_ok || s->dtype == t;
    if (!stored_ok) fail(key, "'" + stored_name + "' is stored as " + s->dtype + ", expected " + rule->dtype);
    const char* data = static_cast<const char*>(s->data);
    long total = 1;
    for (long d : s->shape) total *= d;
    if (rule->type == ElementType::kFloat32 && s->dtype != "F32") {  // F16 / BF16 / F64 of a plain checkpoint
      std::vector<float>& wide = own(total);
      arch::widen_to_float32(*s, wide.data());
      data = reinterpret_cast<const char*>(wide.data());
    }
    long rows = s->shape.empty() ? 1 : s->shape[0];
    const bool transpose = entry.find("transpose") && entry.at("transpose").boolean();
    if (transpose) {
      // [a, b] -> [b, a]; a stored tensor of more axes (XLNet's [d_model, n_head, d_head]) is read as
      // [first axis, the rest].
      if (s->shape.size() < 2 || rule->type != ElementType::kFloat32)
        fail(key, "only float32 of 2+ axes is transposed");
      const long a = s->shape[0], b = s->shape[0] > 0 ? total / s->shape[0] : 0;
      std::vector<float>& out = own(total);
      const float* in = reinterpret_cast<const float*>(data);
      for (long i = 0; i < a; ++i)
        for (long j = 0; j < b; ++j) out[j * a + i] = in[i * b + j];
      data = reinterpret_cast<const char*>(out.data());
      rows = b;
    }
    long elements = total;
    if (const Json* r = entry.find("rows")) {
      const long start = r->array().at(0).integer(), stop = r->array().at(1).integer();
      if (r->array().size() != 2 || start < 0 || stop < start || stop > rows || rows == 0) {
        fail(key, "rows [" + std::to_string(start) + ", " + std::to_string(stop) + ") outside the " +
                      std::to_string(rows) + " rows of '" + stored_name + "'");
      }
      const long row_elements = total / rows;
      data += static_cast<std::size_t>(start * row_elements) * rule->size;
      elements = (stop - start) * row_elements;
    }
    if (elements != count) {
      fail(key, "'" + stored_name + "' " + shape_string(s->shape) + " does not give shape " + shape_string(v.shape));
    }
    if (entry.find("plus_one") && entry.at("plus_one").boolean()) {
      if (rule->type != ElementType::kFloat32) fail(key, "1 + w applies to float32 only");
      std::vector<float>& out = own(count);
      const float* in = reinterpret_cast<const float*>(data);
      for (long i = 0; i < count; ++i) out[i] = in[i] + 1.0f;
      data = reinterpret_cast<const char*>(out.data());
    }
    v.data = data;
    return v;
  }

  std::vector<float>& own(long count) const {
    owned_.emplace_back(static_cast<std::size_t>(count));
    return owned_.back();
  }

  const Json& entries_;
  const SafetensorsSet& file_;
  std::string where_;
  mutable std::map<std::string, TensorView> views_;
  mutable std::vector<std::vector<float>> owned_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(path + ": cannot be read (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// A plain directory's manifest is the one the architecture registry computes (models/arch/checkpoint.h).
Json directory_manifest(const std::string& directory, const std::string& dtype, std::string& where) {
  struct stat st;
  if (::stat(directory.c_str(), &st) != 0) throw FileError(directory + ": no such directory");
  if (!S_ISDIR(st.st_mode)) {
    throw FileError(directory +
                    ": is not a directory (give a Hugging Face model directory or one written by "
                    "`cpuformer convert`)");
  }
  const std::string manifest_path = directory + "/" + kGraphFile;
  if (::stat(manifest_path.c_str(), &st) == 0) {
    where = manifest_path;
    try {
      return Json::parse_python(read_text(manifest_path));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(manifest_path + ": " + e.what());
    }
  }
  const std::string config_path = directory + "/config.json";
  if (::stat(config_path.c_str(), &st) != 0) {
    throw std::invalid_argument(directory +
                                ": has no config.json (give a Hugging Face model directory or one "
                                "written by `cpuformer convert`)");
  }
  const Json config = [&] {
    try {
      return Json::parse_python(read_text(config_path));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(config_path + ": " + e.what());
    }
  }();
  if (config.type() != Json::Type::kObject) throw std::invalid_argument(config_path + ": must contain a JSON object");
  if (config.find("cpuformer")) {  // converted by a build that wrote no manifest for it (image models)
    throw std::invalid_argument(directory + ": has no " + kGraphFile +
                                "; the C API runs the text models that `cpuformer convert` writes one for "
                                "(docs/c-api.md)");
  }
  Json generation;
  const std::string generation_path = directory + "/generation_config.json";
  if (::stat(generation_path.c_str(), &st) == 0) {
    try {
      generation = Json::parse_python(read_text(generation_path));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(generation_path + ": " + e.what());
    }
  }
  where = directory;
  return arch::plain_manifest(directory, config, generation, dtype);
}

std::unique_ptr<GraphModel> load_graph(const std::string& directory, const std::string& dtype) {
  LoadScratchScope scratch;  // the layers join their fused weights in one set of buffers
  std::string manifest_path;
  const Json manifest = directory_manifest(directory, dtype, manifest_path);
  auto model = std::make_unique<GraphModel>();
  try {
    const long version = manifest.at("format_version").integer();
    if (version != kGraphFormatVersion) {
      throw std::invalid_argument("format_version " + std::to_string(version) + " is not supported (this build reads " +
                                  std::to_string(kGraphFormatVersion) + "); convert the model again");
    }
    model->architecture = manifest.at("architecture").string();
    const Json& config = manifest.at("config");
    std::set<std::string> seen;
    JsonValues values{config};
    model->config.fields(ConfigReader<JsonValues>{values, seen});
    for (const auto& item : config.object()) {
      if (!seen.count(item.first)) throw std::invalid_argument("model config: unknown field '" + item.first + "'");
    }
    model->config.validate();
    model->dtype = config.at("dtype").string();
    if (manifest.at("kind").string() != config.at("kind").string()) {
      throw std::invalid_argument("kind differs from the config's");
    }
    if (const Json* generation = manifest.find("generation")) {
      std::set<std::string> names = {"decoder_start_token_id"};
      model->generation.fields(OptionValues{*generation, names});
      for (const auto& item : generation->object()) {
        if (!names.count(item.first)) throw std::invalid_argument("generation: unknown option '" + item.first + "'");
      }
      if (const Json* start = generation->find("decoder_start_token_id"))
        model->decoder_start_token_id = start->integer();
    } else if (model->config.kind != ModelKind::kEncoder) {
      throw std::invalid_argument("a generating model's manifest needs 'generation'");
    }
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(manifest_path + ": " + e.what());
  }
  if (!dtype.empty() && model->dtype != dtype) {
    throw ConvertedDtype(directory + " was converted to dtype '" + model->dtype + "'; open it with dtype NULL or '" +
                         model->dtype + "', or convert the original checkpoint to '" + dtype + "'");
  }

  const TransformerConfig& c = model->config;
  const SafetensorsSet file = SafetensorsSet::open_directory(directory);
  const Json& tensors = manifest.at("tensors");
  const char* what = c.kind == ModelKind::kEncoder ? "encoder" : c.kind == ModelKind::kDecoder ? "decoder" : "seq2seq";
  model->builder = std::make_unique<ModelBuilder>(what);
  // The packed weights `cpuformer convert` stored for this level, mapped: no packing at load. A
  // stale file (other weights, another build's layouts) is not used; a damaged one is an error.
  model->builder->use_packed(io::PackedFile::open_directory(directory).file);
  {
    ManifestSource source(tensors.at("model"), file, manifest_path + ": model");
    const GlobalTensors g = model->builder->global_tensors(source, c);
    if (c.kind == ModelKind::kEncoder) model->encoder = std::make_unique<EncoderModel>(c, g);
    if (c.kind == ModelKind::kDecoder) model->decoder = std::make_unique<DecoderModel>(c, g);
    if (c.kind == ModelKind::kSeq2Seq) model->seq2seq = std::make_unique<Seq2SeqModel>(c, g);
  }
  struct Stack {
    const char* name;
    long count;
  };
  const std::vector<Stack> stacks =
      c.kind == ModelKind::kSeq2Seq ? std::vector<Stack>{{"encoder", c.num_layers}, {"decoder", c.num_decoder_layers}}
                                    : std::vector<Stack>{{what, c.layer_groups > 0 ? c.layer_groups : c.num_layers}};
  for (const Stack& stack : stacks) {
    const Json& layers = tensors.at(stack.name);
    if (static_cast<long>(layers.array().size()) != stack.count) {
      throw std::invalid_argument(manifest_path + ": stack '" + stack.name + "' has " +
                                  std::to_string(layers.array().size()) + " layers, the config " +
                                  std::to_string(stack.count));
    }
    const bool decoder_stack = c.kind == ModelKind::kSeq2Seq && std::string(stack.name) == "decoder";
    for (std::size_t l = 0; l < layers.array().size(); ++l) {
      ManifestSource source(layers.array()[l], file, manifest_path + ": " + stack.name + " layer " + std::to_string(l));
      const BlockTensors b = model->builder->block_tensors(source, c, decoder_stack,
                                                           std::string(stack.name) + ".layers." + std::to_string(l));
      if (model->encoder) model->encoder->add_layer(b);
      if (model->decoder) model->decoder->add_layer(b);
      if (model->seq2seq) {
        if (decoder_stack) {
          model->seq2seq->add_decoder_layer(b);
        } else {
          model->seq2seq->add_encoder_layer(b);
        }
      }
      for (const SafetensorsFile::Entry* e : source.stored()) file.release(*e);
    }
  }
  return model;
}

}  // namespace cpuformer
