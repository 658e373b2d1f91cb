#include "dist/pipeline.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/dispatch.h"

namespace loom::dist {
namespace ag = loom::autograd;

namespace {

// Blocks [first, last) of stage s when `layers` blocks are split over `stages`: the first
// `layers % stages` stages take one more.
std::pair<std::int64_t, std::int64_t> block_range(std::int64_t layers, int stages, int s) {
  std::int64_t base = layers / stages, extra = layers % stages;
  std::int64_t first = s * base + std::min<std::int64_t>(s, extra);
  return {first, first + base + (s < extra ? 1 : 0)};
}

}  // namespace

GptPipeline::GptPipeline(Communicator& comm, nn::Gpt& model, std::int64_t micro_batches)
    : comm_(comm), model_(model), micro_batches_(micro_batches) {
  const std::int64_t layers = model.config().layers;
  check(layers >= stages(), "pipeline: " + std::to_string(stages()) +
                                " stages need at least as many layers, got " +
                                std::to_string(layers));
  check(micro_batches >= 1,
        "pipeline: micro_batches = " + std::to_string(micro_batches) + ", expected >= 1");
  owner_.assign(model.parameters().size(), -1);
  for (int s = stages() - 1; s >= 0; --s) {  // the lowest stage that uses a parameter owns it
    auto [first, last] = block_range(layers, stages(), s);
    for (std::size_t i : model.parameter_indices(first, last, s == 0, s == stages() - 1))
      owner_[i] = s;
    if (s == stage()) {
      first_ = first;
      last_ = last;
      used_ = model.parameter_indices(first, last, s == 0, s == stages() - 1);
    }
  }
}

double GptPipeline::forward_backward(const data::Batch& batch, const nn::ForwardOptions& options) {
  const std::int64_t b = batch.inputs.dim(0), t = batch.inputs.dim(1), c = model_.config().width;
  check(b % micro_batches_ == 0,
        "pipeline: batch = " + std::to_string(b) +
            " does not divide into micro_batches = " + std::to_string(micro_batches_));
  const std::int64_t mb = b / micro_batches_;
  const bool first_stage = stage() == 0, last_stage = stage() == stages() - 1;
  Backend& device = model_.parameters()[0].var.value().backend();
  struct Micro {
    ag::Tape tape;
    ag::Var input, output;  // this stage's boundary values (input: stages after the first)
  };
  std::vector<std::unique_ptr<Micro>> micros;
  double loss_sum = 0.0;
  for (std::int64_t m = 0; m < micro_batches_; ++m) {  // every forward
    auto micro = std::make_unique<Micro>();
    ag::Var x;
    if (first_stage) {
      x = model_.embed(micro->tape, batch.inputs.slice(0, m * mb, (m + 1) * mb), options);
    } else {
      std::vector<float> received(static_cast<std::size_t>(mb * t * c));
      comm_.receive(received, stage() - 1);
      x = micro->input = ag::Var(Tensor::from_floats({mb, t, c}, received, device), true);
    }
    x = model_.run_blocks(micro->tape, x, first_, last_, options);
    if (last_stage) {
      Tensor targets = batch.targets.slice(0, m * mb * t, (m + 1) * mb * t);
      micro->output = ag::cross_entropy(micro->tape, model_.head(micro->tape, x), targets);
      loss_sum += micro->output.value().item();
    } else {
      comm_.send(x.value().to_floats(), stage() + 1);
      micro->output = x;
    }
    micros.push_back(std::move(micro));
  }
  const float inverse =
      1.0f / static_cast<float>(micro_batches_);  // the batch loss is the mean of the micro losses
  for (auto& micro : micros) {                    // every backward, in the same order
    if (last_stage) {
      micro->tape.backward(micro->output,
                           Tensor::from_floats({}, std::vector<float>{inverse}, device));
    } else {
      std::vector<float> received(static_cast<std::size_t>(mb * t * c));
      comm_.receive(received, stage() + 1);
      micro->tape.backward(micro->output, Tensor::from_floats({mb, t, c}, received, device));
    }
    if (!first_stage)
      comm_.send(micro->input.grad().to_floats(), stage() - 1);
  }
  // The token embedding is also the LM head: stage 0 and the last stage add their parts.
  if (stages() > 1 && (first_stage || last_stage)) {
    ag::Var& wte = model_.parameters()[model_.token_embedding_index()].var;
    std::vector<float> mine = wte.grad().to_floats(), theirs(mine.size());
    if (first_stage) {
      comm_.send(mine, stages() - 1);
      comm_.receive(theirs, stages() - 1);
    } else {
      comm_.receive(theirs, 0);
      comm_.send(mine, 0);
    }
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] += theirs[i];  // a + b == b + a: both stages agree exactly
    wte.state()->grad = Tensor::from_floats(wte.shape(), mine, device);
  }
  float loss =
      last_stage ? static_cast<float>(loss_sum / static_cast<double>(micro_batches_)) : 0.0f;
  comm_.all_reduce_sum(std::span<float>(&loss, 1));
  return loss;
}

double GptPipeline::clip_grad_norm(double max_norm) {
  std::vector<nn::Parameter>& params = model_.parameters();
  float squares = 0.0f;
  for (std::size_t i : used_) {
    if (owner_[i] != stage() || !params[i].var.grad().defined())
      continue;  // each parameter once
    squares += dispatch::call1(OpId::sum_squares, {params[i].var.grad()}).item();
  }
  comm_.all_reduce_sum(std::span<float>(&squares, 1));
  double norm = std::sqrt(static_cast<double>(squares));
  if (norm > max_norm && norm > 0.0) {
    Attrs a;
    a.alpha = max_norm / (norm + 1e-6);  // as torch.nn.utils.clip_grad_norm_
    for (std::size_t i : used_) {
      if (!params[i].var.grad().defined())
        continue;
      params[i].var.state()->grad = dispatch::call1(OpId::scale, {params[i].var.grad()}, a);
    }
  }
  return norm;
}

void GptPipeline::gather_to_all(optim::AdamW* optimizer) {
  std::vector<nn::Parameter>& params = model_.parameters();
  auto share = [&](const Tensor& value, int owner) {
    std::vector<float> v = value.to_floats();
    comm_.broadcast(std::as_writable_bytes(std::span<float>(v)), owner);
    return Tensor::from_floats(value.shape(), v, value.backend());
  };
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i].var.set_value(share(params[i].var.value(), owner_[i]));
    if (optimizer != nullptr) {
      optimizer->first_moments()[i] = share(optimizer->first_moments()[i], owner_[i]);
      optimizer->second_moments()[i] = share(optimizer->second_moments()[i], owner_[i]);
    }
  }
}

}  // namespace loom::dist
