// The architecture registry: every family cpuformer runs from a Hugging Face directory, declared
// once, in C++, for both front ends. The Python package reads these declarations through the
// binding (python/cpuformer/arch/native.py: _core.arch_families, arch_hparams, arch_tensors) and the
// C API through this header, so both turn a config.json into the same TransformerConfig and the same
// canonical weights. A family declares:
//   - which configs it claims (config.json "architectures" class names, then "model_type");
//   - hparams(): config.json -> TransformerConfig (the weight-format fields keep their defaults),
//     refusing bad values (std::invalid_argument) and settings cpuformer does not run (NotSupported);
//   - where every canonical weight comes from: a checkpoint tensor with the fixed edits the loader
//     applies once (TensorDecl), or an array computed from the config (RoPE frequencies).
// Canonical weight names and their shapes: python/cpuformer/arch/spec.py.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/arch/config_values.h"
#include "models/transformer_config.h"

namespace cpuformer {
namespace arch {

// One checkpoint tensor and the edits applied to it (the fields of python's arch.spec.Tensor).
struct TensorDecl {
  std::string name;        // below the model's prefix unless `root`
  bool transpose = false;  // stored [in, out] (GPT-2's Conv1D)
  long rows_start = -1;    // >= 0: the row block [rows_start, rows_stop) of a fused tensor
  long rows_stop = -1;
  bool plus_one = false;  // a norm stored as w - 1
  bool optional = false;  // absent from some checkpoints
  bool root = false;      // named from the checkpoint's root
  bool as_row = false;    // a vector stored as one row [1, n]
  std::vector<std::string> fallbacks;
  std::string rows_key;            // the config key that sets the row count (named in shape errors)
  std::vector<long> stored_shape;  // the shape as stored when it differs (split head axes)

  TensorDecl() = default;
  explicit TensorDecl(std::string n) : name(std::move(n)) {}
  TensorDecl& rows(long start, long stop) {
    rows_start = start;
    rows_stop = stop;
    return *this;
  }
  TensorDecl& transposed() {
    transpose = true;
    return *this;
  }
  TensorDecl& one_plus() {
    plus_one = true;
    return *this;
  }
  TensorDecl& may_be_absent() {
    optional = true;
    return *this;
  }
  TensorDecl& from_root() {
    root = true;
    return *this;
  }
};

// A canonical weight's source: a checkpoint tensor, or float32 values computed from the config.
struct Source {
  bool computed = false;
  TensorDecl tensor;
  std::vector<long> shape;    // computed
  std::vector<float> values;  // computed
};

// Canonical name -> source, in declaration order.
class Sources {
 public:
  void add(const std::string& canonical, TensorDecl tensor);
  void add(const std::string& canonical, std::vector<long> shape, std::vector<float> values);
  // `name`.weight and, with bias != kNone, `name`.bias (the bias keeps the weight's rows and root).
  enum Bias { kNone, kRequired, kOptional };
  void weight_and_bias(const std::string& canonical, const std::string& checkpoint, Bias bias = kRequired,
                       TensorDecl edits = TensorDecl());
  Source* find(const std::string& canonical);
  const std::vector<std::pair<std::string, Source>>& items() const { return items_; }

 private:
  std::vector<std::pair<std::string, Source>> items_;
};

// A task head of an encoder checkpoint (python/cpuformer/arch/heads.py has the step semantics):
// steps over the last hidden state, and where each of its weights ("head.<name>", ".bias") comes from.
struct HeadStep {
  std::string kind;  // "first", "last", "mean", "pooler", "dense", "act", "norm"
  std::string name;  // dense / norm: the canonical weight; act: the activation
  double eps = 0.0;  // norm
};

struct Head {
  std::string task;
  std::vector<HeadStep> steps;
  Sources tensors;
  std::vector<std::pair<std::string, std::vector<long>>> shapes;
  std::vector<std::string> labels;  // classification: id2label in id order
};

// Declares a head step by step: HeadBuilder(task).first().dense(...).act("tanh").dense(...).build().
class HeadBuilder {
 public:
  explicit HeadBuilder(std::string task, std::vector<std::string> labels = {});
  HeadBuilder& first() { return step("first"); }
  HeadBuilder& last() { return step("last"); }
  HeadBuilder& mean() { return step("mean"); }
  HeadBuilder& pooler() { return step("pooler"); }
  // head.<name> from checkpoint tensor `weight` [out, in]; `bias`: its tensor ("" for the weight's
  // .bias sibling), or no bias when `has_bias` is false. root: named from the checkpoint's root
  // (bias_root: the bias's, when it differs: -1 the same as root).
  HeadBuilder& dense(const std::string& name, const std::string& weight, std::vector<long> shape,
                     const std::string& bias = "", bool has_bias = true, bool root = true,
                     const std::string& rows_key = "", int bias_root = -1);
  HeadBuilder& act(const std::string& activation);
  // A LayerNorm head.<name> from <checkpoint>.weight (and .bias).
  HeadBuilder& norm(const std::string& name, const std::string& checkpoint, long size, double eps, bool bias = true,
                    bool root = true);
  Head build() const { return head_; }

 private:
  HeadBuilder& step(const char* kind);
  Head head_;
};

// The class labels of a classification checkpoint in id order: config.json's id2label (keys 0..n-1),
// else LABEL_0... for num_labels (default 2, as transformers).
std::vector<std::string> labels(const Config& config);
// The heads that are one linear layer on every token: token classification (classifier) and
// question answering (qa_outputs: start and end logits).
Head linear_head(const Config& config, const std::string& task, long hidden);

class Arch {
 public:
  virtual ~Arch() = default;

  std::string kind;    // "encoder", "decoder", "seq2seq"
  std::string family;  // "llama"
  std::string title;   // the family in prose ("Llama")
  std::vector<std::string> architectures;
  std::vector<std::string> model_types;
  std::vector<std::string> prefixes{""};  // body name prefixes tried in order ("transformer.")
  std::vector<std::string> ignored;       // regular expressions of checkpoint tensors knowingly unused
  std::string example;                    // config.json entries of a typical checkpoint (a JSON object)
  // (copy, table): checkpoint tensors (names without the prefix) read as the table `table`. With
  // tie_word_embeddings false, transformers 5 unties such copies; the loader then checks that a
  // stored copy holds the table's values and refuses the checkpoint if not.
  std::vector<std::pair<std::string, std::string>> tied_copies;
  bool start_from_pad = false;  // seq2seq generation starts from the pad token without a start token (T5)

  virtual TransformerConfig hparams(const Config& config) const = 0;
  // embed.tokens, embed.token_types, embed.project, lm_head, lm_head.bias, pooler.
  virtual Sources model_tensors(const Config& config, const TransformerConfig& hp) const = 0;
  // A stack's embed.positions, embed.norm, final_norm, relative_bias, rope.inv_freq.
  virtual Sources stack_tensors(const Config& config, const TransformerConfig& hp, const std::string& stack) const = 0;
  virtual Sources layer_tensors(const TransformerConfig& hp, const std::string& stack, long layer) const = 0;
  // The task head of `task` (heads.py TASKS) for this config into `out`; false when the family has
  // none (the checkpoint is then refused, naming the task).
  virtual bool head(const Config& config, const TransformerConfig& hp, const std::string& task, Head& out) const {
    return false;
  }
  // How a family with a Transformer-XL memory keeps it between calls (XLNet): config.json's mem_len
  // and reuse_len (0: keep everything / append every token); false for a family without one.
  virtual bool memory(const Config& config, long& mem_len, long& reuse_len) const { return false; }
};

// Every registered family, in the Python registry's order within its kinds.
const std::vector<std::unique_ptr<Arch>>& registry();
// The family named `family`; std::invalid_argument for an unknown one.
const Arch& family(const std::string& family);

// RoPE inverse frequencies [head_dim / 2] as transformers computes them, from config.json's
// rope_theta and rope_scaling / rope_parameters (types default, linear and llama3).
std::vector<float> rope_inv_freq(const Config& config, long head_dim);

// The families of each source file, appended to the registry in this order.
void register_decoders(std::vector<std::unique_ptr<Arch>>& out);
void register_seq2seq(std::vector<std::unique_ptr<Arch>>& out);
void register_encoders(std::vector<std::unique_ptr<Arch>>& out);

}  // namespace arch
}  // namespace cpuformer
