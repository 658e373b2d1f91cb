// autograd/tensor_parallel.h — tensors that carry a placement on a tensor-parallel group, and
// the sharding rules of the ops a decoder step uses (docs/parallel.md). A Var is replicated
// unless its placement says it is sharded along one dimension (each rank holds its 1/T slice)
// or partial (each rank holds a summand). Functions whose inputs are all replicated run as
// they always have; the others run their rule, which calls the same ops on the local tensors
// and the collectives the rule needs, forward and backward:
//   matmul/linear, column   x replicated, W sharded on its output dimension -> the output
//                           sharded on its last dimension; backward, dx is this rank's
//                           summand, all-reduced once where x's gradient is used
//   matmul/linear, row      x sharded on its last dimension, W on its input dimension -> a
//                           partial output (linear: reduced, then its replicated bias added)
//   add, swiglu             equal placements in and out (a partial input is reduced first)
//   reshape                 given the whole tensor's shape (as one process writes it): the
//                           sharded dimension becomes the outer factor it splits into (or the
//                           dimension it merges into), holding 1/T of it
//   rms_norm, rope          sharded on a dimension they do not work along; a replicated
//                           norm weight gets its gradient all-reduced
//   attention               q, k, v sharded on their heads -> the output too; k and v may be
//                           slices held by several ranks (fewer key/value heads than ranks)
// A weight in fewer parts than ranks (Placement::parts: rank r holds slice r parts / T) gives
// its column-parallel output the same placement; its gradient is summed over the ranks that
// hold each slice (one all-reduce of `parts` slots over the group).
//   embedding               the table sharded on the vocabulary -> partial (vocab-parallel)
//   cross_entropy           logits sharded on the vocabulary -> the loss, from each rank's
//                           log-sum-exp and the target's logit (B S numbers, not B S V)
//   others reduce a partial input and refuse a sharded one.
// Under sequence parallelism (TensorGroup::sequence_parallel) the residual stream [N, C] is
// sharded on its rows (Shard(0): rank t holds rows [t N/T, (t+1) N/T)):
//   add                     a partial or replicated operand meeting the stream, or any
//                           partial [N, C] sum, becomes row-sharded: a partial one by a
//                           reduce-scatter (backward all-gather), a replicated one by
//                           keeping its rows (backward all-gather)
//   matmul/linear, column   a row-sharded x is all-gathered first; backward, the partial
//                           gradient is reduce-scattered (not all-reduced)
//   matmul, replicated W    a row-sharded x is gathered (the LM head when the vocabulary does
//                           not divide)
//   rms_norm                on row shards (its weight's gradient summed over them)
//   reshape                 a row shard that maps onto no dimension is gathered first
// The group is the calling thread's (TensorGroupScope), so in-process ranks may share a
// process.
#pragma once

#include <span>
#include <string>

#include "autograd/tape.h"

namespace loom::autograd {

// The collective a tensor-parallel rule needs, implemented above (dist/ over a Communicator).
class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce_sum(std::span<float> data) = 0;  // on every rank of the group
  // Rank r's `local` as the r-th block of `all` (size() x local's length), on every rank.
  virtual void all_gather(std::span<const float> local, std::span<float> all) = 0;
  // The sum over ranks of `all`, rank r receiving its r-th block in `local`.
  virtual void reduce_scatter_sum(std::span<const float> all, std::span<float> local) = 0;
  // Sequence parallelism: the residual stream between blocks is sharded on its rows (the
  // batch's tokens), the reductions after the row-parallel products reduce-scatter it and
  // the column-parallel products gather it.
  virtual bool sequence_parallel() const { return false; }
};

// Makes `group` the calling thread's tensor-parallel group while it lives.
class TensorGroupScope {
 public:
  explicit TensorGroupScope(TensorGroup& group);
  ~TensorGroupScope();
  TensorGroupScope(const TensorGroupScope&) = delete;
  TensorGroupScope& operator=(const TensorGroupScope&) = delete;

 private:
  TensorGroup* previous_;
};

std::string describe(const Placement& p);  // "replicated", "sharded on 1", "partial"

// The sum over the calling thread's tensor-parallel group, on the tensor's device.
Tensor all_reduce_over_group(const Tensor& t);

// True when some input is not replicated and its rule must run (not while a rule runs).
bool distributed(std::initializer_list<const Var*> inputs);

namespace tp {
Var reduce(Tape& tape, const Var& x);  // partial -> replicated (all-reduce; backward identity)
Var add(Tape& tape, const Var& a, const Var& b);
Var matmul(Tape& tape, const Var& a, const Var& b, bool trans_a, bool trans_b);
Var linear(Tape& tape, const Var& x, const Var& weight, const Var& bias, bool trans_b);
Var reshape(Tape& tape, const Var& x, const Shape& shape);
Var rms_norm(Tape& tape, const Var& x, const Var& weight, double eps);
Var swiglu(Tape& tape, const Var& gate, const Var& up);
Var rope(Tape& tape, const Var& x, const Tensor& cos, const Tensor& sin, const Tensor& neg_sin);
Var attention(Tape& tape, const Var& q, const Var& k, const Var& v);
// Vocab-parallel: the table sharded on its rows -> a partial output (zeros for the ids other
// ranks hold); logits sharded on the vocabulary -> the replicated mean loss, the logits never
// gathered.
Var embedding(Tape& tape, const Var& weight, const Tensor& ids);
Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets);
// For ops without a rule: a partial input reduced, a sharded one refused naming the op.
Var replicated_input(Tape& tape, const Var& x, const char* op);
}  // namespace tp

}  // namespace loom::autograd
