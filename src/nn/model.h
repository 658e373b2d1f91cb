// nn/model.h — what the trainer needs from any model: named parameters and a forward
// pass from a batch to logits [N, classes].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/tape.h"

namespace loom::nn {

struct Parameter {
  std::string name;  // the checkpoint name (Hugging Face names for GPT)
  autograd::Var var;
  bool weight_decay;  // AdamW decays matrices and embeddings, not biases or norms
};

struct ForwardOptions {
  bool training = false;
  std::uint64_t dropout_seed = 0;  // varies per step so each step draws new masks
};

class Model {
 public:
  virtual ~Model() = default;
  virtual std::vector<Parameter>& parameters() = 0;
  // inputs: token ids [B,T] (i32) or images [N,C,H,W] (f32) -> logits [N_rows, classes].
  virtual autograd::Var forward(autograd::Tape& tape, const Tensor& inputs,
                                const ForwardOptions& options) = 0;
  virtual std::string kind() const = 0;  // "gpt", "mlp", "cnn"

  std::int64_t parameter_count();
  Parameter* find(const std::string& name);
};

}  // namespace loom::nn
