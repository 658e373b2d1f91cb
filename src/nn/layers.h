// nn/layers.h — the image models: MLP and a small CNN (PyTorch's nn.Linear layout).
#pragma once

#include "nn/init.h"
#include "nn/model.h"

namespace loom::nn {

struct MlpConfig {
  std::int64_t inputs = 784, hidden = 256, classes = 10, depth = 2;  // depth = hidden layers
  double dropout = 0.0;  // after each hidden activation, in training
};

// x [N, ...] flattened -> (Linear -> ReLU -> Dropout) x depth -> Linear. Weights [out, in]
// as nn.Linear.
class Mlp final : public Model {
 public:
  Mlp(const MlpConfig& config, std::uint64_t seed, Backend& backend);
  std::vector<Parameter>& parameters() override { return params_; }
  autograd::Var forward(autograd::Tape& tape, const Tensor& inputs,
                        const ForwardOptions& options) override;
  std::string kind() const override { return "mlp"; }

 private:
  MlpConfig config_;
  std::vector<Parameter> params_;
};

struct CnnConfig {
  std::int64_t channels = 1, size = 28, classes = 10, conv1 = 32, conv2 = 64, hidden = 128;
};

// conv3x3 -> ReLU -> maxpool2 -> conv3x3 -> ReLU -> maxpool2 -> Linear -> ReLU -> Linear.
class Cnn final : public Model {
 public:
  Cnn(const CnnConfig& config, std::uint64_t seed, Backend& backend);
  std::vector<Parameter>& parameters() override { return params_; }
  autograd::Var forward(autograd::Tape& tape, const Tensor& inputs,
                        const ForwardOptions& options) override;
  std::string kind() const override { return "cnn"; }

 private:
  CnnConfig config_;
  std::vector<Parameter> params_;
};

}  // namespace loom::nn
