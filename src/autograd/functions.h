// autograd/functions.h — differentiable functions over Vars.
//
// Each runs its forward op through dispatch and records a backward rule that is itself
// a composition of catalog ops, so a backend that has the backward ops trains natively.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/tape.h"
#include "core/op_catalog.h"

namespace loom::autograd {

// Elementwise (numpy broadcasting; gradients are summed back to each input's shape).
Var add(Tape& tape, const Var& a, const Var& b);
Var sub(Tape& tape, const Var& a, const Var& b);
Var mul(Tape& tape, const Var& a, const Var& b);
Var div(Tape& tape, const Var& a, const Var& b);
Var scale(Tape& tape, const Var& x, double alpha);
// cond (u8, not differentiated) ? a : b, all three broadcast (numpy rules). The gradient
// goes to the operand each element was taken from, so infinities in the other are harmless.
Var where(Tape& tape, const Tensor& cond, const Var& a, const Var& b);
// x broadcast to `shape` (numpy rules); the gradient is summed back to x's shape.
Var expand(Tape& tape, const Var& x, const Shape& shape);
Var exp(Tape& tape, const Var& x);
Var log(Tape& tape, const Var& x);
Var tanh(Tape& tape, const Var& x);
Var sqrt(Tape& tape, const Var& x);
Var erf(Tape& tape, const Var& x);
// f(x) for one of the catalog's math functions; floor, ceil, round and sign have a zero
// gradient (almost everywhere).
Var math(Tape& tape, const Var& x, MathFunction f);
Var relu(Tape& tape, const Var& x);
Var gelu(Tape& tape, const Var& x);
Var silu(Tape& tape, const Var& x);
// silu(gate) * up: the gated MLP's activation (SwiGLU).
Var swiglu(Tape& tape, const Var& gate, const Var& up);
Var dropout(Tape& tape, const Var& x, double p, std::uint64_t seed);
// Dropout whose mask changes every step: seed = mix_seed(step_seed, site), recorded so a
// replayed graph can draw the next step's mask.
Var dropout(Tape& tape, const Var& x, double p, std::uint64_t step_seed, std::uint64_t site);

// Reductions.
Var sum(Tape& tape, const Var& x, std::vector<std::int64_t> axes = {}, bool keepdim = false);
Var mean(Tape& tape, const Var& x, std::vector<std::int64_t> axes = {}, bool keepdim = false);
Var max(Tape& tape, const Var& x, std::int64_t axis, bool keepdim = false);

// Last-axis softmax family and the fused loss (targets: i32 class ids, [N]).
Var softmax(Tape& tape, const Var& x);
Var log_softmax(Tape& tape, const Var& x);
Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets);

// Linear algebra.
Var matmul(Tape& tape, const Var& a, const Var& b, bool trans_a = false, bool trans_b = false);
Var linear(Tape& tape, const Var& x, const Var& weight, const Var& bias, bool trans_b = false);

// Model pieces.
Var layer_norm(Tape& tape, const Var& x, const Var& weight, const Var& bias, double eps = 1e-5);
Var rms_norm(Tape& tape, const Var& x, const Var& weight, double eps);
// Rotary position embedding of x [...,T,N,D] by the tables cos, sin [T,D/2] (rotate-half
// pairs (i, i + D/2)); the backward turns the gradient back, which is the same op with
// sin negated (neg_sin, kept by the caller with its tables).
Var rope(Tape& tape, const Var& x, const Tensor& cos, const Tensor& sin, const Tensor& neg_sin);
// Causal grouped-query attention: q [B,Tq,H,D], k and v [B,Tk,G,D] -> [B,Tq,H,D].
Var attention(Tape& tape, const Var& q, const Var& k, const Var& v);
Var embedding(Tape& tape, const Var& weight, const Tensor& ids);
Var causal_attention(Tape& tape, const Var& qkv, std::int64_t heads);
Var conv2d(Tape& tape, const Var& x, const Var& weight, const Var& bias, std::int64_t stride,
           std::int64_t padding);
Var max_pool2d(Tape& tape, const Var& x, std::int64_t kernel, std::int64_t stride);
Var avg_pool2d(Tape& tape, const Var& x, std::int64_t kernel, std::int64_t stride);

// Routing: each row's k largest of x[..., E] (largest first; equal values by the lower index)
// and their indices (i32, no gradient); the values' gradient goes back to where they came from.
struct TopK {
  Var values;
  Tensor indices;
};
TopK top_k(Tape& tape, const Var& x, std::int64_t k);

// Views and layout (the backward of a view is the matching inverse).
Var reshape(Tape& tape, const Var& x, const Shape& shape);
Var permute(Tape& tape, const Var& x, const std::vector<int>& order);
Var slice(Tape& tape, const Var& x, int axis, std::int64_t start, std::int64_t end);
Var concat(Tape& tape, const std::vector<Var>& xs, int axis);

// Sums `grad` over broadcast dimensions so it has `shape` (the adjoint of broadcasting).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

}  // namespace loom::autograd
