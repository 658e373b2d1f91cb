// onnx/reduce_ops.cpp — ONNX reductions (the Reduce family, ArgMax, ArgMin), the
// normalisations written as one op (LayerNormalization, RMSNormalization) and the loss
// ops (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), as catalog calls.
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/checked.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

// The axes a Reduce op reduces, sorted and normalised; nullopt when it is the identity
// (no axes and noop_with_empty_axes). Axes come from input 1 (ReduceSum from opset 13,
// the others from 18) or the `axes` attribute; none means all.
std::optional<std::vector<std::int64_t>> reduced_axes(Runner& r, const io::OnnxNode& n, int rank) {
  std::vector<std::int64_t> given = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "axes");
  if (given.empty()) {
    if (r.attr_int(n, "noop_with_empty_axes", 0) != 0)
      return std::nullopt;
    given.resize(static_cast<std::size_t>(rank));
    std::iota(given.begin(), given.end(), std::int64_t{0});
  }
  std::vector<std::int64_t> axes;
  for (std::int64_t a : given)
    axes.push_back(axis_of(a, rank, r.where(n)));
  std::sort(axes.begin(), axes.end());
  check(std::adjacent_find(axes.begin(), axes.end()) == axes.end(),
        r.where(n) + ": an axis appears twice in " + shape_str(given));
  return axes;
}

// The shape after reducing `axes` of `s`: kept as 1, or removed.
Shape reduced_shape(const Shape& s, const std::vector<std::int64_t>& axes, bool keepdims) {
  Shape out;
  for (std::size_t d = 0; d < s.size(); ++d) {
    const bool reduced =
        std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) != axes.end();
    if (!reduced)
      out.push_back(s[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

// The largest (or smallest) element over several axes: one catalog max per axis.
ag::Var extreme_over(Runner& r, ag::Var x, const std::vector<std::int64_t>& axes, bool largest) {
  if (!largest)
    x = ag::scale(r.tape, x, -1.0);
  for (std::int64_t a : axes)
    x = ag::max(r.tape, x, a, true);
  return largest ? x : ag::scale(r.tape, x, -1.0);
}

enum class Reduction { sum, max, min, prod, l1, l2, sum_square, log_sum, log_sum_exp };

template <Reduction How>
void reduce(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  const bool keepdims = r.attr_int(n, "keepdims", 1) != 0;
  std::optional<std::vector<std::int64_t>> axes = reduced_axes(r, n, rank);
  if (!axes) {
    r.set(n, 0, x);
    return;
  }
  const Shape out_shape = reduced_shape(x.shape(), *axes, keepdims);
  for (std::int64_t a : *axes)
    if (x.dim(static_cast<int>(a)) == 0) {  // an empty set: the reduction's identity
      const float inf = std::numeric_limits<float>::infinity();
      const float identity =
          How == Reduction::max || How == Reduction::log_sum || How == Reduction::log_sum_exp ? -inf
          : How == Reduction::min                                                             ? inf
          : How == Reduction::prod                                                            ? 1.0f
                                   : 0.0f;
      r.set(n, 0,
            r.constant(Tensor::from_floats(
                out_shape,
                std::vector<float>(static_cast<std::size_t>(shape_numel(out_shape)), identity),
                r.host)));
      return;
    }
  auto sum = [&](const ag::Var& v) { return ag::sum(r.tape, v, *axes, true); };
  ag::Var y;
  switch (How) {
    case Reduction::sum:
      y = sum(x);
      break;
    case Reduction::max:
    case Reduction::min:
      y = extreme_over(r, x, *axes, How == Reduction::max);
      break;
    case Reduction::prod:  // slice by slice, so zeros and signs are exact
      y = x;
      for (std::int64_t a : *axes) {
        const int axis = static_cast<int>(a);
        ag::Var p = ag::slice(r.tape, y, axis, 0, std::min<std::int64_t>(1, y.dim(axis)));
        for (std::int64_t k = 1; k < y.dim(axis); ++k)
          p = ag::mul(r.tape, p, ag::slice(r.tape, y, axis, k, k + 1));
        y = p;
      }
      break;
    case Reduction::l1:
      y = sum(absolute(r, x));
      break;
    case Reduction::l2:
      y = ag::sqrt(r.tape, sum(ag::mul(r.tape, x, x)));
      break;
    case Reduction::sum_square:
      y = sum(ag::mul(r.tape, x, x));
      break;
    case Reduction::log_sum:
      y = ag::log(r.tape, sum(x));
      break;
    case Reduction::log_sum_exp: {  // m + log(sum(e^{x - m})), m the largest element
      ag::Var m = extreme_over(r, x, *axes, true);
      y = ag::add(r.tape, m, ag::log(r.tape, sum(ag::exp(r.tape, ag::sub(r.tape, x, m)))));
      break;
    }
  }
  r.set(n, 0, ag::reshape(r.tape, y, out_shape));
}

// ArgMax, ArgMin: indices (i64, on the host) of the first (or, with select_last_index,
// the last) extreme element along `axis`.
template <bool Largest>
void arg_extreme(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const Shape& s = x.shape();
  const int rank = static_cast<int>(s.size());
  const int axis = axis_of(r.attr_int(n, "axis", 0), rank, r.where(n));
  const bool keepdims = r.attr_int(n, "keepdims", 1) != 0;
  const bool last = r.attr_int(n, "select_last_index", 0) != 0;
  const std::vector<float> v = r.read_on_host(n, x.value()).to_floats();
  const std::int64_t count = s[static_cast<std::size_t>(axis)];
  check(count > 0, r.where(n) + ": the axis is empty");
  const std::int64_t inner = shape_numel(Shape(s.begin() + axis + 1, s.end()));
  const std::int64_t outer = shape_numel(Shape(s.begin(), s.begin() + axis));
  std::vector<std::int64_t> out(static_cast<std::size_t>(outer * inner));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i) {
      std::int64_t best = 0;
      for (std::int64_t k = 1; k < count; ++k) {
        const float candidate = v[static_cast<std::size_t>((o * count + k) * inner + i)];
        const float current = v[static_cast<std::size_t>((o * count + best) * inner + i)];
        const bool better = Largest ? candidate > current : candidate < current;
        if (better || (last && candidate == current))
          best = k;
      }
      out[static_cast<std::size_t>(o * inner + i)] = best;
    }
  r.set_host(n, 0, host_ints(r.host, reduced_shape(s, {axis}, keepdims), out));
}

// LayerNormalization over the dimensions from `axis` on: the catalog's layer_norm on the
// input read as [rows, C]. The optional Mean and InvStdDev outputs keep the normalised
// dimensions as 1.
void layer_normalization(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const Shape& s = x.shape();
  const int rank = static_cast<int>(s.size());
  const int axis = axis_of(r.attr_int(n, "axis", -1), rank, r.where(n));
  const double eps = r.attr_float(n, "epsilon", 1e-5);
  const Shape normalised(s.begin() + axis, s.end());
  const std::int64_t cols = shape_numel(normalised),
                     rows = shape_numel(Shape(s.begin(), s.begin() + axis));
  auto flat_param = [&](const ag::Var& p) {
    return ag::reshape(r.tape, ag::expand(r.tape, p, normalised), {cols});
  };
  ag::Var weight = flat_param(r.var(n, 1));
  ag::Var bias =
      r.has_input(n, 2)
          ? flat_param(r.var(n, 2))
          : r.constant(Tensor::from_floats(
                {cols}, std::vector<float>(static_cast<std::size_t>(cols), 0.0f), r.host));
  ag::Var x2 = ag::reshape(r.tape, x, {rows, cols});
  r.set(n, 0, ag::reshape(r.tape, ag::layer_norm(r.tape, x2, weight, bias, eps), s));
  const bool wants_mean = n.outputs.size() > 1 && !n.outputs[1].empty();
  const bool wants_rstd = n.outputs.size() > 2 && !n.outputs[2].empty();
  if (!wants_mean && !wants_rstd)
    return;
  Shape stat_shape(s.begin(), s.begin() + axis);
  stat_shape.resize(s.size(), 1);
  ag::Var mean = ag::mean(r.tape, x2, {1}, true);
  ag::Var centred = ag::sub(r.tape, x2, mean);
  ag::Var var = ag::mean(r.tape, ag::mul(r.tape, centred, centred), {1}, true);
  ag::Var rstd = ag::div(r.tape, r.scalar(1.0f),
                         ag::sqrt(r.tape, ag::add(r.tape, var, r.scalar(static_cast<float>(eps)))));
  if (wants_mean)
    r.set(n, 1, ag::reshape(r.tape, mean, stat_shape));
  if (wants_rstd)
    r.set(n, 2, ag::reshape(r.tape, rstd, stat_shape));
}

// RMSNormalization: x / sqrt(mean(x^2 over the dimensions from axis on) + eps) * scale.
void rms_normalization(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  const int axis = axis_of(r.attr_int(n, "axis", -1), rank, r.where(n));
  const auto eps = static_cast<float>(r.attr_float(n, "epsilon", 1e-5));
  std::vector<std::int64_t> axes;
  for (int d = axis; d < rank; ++d)
    axes.push_back(d);
  ag::Var ms = ag::mean(r.tape, ag::mul(r.tape, x, x), axes, true);
  ag::Var y = ag::div(r.tape, x, ag::sqrt(r.tape, ag::add(r.tape, ms, r.scalar(eps))));
  r.set(n, 0, ag::mul(r.tape, y, r.var(n, 1)));
}

// The negative log-likelihood of log-probabilities `logp` [N,C,d...] at integer targets
// [N,d...] (ignore_index skipped), weighted per class, reduced as `reduction` says.
ag::Var negative_log_likelihood(Runner& r, const io::OnnxNode& n, const ag::Var& logp,
                                std::size_t target_input, std::size_t weight_input) {
  const Shape& s = logp.shape();
  check(s.size() >= 2, r.where(n) + ": the input must be [N, C, ...], got " + shape_str(s));
  const Tensor& target = r.value(n, target_input).host;
  check(target.defined(), r.where(n) + ": the target must be an integer tensor");
  Shape expected_target = s;
  expected_target.erase(expected_target.begin() + 1);
  check(target.shape() == expected_target, r.where(n) + ": the target is " +
                                               shape_str(target.shape()) + ", expected " +
                                               shape_str(expected_target));
  const std::vector<std::int64_t> t = host_values(r.host, target);
  const bool has_ignore = n.attributes.count("ignore_index") > 0;
  const std::int64_t ignore = r.attr_int(n, "ignore_index", 0);
  const std::int64_t classes = s[1], inner = shape_numel(Shape(s.begin() + 2, s.end()));
  // mask[n, c, d] = 1 where c is the (not ignored) target of [n, d].
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(shape_numel(s)), 0);
  std::int64_t counted = 0;
  for (std::int64_t i = 0; i < s[0]; ++i)
    for (std::int64_t d = 0; d < inner; ++d) {
      const std::int64_t c = t[static_cast<std::size_t>(i * inner + d)];
      if (has_ignore && c == ignore)
        continue;
      check(c >= 0 && c < classes, r.where(n) + ": target " + std::to_string(c) +
                                       " is outside [0, " + std::to_string(classes) + ")");
      mask[static_cast<std::size_t>((i * classes + c) * inner + d)] = 1;
      ++counted;
    }
  Tensor keep = Tensor::from_host(s, DType::u8, mask.data(), r.host).to(r.backend);
  ag::Var zero = r.scalar(0.0f);
  ag::Var picked = ag::where(r.tape, keep, logp, zero);
  std::optional<ag::Var> weight_full;
  if (r.has_input(n, weight_input)) {
    Shape per_class(s.size(), 1);
    per_class[1] = classes;
    ag::Var w = ag::reshape(r.tape, r.var(n, weight_input), per_class);
    picked = ag::mul(r.tape, picked, w);
    weight_full = ag::where(r.tape, keep, w, zero);
  }
  // Loss per [N, d...]: minus the picked element of each class row.
  ag::Var loss = ag::scale(r.tape, ag::sum(r.tape, picked, {1}, false), -1.0);
  const std::string reduction =
      n.attributes.count("reduction") ? n.attributes.at("reduction").s : "mean";
  if (reduction == "none")
    return loss;
  ag::Var total = ag::sum(r.tape, loss);
  if (reduction == "sum")
    return total;
  check(reduction == "mean",
        r.where(n) + ": reduction '" + reduction + "' is not one of none, sum, mean");
  if (weight_full)
    return ag::div(r.tape, total, ag::sum(r.tape, *weight_full));
  return ag::scale(r.tape, total, 1.0 / static_cast<double>(counted));
}

void nll_loss(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, negative_log_likelihood(r, n, r.var(n, 0), 1, 2));
}

// SoftmaxCrossEntropyLoss: log_softmax over the class axis (1), then the NLL; the
// optional second output is the log-probabilities.
void softmax_cross_entropy(Runner& r, const io::OnnxNode& n) {
  const ag::Var& scores = r.var(n, 0);
  const int rank = static_cast<int>(scores.shape().size());
  check(rank >= 2, r.where(n) + ": scores must be [N, C, ...]");
  std::vector<int> order(static_cast<std::size_t>(rank));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[1], order.back());
  ag::Var logp =
      rank == 2
          ? ag::log_softmax(r.tape, scores)
          : ag::permute(r.tape, ag::log_softmax(r.tape, ag::permute(r.tape, scores, order)), order);
  r.set(n, 0, negative_log_likelihood(r, n, logp, 1, 2));
  if (n.outputs.size() > 1 && !n.outputs[1].empty())
    r.set(n, 1, logp);
}

}  // namespace

void add_reduce_ops(OpTable& table) {
  table["ArgMax"] = arg_extreme<true>;
  table["ArgMin"] = arg_extreme<false>;
  table["LayerNormalization"] = layer_normalization;
  table["NegativeLogLikelihoodLoss"] = nll_loss;
  table["ReduceL1"] = reduce<Reduction::l1>;
  table["ReduceL2"] = reduce<Reduction::l2>;
  table["ReduceLogSum"] = reduce<Reduction::log_sum>;
  table["ReduceLogSumExp"] = reduce<Reduction::log_sum_exp>;
  table["ReduceMax"] = reduce<Reduction::max>;
  table["ReduceMin"] = reduce<Reduction::min>;
  table["ReduceProd"] = reduce<Reduction::prod>;
  table["ReduceSum"] = reduce<Reduction::sum>;
  table["ReduceSumSquare"] = reduce<Reduction::sum_square>;
  table["RMSNormalization"] = rms_normalization;
  table["SoftmaxCrossEntropyLoss"] = softmax_cross_entropy;
}

}  // namespace loom::nn::onnx_import
