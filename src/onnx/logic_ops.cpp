// onnx/logic_ops.cpp — ONNX comparisons, logic, Where, the variadic Max, Min, Sum,
// Mean, Mod, and the trigonometric and rounding functions (the catalog's `math`). Float operands
// run through the catalog (compare, where) on the model's device; integer and boolean operands are
// host values, computed here with numpy broadcasting.
#include <cmath>
#include <limits>

#include "core/checked.h"
#include "core/reference_util.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {

std::vector<std::int64_t> host_values(Backend& host, const Tensor& t) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(t.numel()));
  const Tensor h = t.to(host);
  switch (h.dtype()) {
    case DType::i64:
      std::copy_n(h.data<std::int64_t>(), h.numel(), out.begin());
      break;
    case DType::i32:
      std::copy_n(h.data<std::int32_t>(), h.numel(), out.begin());
      break;
    case DType::u8:
      std::copy_n(h.data<std::uint8_t>(), h.numel(), out.begin());
      break;
    default:
      throw Error("expected an integer tensor, got " + h.describe());
  }
  return out;
}

Tensor host_broadcast(const Tensor& a, const Tensor& b, DType dtype,
                      std::int64_t (*f)(std::int64_t, std::int64_t), const std::string& where) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), where);
  Backend& host = a.backend();
  const std::vector<std::int64_t> va = host_values(host, a), vb = host_values(host, b);
  const Strides sa = broadcast_strides(a.shape(), shape), sb = broadcast_strides(b.shape(), shape);
  std::vector<std::int64_t> out(static_cast<std::size_t>(shape_numel(shape)));
  for_each_index(shape, [&](std::int64_t k, const std::vector<std::int64_t>& index) {
    out[static_cast<std::size_t>(k)] = f(va[static_cast<std::size_t>(offset_of(index, sa))],
                                         vb[static_cast<std::size_t>(offset_of(index, sb))]);
  });
  if (dtype == DType::i64)
    return host_ints(host, shape, out);
  std::vector<std::uint8_t> bytes(out.begin(), out.end());
  return Tensor::from_host(shape, DType::u8, bytes.data(), host);
}

ag::Var absolute(Runner& r, const ag::Var& x) {
  return ag::add(r.tape, ag::relu(r.tape, x), ag::relu(r.tape, ag::scale(r.tape, x, -1.0)));
}

void through_floats(Runner& r, const io::OnnxNode& n, const OpFn& f,
                    const std::vector<std::size_t>& inputs) {
  if (!r.has_input(n, 0) || !is_host(r, n, 0))
    return f(r, n);
  const DType dtype = r.value(n, 0).host.dtype() == DType::u8 ? DType::u8 : DType::i64;
  // The inputs held as floats while f runs, and their values to put back after.
  std::vector<std::pair<std::string, Value>> originals;
  for (std::size_t i : inputs) {
    if (!is_host(r, n, i))
      continue;
    const Value original = r.value(n, i);
    const std::vector<std::int64_t> ints = host_values(r.host, original.host);
    // 2^23: the ops' float forms add and subtract two such values (Clip's lo + relu(x -
    // lo)), and sums up to 2^24 are still exact in f32.
    constexpr std::int64_t exact = std::int64_t{1} << 23;
    std::vector<float> floats(ints.size());
    for (std::size_t k = 0; k < ints.size(); ++k) {
      check(ints[k] >= -exact && ints[k] <= exact,
            r.where(n) + ": integer input value " + std::to_string(ints[k]) +
                " is beyond 2^23, where this op's float form (f32) is no longer exact");
      floats[k] = static_cast<float>(ints[k]);
    }
    Value as_float;
    as_float.var = r.constant(Tensor::from_floats(original.host.shape(), floats, r.host));
    as_float.fixed = original.fixed;
    originals.emplace_back(n.inputs[i], original);
    r.env[n.inputs[i]] = as_float;
  }
  auto restore = [&] {
    for (auto it = originals.rbegin(); it != originals.rend(); ++it)
      r.env[it->first] = it->second;
  };
  try {
    f(r, n);
  } catch (...) {
    restore();
    throw;
  }
  restore();
  for (std::size_t o = 0; o < n.outputs.size(); ++o) {
    auto it = r.env.find(n.outputs[o]);
    if (n.outputs[o].empty() || it == r.env.end() || !it->second.var.defined())
      continue;
    const Tensor y = it->second.var.value();
    const std::vector<float> v = r.read_on_host(n, y).to_floats();
    std::vector<std::int64_t> rounded(v.size());
    for (std::size_t k = 0; k < v.size(); ++k)
      rounded[k] = std::llround(v[k]);
    r.set_host(n, o, host_tensor(r.host, y.shape(), rounded, dtype));
  }
}

Tensor compare_on_device(const Tensor& a, const Tensor& b, Comparison how) {
  Attrs attrs;
  attrs.comparison = how;
  return dispatch::call1(OpId::compare, {a, b}, attrs);
}

namespace {

template <Comparison How>
bool holds(std::int64_t x, std::int64_t y) {
  switch (How) {
    case Comparison::eq:
      return x == y;
    case Comparison::lt:
      return x < y;
    case Comparison::le:
      return x <= y;
    case Comparison::gt:
      return x > y;
    case Comparison::ge:
      return x >= y;
  }
  return false;
}

// Equal, Less, ...: a boolean host tensor. Integers compare on the host; floats compare on
// the device, and the (non-differentiable) result is brought to the host, where booleans
// are used (Where's condition, Not, And).
template <Comparison How>
void comparison(Runner& r, const io::OnnxNode& n) {
  if (is_host(r, n, 0) && is_host(r, n, 1)) {
    r.set_host(n, 0,
               host_broadcast(
                   r.value(n, 0).host, r.value(n, 1).host, DType::u8,
                   [](std::int64_t x, std::int64_t y) -> std::int64_t { return holds<How>(x, y); },
                   r.where(n)));
    return;
  }
  r.set_host(n, 0,
             r.read_on_host(
                 n, compare_on_device(r.as_float(n, 0).value(), r.as_float(n, 1).value(), How)));
}

template <std::int64_t (*F)(std::int64_t, std::int64_t)>
void host_logic(Runner& r, const io::OnnxNode& n) {
  check(is_host(r, n, 0) && is_host(r, n, 1),
        r.where(n) + ": operands must be boolean or integer tensors");
  r.set_host(n, 0,
             host_broadcast(r.value(n, 0).host, r.value(n, 1).host,
                            r.value(n, 0).host.dtype() == DType::u8 ? DType::u8 : DType::i64, F,
                            r.where(n)));
}

std::int64_t logical_and(std::int64_t x, std::int64_t y) {
  return (x != 0) && (y != 0);
}
std::int64_t logical_or(std::int64_t x, std::int64_t y) {
  return (x != 0) || (y != 0);
}
std::int64_t logical_xor(std::int64_t x, std::int64_t y) {
  return (x != 0) != (y != 0);
}
std::int64_t bit_and(std::int64_t x, std::int64_t y) {
  return x & y;
}
std::int64_t bit_or(std::int64_t x, std::int64_t y) {
  return x | y;
}
std::int64_t bit_xor(std::int64_t x, std::int64_t y) {
  return x ^ y;
}

void logical_not(Runner& r, const io::OnnxNode& n) {
  check(is_host(r, n, 0), r.where(n) + ": the operand must be a boolean tensor");
  std::vector<std::int64_t> v = r.ints(n, 0);
  std::vector<std::uint8_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    out[i] = v[i] == 0;
  r.set_host(n, 0, Tensor::from_host(r.value(n, 0).host.shape(), DType::u8, out.data(), r.host));
}

// Mod: integers on the host. fmod 0 takes the divisor's sign (Python's %), fmod 1 the
// dividend's (C's %).
ag::Var math_of(Runner& r, const ag::Var& x, MathFunction f) {
  return ag::math(r.tape, x, f);
}

template <MathFunction F>
void math_op(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, math_of(r, r.var(n, 0), F));
}

// Mod of floats: a - b trunc(a / b) (fmod 1, C's fmod) or a - b floor(a / b) (fmod 0, the
// divisor's sign), trunc being floor for x >= 0 and ceil below.
void float_mod(Runner& r, const io::OnnxNode& n) {
  const ag::Var a = r.as_float(n, 0), b = r.as_float(n, 1);
  ag::Var q = ag::div(r.tape, a, b);
  ag::Var whole;
  if (r.attr_int(n, "fmod", 0) != 0) {
    Tensor positive = compare_on_device(q.value(), r.scalar(0.0f).value(), Comparison::ge);
    whole = ag::where(r.tape, positive, math_of(r, q, MathFunction::floor),
                      math_of(r, q, MathFunction::ceil));
  } else {
    whole = math_of(r, q, MathFunction::floor);
  }
  r.set(n, 0, ag::sub(r.tape, a, ag::mul(r.tape, b, whole)));
}

void mod(Runner& r, const io::OnnxNode& n) {
  if (!is_host(r, n, 0) || !is_host(r, n, 1))
    return float_mod(r, n);
  const bool c_style = r.attr_int(n, "fmod", 0) != 0;
  auto f = c_style ? +[](std::int64_t x, std::int64_t y) -> std::int64_t {
    return y == 0 || (y == -1) ? 0 : x % y;
  }
  : +[](std::int64_t x, std::int64_t y) -> std::int64_t {
      if (y == 0 || y == -1)
        return 0;
      const std::int64_t m = x % y;
      return m != 0 && ((m < 0) != (y < 0)) ? m + y : m;
    };
  const std::vector<std::int64_t> divisors = r.ints(n, 1);
  for (std::int64_t d : divisors)
    check(d != 0, r.where(n) + ": integer Mod by zero");
  r.set_host(n, 0,
             host_broadcast(r.value(n, 0).host, r.value(n, 1).host, DType::i64, f, r.where(n)));
}

// Where(cond, x, y): the condition is a host boolean; integers choose on the host, floats
// on the device (the catalog's where: the gradient goes to the side each element came from).
void where_op(Runner& r, const io::OnnxNode& n) {
  check(is_host(r, n, 0), r.where(n) + ": the condition must be a boolean tensor");
  const Tensor& cond = r.value(n, 0).host;
  if (is_host(r, n, 1) && is_host(r, n, 2)) {
    // Broadcast all three: pick x or y by the condition.
    const Tensor& x = r.value(n, 1).host;
    const Tensor& y = r.value(n, 2).host;
    const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), x.shape(), r.where(n)),
                                         y.shape(), r.where(n));
    const std::vector<std::int64_t> c = host_values(r.host, cond), vx = host_values(r.host, x),
                                    vy = host_values(r.host, y);
    const Strides sc = broadcast_strides(cond.shape(), shape),
                  sx = broadcast_strides(x.shape(), shape),
                  sy = broadcast_strides(y.shape(), shape);
    std::vector<std::int64_t> out(static_cast<std::size_t>(shape_numel(shape)));
    for_each_index(shape, [&](std::int64_t k, const std::vector<std::int64_t>& index) {
      out[static_cast<std::size_t>(k)] = c[static_cast<std::size_t>(offset_of(index, sc))] != 0
                                             ? vx[static_cast<std::size_t>(offset_of(index, sx))]
                                             : vy[static_cast<std::size_t>(offset_of(index, sy))];
    });
    r.set_host(n, 0, host_ints(r.host, shape, out));
    return;
  }
  Tensor c =
      cond.dtype() == DType::u8
          ? cond
          : host_broadcast(
                cond, host_ints(r.host, {}, {0}), DType::u8,
                [](std::int64_t x, std::int64_t) -> std::int64_t { return x != 0; }, r.where(n));
  r.set(n, 0, ag::where(r.tape, c.to(r.backend), r.as_float(n, 1), r.as_float(n, 2)));
}

// Max, Min of one or more inputs (numpy broadcasting). Floats: where(a >= b, a, b), so the
// gradient goes to the larger operand (the first at a tie). A NaN is not propagated.
template <bool Largest>
void extreme(Runner& r, const io::OnnxNode& n) {
  check(!n.inputs.empty(), r.where(n) + ": needs at least one input");
  bool all_host = true;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    all_host = all_host && is_host(r, n, i);
  if (all_host) {
    Tensor acc = r.value(n, 0).host;
    for (std::size_t i = 1; i < n.inputs.size(); ++i)
      acc = host_broadcast(
          acc, r.value(n, i).host, DType::i64,
          [](std::int64_t x, std::int64_t y) { return Largest ? std::max(x, y) : std::min(x, y); },
          r.where(n));
    r.set_host(n, 0, acc);
    return;
  }
  ag::Var acc = r.as_float(n, 0);
  for (std::size_t i = 1; i < n.inputs.size(); ++i) {
    ag::Var next = r.as_float(n, i);
    Tensor keep =
        compare_on_device(acc.value(), next.value(), Largest ? Comparison::ge : Comparison::le);
    acc = ag::where(r.tape, keep, acc, next);
  }
  r.set(n, 0, acc);
}

// Sum and Mean of one or more inputs (numpy broadcasting).
template <bool Average>
void total(Runner& r, const io::OnnxNode& n) {
  check(!n.inputs.empty(), r.where(n) + ": needs at least one input");
  ag::Var acc = r.as_float(n, 0);
  for (std::size_t i = 1; i < n.inputs.size(); ++i)
    acc = ag::add(r.tape, acc, r.as_float(n, i));
  if (Average && n.inputs.size() > 1)
    acc = ag::scale(r.tape, acc, 1.0 / static_cast<double>(n.inputs.size()));
  r.set(n, 0, acc);
}

// IsNaN: x != x. IsInf: |x| == inf, with detect_negative / detect_positive.
void is_nan(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  std::vector<std::int64_t> equal = host_values(
      r.host, r.read_on_host(n, compare_on_device(x.value(), x.value(), Comparison::eq)));
  std::vector<std::uint8_t> out(equal.size());
  for (std::size_t i = 0; i < equal.size(); ++i)
    out[i] = equal[i] == 0;
  r.set_host(n, 0, Tensor::from_host(x.shape(), DType::u8, out.data(), r.host));
}

void is_inf(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const bool negative = r.attr_int(n, "detect_negative", 1) != 0;
  const bool positive = r.attr_int(n, "detect_positive", 1) != 0;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::int64_t> pos = host_values(
      r.host,
      r.read_on_host(n, compare_on_device(x.value(), r.scalar(inf).value(), Comparison::eq)));
  std::vector<std::int64_t> neg = host_values(
      r.host,
      r.read_on_host(n, compare_on_device(x.value(), r.scalar(-inf).value(), Comparison::eq)));
  std::vector<std::uint8_t> out(pos.size());
  for (std::size_t i = 0; i < pos.size(); ++i)
    out[i] = (positive && pos[i] != 0) || (negative && neg[i] != 0);
  r.set_host(n, 0, Tensor::from_host(x.shape(), DType::u8, out.data(), r.host));
}

}  // namespace

void add_logic_ops(OpTable& table) {
  table["And"] = host_logic<logical_and>;
  table["BitwiseAnd"] = host_logic<bit_and>;
  table["BitwiseOr"] = host_logic<bit_or>;
  table["BitwiseXor"] = host_logic<bit_xor>;
  table["Equal"] = comparison<Comparison::eq>;
  table["Greater"] = comparison<Comparison::gt>;
  table["GreaterOrEqual"] = comparison<Comparison::ge>;
  table["IsInf"] = is_inf;
  table["IsNaN"] = is_nan;
  table["Less"] = comparison<Comparison::lt>;
  table["LessOrEqual"] = comparison<Comparison::le>;
  table["Max"] = extreme<true>;
  table["Mean"] = total<true>;
  table["Min"] = extreme<false>;
  table["Mod"] = mod;
  table["Not"] = logical_not;
  table["Or"] = host_logic<logical_or>;
  table["Sum"] = total<false>;
  table["Where"] = where_op;
  table["Xor"] = host_logic<logical_xor>;
  table["Sin"] = math_op<MathFunction::sin>;
  table["Cos"] = math_op<MathFunction::cos>;
  table["Tan"] = math_op<MathFunction::tan>;
  table["Asin"] = math_op<MathFunction::asin>;
  table["Acos"] = math_op<MathFunction::acos>;
  table["Atan"] = math_op<MathFunction::atan>;
  table["Sinh"] = math_op<MathFunction::sinh>;
  table["Cosh"] = math_op<MathFunction::cosh>;
  table["Asinh"] = math_op<MathFunction::asinh>;
  table["Acosh"] = math_op<MathFunction::acosh>;
  table["Atanh"] = math_op<MathFunction::atanh>;
  table["Floor"] = math_op<MathFunction::floor>;
  table["Ceil"] = math_op<MathFunction::ceil>;
  table["Round"] = math_op<MathFunction::round>;
  table["Sign"] = math_op<MathFunction::sign>;
}

}  // namespace loom::nn::onnx_import
