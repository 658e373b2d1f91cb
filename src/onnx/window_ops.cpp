// onnx/window_ops.cpp — convolution and pooling of any rank (1-D, 2-D, 3-D, ...) with
// any strides, dilations, padding (auto_pad too) and ceil mode, and ConvTranspose and
// LpPool: what the catalog's conv2d and square 2-D pools do not cover.
//
// Every such op is a window gather and a reduction. The gather builds, for each output
// position and kernel offset, the input element it reads (or a fill value outside the
// input): cols [N, C, out..., K] with K the kernel's size, taken by one embedding lookup
// of x at linear positions, so its gradient scatters back to x. A convolution is then one
// product of cols with the weights; a pool a max, mean or p-norm over K.
#include <cmath>
#include <limits>
#include <numeric>

#include "core/checked.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

struct Geometry {
  std::vector<std::int64_t> in, out, kernel, strides, dilations, begin, end;
  std::size_t dims() const { return in.size(); }
};

std::vector<std::int64_t> ints_or(const Runner& r, const io::OnnxNode& n, const char* name,
                                  std::size_t count, std::int64_t fallback) {
  std::vector<std::int64_t> v = r.attr_ints(n, name);
  if (v.empty())
    v.assign(count, fallback);
  check(v.size() == count, r.where(n) + ": " + name + " " + shape_str(v) + " must have " +
                               std::to_string(count) + " entries");
  return v;
}

std::string auto_pad_of(const io::OnnxNode& n) {
  auto it = n.attributes.find("auto_pad");
  return it == n.attributes.end() || it->second.s.empty() ? "NOTSET" : it->second.s;
}

// The geometry of a convolution or pool over x [N, C, spatial...] with `kernel`.
Geometry window_geometry(const Runner& r, const io::OnnxNode& n, const Shape& x,
                         const std::vector<std::int64_t>& kernel, bool ceil_mode) {
  Geometry g;
  const std::size_t d = x.size() - 2;
  check(kernel.size() == d, r.where(n) + ": kernel " + shape_str(kernel) + " for a " +
                                std::to_string(d) + "-D input " + shape_str(x));
  g.in.assign(x.begin() + 2, x.end());
  g.kernel = kernel;
  g.strides = ints_or(r, n, "strides", d, 1);
  g.dilations = ints_or(r, n, "dilations", d, 1);
  for (std::size_t i = 0; i < d; ++i)
    check(g.kernel[i] > 0 && g.strides[i] > 0 && g.dilations[i] > 0,
          r.where(n) + ": kernel, strides and dilations must be positive");
  std::vector<std::int64_t> pads = ints_or(r, n, "pads", 2 * d, 0);
  const std::string auto_pad = auto_pad_of(n);
  for (std::size_t i = 0; i < d; ++i) {
    const std::int64_t span = (g.kernel[i] - 1) * g.dilations[i] + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const std::int64_t out = (g.in[i] + g.strides[i] - 1) / g.strides[i];
      const std::int64_t total =
          std::max<std::int64_t>(0, (out - 1) * g.strides[i] + span - g.in[i]);
      const std::int64_t small = total / 2, large = total - small;
      g.begin.push_back(auto_pad == "SAME_UPPER" ? small : large);
      g.end.push_back(auto_pad == "SAME_UPPER" ? large : small);
    } else {
      check(auto_pad == "NOTSET" || auto_pad == "VALID",
            r.where(n) + ": auto_pad '" + auto_pad +
                "' is not NOTSET, VALID, SAME_UPPER or SAME_LOWER");
      const bool valid = auto_pad == "VALID";
      g.begin.push_back(valid ? 0 : pads[i]);
      g.end.push_back(valid ? 0 : pads[d + i]);
      check(g.begin.back() >= 0 && g.end.back() >= 0 && g.begin.back() <= 4096 &&
                g.end.back() <= 4096,
            r.where(n) + ": pads " + shape_str(pads) + " must be in 0..4096");
    }
    const std::int64_t room = g.in[i] + g.begin[i] + g.end[i] - span;
    check(room >= 0, r.where(n) + ": the window " + shape_str(g.kernel) +
                         " does not fit the padded input " + shape_str(x));
    std::int64_t out = room / g.strides[i] + 1;
    if (ceil_mode) {
      out = (room + g.strides[i] - 1) / g.strides[i] + 1;
      if ((out - 1) * g.strides[i] >= g.in[i] + g.begin[i])
        --out;  // a window may not start in the end padding
    }
    g.out.push_back(out);
  }
  return g;
}

// cols [N, C, out..., K]: element (o, k) of each (n, c) plane is x at the source position
// `source(i, o_i, k_i)` in every spatial dimension i, or `fill` where a source is -1.
template <class Source>
ag::Var gather_windows(Runner& r, const ag::Var& x, const Geometry& g, float fill, Source source) {
  const Shape& s = x.shape();
  const std::int64_t planes = s[0] * s[1];
  const std::int64_t in_size = shape_numel(g.in), out_size = shape_numel(g.out),
                     k_size = shape_numel(g.kernel);
  const std::int64_t total =
      checked_mul(checked_mul(planes, out_size, "window gather"), k_size, "window gather");
  check(total < (std::int64_t{1} << 31) && shape_numel(s) < (std::int64_t{1} << 31),
        "window gather: " + std::to_string(total) + " elements exceed 2^31");
  const auto fill_index = static_cast<std::int32_t>(shape_numel(s));  // one past x
  // The source offset within a plane (or -1) for each (out, kernel) pair, then per plane.
  std::vector<std::int32_t> within(static_cast<std::size_t>(out_size * k_size));
  std::vector<std::int64_t> o(g.dims(), 0), k(g.dims(), 0);
  for (std::int64_t oi = 0; oi < out_size; ++oi) {
    for (std::int64_t rem = oi, i = static_cast<std::int64_t>(g.dims()) - 1; i >= 0; --i) {
      o[static_cast<std::size_t>(i)] = rem % g.out[static_cast<std::size_t>(i)];
      rem /= g.out[static_cast<std::size_t>(i)];
    }
    for (std::int64_t ki = 0; ki < k_size; ++ki) {
      for (std::int64_t rem = ki, i = static_cast<std::int64_t>(g.dims()) - 1; i >= 0; --i) {
        k[static_cast<std::size_t>(i)] = rem % g.kernel[static_cast<std::size_t>(i)];
        rem /= g.kernel[static_cast<std::size_t>(i)];
      }
      std::int64_t offset = 0;
      for (std::size_t i = 0; i < g.dims() && offset >= 0; ++i) {
        const std::int64_t at = source(i, o[i], k[i]);
        offset = at < 0 || at >= g.in[i] ? -1 : offset * g.in[i] + at;
      }
      within[static_cast<std::size_t>(oi * k_size + ki)] = static_cast<std::int32_t>(offset);
    }
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(total));
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::size_t e = 0; e < within.size(); ++e)
      ids[static_cast<std::size_t>(p) * within.size() + e] =
          within[e] < 0 ? fill_index : static_cast<std::int32_t>(p * in_size + within[e]);
  ag::Var column =
      ag::concat(r.tape,
                 {ag::reshape(r.tape, x, {shape_numel(s), 1}),
                  r.constant(Tensor::from_floats({1, 1}, std::vector<float>{fill}, r.host))},
                 0);
  Tensor id_tensor = Tensor::from_ints({total}, ids, r.host).to(r.backend);
  Shape cols{s[0], s[1]};
  cols.insert(cols.end(), g.out.begin(), g.out.end());
  cols.push_back(k_size);
  return ag::reshape(r.tape, ag::embedding(r.tape, column, id_tensor), cols);
}

// The windows of a convolution or pool: source = o s + k d - begin.
ag::Var forward_windows(Runner& r, const ag::Var& x, const Geometry& g, float fill) {
  return gather_windows(r, x, g, fill, [&](std::size_t i, std::int64_t o, std::int64_t k) {
    return o * g.strides[i] + k * g.dilations[i] - g.begin[i];
  });
}

// y[n, m, out...] = sum over (c, k) of cols[n, c, out..., k] w[m or c, ...]: `weights` is
// [rows = C/groups * K, M/groups] for each group, from `group_weight(g)`.
template <class GroupWeight>
ag::Var windows_times_weights(Runner& r, const ag::Var& cols, std::int64_t groups,
                              std::int64_t out_channels, GroupWeight group_weight) {
  const Shape& s = cols.shape();
  const int rank = static_cast<int>(s.size());
  const std::int64_t batch = s[0], channels = s[1], k_size = s.back();
  const std::int64_t out_size = shape_numel(Shape(s.begin() + 2, s.end() - 1));
  // [N, C, out..., K] -> [N, out..., C, K]
  std::vector<int> order{0};
  for (int d = 2; d < rank - 1; ++d)
    order.push_back(d);
  order.push_back(1);
  order.push_back(rank - 1);
  ag::Var moved = ag::permute(r.tape, cols, order);
  const std::int64_t per = channels / groups;
  std::vector<ag::Var> parts;
  for (std::int64_t gi = 0; gi < groups; ++gi) {
    ag::Var part =
        groups == 1 ? moved : ag::slice(r.tape, moved, rank - 2, gi * per, (gi + 1) * per);
    part = ag::reshape(r.tape, part, {batch * out_size, per * k_size});
    parts.push_back(ag::matmul(r.tape, part, group_weight(gi)));
  }
  ag::Var y = parts.size() == 1 ? parts[0] : ag::concat(r.tape, parts, 1);
  Shape spatial(s.begin() + 2, s.end() - 1);
  Shape shaped{batch};
  shaped.insert(shaped.end(), spatial.begin(), spatial.end());
  shaped.push_back(out_channels);
  std::vector<int> back{0, rank - 2};
  for (int d = 1; d < rank - 2; ++d)
    back.push_back(d);
  return ag::permute(r.tape, ag::reshape(r.tape, y, shaped), back);
}

ag::Var add_channel_bias(Runner& r, const io::OnnxNode& n, const ag::Var& y) {
  if (!r.has_input(n, 2))
    return y;
  Shape per_channel(y.shape().size() - 1, 1);
  per_channel[0] = y.dim(1);
  return ag::add(r.tape, y, ag::reshape(r.tape, r.var(n, 2), per_channel));
}

}  // namespace

void general_conv(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const ag::Var& w = r.var(n, 1);
  check(x.shape().size() >= 3 && w.shape().size() == x.shape().size(),
        r.where(n) + ": input " + shape_str(x.shape()) + " and weight " + shape_str(w.shape()) +
            " must be [N, C, ...] and [M, C/group, ...]");
  const std::int64_t groups = r.attr_int(n, "group", 1), out_channels = w.dim(0);
  check(groups >= 1 && x.dim(1) % groups == 0 && out_channels % groups == 0 &&
            x.dim(1) / groups == w.dim(1),
        r.where(n) + ": group " + std::to_string(groups) + " does not divide the channels of " +
            shape_str(x.shape()) + " and " + shape_str(w.shape()));
  std::vector<std::int64_t> kernel(w.shape().begin() + 2, w.shape().end());
  const Geometry g = window_geometry(r, n, x.shape(), kernel, false);
  ag::Var cols = forward_windows(r, x, g, 0.0f);
  const std::int64_t per_out = out_channels / groups, rows = w.dim(1) * shape_numel(kernel);
  if (groups > 1 && w.dim(1) == 1) {
    // Depthwise (one input channel per group, MobileNet's 3x3 layers), as one product and
    // one row sum instead of a product per channel: y[n, c m' + j, o] = sum over k of
    // cols[n, c, o, k] w[c m' + j, 0, k], with m' = M / C outputs per channel. The windows
    // are laid out [N O, C m' K] so the weights broadcast along rows and the sum runs over
    // the last axis: the forms the device backends run natively, forward and backward.
    const std::int64_t batch = x.dim(0), channels = x.dim(1), k_size = shape_numel(kernel);
    const std::int64_t out_size = shape_numel(g.out);
    const int rank = static_cast<int>(cols.shape().size());
    std::vector<int> order{0};  // [N, C, out..., K] -> [N, out..., C, K]
    for (int d = 2; d < rank - 1; ++d)
      order.push_back(d);
    order.push_back(1);
    order.push_back(rank - 1);
    ag::Var windows = ag::reshape(r.tape, ag::permute(r.tape, cols, order),
                                  {batch * out_size, channels, 1, k_size});
    if (per_out > 1)
      windows = ag::expand(r.tape, windows, {batch * out_size, channels, per_out, k_size});
    windows = ag::reshape(r.tape, windows, {batch * out_size, out_channels * k_size});
    ag::Var product = ag::mul(r.tape, windows, ag::reshape(r.tape, w, {out_channels * k_size}));
    ag::Var y = ag::sum(
        r.tape, ag::reshape(r.tape, product, {batch * out_size * out_channels, k_size}), {1});
    if (r.has_input(n, 2))  // the bias along rows too: [N O, M] + [M]
      y = ag::add(r.tape, ag::reshape(r.tape, y, {batch * out_size, out_channels}), r.var(n, 2));
    Shape shaped{batch};  // [N, out..., M] -> [N, M, out...]
    shaped.insert(shaped.end(), g.out.begin(), g.out.end());
    shaped.push_back(out_channels);
    std::vector<int> back{0, rank - 2};
    for (int d = 1; d < rank - 2; ++d)
      back.push_back(d);
    r.set(n, 0, ag::permute(r.tape, ag::reshape(r.tape, y, shaped), back));
    return;
  }
  ag::Var flat_w = ag::reshape(r.tape, w, {out_channels, rows});  // [M, C/g * K]
  ag::Var y = windows_times_weights(r, cols, groups, out_channels, [&](std::int64_t gi) {
    ag::Var wg =
        groups == 1 ? flat_w : ag::slice(r.tape, flat_w, 0, gi * per_out, (gi + 1) * per_out);
    return ag::permute(r.tape, wg, {1, 0});
  });
  r.set(n, 0, add_channel_bias(r, n, y));
}

// ConvTranspose: y[o] = sum of x[i] w[k] over o = i s + k d - begin; the gather reads, for
// each output and kernel offset, i = (o + begin - k d) / s where that divides.
void conv_transpose(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const ag::Var& w = r.var(n, 1);  // [C, M/group, k...]
  check(x.shape().size() >= 3 && w.shape().size() == x.shape().size(),
        r.where(n) + ": input and weight must be [N, C, ...] and [C, M/group, ...]");
  const std::size_t d = x.shape().size() - 2;
  const std::int64_t groups = r.attr_int(n, "group", 1), channels = x.dim(1);
  check(groups >= 1 && channels % groups == 0 && w.dim(0) == channels,
        r.where(n) + ": group " + std::to_string(groups) + " does not fit " + shape_str(x.shape()) +
            " and " + shape_str(w.shape()));
  Geometry g;
  g.in.assign(x.shape().begin() + 2, x.shape().end());
  g.kernel.assign(w.shape().begin() + 2, w.shape().end());
  g.strides = ints_or(r, n, "strides", d, 1);
  g.dilations = ints_or(r, n, "dilations", d, 1);
  const std::vector<std::int64_t> extra = ints_or(r, n, "output_padding", d, 0);
  std::vector<std::int64_t> pads = ints_or(r, n, "pads", 2 * d, 0);
  const std::vector<std::int64_t> wanted = r.attr_ints(n, "output_shape");
  const std::string auto_pad = auto_pad_of(n);
  for (std::size_t i = 0; i < d; ++i) {
    const std::int64_t full =
        g.strides[i] * (g.in[i] - 1) + extra[i] + (g.kernel[i] - 1) * g.dilations[i] + 1;
    // As the reference: auto_pad SAME_* pads to reach output_shape (or in * stride);
    // otherwise the pads are given and output_shape, when given, crops or extends the end.
    const std::int64_t target = !wanted.empty() ? wanted.at(wanted.size() - d + i) : -1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const std::int64_t goal = target >= 0 ? target : g.in[i] * g.strides[i];
      const std::int64_t total = full - goal;
      g.begin.push_back(auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2);
      g.end.push_back(total - g.begin.back());
      g.out.push_back(goal);
    } else {
      g.begin.push_back(auto_pad == "VALID" ? 0 : pads[i]);
      g.end.push_back(auto_pad == "VALID" ? 0 : pads[d + i]);
      g.out.push_back(target >= 0 ? target : full - g.begin[i] - g.end[i]);
    }
    check(g.out.back() >= 0, r.where(n) + ": the pads leave no output");
  }
  ag::Var cols = gather_windows(r, x, g, 0.0f,
                                [&](std::size_t i, std::int64_t o, std::int64_t k) -> std::int64_t {
                                  const std::int64_t t = o + g.begin[i] - k * g.dilations[i];
                                  return t < 0 || t % g.strides[i] != 0 ? -1 : t / g.strides[i];
                                });
  const std::int64_t per_in = channels / groups, per_out = w.dim(1), k_size = shape_numel(g.kernel);
  // w [C, M/g, K] -> per group [C/g * K, M/g]
  ag::Var w3 = ag::permute(r.tape, ag::reshape(r.tape, w, {channels, per_out, k_size}), {0, 2, 1});
  ag::Var y = windows_times_weights(r, cols, groups, per_out * groups, [&](std::int64_t gi) {
    ag::Var wg = groups == 1 ? w3 : ag::slice(r.tape, w3, 0, gi * per_in, (gi + 1) * per_in);
    return ag::reshape(r.tape, wg, {per_in * k_size, per_out});
  });
  r.set(n, 0, add_channel_bias(r, n, y));
}

// Pools of any rank: max (fill -inf), average (padding counted or not; the ceil-mode
// extension never counts), and LpPool.
void general_pool(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  check(x.shape().size() >= 3, r.where(n) + ": the input must be [N, C, spatial...]");
  const bool is_max = n.op_type == "MaxPool", is_lp = n.op_type == "LpPool";
  const Geometry g = window_geometry(r, n, x.shape(), r.attr_ints(n, "kernel_shape"),
                                     r.attr_int(n, "ceil_mode", 0) != 0);
  const float fill = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
  ag::Var cols = forward_windows(r, x, g, fill);
  const int last = static_cast<int>(cols.shape().size()) - 1;
  if (is_max) {
    r.set(n, 0, ag::max(r.tape, cols, last, false));
    return;
  }
  if (is_lp) {
    const std::int64_t p = r.attr_int(n, "p", 2);
    check(p >= 1 && p <= 16, r.where(n) + ": p " + std::to_string(p) + " is not in 1..16");
    ag::Var a = absolute(r, cols);
    ag::Var power = a;
    for (std::int64_t k = 1; k < p; ++k)
      power = ag::mul(r.tape, power, a);
    ag::Var total = ag::sum(r.tape, power, {last}, false);
    r.set(n, 0,
          p == 1   ? total
          : p == 2 ? ag::sqrt(r.tape, total)
                   : ag::exp(r.tape, ag::scale(r.tape, ag::log(r.tape, total),
                                               1.0 / static_cast<double>(p))));
    return;
  }
  // Average: divide each window's sum by how many of its elements count.
  const bool include_pad = r.attr_int(n, "count_include_pad", 0) != 0;
  const std::int64_t out_size = shape_numel(g.out), k_size = shape_numel(g.kernel);
  const std::vector<std::int64_t> pads = ints_or(r, n, "pads", 2 * g.dims(), 0);
  const bool explicit_pads = auto_pad_of(n) == "NOTSET";
  std::vector<float> counts(static_cast<std::size_t>(out_size), 0.0f);
  std::vector<std::int64_t> o(g.dims()), k(g.dims());
  for (std::int64_t oi = 0; oi < out_size; ++oi) {
    for (std::int64_t rem = oi, i = static_cast<std::int64_t>(g.dims()) - 1; i >= 0; --i) {
      o[static_cast<std::size_t>(i)] = rem % g.out[static_cast<std::size_t>(i)];
      rem /= g.out[static_cast<std::size_t>(i)];
    }
    for (std::int64_t ki = 0; ki < k_size; ++ki) {
      bool counts_here = true;
      for (std::int64_t rem = ki, i = static_cast<std::int64_t>(g.dims()) - 1; i >= 0; --i) {
        const auto u = static_cast<std::size_t>(i);
        const std::int64_t kk = rem % g.kernel[u];
        rem /= g.kernel[u];
        const std::int64_t at = o[u] * g.strides[u] + kk * g.dilations[u] - g.begin[u];
        // With count_include_pad the given padding counts, the ceil extension does not.
        const std::int64_t lo = include_pad ? -g.begin[u] : 0;
        const std::int64_t hi =
            include_pad ? g.in[u] + (explicit_pads ? pads[g.dims() + u] : g.end[u]) : g.in[u];
        counts_here = counts_here && at >= lo && at < hi;
      }
      counts[static_cast<std::size_t>(oi)] += counts_here ? 1.0f : 0.0f;
    }
  }
  Shape count_shape(g.out.begin(), g.out.end());
  r.set(n, 0,
        ag::div(r.tape, ag::sum(r.tape, cols, {last}, false),
                r.constant(Tensor::from_floats(count_shape, counts, r.host))));
}

void add_window_ops(OpTable& table) {
  table["ConvTranspose"] = conv_transpose;
  table["LpPool"] = general_pool;
}

}  // namespace loom::nn::onnx_import
