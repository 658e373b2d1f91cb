// onnx/ops.cpp — ONNX ops on float tensors: arithmetic, products, softmax, views,
// constants, dropout, elementwise functions.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "core/checked.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

template <ag::Var (*F)(ag::Tape&, const ag::Var&)>
void unary(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, F(r.tape, r.var(n, 0)));
}

// Y = alpha op(A) op(B) + beta C: a linear layer when it is one (bias of N, no scaling).
void gemm(Runner& r, const io::OnnxNode& n) {
  const ag::Var& a = r.var(n, 0);
  const ag::Var& b = r.var(n, 1);
  const double alpha = r.attr_float(n, "alpha", 1.0), beta = r.attr_float(n, "beta", 1.0);
  const bool trans_a = r.attr_int(n, "transA", 0) != 0, trans_b = r.attr_int(n, "transB", 0) != 0;
  check(a.shape().size() == 2 && b.shape().size() == 2, r.where(n) + ": A and B must be matrices");
  const std::int64_t cols = trans_b ? b.dim(0) : b.dim(1);
  if (r.has_input(n, 2)) {
    const ag::Var& c = r.var(n, 2);
    if (!trans_a && alpha == 1.0 && beta == 1.0 && c.shape() == Shape{cols}) {
      r.set(n, 0, ag::linear(r.tape, a, b, c, trans_b));
      return;
    }
  }
  ag::Var y = ag::matmul(r.tape, a, b, trans_a, trans_b);
  if (alpha != 1.0)
    y = ag::scale(r.tape, y, alpha);
  if (r.has_input(n, 2)) {
    ag::Var c = r.var(n, 2);
    if (beta != 1.0)
      c = ag::scale(r.tape, c, beta);
    y = ag::add(r.tape, y, c);
  }
  r.set(n, 0, y);
}

void matmul(Runner& r, const io::OnnxNode& n) {
  const ag::Var& a = r.var(n, 0);
  const ag::Var& b = r.var(n, 1);
  // numpy's rule: a vector a is a row [1,K], a vector b a column [K,1]; the added
  // dimension is removed from the product.
  const bool a_vector = a.shape().size() == 1, b_vector = b.shape().size() == 1;
  ag::Var a2 = a_vector ? ag::reshape(r.tape, a, {1, a.dim(0)}) : a;
  ag::Var b2 = b_vector ? ag::reshape(r.tape, b, {b.dim(0), 1}) : b;
  ag::Var y = ag::matmul(r.tape, a2, b2);
  if (a_vector || b_vector) {
    Shape s = y.shape();
    if (b_vector)
      s.erase(s.end() - 1);
    if (a_vector)
      s.erase(s.end() - (b_vector ? 1 : 2));
    y = ag::reshape(r.tape, y, s);
  }
  r.set(n, 0, y);
}

// Softmax and LogSoftmax: F over `axis`.
template <ag::Var (*F)(ag::Tape&, const ag::Var&)>
void softmax(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  const bool opset13 = r.opset() >= 13;
  const int axis = axis_of(r.attr_int(n, "axis", opset13 ? -1 : 1), rank, r.where(n));
  if (axis == rank - 1) {
    r.set(n, 0, F(r.tape, x));
  } else if (opset13) {
    // Move the axis last, normalise there, move it back.
    std::vector<int> order(static_cast<std::size_t>(rank));
    std::iota(order.begin(), order.end(), 0);
    std::swap(order[static_cast<std::size_t>(axis)], order.back());
    r.set(n, 0, ag::permute(r.tape, F(r.tape, ag::permute(r.tape, x, order)), order));
  } else {
    // Before opset 13: the input is read as a matrix [prod(dims < axis), prod(dims >= axis)].
    const Shape& s = x.shape();
    std::int64_t rows =
        std::accumulate(s.begin(), s.begin() + axis, std::int64_t{1}, std::multiplies<>());
    ag::Var flat = ag::reshape(r.tape, x, {rows, shape_numel(s) / std::max<std::int64_t>(rows, 1)});
    r.set(n, 0, ag::reshape(r.tape, F(r.tape, flat), s));
  }
}

void flatten(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const Shape& s = x.shape();
  const int rank = static_cast<int>(s.size());
  std::int64_t axis = r.attr_int(n, "axis", 1);
  check(axis >= -rank && axis <= rank,
        r.where(n) + ": axis " + std::to_string(axis) + " outside rank " + std::to_string(rank));
  if (axis < 0)
    axis += rank;
  std::int64_t rows =
      std::accumulate(s.begin(), s.begin() + axis, std::int64_t{1}, std::multiplies<>());
  r.set(n, 0, ag::reshape(r.tape, x, {rows, shape_numel(s) / std::max<std::int64_t>(rows, 1)}));
}

// Reshape's target: 0 copies the input's dimension (unless allowzero), one -1 is inferred.
Shape reshape_target(Runner& r, const io::OnnxNode& n, const Shape& in) {
  std::vector<std::int64_t> target = r.ints(n, 1);
  const bool allow_zero = r.attr_int(n, "allowzero", 0) != 0;
  const std::int64_t numel = shape_numel(in);
  Shape shape;
  std::int64_t known = 1;  // the product of the non-zero target dimensions
  bool has_zero = false;
  int infer = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    std::int64_t d = target[i];
    if (d == 0 && !allow_zero) {
      check(i < in.size(), r.where(n) + ": shape entry 0 copies dimension " + std::to_string(i) +
                               " of a rank-" + std::to_string(in.size()) + " input");
      d = in[i];
    }
    if (d == -1) {
      check(infer < 0, r.where(n) + ": more than one -1 in the target shape");
      infer = static_cast<int>(i);
    } else {
      check(d >= 0,
            r.where(n) + ": negative dimension " + std::to_string(d) + " in the target shape");
      if (d == 0)
        has_zero = true;
      else
        known = checked_mul(known, d, r.where(n) + ": target shape " + shape_str(target));
    }
    shape.push_back(d);
  }
  if (infer >= 0) {
    check(!has_zero && numel % known == 0, r.where(n) +
                                               ": cannot infer the -1 of the target shape " +
                                               shape_str(target) + " for " + shape_str(in));
    shape[static_cast<std::size_t>(infer)] = numel / known;
  }
  check(shape_numel(shape) == numel,
        r.where(n) + ": cannot reshape " + shape_str(in) + " to " + shape_str(shape));
  return shape;
}

void reshape(Runner& r, const io::OnnxNode& n) {
  if (is_host(r, n, 0)) {
    const Tensor& h = r.value(n, 0).host;
    r.set_host(n, 0, host_ints(r.host, reshape_target(r, n, h.shape()), r.ints(n, 0)));
    return;
  }
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0, ag::reshape(r.tape, x, reshape_target(r, n, x.shape())));
}

void transpose(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  std::vector<std::int64_t> perm = r.attr_ints(n, "perm");
  std::vector<int> order(static_cast<std::size_t>(rank));
  if (perm.empty()) {
    for (int i = 0; i < rank; ++i)
      order[static_cast<std::size_t>(i)] = rank - 1 - i;
  } else {
    check(static_cast<int>(perm.size()) == rank,
          r.where(n) + ": perm has " + std::to_string(perm.size()) + " entries for a rank-" +
              std::to_string(rank) + " tensor");
    for (int i = 0; i < rank; ++i)
      order[static_cast<std::size_t>(i)] =
          axis_of(perm[static_cast<std::size_t>(i)], rank, r.where(n));
  }
  r.set(n, 0, ag::permute(r.tape, x, order));
}

void identity(Runner& r, const io::OnnxNode& n) {
  check(!n.outputs.empty(), r.where(n) + ": has no output 0");
  if (r.env.count(n.outputs[0]))
    return;  // an initializer alias the model holds as its own parameter
  r.env[n.outputs[0]] = r.value(n, 0);
}

// Inference: the identity. Training: inverted dropout with this step's seed.
void dropout(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  double ratio = r.attr_float(n, "ratio", 0.5);
  if (r.has_input(n, 1))
    ratio = r.value(n, 1).host.defined() ? static_cast<double>(r.ints(n, 1).at(0))
                                         : static_cast<double>(r.input_on_host(n, 1).item());
  // ONNX's training_mode input overrides the run's mode when given.
  const bool training = r.has_input(n, 2) ? r.ints(n, 2).at(0) != 0 : r.options.training;
  if (!training || ratio == 0.0) {
    r.set(n, 0, x);
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) {  // the mask: every element kept
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(x.value().numel()), 1);
      r.set_host(n, 1, Tensor::from_host(x.shape(), DType::u8, keep.data(), r.host));
    }
    return;
  }
  r.set(n, 0, ag::dropout(r.tape, x, ratio, r.options.dropout_seed, r.node_index));
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) {
    // The mask: the same draw (seed and site) applied to ones gives 1 / (1 - ratio) where
    // an element is kept and 0 where it is dropped.
    ag::Var ones = r.constant(Tensor::from_floats(
        x.shape(), std::vector<float>(static_cast<std::size_t>(x.value().numel()), 1.0f), r.host));
    ag::Var kept = ag::dropout(r.tape, ones, ratio, r.options.dropout_seed, r.node_index);
    r.set_host(
        n, 1,
        r.read_on_host(n, compare_on_device(kept.value(), r.scalar(0.0f).value(), Comparison::gt)));
  }
}

void constant(Runner& r, const io::OnnxNode& n) {
  const auto& attrs = n.attributes;
  Backend& host = r.host;
  Tensor value;
  if (auto it = attrs.find("value"); it != attrs.end() && it->second.t.defined()) {
    value = it->second.t;
  } else if (auto f = attrs.find("value_float"); f != attrs.end()) {
    float v = static_cast<float>(f->second.f);
    value = Tensor::from_floats({}, std::span<const float>(&v, 1), host);
  } else if (auto fs = attrs.find("value_floats"); fs != attrs.end()) {
    std::vector<float> v(fs->second.floats.begin(), fs->second.floats.end());
    value = Tensor::from_floats({static_cast<std::int64_t>(v.size())}, v, host);
  } else if (auto i = attrs.find("value_int"); i != attrs.end()) {
    value = Tensor::from_host({}, DType::i64, &i->second.i, host);
  } else if (auto is = attrs.find("value_ints"); is != attrs.end()) {
    value = Tensor::from_host({static_cast<std::int64_t>(is->second.ints.size())}, DType::i64,
                              is->second.ints.data(), host);
  } else {
    throw Error(r.where(n) +
                ": no value attribute Loom reads (value, value_float(s), value_int(s))");
  }
  if (value.dtype() == DType::f32)
    r.set(n, 0, r.constant(value));
  else
    r.set_host(n, 0, value);  // integer constants stay on the host, where shapes are computed
}

// ---- more elementwise ------------------------------------------------------------------

ag::Var one_like(Runner& r) {
  return r.constant(Tensor::from_floats({}, std::vector<float>{1.0f}, r.host));
}

void sigmoid(Runner& r, const io::OnnxNode& n) {  // 1 / (1 + e^{-x})
  ag::Var one = one_like(r);
  r.set(n, 0,
        ag::div(r.tape, one,
                ag::add(r.tape, one, ag::exp(r.tape, ag::scale(r.tape, r.var(n, 0), -1.0)))));
}

// f of each element of a host integer tensor, checked for overflow by f.
void host_unary(Runner& r, const io::OnnxNode& n,
                std::int64_t (*f)(std::int64_t, const std::string&)) {
  std::vector<std::int64_t> v = r.ints(n, 0);
  for (std::int64_t& x : v)
    x = f(x, r.where(n));
  r.set_host(n, 0, host_ints(r.host, r.value(n, 0).host.shape(), v));
}

std::int64_t negated(std::int64_t x, const std::string& where) {
  check(x != std::numeric_limits<std::int64_t>::min(),
        where + ": -(" + std::to_string(x) + ") overflows int64");
  return -x;
}

void neg(Runner& r, const io::OnnxNode& n) {
  if (is_host(r, n, 0))
    return host_unary(r, n, negated);
  r.set(n, 0, ag::scale(r.tape, r.var(n, 0), -1.0));
}

void abs(Runner& r, const io::OnnxNode& n) {  // relu(x) + relu(-x)
  if (is_host(r, n, 0))
    return host_unary(r, n, [](std::int64_t x, const std::string& where) {
      return x < 0 ? negated(x, where) : x;
    });
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0, absolute(r, x));
}

void reciprocal(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, ag::div(r.tape, one_like(r), r.var(n, 0)));
}

}  // namespace

void add_tensor_ops(OpTable& table) {
  table["Abs"] = abs;
  table["Neg"] = neg;
  table["Reciprocal"] = reciprocal;
  table["Sigmoid"] = sigmoid;
  table["Constant"] = constant;
  table["Dropout"] = dropout;
  table["Erf"] = unary<ag::erf>;
  table["Exp"] = unary<ag::exp>;
  table["Flatten"] = flatten;
  table["Gemm"] = gemm;
  table["Identity"] = identity;
  table["Log"] = unary<ag::log>;
  table["MatMul"] = matmul;
  table["Relu"] = unary<ag::relu>;
  table["Reshape"] = reshape;
  table["Softmax"] = softmax<ag::softmax>;
  table["LogSoftmax"] = softmax<ag::log_softmax>;
  table["Sqrt"] = unary<ag::sqrt>;
  table["Tanh"] = unary<ag::tanh>;
  table["Transpose"] = transpose;
}

}  // namespace loom::nn::onnx_import
