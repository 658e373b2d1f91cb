// onnx/layout_ops.cpp — ONNX ops that rearrange or make tensors (Split, Squeeze,
// Expand, Tile, Pad, Trilu, ConstantOfShape, Size, Range) and the activations written as
// compositions of catalog ops (LeakyRelu, Elu, Selu, Celu, HardSigmoid, HardSwish,
// Softplus, Softsign, Mish, PRelu, ThresholdedRelu, Gelu).
#include <cmath>
#include <numeric>

#include "core/checked.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

// Split along `axis` into the sizes of input 1 or the `split` attribute; else into
// num_outputs (or as many as there are outputs) equal parts, the last one smaller when
// the axis does not divide (opset 18).
void split(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int axis =
      axis_of(r.attr_int(n, "axis", 0), static_cast<int>(x.shape().size()), r.where(n));
  const std::int64_t dim = x.dim(axis);
  std::vector<std::int64_t> sizes = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "split");
  if (sizes.empty()) {
    const auto parts = static_cast<std::int64_t>(
        r.attr_int(n, "num_outputs", static_cast<std::int64_t>(n.outputs.size())));
    check(parts > 0, r.where(n) + ": num_outputs must be positive");
    const std::int64_t each = (dim + parts - 1) / parts;
    for (std::int64_t at = 0; at < dim || static_cast<std::int64_t>(sizes.size()) < parts;
         at += each)
      sizes.push_back(std::clamp<std::int64_t>(dim - at, 0, each));
  }
  check(sizes.size() == n.outputs.size(), r.where(n) + ": " + std::to_string(sizes.size()) +
                                              " parts for " + std::to_string(n.outputs.size()) +
                                              " outputs");
  std::int64_t at = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    check(sizes[i] >= 0 && at + sizes[i] <= dim, r.where(n) + ": split sizes " + shape_str(sizes) +
                                                     " do not fit dimension " +
                                                     std::to_string(dim));
    r.set(n, i, ag::slice(r.tape, x, axis, at, at + sizes[i]));
    at += sizes[i];
  }
  check(at == dim, r.where(n) + ": split sizes " + shape_str(sizes) + " sum to " +
                       std::to_string(at) + ", not " + std::to_string(dim));
}

// A float or host-integer input reshaped (a view for floats, a copy for integers).
void set_reshaped(Runner& r, const io::OnnxNode& n, const Shape& shape) {
  const Value& v = r.value(n, 0);
  if (v.var.defined())
    r.set(n, 0, ag::reshape(r.tape, v.var, shape));
  else
    r.set_host(n, 0, host_ints(r.host, shape, r.ints(n, 0)));
}

void squeeze(Runner& r, const io::OnnxNode& n) {
  const Shape s = r.shape_of(n, 0);
  const int rank = static_cast<int>(s.size());
  std::vector<std::int64_t> axes = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "axes");
  std::vector<bool> drop(s.size(), false);
  for (std::int64_t a : axes) {
    const auto d = static_cast<std::size_t>(axis_of(a, rank, r.where(n)));
    check(s[d] == 1, r.where(n) + ": axis " + std::to_string(a) + " has size " +
                         std::to_string(s[d]) + ", only size 1 can be squeezed");
    drop[d] = true;
  }
  Shape out;
  for (std::size_t d = 0; d < s.size(); ++d)
    if (!(axes.empty() ? s[d] == 1 : drop[d]))
      out.push_back(s[d]);
  set_reshaped(r, n, out);
}

// Expand: numpy's two-way broadcast of the input's shape and the given one.
void expand(Runner& r, const io::OnnxNode& n) {
  const Shape target = broadcast_shapes(r.shape_of(n, 0), r.ints(n, 1), r.where(n));
  const Value& v = r.value(n, 0);
  if (v.var.defined()) {
    r.set(n, 0, ag::expand(r.tape, v.var, target));
    return;
  }
  r.set_host(
      n, 0,
      host_broadcast(
          v.host,
          host_ints(r.host, target,
                    std::vector<std::int64_t>(static_cast<std::size_t>(shape_numel(target)), 0)),
          DType::i64, [](std::int64_t x, std::int64_t) { return x; }, r.where(n)));
}

// Tile: each axis repeated `repeats` times, by concatenation.
void tile(Runner& r, const io::OnnxNode& n) {
  ag::Var y = r.as_float(n, 0);
  const std::vector<std::int64_t> repeats = r.ints(n, 1);
  check(repeats.size() == y.shape().size(),
        r.where(n) + ": repeats has " + std::to_string(repeats.size()) + " entries for rank " +
            std::to_string(y.shape().size()));
  for (std::size_t d = 0; d < repeats.size(); ++d) {
    check(repeats[d] >= 0, r.where(n) + ": negative repeat " + std::to_string(repeats[d]));
    if (repeats[d] == 1)
      continue;
    if (repeats[d] == 0) {
      y = ag::slice(r.tape, y, static_cast<int>(d), 0, 0);
      continue;
    }
    y = ag::concat(r.tape, std::vector<ag::Var>(static_cast<std::size_t>(repeats[d]), y),
                   static_cast<int>(d));
  }
  r.set(n, 0, y);
}

// Pad: constant (a value), reflect, edge or wrap padding, axis by axis, by concatenating
// slices of the input (negative pads crop).
void pad(Runner& r, const io::OnnxNode& n) {
  ag::Var y = r.var(n, 0);
  const int rank = static_cast<int>(y.shape().size());
  const std::string mode = n.attributes.count("mode") ? n.attributes.at("mode").s : "constant";
  std::vector<std::int64_t> pads = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "pads");
  std::vector<std::int64_t> axes;
  if (r.has_input(n, 3)) {
    for (std::int64_t a : r.ints(n, 3))
      axes.push_back(axis_of(a, rank, r.where(n)));
  } else {
    axes.resize(static_cast<std::size_t>(rank));
    std::iota(axes.begin(), axes.end(), std::int64_t{0});
  }
  check(pads.size() == 2 * axes.size(), r.where(n) + ": pads has " + std::to_string(pads.size()) +
                                            " entries for " + std::to_string(axes.size()) +
                                            " axes");
  float value = static_cast<float>(r.attr_float(n, "value", 0.0));
  if (r.has_input(n, 2))
    value = r.input_on_host(n, 2).to_floats().at(0);
  for (std::size_t k = 0; k < axes.size(); ++k) {
    const int axis = static_cast<int>(axes[k]);
    const std::int64_t before = pads[k], after = pads[k + axes.size()];
    // Crop first (negative pads), then pad.
    y = ag::slice(r.tape, y, axis, std::max<std::int64_t>(0, -before),
                  y.dim(axis) - std::max<std::int64_t>(0, -after));
    const std::int64_t dim = y.dim(axis);
    auto border = [&](std::int64_t count, bool leading) -> std::vector<ag::Var> {
      std::vector<ag::Var> parts;
      for (std::int64_t j = 0; j < count; ++j) {
        std::int64_t src = 0;  // the source index of the j-th padded element, outward
        if (mode == "edge") {
          src = leading ? 0 : dim - 1;
        } else if (mode == "reflect") {
          check(dim > count, r.where(n) + ": reflect padding of " + std::to_string(count) +
                                 " needs a dimension larger than that, got " + std::to_string(dim));
          src = leading ? j + 1 : dim - 2 - j;
        } else if (mode == "wrap") {
          src = leading ? ((dim - 1 - j) % dim + dim) % dim : j % dim;
        } else {
          throw Error(r.where(n) + ": mode '" + mode +
                      "' is not one of constant, reflect, edge, wrap");
        }
        parts.push_back(ag::slice(r.tape, y, axis, src, src + 1));
      }
      if (leading)
        std::reverse(parts.begin(), parts.end());
      return parts;
    };
    std::vector<ag::Var> pieces;
    const std::int64_t lead = std::max<std::int64_t>(0, before),
                       trail = std::max<std::int64_t>(0, after);
    auto constant_block = [&](std::int64_t count) {
      Shape s = y.shape();
      s[static_cast<std::size_t>(axis)] = count;
      return r.constant(Tensor::from_floats(
          s, std::vector<float>(static_cast<std::size_t>(shape_numel(s)), value), r.host));
    };
    if (lead > 0) {
      if (mode == "constant") {
        pieces.push_back(constant_block(lead));
      } else {
        check(dim > 0, r.where(n) + ": cannot pad an empty dimension in mode " + mode);
        for (ag::Var& p : border(lead, true))
          pieces.push_back(p);
      }
    }
    pieces.push_back(y);
    if (trail > 0) {
      if (mode == "constant") {
        pieces.push_back(constant_block(trail));
      } else {
        check(dim > 0, r.where(n) + ": cannot pad an empty dimension in mode " + mode);
        for (ag::Var& p : border(trail, false))
          pieces.push_back(p);
      }
    }
    if (pieces.size() > 1)
      y = ag::concat(r.tape, pieces, axis);
  }
  r.set(n, 0, y);
}

// Trilu: the upper (or lower) triangle of the last two dimensions from diagonal k on,
// zero elsewhere (where, so infinities outside the triangle become zeros too).
void trilu(Runner& r, const io::OnnxNode& n) {
  const Value& v = r.value(n, 0);
  const Shape s = r.shape_of(n, 0);
  check(s.size() >= 2, r.where(n) + ": the input needs at least 2 dimensions");
  const bool upper = r.attr_int(n, "upper", 1) != 0;
  const std::int64_t k = r.has_input(n, 1) ? r.ints(n, 1).at(0) : 0;
  const std::int64_t rows = s[s.size() - 2], cols = s.back();
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      keep[static_cast<std::size_t>(i * cols + j)] = upper ? j - i >= k : j - i <= k;
  Tensor mask = Tensor::from_host({rows, cols}, DType::u8, keep.data(), r.host);
  if (v.host.defined()) {
    r.set_host(n, 0,
               host_broadcast(
                   v.host, mask, DType::i64,
                   [](std::int64_t x, std::int64_t m) { return m != 0 ? x : 0; }, r.where(n)));
    return;
  }
  r.set(n, 0, ag::where(r.tape, mask.to(r.backend), v.var, r.scalar(0.0f)));
}

// ConstantOfShape: a tensor of the given shape filled with the `value` attribute's one
// element (0.0f when absent): floats on the device, integers on the host.
void constant_of_shape(Runner& r, const io::OnnxNode& n) {
  const std::vector<std::int64_t> dims = r.ints(n, 0);
  for (std::int64_t d : dims)
    check(d >= 0, r.where(n) + ": negative dimension in " + shape_str(dims));
  const Shape shape(dims.begin(), dims.end());
  const std::int64_t count = shape_numel(shape);
  check(count <= (std::int64_t{1} << 31),
        r.where(n) + ": shape " + shape_str(shape) + " holds more than 2^31 elements");
  auto it = n.attributes.find("value");
  if (it == n.attributes.end() || !it->second.t.defined() || it->second.t.dtype() == DType::f32) {
    const float fill =
        it == n.attributes.end() || !it->second.t.defined() ? 0.0f : it->second.t.to_floats().at(0);
    r.set(n, 0,
          r.constant(Tensor::from_floats(
              shape, std::vector<float>(static_cast<std::size_t>(count), fill), r.host)));
    return;
  }
  const std::vector<std::int64_t> one = host_values(r.host, it->second.t);
  check(!one.empty(), r.where(n) + ": the value attribute holds no element");
  r.set_host(
      n, 0,
      host_ints(r.host, shape, std::vector<std::int64_t>(static_cast<std::size_t>(count), one[0])));
}

void size(Runner& r, const io::OnnxNode& n) {
  r.set_host(n, 0, host_ints(r.host, {}, {shape_numel(r.shape_of(n, 0))}));
}

// Range(start, limit, delta): ceil((limit - start) / delta) values (none when negative).
void range(Runner& r, const io::OnnxNode& n) {
  auto scalar_of = [&](std::size_t i) -> double {
    if (is_host(r, n, i))
      return static_cast<double>(r.ints(n, i).at(0));
    return r.read_on_host(n, r.var(n, i).value()).to_floats().at(0);
  };
  const double start = scalar_of(0), limit = scalar_of(1), delta = scalar_of(2);
  check(delta != 0, r.where(n) + ": delta is 0");
  const double steps = std::ceil((limit - start) / delta);
  check(std::isfinite(steps) && steps <= double(1 << 30),
        r.where(n) + ": " + std::to_string(steps) + " values is not a size Loom can hold");
  const auto count = static_cast<std::int64_t>(std::max(0.0, steps));
  if (is_host(r, n, 0) && is_host(r, n, 1) && is_host(r, n, 2)) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      v[static_cast<std::size_t>(i)] =
          static_cast<std::int64_t>(start) + i * static_cast<std::int64_t>(delta);
    r.set_host(n, 0, host_ints(r.host, {count}, v));
    return;
  }
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)  // accumulated as the reference does: start + i delta
    v[static_cast<std::size_t>(i)] =
        static_cast<float>(start) + static_cast<float>(i) * static_cast<float>(delta);
  r.set(n, 0, r.constant(Tensor::from_floats({count}, v, r.host)));
}

// ---- activations ------------------------------------------------------------------
ag::Var negative_part(Runner& r, const ag::Var& x) {  // min(x, 0) = -relu(-x)
  return ag::scale(r.tape, ag::relu(r.tape, ag::scale(r.tape, x, -1.0)), -1.0);
}
// alpha (e^{min(x,0)/s} - 1): the negative branch of Elu, Selu, Celu.
ag::Var exp_branch(Runner& r, const ag::Var& x, double alpha, double s) {
  ag::Var e = ag::exp(r.tape, ag::scale(r.tape, negative_part(r, x), 1.0 / s));
  return ag::scale(r.tape, ag::sub(r.tape, e, r.scalar(1.0f)), alpha);
}
// clamp(alpha x + beta, 0, 1) = 1 - relu(1 - relu(alpha x + beta))
ag::Var hard_sigmoid_of(Runner& r, const ag::Var& x, double alpha, double beta) {
  ag::Var t = ag::relu(
      r.tape, ag::add(r.tape, ag::scale(r.tape, x, alpha), r.scalar(static_cast<float>(beta))));
  ag::Var one = r.scalar(1.0f);
  return ag::sub(r.tape, one, ag::relu(r.tape, ag::sub(r.tape, one, t)));
}
// softplus(x) = relu(x) + log(1 + e^{-|x|}), which does not overflow.
ag::Var softplus_of(Runner& r, const ag::Var& x) {
  ag::Var tail = ag::log(r.tape, ag::add(r.tape, r.scalar(1.0f),
                                         ag::exp(r.tape, ag::scale(r.tape, absolute(r, x), -1.0))));
  return ag::add(r.tape, ag::relu(r.tape, x), tail);
}

void leaky_relu(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const double alpha = r.attr_float(n, "alpha", 0.01);
  r.set(n, 0, ag::add(r.tape, ag::relu(r.tape, x), ag::scale(r.tape, negative_part(r, x), alpha)));
}
void prelu(Runner& r, const io::OnnxNode& n) {  // relu(x) + slope min(x, 0)
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0,
        ag::add(r.tape, ag::relu(r.tape, x), ag::mul(r.tape, negative_part(r, x), r.var(n, 1))));
}
void elu(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0,
        ag::add(r.tape, ag::relu(r.tape, x), exp_branch(r, x, r.attr_float(n, "alpha", 1.0), 1.0)));
}
void celu(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const double alpha = r.attr_float(n, "alpha", 1.0);
  r.set(n, 0, ag::add(r.tape, ag::relu(r.tape, x), exp_branch(r, x, alpha, alpha)));
}
void selu(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const double alpha = r.attr_float(n, "alpha", 1.67326319217681884765625);
  const double gamma = r.attr_float(n, "gamma", 1.05070102214813232421875);
  r.set(
      n, 0,
      ag::scale(r.tape, ag::add(r.tape, ag::relu(r.tape, x), exp_branch(r, x, alpha, 1.0)), gamma));
}
void hard_sigmoid(Runner& r, const io::OnnxNode& n) {
  r.set(
      n, 0,
      hard_sigmoid_of(r, r.var(n, 0), r.attr_float(n, "alpha", 0.2), r.attr_float(n, "beta", 0.5)));
}
void hard_swish(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0, ag::mul(r.tape, x, hard_sigmoid_of(r, x, 1.0 / 6.0, 0.5)));
}
void softplus(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, softplus_of(r, r.var(n, 0)));
}
void softsign(Runner& r, const io::OnnxNode& n) {  // x / (1 + |x|)
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0, ag::div(r.tape, x, ag::add(r.tape, r.scalar(1.0f), absolute(r, x))));
}
void mish(Runner& r, const io::OnnxNode& n) {  // x tanh(softplus(x))
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0, ag::mul(r.tape, x, ag::tanh(r.tape, softplus_of(r, x))));
}
void thresholded_relu(Runner& r, const io::OnnxNode& n) {  // x where x > alpha, else 0
  const ag::Var& x = r.var(n, 0);
  ag::Var alpha = r.scalar(static_cast<float>(r.attr_float(n, "alpha", 1.0)));
  Tensor above = compare_on_device(x.value(), alpha.value(), Comparison::gt);
  r.set(n, 0, ag::where(r.tape, above, x, r.scalar(0.0f)));
}
// Gelu: exact, 0.5 x (1 + erf(x / sqrt 2)), or the catalog's tanh form.
void gelu(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const std::string approximate =
      n.attributes.count("approximate") ? n.attributes.at("approximate").s : "none";
  if (approximate == "tanh") {
    r.set(n, 0, ag::gelu(r.tape, x));
    return;
  }
  check(approximate == "none",
        r.where(n) + ": approximate '" + approximate + "' is not none or tanh");
  ag::Var e = ag::erf(r.tape, ag::scale(r.tape, x, 1.0 / std::sqrt(2.0)));
  r.set(n, 0, ag::scale(r.tape, ag::mul(r.tape, x, ag::add(r.tape, e, r.scalar(1.0f))), 0.5));
}

}  // namespace

void add_layout_ops(OpTable& table) {
  table["Celu"] = celu;
  table["ConstantOfShape"] = constant_of_shape;
  table["Elu"] = elu;
  table["Expand"] = expand;
  table["Gelu"] = gelu;
  table["HardSigmoid"] = hard_sigmoid;
  table["HardSwish"] = hard_swish;
  table["LeakyRelu"] = leaky_relu;
  table["Mish"] = mish;
  table["Pad"] = pad;
  table["PRelu"] = prelu;
  table["Range"] = range;
  table["Selu"] = selu;
  table["Size"] = size;
  table["Softplus"] = softplus;
  table["Softsign"] = softsign;
  table["Split"] = split;
  table["Squeeze"] = squeeze;
  table["ThresholdedRelu"] = thresholded_relu;
  table["Tile"] = tile;
  table["Trilu"] = trilu;
}

}  // namespace loom::nn::onnx_import
