// Decompositions: composite operators written with other catalog operators, so a
// backend that lacks them still runs them on its own device (docs/architecture.md, dispatch).
// Each is the op's math spelled with primitives; the conformance suite checks them
// against the reference kernels through a backend that has only a few primitives.
#include <array>
#include <cmath>

#include "core/fused_elementwise.h"
#include "core/op_catalog.h"

namespace loom {
namespace {

struct Ops {  // small helpers over an OpRunner
  OpRunner& r;
  Tensor one(OpId op, std::initializer_list<Tensor> in, const Attrs& a = {}) {
    return r.run(op, std::span<const Tensor>(in.begin(), in.size()), a).front();
  }
  Tensor add(const Tensor& a, const Tensor& b) { return one(OpId::add, {a, b}); }
  Tensor mul(const Tensor& a, const Tensor& b) { return one(OpId::mul, {a, b}); }
  Tensor div(const Tensor& a, const Tensor& b) { return one(OpId::div, {a, b}); }
  Tensor exp(const Tensor& x) { return one(OpId::exp, {x}); }
  Tensor log(const Tensor& x) { return one(OpId::log, {x}); }
  Tensor constant(double value, const Tensor&) {  // a one-element tensor on the runner's device
    Attrs a;
    a.shape = {1};
    a.alpha = value;
    return r.run(OpId::fill, {}, a).front();
  }
  Tensor scale(const Tensor& x, double alpha) { return mul(x, constant(alpha, x)); }
  Tensor sum_last(const Tensor& x, bool keepdim) {
    Attrs a;
    a.axes = {-1};
    a.keepdim = keepdim;
    return one(OpId::sum, {x}, a);
  }
  Tensor max_last(const Tensor& x) {
    Attrs a;
    a.axis = -1;
    a.keepdim = true;
    return one(OpId::max, {x}, a);
  }
  // tanh(x) = 1 - 2 / (e^{2x} + 1)
  Tensor tanh(const Tensor& x) {
    return add(constant(1.0, x),
               scale(div(constant(1.0, x), add(exp(scale(x, 2.0)), constant(1.0, x))), -2.0));
  }
};

constexpr double kSqrt2OverPi = 0.7978845608028654;

std::vector<Tensor> sub(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  return {o.add(in[0], o.scale(in[1], -1.0))};
}

std::vector<Tensor> scale(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  Ops o{r};
  return {o.scale(in[0], a.alpha)};
}

std::vector<Tensor> mean(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  Ops o{r};
  Tensor total = o.one(OpId::sum, {in[0]}, a);
  double count = static_cast<double>(in[0].numel()) /
                 static_cast<double>(std::max<std::int64_t>(total.numel(), 1));
  return {o.scale(total, 1.0 / count)};
}

std::vector<Tensor> linear(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  Ops o{r};
  Attrs m;
  m.trans_b = a.trans_b;
  return {o.add(o.one(OpId::matmul, {in[0], in[1]}, m), in[2])};
}

std::vector<Tensor> tanh(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  return {Ops{r}.tanh(in[0])};
}

// sqrt(x) = e^{log(x) / 2} (log 0 = -inf gives 0; about 2 ulp from the exact root).
std::vector<Tensor> sqrt(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  return {o.exp(o.scale(o.one(OpId::log, {in[0]}), 0.5))};
}

std::vector<Tensor> tanh_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};  // dy (1 - y^2)
  return {o.mul(in[0], o.add(o.constant(1.0, in[1]), o.scale(o.mul(in[1], in[1]), -1.0)))};
}

// u = sqrt(2/pi) (x + 0.044715 x^3); gelu = 0.5 x (1 + tanh u)
std::vector<Tensor> gelu(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  const Tensor& x = in[0];
  Tensor x3 = o.mul(o.mul(x, x), x);
  Tensor u = o.scale(o.add(x, o.scale(x3, 0.044715)), kSqrt2OverPi);
  return {o.mul(o.scale(x, 0.5), o.add(o.constant(1.0, x), o.tanh(u)))};
}

// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh u
std::vector<Tensor> gelu_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  const Tensor& dy = in[0];
  const Tensor& x = in[1];
  Tensor x2 = o.mul(x, x);
  Tensor t = o.tanh(o.scale(o.add(x, o.scale(o.mul(x2, x), 0.044715)), kSqrt2OverPi));
  Tensor one = o.constant(1.0, x);
  Tensor left = o.scale(o.add(one, t), 0.5);
  Tensor sech2 = o.add(one, o.scale(o.mul(t, t), -1.0));
  Tensor du = o.scale(o.add(one, o.scale(x2, 3.0 * 0.044715)), kSqrt2OverPi);
  Tensor right = o.mul(o.mul(o.scale(x, 0.5), sech2), du);
  return {o.mul(dy, o.add(left, right))};
}

std::vector<Tensor> softmax(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};  // e^(x - max) / sum e^(x - max)
  Tensor e = o.exp(o.add(in[0], o.scale(o.max_last(in[0]), -1.0)));
  return {o.div(e, o.sum_last(e, true))};
}

std::vector<Tensor> log_softmax(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};  // x - (max + log sum e^(x - max))
  Tensor m = o.max_last(in[0]);
  Tensor shifted = o.add(in[0], o.scale(m, -1.0));
  Tensor lse = o.log(o.sum_last(o.exp(shifted), true));
  return {o.add(shifted, o.scale(lse, -1.0))};
}

std::vector<Tensor> softmax_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};  // y (dy - sum(dy y))
  Tensor dot = o.sum_last(o.mul(in[0], in[1]), true);
  return {o.mul(in[1], o.add(in[0], o.scale(dot, -1.0)))};
}

std::vector<Tensor> log_softmax_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};  // dy - e^y sum(dy)
  return {o.add(in[0], o.scale(o.mul(o.exp(in[1]), o.sum_last(in[0], true)), -1.0))};
}

// y = (x - mean) rstd w + b, rstd = (var + eps)^(-1/2) = exp(-log(var + eps) / 2)
std::vector<Tensor> layer_norm(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  Ops o{r};
  const Tensor& x = in[0];
  double c = static_cast<double>(x.dim(-1));
  Tensor mean = o.scale(o.sum_last(x, true), 1.0 / c);
  Tensor xc = o.add(x, o.scale(mean, -1.0));
  Tensor var = o.scale(o.sum_last(o.mul(xc, xc), true), 1.0 / c);
  Tensor rstd = o.exp(o.scale(o.log(o.add(var, o.constant(a.eps, x))), -0.5));
  Tensor y = o.add(o.mul(o.mul(xc, rstd), in[1]), in[2]);
  Shape rows(x.shape().begin(), x.shape().end() - 1);
  return {y, mean.reshape(rows), rstd.reshape(rows)};
}

// sigmoid(x) = 1 / (1 + e^-x); silu(x) = x sigmoid(x)
Tensor sigmoid(Ops& o, const Tensor& x) {
  return o.div(o.constant(1.0, x), o.add(o.constant(1.0, x), o.exp(o.scale(x, -1.0))));
}
std::vector<Tensor> silu(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  return {o.mul(in[0], sigmoid(o, in[0]))};
}
// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
std::vector<Tensor> silu_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  const Tensor& x = in[1];
  Tensor s = sigmoid(o, x);
  Tensor one_minus_s = o.add(o.constant(1.0, x), o.scale(s, -1.0));
  return {o.mul(in[0], o.mul(s, o.add(o.constant(1.0, x), o.mul(x, one_minus_s))))};
}
std::vector<Tensor> swiglu(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  return {o.mul(o.one(OpId::silu, {in[0]}), in[1])};
}
// dgate = silu'(gate) (dy up), dup = dy silu(gate)
std::vector<Tensor> swiglu_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  return {o.one(OpId::silu_backward, {o.mul(in[0], in[2]), in[1]}),
          o.mul(in[0], o.one(OpId::silu, {in[1]}))};
}

// y = x rstd w, rstd = (mean(x^2) + eps)^(-1/2) = exp(-log(mean(x^2) + eps) / 2)
std::vector<Tensor> rms_norm(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  Ops o{r};
  const Tensor& x = in[0];
  double c = static_cast<double>(x.dim(-1));
  Tensor mean_square = o.scale(o.sum_last(o.mul(x, x), true), 1.0 / c);
  Tensor rstd = o.exp(o.scale(o.log(o.add(mean_square, o.constant(a.eps, x))), -0.5));
  Shape rows(x.shape().begin(), x.shape().end() - 1);
  return {o.mul(o.mul(x, rstd), in[1]), rstd.reshape(rows)};
}
// xhat = x rstd, g = dy w: dx = rstd (g - xhat mean(g xhat)), dw = sum over rows of dy xhat
std::vector<Tensor> rms_norm_backward(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  const Tensor &dy = in[0], &x = in[1];
  Shape kept = in[3].shape();
  kept.push_back(1);
  Tensor rstd = in[3].reshape(kept);
  Tensor xhat = o.mul(x, rstd);
  Tensor g = o.mul(dy, in[2]);
  Tensor mean_gx = o.scale(o.sum_last(o.mul(g, xhat), true), 1.0 / static_cast<double>(x.dim(-1)));
  Tensor dx = o.mul(rstd, o.add(g, o.scale(o.mul(xhat, mean_gx), -1.0)));
  Tensor dw = o.mul(dy, xhat);
  if (x.rank() > 1) {
    Attrs rows;
    for (int axis = 0; axis + 1 < x.rank(); ++axis)
      rows.axes.push_back(axis);
    dw = o.one(OpId::sum, {dw}, rows);
  }
  return {dx, dw};
}

// The halves x1 = x[..., :D/2], x2 = x[..., D/2:] turned by the angle of their position:
// y = concat(x1 cos - x2 sin, x2 cos + x1 sin), the tables broadcast as [T, 1, D/2].
std::vector<Tensor> rope(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Ops o{r};
  const Tensor& x = in[0];
  const int last = x.rank() - 1;
  const std::int64_t half = x.dim(-1) / 2;
  Tensor x1 = x.slice(last, 0, half), x2 = x.slice(last, half, 2 * half);
  Shape table{in[1].dim(0), 1, half};
  Tensor c = in[1].reshape(table), s = in[2].reshape(table);
  Attrs join;
  join.axis = last;
  std::array<Tensor, 2> halves{o.add(o.mul(x1, c), o.scale(o.mul(x2, s), -1.0)),
                               o.add(o.mul(x2, c), o.mul(x1, s))};
  return r.run(OpId::concat, halves, join);
}

// The chain run step by step as the ops it was made of (what the graph ran before fusion).
// Broadcasting ops take their operands as they are; the other two-operand ops (the
// *_backward pairs) need equal shapes, so an operand of another shape is expanded first.
// A row reduction step runs as sum or mean over the last axis, keeping it; a value is
// expanded only to its own register's shape (the output shape, or the row shape).
std::vector<Tensor> fused_elementwise(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  Ops o{r};
  const ElementwiseProgram& program = *a.program;
  std::vector<Shape> input_shapes;
  for (const Tensor& x : in)
    input_shapes.push_back(x.shape());
  const std::vector<bool> row = row_registers(program, input_shapes, a.shape);
  auto shape_of = [&](std::size_t reg) { return row[reg] ? row_shape(a.shape) : a.shape; };
  auto to = [&](const Tensor& x, const Shape& shape) {
    Attrs target;
    target.shape = shape;
    return x.shape() == shape ? x : o.one(OpId::expand, {x}, target);
  };
  std::vector<Tensor> registers(in.begin(), in.end());
  for (std::size_t k = 0; k < program.steps.size(); ++k) {
    const ElementwiseStep& s = program.steps[k];
    const Shape shape = shape_of(in.size() + k);
    const bool broadcasts =
        s.op == OpId::add || s.op == OpId::sub || s.op == OpId::mul || s.op == OpId::div;
    std::vector<Tensor> args;
    for (int j = 0; j < elementwise_arity(s.op); ++j)
      args.push_back(elementwise_arity(s.op) == 2 && !broadcasts ? to(registers[s.args[j]], shape)
                                                                 : registers[s.args[j]]);
    Attrs step;
    step.alpha = s.alpha;
    step.shape = shape;
    if (row_reduction(s.op)) {
      step.axes = {static_cast<std::int64_t>(a.shape.size()) - 1};
      step.keepdim = true;
    }
    registers.push_back(r.run(s.op, args, step).front());
  }
  std::vector<Tensor> outputs;
  for (int k : program.output_registers())
    outputs.push_back(to(registers[k], shape_of(static_cast<std::size_t>(k))));
  return outputs;
}

// The product as matmul, then the chain as fused_elementwise (which a backend without its
// kernel runs step by step in turn).
std::vector<Tensor> matmul_elementwise(OpRunner& r, std::span<const Tensor> in, const Attrs& a) {
  std::vector<Tensor> chain_inputs{r.run(OpId::matmul, in.first(2), a).front()};
  chain_inputs.insert(chain_inputs.end(), in.begin() + 2, in.end());
  return r.run(OpId::fused_elementwise, chain_inputs, a);
}

// The scatter-add, then the sum with base.
std::vector<Tensor> embedding_backward_add(OpRunner& r, std::span<const Tensor> in, const Attrs&) {
  Attrs a;
  a.shape = in[0].shape();
  Ops o{r};
  return {o.add(in[0], r.run(OpId::embedding_backward, in.subspan(1), a).front())};
}

std::array<DecomposeFn, kNumOps> make_table() {
  std::array<DecomposeFn, kNumOps> t{};
  auto set = [&](OpId op, DecomposeFn fn) { t[static_cast<std::size_t>(op)] = fn; };
  set(OpId::sub, sub);
  set(OpId::scale, scale);
  set(OpId::mean, mean);
  set(OpId::linear, linear);
  set(OpId::tanh, tanh);
  set(OpId::sqrt, sqrt);
  set(OpId::tanh_backward, tanh_backward);
  set(OpId::gelu, gelu);
  set(OpId::gelu_backward, gelu_backward);
  set(OpId::softmax, softmax);
  set(OpId::log_softmax, log_softmax);
  set(OpId::softmax_backward, softmax_backward);
  set(OpId::log_softmax_backward, log_softmax_backward);
  set(OpId::layer_norm, layer_norm);
  set(OpId::silu, silu);
  set(OpId::silu_backward, silu_backward);
  set(OpId::swiglu, swiglu);
  set(OpId::swiglu_backward, swiglu_backward);
  set(OpId::rms_norm, rms_norm);
  set(OpId::rms_norm_backward, rms_norm_backward);
  set(OpId::rope, rope);

  set(OpId::fused_elementwise, fused_elementwise);
  set(OpId::matmul_elementwise, matmul_elementwise);
  set(OpId::embedding_backward_add, embedding_backward_add);
  return t;
}

}  // namespace

DecomposeFn decomposition(OpId op) {
  static const std::array<DecomposeFn, kNumOps> table = make_table();
  return table[static_cast<std::size_t>(op)];
}

}  // namespace loom
