#include "dist/pipeline.h"

#include <algorithm>
#include <cmath>
#include <deque>
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

GptPipeline::GptPipeline(Communicator& comm, nn::Decoder& model, std::int64_t micro_batches,
                         PipelineSchedule schedule)
    : comm_(comm), model_(model), micro_batches_(micro_batches), schedule_(schedule) {
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
  const std::int64_t b = batch.inputs.dim(0), t = batch.inputs.dim(1), c = model_.config().hidden;
  check(b % micro_batches_ == 0,
        "pipeline: batch = " + std::to_string(b) +
            " does not divide into micro_batches = " + std::to_string(micro_batches_));
  const std::int64_t mb = b / micro_batches_;
  const std::size_t boundary = static_cast<std::size_t>(mb * t * c);  // floats of one activation
  const bool first_stage = stage() == 0, last_stage = stage() == stages() - 1;
  Backend& device = model_.parameters()[0].var.value().backend();
  struct Micro {
    ag::Tape tape;
    ag::Var input, output;  // this stage's boundary values (input: stages after the first)
  };
  double loss_sum = 0.0;
  std::int64_t next_forward = 0;
  // Forward of the next micro-batch, from the previous stage's activation (`received`).
  auto forward = [&](std::vector<float> received) {
    auto micro = std::make_unique<Micro>();
    const std::int64_t m = next_forward++;
    ag::Var x;
    if (first_stage) {
      x = model_.embed(micro->tape, batch.inputs.slice(0, m * mb, (m + 1) * mb), options);
    } else {
      x = micro->input = ag::Var(Tensor::from_floats({mb, t, c}, received, device), true);
    }
    x = model_.run_blocks(micro->tape, x, first_, last_, options);
    if (last_stage) {
      Tensor targets = batch.targets.slice(0, m * mb * t, (m + 1) * mb * t);
      micro->output = ag::cross_entropy(micro->tape, model_.head(micro->tape, x), targets);
      loss_sum += micro->output.value().item();
    } else {
      micro->output = x;
    }
    return micro;
  };
  // Backward of a micro-batch from the gradient of its output (the last stage seeds its
  // loss with 1/M: the batch loss is the mean of the micro-batch losses). Returns the
  // gradient of its input, for the previous stage.
  const float inverse = 1.0f / static_cast<float>(micro_batches_);
  auto backward = [&](Micro& micro, const std::vector<float>& grad) {
    micro.tape.backward(micro.output,
                        last_stage ? Tensor::from_floats({}, std::vector<float>{inverse}, device)
                                   : Tensor::from_floats({mb, t, c}, grad, device));
    return first_stage ? std::vector<float>{} : micro.input.grad().to_floats();
  };
  auto receive_from = [&](bool exists, int peer) {
    std::vector<float> v;
    if (exists) {
      v.resize(boundary);
      comm_.receive(v, peer);
    }
    return v;
  };
  auto receive_forward = [&] { return receive_from(!first_stage, stage() - 1); };
  auto receive_backward = [&] { return receive_from(!last_stage, stage() + 1); };
  auto send_forward = [&](Micro& micro) {
    if (!last_stage)
      comm_.send(micro.output.value().to_floats(), stage() + 1);
  };
  auto send_backward = [&](const std::vector<float>& grad) {
    if (!first_stage)
      comm_.send(grad, stage() - 1);
  };

  std::deque<std::unique_ptr<Micro>> in_flight;  // forwarded, not yet backwarded, oldest first
  if (schedule_ == PipelineSchedule::gpipe) {
    for (std::int64_t m = 0; m < micro_batches_; ++m) {
      in_flight.push_back(forward(receive_forward()));
      send_forward(*in_flight.back());
    }
    while (!in_flight.empty()) {
      send_backward(backward(*in_flight.front(), receive_backward()));
      in_flight.pop_front();
    }
  } else {
    // 1F1B: stage s first runs S - s - 1 forwards, then alternates one forward and one
    // backward, then drains. At most S - s micro-batches are held at once (GPipe: M).
    // Where a stage sends and receives with the same neighbour at once, the two go
    // together (send_receive), so neither side can block the other.
    const std::int64_t warmup = std::min<std::int64_t>(stages() - stage() - 1, micro_batches_);
    const std::int64_t steady = micro_batches_ - warmup;
    for (std::int64_t i = 0; i < warmup; ++i) {
      in_flight.push_back(forward(receive_forward()));
      send_forward(*in_flight.back());
    }
    std::vector<float> input = steady > 0 ? receive_forward() : std::vector<float>{};
    for (std::int64_t i = 0; i < steady; ++i) {
      in_flight.push_back(forward(std::move(input)));
      std::vector<float> grad;
      if (!last_stage) {
        grad.resize(boundary);
        comm_.send_receive(in_flight.back()->output.value().to_floats(), stage() + 1, grad,
                           stage() + 1);
      }
      std::vector<float> input_grad = backward(*in_flight.front(), grad);
      in_flight.pop_front();
      input.clear();
      if (i == steady - 1) {
        send_backward(input_grad);
      } else if (!first_stage) {
        input.resize(boundary);
        comm_.send_receive(input_grad, stage() - 1, input, stage() - 1);
      }
    }
    while (!in_flight.empty()) {
      send_backward(backward(*in_flight.front(), receive_backward()));
      in_flight.pop_front();
    }
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
  std::vector<bool> used(params.size(), false);
  for (std::size_t i : used_)
    used[i] = true;
  // Each parameter is counted once, by its owner stage; the sum then spans the stages.
  float squares = optim::grad_sum_squares(
      params, [&](std::size_t i) { return used[i] && owner_[i] == stage(); });
  comm_.all_reduce_sum(std::span<float>(&squares, 1));
  double norm = std::sqrt(static_cast<double>(squares));
  optim::scale_grads_to_norm(params, norm, max_norm, [&](std::size_t i) { return used[i]; });
  return norm;
}

void GptPipeline::gather_to_all(optim::AdamW* optimizer) {
  std::vector<nn::Parameter>& params = model_.parameters();
  auto share = [&](const Tensor& value, int owner) {
    return broadcast_tensor(comm_, value, value.shape(), value.backend(), owner);
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
