// onnx/resize_ops.cpp — ONNX Resize (nearest, linear and cubic, every coordinate
// transformation, antialiasing, axes, aspect-ratio policies), CumSum, CumProd, BitShift
// and LpNormalization.
//
// Resize is separable and linear in its input: along each resized axis, output position o
// is sum_i W[o, i] x[i], with W built on the host from the interpolation's coefficients
// (neighbours beyond the edge clamped to it, as the reference pads by repeating the edge).
// So each axis is one product with W^T on the device, differentiable like any matmul.
#include <cmath>
#include <numeric>
#include <optional>

#include "core/checked.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

struct ResizeRule {
  std::string mode, coordinates, nearest;
  double cubic_a = -0.75;
  bool antialias = false, exclude_outside = false;
  double extrapolation = 0.0;
};

// The coefficients of the neighbours of a source position whose fraction is `ratio`
// (in (0, 1]; 1 at an exact integer), for a scale `scale`.
std::vector<double> coefficients(const ResizeRule& rule, double ratio, double scale) {
  if (rule.mode == "nearest") {
    if (ratio == 1.0)
      return {0, 1};
    if (rule.nearest == "round_prefer_ceil")
      return {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
    if (rule.nearest == "floor")
      return {1, 0};
    if (rule.nearest == "ceil")
      return {0, 1};
    return {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};  // round_prefer_floor
  }
  const double a = rule.cubic_a;
  if (rule.mode == "linear" && !rule.antialias)
    return {1 - ratio, ratio};
  if (rule.mode == "cubic" && !rule.antialias) {
    const double r = ratio, s = 1 - ratio;
    return {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1, ((a + 2) * s - (a + 3)) * s * s + 1,
            ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a};
  }
  // Antialiasing widens the kernel by 1 / scale when downsampling.
  const double sc = std::min(scale, 1.0);
  std::vector<double> c;
  if (rule.mode == "linear") {
    const auto start = static_cast<std::int64_t>(std::floor(-1 / sc) + 1);
    for (std::int64_t i = start; i < start + 2 - 2 * start; ++i)
      c.push_back(std::clamp(1 - std::fabs((static_cast<double>(i) - ratio) * sc), 0.0, 1.0));
  } else {
    const auto start = static_cast<std::int64_t>(std::floor(-2 / sc) + 1);
    for (std::int64_t i = start; i < 2 - start; ++i) {
      const double x = std::fabs(sc * (static_cast<double>(i) - ratio));
      c.push_back(x <= 1  ? ((a + 2) * x - (a + 3)) * x * x + 1
                  : x < 2 ? ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
                          : 0.0);
    }
  }
  const double total = std::accumulate(c.begin(), c.end(), 0.0);
  for (double& v : c)
    v /= total;
  return c;
}

// W [out, in] for one axis, and the rows that are extrapolated (tf_crop_and_resize).
std::vector<double> resize_matrix(const ResizeRule& rule, std::int64_t in, std::int64_t out,
                                  double scale, std::optional<std::pair<double, double>> roi,
                                  std::vector<bool>& extrapolated, const std::string& where) {
  std::vector<double> w(static_cast<std::size_t>(out * in), 0.0);
  extrapolated.assign(static_cast<std::size_t>(out), false);
  const double out_width = scale * static_cast<double>(in);
  for (std::int64_t o = 0; o < out; ++o) {
    const double y = static_cast<double>(o);
    double x = 0;
    const std::string& m = rule.coordinates;
    if (m == "align_corners") {
      x = out_width == 1 ? 0.0 : y * static_cast<double>(in - 1) / (out_width - 1);
    } else if (m == "asymmetric") {
      x = y / scale;
    } else if (m == "tf_crop_and_resize") {
      check(roi.has_value(), where + ": tf_crop_and_resize needs a roi");
      const auto [lo, hi] = *roi;
      x = out_width == 1 ? (hi - lo) * static_cast<double>(in - 1) / 2
                         : y * (hi - lo) * static_cast<double>(in - 1) / (out_width - 1);
      x += lo * static_cast<double>(in - 1);
      if (x < 0 || x > static_cast<double>(in - 1)) {
        extrapolated[static_cast<std::size_t>(o)] = true;
        continue;
      }
    } else if (m == "pytorch_half_pixel") {
      x = out_width == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
    } else if (m == "half_pixel") {
      x = (y + 0.5) / scale - 0.5;
    } else if (m == "half_pixel_symmetric") {
      const double adjustment = static_cast<double>(out) / out_width;
      const double offset = static_cast<double>(in) / 2 * (1 - adjustment);
      x = offset + (y + 0.5) / scale - 0.5;
    } else {
      throw Error(where + ": coordinate_transformation_mode '" + m + "' is unknown");
    }
    const double x_floor = std::floor(x);
    const double ratio = x == x_floor ? 1.0 : x - x_floor;
    std::vector<double> c = coefficients(rule, ratio, scale);
    const auto n = static_cast<std::int64_t>(c.size());
    // The n neighbours nearest x (ties to the smaller index), as the reference picks them.
    const auto pad = (n + 1) / 2;
    const double xp = x + static_cast<double>(pad);
    const double pp = std::floor(xp), frac = xp - pp;
    const std::int64_t offset = n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1)
                                           : (frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1);
    const std::int64_t start = static_cast<std::int64_t>(pp) + offset - pad;
    if (rule.exclude_outside) {
      double total = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        if (start + j < 0 || start + j >= in)
          c[static_cast<std::size_t>(j)] = 0;
        total += c[static_cast<std::size_t>(j)];
      }
      for (double& v : c)
        v /= total == 0 ? 1.0 : total;
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t i = std::clamp<std::int64_t>(start + j, 0, in - 1);
      w[static_cast<std::size_t>(o * in + i)] += c[static_cast<std::size_t>(j)];
    }
  }
  return w;
}

// x [..., K] times m [K, N], for any rank of x (a vector as one row).
ag::Var times_last(Runner& r, const ag::Var& x, const ag::Var& m) {
  if (x.shape().size() >= 2)
    return ag::matmul(r.tape, x, m);
  ag::Var row = ag::matmul(r.tape, ag::reshape(r.tape, x, {1, x.dim(0)}), m);
  return ag::reshape(r.tape, row, {m.dim(1)});
}

// Floats of a small constant input (scales, roi), read on the host.
std::vector<double> constant_floats(Runner& r, const io::OnnxNode& n, std::size_t i) {
  if (!r.has_input(n, i))
    return {};
  if (is_host(r, n, i)) {
    std::vector<std::int64_t> v = r.ints(n, i);
    return {v.begin(), v.end()};
  }
  std::vector<float> v = r.input_on_host(n, i).to_floats();
  return {v.begin(), v.end()};
}

void resize(Runner& r, const io::OnnxNode& n) {
  ag::Var y = r.var(n, 0);
  const Shape in_shape = y.shape();
  const int rank = static_cast<int>(in_shape.size());
  ResizeRule rule;
  auto text = [&](const char* name, const char* fallback) {
    auto it = n.attributes.find(name);
    return it == n.attributes.end() ? std::string(fallback) : it->second.s;
  };
  rule.mode = text("mode", "nearest");
  rule.coordinates =
      text("coordinate_transformation_mode", r.opset() < 11 ? "asymmetric" : "half_pixel");
  rule.nearest = text("nearest_mode", r.opset() < 11 ? "floor" : "round_prefer_floor");
  rule.cubic_a = r.attr_float(n, "cubic_coeff_a", -0.75);
  rule.antialias = r.attr_int(n, "antialias", 0) != 0;
  rule.exclude_outside = r.attr_int(n, "exclude_outside", 0) != 0;
  rule.extrapolation = r.attr_float(n, "extrapolation_value", 0.0);
  check(rule.mode == "nearest" || rule.mode == "linear" || rule.mode == "cubic",
        r.where(n) + ": mode '" + rule.mode + "' is not nearest, linear or cubic");
  check(!(rule.antialias && rule.mode == "nearest"),
        r.where(n) + ": antialias needs linear or cubic");
  // Opset 10: (X, scales); later: (X, roi, scales, sizes).
  const std::vector<double> roi = r.opset() < 11 ? std::vector<double>{} : constant_floats(r, n, 1);
  const std::vector<double> scales_given = constant_floats(r, n, r.opset() < 11 ? 1 : 2);
  const std::vector<std::int64_t> sizes_given =
      r.opset() >= 11 && r.has_input(n, 3) ? r.ints(n, 3) : std::vector<std::int64_t>{};
  std::vector<std::int64_t> axes;
  for (std::int64_t a : r.attr_ints(n, "axes"))
    axes.push_back(axis_of(a, rank, r.where(n)));
  if (axes.empty()) {
    axes.resize(static_cast<std::size_t>(rank));
    std::iota(axes.begin(), axes.end(), std::int64_t{0});
  }
  const std::size_t k = axes.size();
  std::vector<double> scale(static_cast<std::size_t>(rank), 1.0);
  std::vector<std::int64_t> out(in_shape.begin(), in_shape.end());
  if (!sizes_given.empty()) {
    check(sizes_given.size() == k, r.where(n) + ": sizes has " +
                                       std::to_string(sizes_given.size()) + " entries for " +
                                       std::to_string(k) + " axes");
    for (std::size_t i = 0; i < k; ++i)
      scale[static_cast<std::size_t>(axes[i])] =
          static_cast<double>(sizes_given[i]) /
          static_cast<double>(in_shape[static_cast<std::size_t>(axes[i])]);
    const std::string policy = text("keep_aspect_ratio_policy", "stretch");
    if (policy == "stretch") {
      for (std::size_t i = 0; i < k; ++i)
        out[static_cast<std::size_t>(axes[i])] = sizes_given[i];
    } else {
      check(policy == "not_larger" || policy == "not_smaller",
            r.where(n) + ": keep_aspect_ratio_policy '" + policy + "' is unknown");
      double s = scale[static_cast<std::size_t>(axes[0])];
      for (std::int64_t a : axes)
        s = policy == "not_larger" ? std::min(s, scale[static_cast<std::size_t>(a)])
                                   : std::max(s, scale[static_cast<std::size_t>(a)]);
      for (std::int64_t a : axes) {
        scale[static_cast<std::size_t>(a)] = s;
        out[static_cast<std::size_t>(a)] = static_cast<std::int64_t>(
            s * static_cast<double>(in_shape[static_cast<std::size_t>(a)]) + 0.5);
      }
    }
  } else {
    check(scales_given.size() == k, r.where(n) + ": give scales (one per axis) or sizes");
    for (std::size_t i = 0; i < k; ++i) {
      check(scales_given[i] > 0,
            r.where(n) + ": scale " + std::to_string(scales_given[i]) + " is not positive");
      const auto a = static_cast<std::size_t>(axes[i]);
      scale[a] = scales_given[i];
      out[a] = static_cast<std::int64_t>(scales_given[i] * static_cast<double>(in_shape[a]));
    }
  }
  for (std::size_t i = 0; i < k; ++i) {
    const auto a = static_cast<std::size_t>(axes[i]);
    std::optional<std::pair<double, double>> axis_roi;
    if (roi.size() == 2 * k)
      axis_roi = std::make_pair(roi[i], roi[k + i]);
    else if (roi.size() == 2 * static_cast<std::size_t>(rank))
      axis_roi = std::make_pair(roi[a], roi[static_cast<std::size_t>(rank) + a]);
    const bool trivial_roi =
        !axis_roi || (std::fabs(axis_roi->first) < 1e-9 && std::fabs(axis_roi->second - 1) < 1e-9);
    if (std::fabs(scale[a] - 1.0) < 1e-9 && out[a] == in_shape[a] && trivial_roi)
      continue;
    check(out[a] >= 0 && out[a] <= (1 << 24),
          r.where(n) + ": output size " + std::to_string(out[a]) + " is out of range");
    std::vector<bool> extrapolated;
    const std::vector<double> w =
        resize_matrix(rule, in_shape[a], out[a], scale[a], axis_roi, extrapolated, r.where(n));
    // y [..., in_a, ...] -> move axis a last, multiply by W^T [in, out], move it back.
    std::vector<int> order(static_cast<std::size_t>(rank));
    std::iota(order.begin(), order.end(), 0);
    std::swap(order[a], order.back());
    std::vector<float> wt(w.size());
    for (std::int64_t o = 0; o < out[a]; ++o)
      for (std::int64_t s = 0; s < in_shape[a]; ++s)
        wt[static_cast<std::size_t>(s * out[a] + o)] =
            static_cast<float>(w[static_cast<std::size_t>(o * in_shape[a] + s)]);
    ag::Var moved = ag::permute(r.tape, y, order);
    ag::Var product =
        times_last(r, moved, r.constant(Tensor::from_floats({in_shape[a], out[a]}, wt, r.host)));
    if (std::find(extrapolated.begin(), extrapolated.end(), true) != extrapolated.end()) {
      std::vector<float> fill(static_cast<std::size_t>(out[a]), 0.0f);
      for (std::size_t o = 0; o < fill.size(); ++o)
        if (extrapolated[o])
          fill[o] = static_cast<float>(rule.extrapolation);
      product = ag::add(r.tape, product, r.constant(Tensor::from_floats({out[a]}, fill, r.host)));
    }
    y = ag::permute(r.tape, product, order);
  }
  r.set(n, 0, y);
}

// CumSum along an axis (input 1): a product with a triangular matrix of ones, inclusive
// or exclusive, forward or reversed. Integers are summed on the host.
void cum_sum(Runner& r, const io::OnnxNode& n) {
  const Shape s = r.shape_of(n, 0);
  const int rank = static_cast<int>(s.size());
  const int axis = axis_of(r.ints(n, 1).at(0), rank, r.where(n));
  const bool exclusive = r.attr_int(n, "exclusive", 0) != 0,
             reverse = r.attr_int(n, "reverse", 0) != 0;
  const std::int64_t len = s[static_cast<std::size_t>(axis)];
  // m[i][j] = 1 when input i contributes to output j.
  auto contributes = [&](std::int64_t i, std::int64_t j) {
    return reverse ? (exclusive ? i > j : i >= j) : (exclusive ? i < j : i <= j);
  };
  if (is_host(r, n, 0)) {
    const std::vector<std::int64_t> v = r.ints(n, 0);
    const std::int64_t inner = shape_numel(Shape(s.begin() + axis + 1, s.end()));
    const std::int64_t outer = shape_numel(Shape(s.begin(), s.begin() + axis));
    std::vector<std::int64_t> out(v.size(), 0);
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t in = 0; in < inner; ++in)
        for (std::int64_t j = 0; j < len; ++j)
          for (std::int64_t i = 0; i < len; ++i)
            if (contributes(i, j))
              out[static_cast<std::size_t>((o * len + j) * inner + in)] +=
                  v[static_cast<std::size_t>((o * len + i) * inner + in)];
    r.set_host(n, 0, host_ints(r.host, s, out));
    return;
  }
  std::vector<float> m(static_cast<std::size_t>(len * len), 0.0f);
  for (std::int64_t i = 0; i < len; ++i)
    for (std::int64_t j = 0; j < len; ++j)
      m[static_cast<std::size_t>(i * len + j)] = contributes(i, j) ? 1.0f : 0.0f;
  std::vector<int> order(static_cast<std::size_t>(rank));
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[static_cast<std::size_t>(axis)], order.back());
  ag::Var moved = ag::permute(r.tape, r.var(n, 0), order);
  ag::Var summed = times_last(r, moved, r.constant(Tensor::from_floats({len, len}, m, r.host)));
  r.set(n, 0, ag::permute(r.tape, summed, order));
}

// CumProd: running products slice by slice (exact for zeros and signs).
void cum_prod(Runner& r, const io::OnnxNode& n) {
  if (is_host(r, n, 0)) {  // integers: float stand-ins would round large products
    const Shape s = r.shape_of(n, 0);
    const int axis = axis_of(r.ints(n, 1).at(0), static_cast<int>(s.size()), r.where(n));
    const bool exclusive = r.attr_int(n, "exclusive", 0) != 0,
               reverse = r.attr_int(n, "reverse", 0) != 0;
    const std::vector<std::int64_t> v = r.ints(n, 0);
    const std::int64_t len = s[static_cast<std::size_t>(axis)];
    const std::int64_t inner = shape_numel(Shape(s.begin() + axis + 1, s.end()));
    const std::int64_t outer = shape_numel(Shape(s.begin(), s.begin() + axis));
    std::vector<std::int64_t> out(v.size());
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t in = 0; in < inner; ++in) {
        std::int64_t running = 1;
        for (std::int64_t step = 0; step < len; ++step) {
          const std::int64_t j = reverse ? len - 1 - step : step;
          const auto at = static_cast<std::size_t>((o * len + j) * inner + in);
          std::int64_t next = 0;
          check(!__builtin_mul_overflow(running, v[at], &next),
                r.where(n) + ": the product overflows int64");
          out[at] = exclusive ? running : next;
          running = next;
        }
      }
    r.set_host(n, 0, host_ints(r.host, s, out));
    return;
  }
  const ag::Var& x = r.var(n, 0);
  const int axis = axis_of(r.ints(n, 1).at(0), static_cast<int>(x.shape().size()), r.where(n));
  const bool exclusive = r.attr_int(n, "exclusive", 0) != 0,
             reverse = r.attr_int(n, "reverse", 0) != 0;
  const std::int64_t len = x.dim(axis);
  std::vector<ag::Var> parts(static_cast<std::size_t>(len));
  Shape one = x.shape();
  one[static_cast<std::size_t>(axis)] = 1;
  ag::Var ones = r.constant(Tensor::from_floats(
      one, std::vector<float>(static_cast<std::size_t>(shape_numel(one)), 1.0f), r.host));
  ag::Var running = ones;
  for (std::int64_t step = 0; step < len; ++step) {
    const std::int64_t j = reverse ? len - 1 - step : step;
    ag::Var here = ag::slice(r.tape, x, axis, j, j + 1);
    ag::Var next = step == 0 ? here : ag::mul(r.tape, running, here);
    parts[static_cast<std::size_t>(j)] = exclusive ? running : next;
    running = next;
  }
  r.set(n, 0, len == 0 ? x : parts.size() == 1 ? parts[0] : ag::concat(r.tape, parts, axis));
}

// BitShift of unsigned integers (held as int64): LEFT or RIGHT by the second operand.
void bit_shift(Runner& r, const io::OnnxNode& n) {
  check(is_host(r, n, 0) && is_host(r, n, 1), r.where(n) + ": operands must be integer tensors");
  const std::string direction =
      n.attributes.count("direction") ? n.attributes.at("direction").s : "";
  check(direction == "LEFT" || direction == "RIGHT",
        r.where(n) + ": direction '" + direction + "' is not LEFT or RIGHT");
  auto left = [](std::int64_t x, std::int64_t b) -> std::int64_t {
    return b < 0 || b >= 64 ? 0 : static_cast<std::int64_t>(static_cast<std::uint64_t>(x) << b);
  };
  auto right = [](std::int64_t x, std::int64_t b) -> std::int64_t {
    return b < 0 || b >= 64 ? 0 : static_cast<std::int64_t>(static_cast<std::uint64_t>(x) >> b);
  };
  r.set_host(n, 0,
             host_broadcast(r.value(n, 0).host, r.value(n, 1).host, DType::i64,
                            direction == "LEFT" ? +left : +right, r.where(n)));
}

// LpNormalization: x / ||x||_p along axis (p 1 or 2).
void lp_normalization(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int axis =
      axis_of(r.attr_int(n, "axis", -1), static_cast<int>(x.shape().size()), r.where(n));
  const std::int64_t p = r.attr_int(n, "p", 2);
  check(p == 1 || p == 2, r.where(n) + ": p " + std::to_string(p) + " is not 1 or 2");
  ag::Var norm = p == 2 ? ag::sqrt(r.tape, ag::sum(r.tape, ag::mul(r.tape, x, x), {axis}, true))
                        : ag::sum(r.tape, absolute(r, x), {axis}, true);
  // A zero vector stays zero (as the reference), not 0/0.
  const Tensor zero = compare_on_device(norm.value(), r.scalar(0.0f).value(), Comparison::eq);
  r.set(n, 0, ag::where(r.tape, zero, r.scalar(0.0f), ag::div(r.tape, x, norm)));
}

}  // namespace

void add_resize_ops(OpTable& table) {
  table["BitShift"] = bit_shift;
  table["CumProd"] = cum_prod;
  table["CumSum"] = cum_sum;
  table["LpNormalization"] = lp_normalization;
  table["Resize"] = resize;
}

}  // namespace loom::nn::onnx_import
