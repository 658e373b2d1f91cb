#include "autograd/tape.h"

#include "autograd/tensor_parallel.h"
#include "core/error.h"
#include "dispatch/dispatch.h"

namespace loom::autograd {

Var::Var(Tensor value, bool requires_grad) : state_(std::make_shared<VarState>()) {
  state_->value = std::move(value);
  state_->requires_grad = requires_grad;
}

Var Tape::record(const std::vector<Var>& inputs, Tensor output, BackwardFn backward,
                 AccumulateFn accumulate) {
  check(!accumulate || inputs.size() == 1, "Tape::record: an accumulating rule takes one input");
  bool needs_grad = false;
  for (const Var& v : inputs)
    needs_grad = needs_grad || v.requires_grad();
  Var out(std::move(output), recording_ && needs_grad);
  if (!out.requires_grad())
    return out;
  Entry entry;
  entry.inputs.reserve(inputs.size());
  for (const Var& v : inputs)
    entry.inputs.push_back(v.state());
  entry.output = out.state();
  entry.backward = std::move(backward);
  entry.accumulate = std::move(accumulate);
  entries_.push_back(std::move(entry));
  return out;
}

Var Tape::record_partial_gradient(const Var& x) {
  Var out = record({x}, x.value(), [](const Tensor& g) { return std::vector<Tensor>{g}; });
  if (!entries_.empty() && entries_.back().output == out.state())
    entries_.back().partial_grads = true;
  return out;
}

Var Tape::record_gather(const Var& x, Tensor output, GatherBackwardFn backward) {
  Var out = record({x}, std::move(output), [](const Tensor& g) { return std::vector<Tensor>{g}; });
  if (!entries_.empty() && entries_.back().output == out.state())
    entries_.back().gather = std::move(backward);
  return out;
}

namespace {
// A partial gradient becomes the whole one (the sum over the tensor-parallel group).
void settle(VarState& v) {
  if (!v.grad_partial)
    return;
  v.grad = all_reduce_over_group(v.grad);
  v.grad_partial = false;
}
}  // namespace

void Tape::backward(const Var& loss) {
  check(loss.defined() && loss.value().numel() == 1, [&] {
    return "Tape::backward: loss must be a one-element tensor, got " +
           (loss.defined() ? loss.value().describe() : std::string("an undefined Var"));
  });
  Attrs one;
  one.shape = loss.shape();
  one.alpha = 1.0;
  backward(loss, dispatch::call(OpId::fill, {}, one, &loss.value().backend()).front());
}

void Tape::backward(const Var& output, const Tensor& grad_output) {
  check(output.defined() && grad_output.defined() && grad_output.shape() == output.shape(), [&] {
    return "Tape::backward: the seed gradient " +
           (grad_output.defined() ? grad_output.describe() : std::string("(none)")) +
           " does not match the output " +
           (output.defined() ? output.value().describe() : std::string("(none)"));
  });
  check(output.requires_grad(),
        "Tape::backward: the output does not depend on anything that requires a gradient");
  output.state()->grad = grad_output;
  std::vector<std::shared_ptr<VarState>> partial;  // gradients left as summands
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (!it->gather)
      settle(*it->output);  // every use of it has contributed: reduce once
    Tensor grad_out = it->output->grad;
    if (!grad_out.defined())
      continue;  // the output did not reach the loss
    if (it->accumulate && it->inputs[0]->requires_grad && it->inputs[0]->grad.defined()) {
      VarState& in = *it->inputs[0];
      settle(in);
      in.grad = it->accumulate(grad_out, in.grad);
      it->output->grad = Tensor();
      continue;
    }
    std::vector<Tensor> grads =
        it->gather ? it->gather(grad_out, it->output->grad_partial) : it->backward(grad_out);
    it->output->grad = Tensor();  // intermediate gradients are not kept
    it->output->grad_partial = false;
    for (std::size_t i = 0; i < it->inputs.size() && i < grads.size(); ++i) {
      VarState& in = *it->inputs[i];
      if (!in.requires_grad || !grads[i].defined())
        continue;
      check(grads[i].shape() == in.value.shape(), [&] {
        return "Tape::backward: gradient " + grads[i].describe() + " does not match its input " +
               in.value.describe();
      });
      Tensor g = grads[i];
      if (in.grad.defined() && in.grad_partial != it->partial_grads) {
        // A summand meets a whole gradient: make both whole before adding.
        if (it->partial_grads)
          g = all_reduce_over_group(g);
        else
          settle(in);
      }
      if (!in.grad.defined()) {
        in.grad_partial = it->partial_grads;
        if (in.grad_partial)
          partial.push_back(it->inputs[i]);
      }
      in.grad = in.grad.defined() ? dispatch::call1(OpId::add, {in.grad, g}) : g;
    }
  }
  for (const std::shared_ptr<VarState>& v : partial)  // leaves (parameters) reduced at the end
    settle(*v);
  entries_.clear();
}

}  // namespace loom::autograd
