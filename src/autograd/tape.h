// autograd/tape.h — tape-based reverse-mode differentiation.
//
// A Var is a tensor plus its gradient slot. Each differentiable function runs its
// forward op through dispatch and, when any input requires a gradient, appends one
// entry to the Tape: the inputs, the output, and a backward rule written with catalog
// ops. Tape::backward walks the entries in reverse (the tape order is a topological
// order by construction) and accumulates gradients into the inputs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::autograd {

// Where a tensor lives on a tensor-parallel group (autograd/tensor_parallel.h): replicated
// (the default), sharded along dimension `shard`, or partial (the value is the sum over ranks).
struct Placement {
  int shard = -1;
  // Sharded: how many distinct slices the dimension is cut into; 0, one per rank of the group
  // (T). Fewer (grouped-query key/value heads when the group outnumbers them): rank r holds
  // slice r * parts / T, so each slice is held by T / parts consecutive ranks.
  int parts = 0;
  bool partial = false;
  bool replicated() const { return shard < 0 && !partial; }
  bool operator==(const Placement&) const = default;
};

struct VarState {
  Tensor value;
  Tensor grad;  // undefined until a gradient arrives
  bool requires_grad = false;
  Placement placement;
  // The gradient so far is each rank's summand of it (tensor parallelism): reduced over the
  // group when it is used, or at the end of the backward pass.
  bool grad_partial = false;
};

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false);

  bool defined() const { return state_ != nullptr; }
  const Tensor& value() const { return state_->value; }
  const Tensor& grad() const { return state_->grad; }
  bool requires_grad() const { return state_ && state_->requires_grad; }
  const Shape& shape() const { return state_->value.shape(); }
  const Placement& placement() const { return state_->placement; }
  void set_placement(const Placement& p) { state_->placement = p; }
  std::int64_t dim(int axis) const { return state_->value.dim(axis); }

  // For optimizers and loaders: replace the value (same shape) or drop the gradient.
  void set_value(Tensor value) { state_->value = std::move(value); }
  void zero_grad() { state_->grad = Tensor(); }

  const std::shared_ptr<VarState>& state() const { return state_; }

 private:
  std::shared_ptr<VarState> state_;
};

// Gradient of the output -> gradients of the inputs (undefined where not needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
// For a function of one input: the gradient that input already holds plus this function's
// share of it, in one op (the tape otherwise adds the two). An embedding table that is
// also the tied LM head gets its scatter-add onto the head's gradient this way, without a
// zeroed table and a full add.
using AccumulateFn = std::function<Tensor(const Tensor& grad_output, const Tensor& existing)>;
// For a gather of sequence shards (autograd/tensor_parallel.h): the gradient of the output as
// it arrived, each rank's summand (`partial`) or the whole one, -> the input's gradient.
using GatherBackwardFn =
    std::function<std::vector<Tensor>(const Tensor& grad_output, bool partial)>;

class Tape {
 public:
  // Recording is on by default; turn it off for evaluation (no entries, no saved tensors).
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }

  // Wraps `output` as a Var; records the entry when recording and an input needs a gradient.
  Var record(const std::vector<Var>& inputs, Tensor output, BackwardFn backward,
             AccumulateFn accumulate = {});
  // Identity forward; backward, x's gradient is this rank's summand of it (it was computed
  // with this rank's slice of a weight). Summands accumulate locally and are all-reduced over
  // the tensor-parallel group once, when the gradient is used or the backward pass ends
  // (Megatron's f operator, with one reduction however many slices used x).
  Var record_partial_gradient(const Var& x);
  // `output` made from x by a collective whose backward takes its output's gradient as it
  // arrives, not reduced first: a partial gradient is reduce-scattered rather than
  // all-reduced, a whole one sliced (sequence parallelism's all-gather).
  Var record_gather(const Var& x, Tensor output, GatherBackwardFn backward);

  // Seeds d(loss)/d(loss) = 1 and runs every entry in reverse; clears the tape afterwards.
  void backward(const Var& loss);
  // The same from any output, seeded with `grad_output` (its shape): the gradient that
  // arrives at a pipeline stage's output, or a loss scaled by 1/micro-batches.
  void backward(const Var& output, const Tensor& grad_output);
  void clear() { entries_.clear(); }
  std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<std::shared_ptr<VarState>> inputs;
    std::shared_ptr<VarState> output;
    BackwardFn backward;
    AccumulateFn accumulate;     // may be empty; only for one input
    bool partial_grads = false;  // its input gradients are summands (record_partial_gradient)
    GatherBackwardFn gather;     // set by record_gather: replaces `backward`
  };
  std::vector<Entry> entries_;
  bool recording_ = true;
};

}  // namespace loom::autograd
