// train/checkpoint.h — checkpoints as two safetensors files in one folder:
//   model.safetensors        the weights (Hugging Face GPT-2 names and layouts for GPT),
//                            metadata: loom_model (architecture JSON), loom_vocab, step
//   train_state.safetensors  AdamW moments (optimizer.m.<name>, optimizer.v.<name>),
//                            metadata: step, loom_config (the run's settings)
// Each file is written atomically; the step is recorded in both and must agree on load.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "data/text.h"
#include "data/tokenizer.h"
#include "nn/model.h"
#include "optim/adamw.h"

namespace loom::train {

struct ModelSpec {
  std::string kind = "gpt";  // gpt | llama | mistral | qwen2 | qwen3 | mlp | cnn | onnx
  std::int64_t vocab = 65, context = 64, layers = 4, heads = 4, width = 128;
  double dropout = 0.0;
  bool bias = true;
  std::string onnx;     // kind onnx: the model file
  std::string decoder;  // decoder families: the model's config.json text (nn/hf_config.h),
                        // which decides it; vocab ... width above repeat its sizes
  std::string to_json() const;
  static ModelSpec from_json(const std::string& text, const std::string& where);
};

std::unique_ptr<nn::Model> make_model(const ModelSpec& spec, std::uint64_t seed, Backend& backend);

// The most steps a checkpoint may record (far beyond any run; keeps the arithmetic exact).
inline constexpr std::int64_t kMaxSteps = std::int64_t{1} << 40;

// A checkpoint's integer metadata in [lo, hi]: the whole text must be the number; `where`
// names the file. Anything else is an error naming the key, the text and the range.
std::int64_t metadata_integer(const std::map<std::string, std::string>& metadata,
                              const std::string& key, std::int64_t lo, std::int64_t hi,
                              const std::string& where);

void save_checkpoint(const std::string& dir, nn::Model& model, const ModelSpec& spec,
                     const std::string& vocab_utf8, optim::AdamW& optimizer, std::int64_t step,
                     const std::string& config_json);

// Tensors of Hugging Face state dicts that are not parameters: a tied head saved anyway,
// GPT-2's causal-mask buffers, older Llama checkpoints' rotary frequencies.
bool is_ignorable_extra(const std::string& name);

// Loads weights into `model` from a safetensors file or a sharded checkpoint's folder
// (sharded_checkpoint.h); every model parameter must be present with its shape.
// Known Hugging Face extras (lm_head.weight tied to wte, attention mask buffers) are ignored.
void load_weights(const std::string& path, nn::Model& model);

// Restores weights and optimizer state from a checkpoint folder (whole or sharded); returns
// the step the checkpoint was taken after. Only the moments the optimizer keeps are read (a
// pipeline stage's, before the distributed optimizer shards them); `weights` false leaves
// the parameters to a broadcast from a process that read them.
std::int64_t load_checkpoint(const std::string& dir, nn::Model& model, optim::AdamW& optimizer,
                             bool weights = true);

struct LoadedModel {
  ModelSpec spec;
  std::unique_ptr<nn::Model> model;
  data::CharTokenizer tokenizer;             // empty for image models and subword models
  std::unique_ptr<data::Tokenizer> subword;  // the checkpoint's tokenizer file, when it has one
  std::int64_t step = 0;
};
// Reads model.safetensors (or a folder holding one, or a sharded checkpoint's folder) and
// rebuilds the model it describes.
LoadedModel load_model_file(const std::string& path, Backend& backend);

}  // namespace loom::train
