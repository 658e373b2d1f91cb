#include "nn/layers.h"

#include <cmath>

#include "autograd/functions.h"
#include "core/error.h"

namespace loom::nn {

namespace ag = loom::autograd;

std::int64_t Model::parameter_count() {
  std::int64_t n = 0;
  for (const Parameter& p : parameters())
    n += p.var.value().numel();
  return n;
}

Parameter* Model::find(const std::string& name) {
  for (Parameter& p : parameters())
    if (p.name == name)
      return &p;
  return nullptr;
}

namespace {
// PyTorch's default nn.Linear / nn.Conv2d init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both.
void add_affine(std::vector<Parameter>& params, const std::string& name, const Shape& weight_shape,
                std::int64_t fan_in, Rng& rng, Backend& backend) {
  double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  params.push_back(
      {name + ".weight", ag::Var(uniform_tensor(weight_shape, bound, rng, backend), true), true});
  params.push_back({name + ".bias",
                    ag::Var(uniform_tensor({weight_shape[0]}, bound, rng, backend), true), false});
}
}  // namespace

Mlp::Mlp(const MlpConfig& config, std::uint64_t seed, Backend& backend) : config_(config) {
  Rng rng(seed);
  std::int64_t in = config.inputs;
  for (std::int64_t i = 0; i < config.depth; ++i) {
    add_affine(params_, "fc" + std::to_string(i + 1), {config.hidden, in}, in, rng, backend);
    in = config.hidden;
  }
  add_affine(params_, "fc" + std::to_string(config.depth + 1), {config.classes, in}, in, rng,
             backend);
}

ag::Var Mlp::forward(ag::Tape& tape, const Tensor& inputs, const ForwardOptions& options) {
  std::int64_t n = inputs.dim(0);
  check(inputs.numel() == n * config_.inputs,
        "mlp: input " + inputs.describe() + " does not have " + std::to_string(config_.inputs) +
            " features per sample");
  ag::Var x(inputs.reshape({n, config_.inputs}));
  const double p = options.training ? config_.dropout : 0.0;
  for (std::size_t i = 0; i + 2 < params_.size(); i += 2) {
    x = ag::relu(tape, ag::linear(tape, x, params_[i].var, params_[i + 1].var, true));
    x = ag::dropout(tape, x, p, options.dropout_seed, i);
  }
  return ag::linear(tape, x, params_[params_.size() - 2].var, params_.back().var, true);
}

Cnn::Cnn(const CnnConfig& config, std::uint64_t seed, Backend& backend) : config_(config) {
  Rng rng(seed);
  add_affine(params_, "conv1", {config.conv1, config.channels, 3, 3}, config.channels * 9, rng,
             backend);
  add_affine(params_, "conv2", {config.conv2, config.conv1, 3, 3}, config.conv1 * 9, rng, backend);
  std::int64_t flat = config.conv2 * (config.size / 4) * (config.size / 4);
  add_affine(params_, "fc1", {config.hidden, flat}, flat, rng, backend);
  add_affine(params_, "fc2", {config.classes, config.hidden}, config.hidden, rng, backend);
}

ag::Var Cnn::forward(ag::Tape& tape, const Tensor& inputs, const ForwardOptions&) {
  check(inputs.rank() == 4 && inputs.dim(1) == config_.channels && inputs.dim(2) == config_.size &&
            inputs.dim(3) == config_.size,
        "cnn: input " + inputs.describe() + " must be [N," + std::to_string(config_.channels) +
            "," + std::to_string(config_.size) + "," + std::to_string(config_.size) + "]");
  ag::Var x(inputs);
  x = ag::max_pool2d(
      tape, ag::relu(tape, ag::conv2d(tape, x, params_[0].var, params_[1].var, 1, 1)), 2, 2);
  x = ag::max_pool2d(
      tape, ag::relu(tape, ag::conv2d(tape, x, params_[2].var, params_[3].var, 1, 1)), 2, 2);
  x = ag::reshape(tape, x, {inputs.dim(0), -1});
  x = ag::relu(tape, ag::linear(tape, x, params_[4].var, params_[5].var, true));
  return ag::linear(tape, x, params_[6].var, params_[7].var, true);
}

}  // namespace loom::nn
