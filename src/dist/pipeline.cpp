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

std::vector<std::int64_t> stage_blocks(std::int64_t layers, int stages,
                                       const std::vector<std::int64_t>& counts) {
  check(layers >= stages, "pipeline: " + std::to_string(stages) +
                              " stages need at least as many layers, got " +
                              std::to_string(layers));
  if (counts.empty()) {
    std::vector<std::int64_t> even(static_cast<std::size_t>(stages), layers / stages);
    for (std::int64_t s = 0; s < layers % stages; ++s)
      ++even[static_cast<std::size_t>(s)];
    return even;
  }
  std::string given;
  std::int64_t total = 0;
  for (std::int64_t n : counts) {
    given += (given.empty() ? "" : ",") + std::to_string(n);
    total += n;
  }
  check(counts.size() == static_cast<std::size_t>(stages),
        "stages = " + given + ": " + std::to_string(counts.size()) + " counts for " +
            std::to_string(stages) + " pipeline stages (pipeline = " + std::to_string(stages) +
            "); expected one block count per stage");
  for (std::int64_t n : counts)
    check(n >= 1, "stages = " + given + ": every stage needs at least one block");
  check(total == layers, "stages = " + given + ": the counts sum to " + std::to_string(total) +
                             ", the model has " + std::to_string(layers) + " layers");
  return counts;
}

Pipeline::Pipeline(Communicator& comm, nn::Decoder& model, std::int64_t micro_batches,
                   PipelineSchedule schedule, const std::vector<std::int64_t>& blocks_per_stage)
    : comm_(comm), model_(model), micro_batches_(micro_batches), schedule_(schedule) {
  blocks_ = dist::stage_blocks(model.config().layers, stages(), blocks_per_stage);
  const std::vector<std::int64_t>& blocks = blocks_;
  check(micro_batches >= 1,
        "pipeline: micro_batches = " + std::to_string(micro_batches) + ", expected >= 1");
  owner_.assign(model.parameters().size(), -1);
  used_.assign(model.parameters().size(), false);
  std::vector<std::int64_t> firsts(blocks.size());
  for (std::size_t s = 1; s < blocks.size(); ++s)
    firsts[s] = firsts[s - 1] + blocks[s - 1];
  for (int s = stages() - 1; s >= 0; --s) {  // the lowest stage that uses a parameter owns it
    const std::int64_t first = firsts[static_cast<std::size_t>(s)];
    const std::int64_t last = first + blocks[static_cast<std::size_t>(s)];
    const std::vector<std::size_t> indices =
        model.parameter_indices(first, last, s == 0, s == stages() - 1);
    for (std::size_t i : indices)
      owner_[i] = s;
    if (s == stage()) {
      first_ = first;
      last_ = last;
      for (std::size_t i : indices)
        used_[i] = true;
    }
  }
}

double Pipeline::forward_backward(const data::Batch& batch, const nn::ForwardOptions& options) {
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
  // A tied LM head is the token embedding: stage 0 and the last stage add their parts.
  if (model_.tied_head() && stages() > 1 && (first_stage || last_stage)) {
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

void Pipeline::gather_to_all(optim::AdamW* optimizer) {
  std::vector<nn::Parameter>& params = model_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    // The shape and device are the parameter's: a rank outside the owner stage may hold no
    // moments of it (ZeRO keeps only its own stage's).
    const Tensor value = params[i].var.value();
    auto share = [&](const Tensor& t) {
      return broadcast_tensor(comm_, t, value.shape(), value.backend(), owner_[i]);
    };
    params[i].var.set_value(share(value));
    if (optimizer != nullptr) {
      optimizer->first_moments()[i] = share(optimizer->first_moments()[i]);
      optimizer->second_moments()[i] = share(optimizer->second_moments()[i]);
    }
  }
}

}  // namespace loom::dist
