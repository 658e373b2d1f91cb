// onnx/conv_ops.cpp — ONNX ops of convolutional networks: Conv, pooling,
// BatchNormalization (inference form), Clip.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <span>

#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

// ---- convolutional networks --------------------------------------------------------

// All entries of an ints attribute equal to `value` (absent: true).
bool all_equal(std::span<const std::int64_t> values, std::int64_t value) {
  return std::all_of(values.begin(), values.end(), [&](std::int64_t v) { return v == value; });
}

// One stride for both spatial dimensions, as the catalog's 2-D ops take. Checked here,
// before any use: ceil_mode divides by it.
std::int64_t uniform_stride(const Runner& r, const io::OnnxNode& n) {
  std::vector<std::int64_t> v = r.attr_ints(n, "strides");
  if (v.empty())
    return 1;
  check(all_equal(v, v[0]),
        r.where(n) + ": strides " + shape_str(v) +
            " must be equal in every dimension (Loom's 2-D operators take one)");
  check(v[0] > 0, r.where(n) + ": strides " + shape_str(v) + " must be > 0");
  return v[0];
}

// Whether the catalog's 2-D ops take the node as it is: an NCHW input, no dilation, no
// auto_pad SAME_*, one stride for both dimensions (and for pools a square window, and no
// ceil mode for AveragePool). Anything else goes to the general window ops
// (window_ops.cpp).
bool fits_2d_ops(const Runner& r, const io::OnnxNode& n, bool pool) {
  if (r.var(n, 0).shape().size() != 4 || !all_equal(r.attr_ints(n, "dilations"), 1))
    return false;
  auto pad = n.attributes.find("auto_pad");
  if (pad != n.attributes.end() && pad->second.s != "NOTSET" && pad->second.s != "VALID" &&
      !pad->second.s.empty())
    return false;
  std::vector<std::int64_t> strides = r.attr_ints(n, "strides");
  if (!strides.empty() && !all_equal(strides, strides[0]))
    return false;
  if (pool) {
    std::vector<std::int64_t> kernel = r.attr_ints(n, "kernel_shape");
    if (kernel.size() != 2 || kernel[0] != kernel[1])
      return false;
    if (n.op_type == "AveragePool" && r.attr_int(n, "ceil_mode", 0) != 0)
      return false;
  }
  return true;
}

void check_no_dilation(const Runner& r, const io::OnnxNode& n) {
  auto it = n.attributes.find("auto_pad");
  check(it == n.attributes.end() || it->second.s == "NOTSET" || it->second.s == "VALID",
        r.where(n) + ": auto_pad " + (it == n.attributes.end() ? "" : it->second.s) +
            " is not supported yet");
  check(all_equal(r.attr_ints(n, "dilations"), 1),
        r.where(n) + ": dilations other than 1 are not supported yet");
}

// The largest pad accepted: far above what exported networks use (FCN's famous 100), and
// it bounds the padding blocks a file can make Loom allocate to 4096 rows or columns.
constexpr std::int64_t kMaxPad = 4096;

// ONNX pads [top, left, bottom, right] of a 2-D window op (absent: none).
std::array<std::int64_t, 4> pads_of(const Runner& r, const io::OnnxNode& n) {
  std::vector<std::int64_t> p = r.attr_ints(n, "pads");
  if (p.empty())
    return {0, 0, 0, 0};
  check(p.size() == 4, r.where(n) + ": pads " + shape_str(p) + " must have 4 entries for 2-D");
  for (std::int64_t pad : p)
    check(pad >= 0 && pad <= kMaxPad,
          r.where(n) + ": pads " + shape_str(p) + " must be in 0.." + std::to_string(kMaxPad));
  return {p[0], p[1], p[2], p[3]};
}

// x [N,C,H,W] with `pads` rows and columns of `fill` around it (concatenated constants:
// the gradient reaches x only).
ag::Var pad_spatial(Runner& r, const ag::Var& x, const std::array<std::int64_t, 4>& pads,
                    float fill) {
  ag::Var y = x;
  for (int axis : {2, 3}) {
    const std::int64_t before = pads[axis - 2], after = pads[axis];
    if (before == 0 && after == 0)
      continue;
    std::vector<ag::Var> parts;
    auto block = [&](std::int64_t size) {
      Shape s = y.shape();
      s[static_cast<std::size_t>(axis)] = size;
      std::vector<float> values(static_cast<std::size_t>(shape_numel(s)), fill);
      return r.constant(Tensor::from_floats(s, values, r.host));
    };
    if (before > 0)
      parts.push_back(block(before));
    parts.push_back(y);
    if (after > 0)
      parts.push_back(block(after));
    y = ag::concat(r.tape, parts, axis);
  }
  return y;
}

// Convolution: symmetric padding goes to conv2d itself, other padding is added first;
// groups are separate convolutions over channel slices, concatenated, except depthwise ones.
void conv(Runner& r, const io::OnnxNode& n) {
  // Depthwise convolutions (one input channel per group) take general_conv's one-product
  // form: a conv2d per channel would be C small launches forward and backward.
  const std::int64_t group = r.attr_int(n, "group", 1);
  if (!fits_2d_ops(r, n, false) ||
      (group > 1 && r.var(n, 1).shape().size() == 4 && r.var(n, 1).dim(1) == 1))
    return general_conv(r, n);
  ag::Var x = r.var(n, 0);
  const ag::Var& w = r.var(n, 1);
  check(x.shape().size() == 4, r.where(n) + ": only 2-D convolution (NCHW input) is supported yet");
  check_no_dilation(r, n);
  const std::int64_t stride = uniform_stride(r, n), groups = r.attr_int(n, "group", 1);
  std::array<std::int64_t, 4> pads = pads_of(r, n);
  std::int64_t padding = 0;
  if (all_equal(pads, pads[0]))
    padding = pads[0];
  else
    x = pad_spatial(r, x, pads, 0.0f);
  const std::int64_t out_channels = w.dim(0);
  ag::Var bias =
      r.has_input(n, 2)
          ? r.var(n, 2)
          : r.constant(Tensor::from_floats(
                {out_channels}, std::vector<float>(static_cast<std::size_t>(out_channels), 0.0f),
                r.host));
  check(groups >= 1 && x.dim(1) % groups == 0 && out_channels % groups == 0 &&
            x.dim(1) / groups == w.dim(1),
        r.where(n) + ": group " + std::to_string(groups) + " does not divide the channels of " +
            x.value().describe() + " and " + w.value().describe());
  if (groups == 1) {
    r.set(n, 0, ag::conv2d(r.tape, x, w, bias, stride, padding));
    return;
  }
  const std::int64_t in_per = x.dim(1) / groups, out_per = out_channels / groups;
  std::vector<ag::Var> outputs;
  for (std::int64_t g = 0; g < groups; ++g) {
    ag::Var xg = ag::slice(r.tape, x, 1, g * in_per, (g + 1) * in_per);
    ag::Var wg = ag::slice(r.tape, w, 0, g * out_per, (g + 1) * out_per);
    ag::Var bg = ag::slice(r.tape, bias, 0, g * out_per, (g + 1) * out_per);
    outputs.push_back(ag::conv2d(r.tape, xg, wg, bg, stride, padding));
  }
  r.set(n, 0, ag::concat(r.tape, outputs, 1));
}

// A square window and one stride, as max_pool2d and avg_pool2d take.
std::pair<std::int64_t, std::int64_t> pool_window(const Runner& r, const io::OnnxNode& n) {
  check(r.var(n, 0).shape().size() == 4,
        r.where(n) + ": only 2-D pooling (NCHW input) is supported yet");
  check_no_dilation(r, n);
  std::vector<std::int64_t> kernel = r.attr_ints(n, "kernel_shape");
  check(kernel.size() == 2 && kernel[0] == kernel[1],
        r.where(n) + ": kernel_shape " + shape_str(kernel) + " must be square");
  check(kernel[0] > 0, r.where(n) + ": kernel_shape " + shape_str(kernel) + " must be > 0");
  return {kernel[0], uniform_stride(r, n)};
}

// ceil_mode: windows that start inside the (padded) input but run past its end count too;
// the extra end rows and columns this needs.
std::array<std::int64_t, 4> with_ceil(const Runner& r, const io::OnnxNode& n, const ag::Var& x,
                                      std::array<std::int64_t, 4> pads, std::int64_t kernel,
                                      std::int64_t stride) {
  if (r.attr_int(n, "ceil_mode", 0) == 0)
    return pads;
  for (int axis : {2, 3}) {
    const std::int64_t size = x.dim(axis) + pads[axis - 2] + pads[axis];
    std::int64_t out = (size - kernel + stride - 1) / stride + 1;
    if ((out - 1) * stride >= x.dim(axis) + pads[axis - 2])
      --out;  // a window may not start in the end padding
    pads[axis] += std::max<std::int64_t>(0, (out - 1) * stride + kernel - size);
  }
  return pads;
}

void max_pool(Runner& r, const io::OnnxNode& n) {
  check(n.outputs.size() < 2 || n.outputs[1].empty(),
        r.where(n) + ": the Indices output is not supported yet");
  check(r.attr_int(n, "storage_order", 0) == 0,
        r.where(n) + ": storage_order 1 is not supported yet");
  if (!fits_2d_ops(r, n, true))
    return general_pool(r, n);
  auto [kernel, stride] = pool_window(r, n);
  const ag::Var& x = r.var(n, 0);
  std::array<std::int64_t, 4> pads = with_ceil(r, n, x, pads_of(r, n), kernel, stride);
  ag::Var padded = pad_spatial(r, x, pads, -std::numeric_limits<float>::infinity());
  r.set(n, 0, ag::max_pool2d(r.tape, padded, kernel, stride));
}

// Padding counts as zeros (count_include_pad = 1), or the sum is divided by the number of
// real elements in each window: avg(x padded with 0) / avg(ones padded with 0).
void average_pool(Runner& r, const io::OnnxNode& n) {
  if (!fits_2d_ops(r, n, true))
    return general_pool(r, n);
  auto [kernel, stride] = pool_window(r, n);
  const ag::Var& x = r.var(n, 0);
  std::array<std::int64_t, 4> pads = pads_of(r, n);
  ag::Var y = ag::avg_pool2d(r.tape, pad_spatial(r, x, pads, 0.0f), kernel, stride);
  if (r.attr_int(n, "count_include_pad", 0) == 0 && !all_equal(pads, 0)) {
    Shape plane{1, 1, x.dim(2), x.dim(3)};
    ag::Var ones = r.constant(Tensor::from_floats(
        plane, std::vector<float>(static_cast<std::size_t>(shape_numel(plane)), 1.0f), r.host));
    y = ag::div(r.tape, y,
                ag::avg_pool2d(r.tape, pad_spatial(r, ones, pads, 0.0f), kernel, stride));
  }
  r.set(n, 0, y);
}

void global_average_pool(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  std::vector<std::int64_t> spatial;
  for (std::size_t d = 2; d < x.shape().size(); ++d)
    spatial.push_back(static_cast<std::int64_t>(d));
  r.set(n, 0, ag::mean(r.tape, x, spatial, true));
}

// y = (x - mean) / sqrt(var + eps) * scale + bias, per channel (axis 1). Inference form:
// mean and var are the inputs (running statistics). Training form (training_mode = 1):
// the batch's own, over every axis but the channel (var biased), and the outputs 1 and 2
// are the updated running statistics: input * momentum + batch's * (1 - momentum).
void batch_normalization(Runner& r, const io::OnnxNode& n) {
  const bool training = r.attr_int(n, "training_mode", 0) != 0;
  check(training || n.outputs.size() < 2 ||
            std::all_of(n.outputs.begin() + 1, n.outputs.end(),
                        [](const auto& o) { return o.empty(); }),
        r.where(n) + ": the running statistics are outputs only in training mode");
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  check(rank >= 2, r.where(n) + ": the input needs a channel axis");
  Shape per_channel{x.dim(1)};
  for (int d = 2; d < rank; ++d)
    per_channel.push_back(1);  // [C,1,1]: broadcasts over N and the spatial axes
  auto channel = [&](std::size_t i) { return ag::reshape(r.tape, r.var(n, i), per_channel); };
  const double eps = r.attr_float(n, "epsilon", 1e-5);
  ag::Var mean = channel(3), var = channel(4);
  if (training) {
    std::vector<std::int64_t> axes{0};
    for (int d = 2; d < rank; ++d)
      axes.push_back(d);
    mean = ag::reshape(r.tape, ag::mean(r.tape, x, axes, true), per_channel);
    ag::Var centred = ag::sub(r.tape, x, mean);
    var = ag::reshape(r.tape, ag::mean(r.tape, ag::mul(r.tape, centred, centred), axes, true),
                      per_channel);
    const double momentum = r.attr_float(n, "momentum", 0.9);
    for (std::size_t out = 1; out <= 2 && out < n.outputs.size(); ++out) {
      if (n.outputs[out].empty())
        continue;
      ag::Var batch = ag::reshape(r.tape, out == 1 ? mean : var, {x.dim(1)});
      r.set(n, out,
            ag::add(r.tape, ag::scale(r.tape, r.var(n, 2 + out), momentum),
                    ag::scale(r.tape, batch, 1.0 - momentum)));
    }
  }
  ag::Var rstd = ag::sqrt(r.tape, ag::add(r.tape, var, r.scalar(static_cast<float>(eps))));
  ag::Var normed = ag::div(r.tape, ag::sub(r.tape, x, mean), rstd);
  r.set(n, 0, ag::add(r.tape, ag::mul(r.tape, normed, channel(1)), channel(2)));
}

// clip(x, lo, hi) = min(max(x, lo), hi) with max(x, lo) = lo + relu(x - lo) and
// min(y, hi) = y - relu(y - hi): relus, so it stays differentiable with the catalog's ops
// (within an ulp of the exact value).
void clip(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  auto bound = [&](std::size_t input, const char* attr) -> std::optional<ag::Var> {
    if (r.has_input(n, input))
      return r.var(n, input);
    if (n.attributes.count(attr))
      return r.constant(Tensor::from_floats(
          {}, std::vector<float>{static_cast<float>(r.attr_float(n, attr, 0))}, r.host));
    return std::nullopt;
  };
  std::optional<ag::Var> lo = bound(1, "min"), hi = bound(2, "max");
  ag::Var y = x;
  if (lo)
    y = ag::add(r.tape, *lo, ag::relu(r.tape, ag::sub(r.tape, x, *lo)));
  if (hi)  // of the clipped-below value: min(max(x, lo), hi) = hi when lo > hi, as numpy
    y = ag::sub(r.tape, y, ag::relu(r.tape, ag::sub(r.tape, y, *hi)));
  r.set(n, 0, y);
}

}  // namespace

void add_conv_ops(OpTable& table) {
  table["AveragePool"] = average_pool;
  table["BatchNormalization"] = batch_normalization;
  table["Clip"] = clip;
  table["Conv"] = conv;
  table["GlobalAveragePool"] = global_average_pool;
  table["MaxPool"] = max_pool;
}

}  // namespace loom::nn::onnx_import
