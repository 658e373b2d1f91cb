// onnx/shape_ops.cpp — ONNX ops that compute shapes on the host (Shape, Gather, Slice,
// Unsqueeze, Concat, Cast, integer arithmetic), with their float forms, and ReduceMean, Pow.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "core/broadcast.h"
#include "core/reference_util.h"
#include "onnx/runner.h"

namespace loom::nn::onnx_import {
namespace {

// ---- shape arithmetic on the host -------------------------------------------------
// Exporters compute shapes with Shape, Gather, Slice, Concat and integer arithmetic;
// those values live on the host as i64 tensors.

// Integer a (op) b with numpy broadcasting of a one-element side; Div truncates as C++.
void host_binary(Runner& r, const io::OnnxNode& n) {
  const Tensor& ta = r.value(n, 0).host;
  const Tensor& tb = r.value(n, 1).host;
  std::vector<std::int64_t> a = r.ints(n, 0), b = r.ints(n, 1);
  check(a.size() == b.size() || a.size() == 1 || b.size() == 1,
        r.where(n) + ": integer operands of " + std::to_string(a.size()) + " and " +
            std::to_string(b.size()) + " values do not broadcast");
  // Broadcasting: a one-value side repeats; against an empty side the result is empty.
  const std::size_t count = a.size() == b.size() ? a.size() : a.size() == 1 ? b.size() : a.size();
  std::vector<std::int64_t> out(count);
  for (std::size_t k = 0; k < count; ++k) {
    const std::int64_t x = a[a.size() == 1 ? 0 : k], y = b[b.size() == 1 ? 0 : k];
    // The values come from the file: signed overflow is undefined behaviour, and
    // INT64_MIN / -1 traps (SIGFPE on x86).
    bool overflows = false;
    if (n.op_type == "Add") {
      overflows = __builtin_add_overflow(x, y, &out[k]);
    } else if (n.op_type == "Sub") {
      overflows = __builtin_sub_overflow(x, y, &out[k]);
    } else if (n.op_type == "Mul") {
      overflows = __builtin_mul_overflow(x, y, &out[k]);
    } else {
      check(y != 0, r.where(n) + ": integer division by zero");
      overflows = x == std::numeric_limits<std::int64_t>::min() && y == -1;
      if (!overflows)
        out[k] = x / y;
    }
    check(!overflows, r.where(n) + ": integer " + n.op_type + " of " + std::to_string(x) + " and " +
                          std::to_string(y) + " overflows int64");
  }
  r.set_host(n, 0, host_ints(r.host, a.size() == count ? ta.shape() : tb.shape(), out));
}

template <ag::Var (*F)(ag::Tape&, const ag::Var&, const ag::Var&)>
void arithmetic(Runner& r, const io::OnnxNode& n) {
  if (is_host(r, n, 0) && is_host(r, n, 1))
    host_binary(r, n);
  else
    r.set(n, 0, F(r.tape, r.var(n, 0), r.var(n, 1)));
}

void shape(Runner& r, const io::OnnxNode& n) {
  const Value& v = r.value(n, 0);
  const Shape s = v.var.defined() ? v.var.shape() : v.host.shape();
  const auto rank = static_cast<std::int64_t>(s.size());
  std::int64_t start = r.attr_int(n, "start", 0), end = r.attr_int(n, "end", rank);
  start = std::clamp(start < 0 ? start + rank : start, std::int64_t{0}, rank);
  end = std::clamp(end < 0 ? end + rank : end, std::int64_t{0}, rank);
  std::vector<std::int64_t> dims(s.begin() + start, s.begin() + std::max(start, end));
  r.set_host(n, 0, host_ints(r.host, {static_cast<std::int64_t>(dims.size())}, dims));
}

// Gather along axis 0: rows of a float matrix by integer ids (an embedding lookup), or
// entries of a host integer vector (shape arithmetic).
void gather(Runner& r, const io::OnnxNode& n) {
  check(is_host(r, n, 1), r.where(n) + ": indices must be an integer tensor");
  const Tensor& indices = r.value(n, 1).host;
  std::vector<std::int64_t> ids = r.ints(n, 1);
  if (is_host(r, n, 0)) {
    check(r.attr_int(n, "axis", 0) == 0,
          r.where(n) + ": integer data is gathered along axis 0 only");
    std::vector<std::int64_t> data = r.ints(n, 0);
    check(r.value(n, 0).host.rank() == 1, r.where(n) + ": integer data must be a vector");
    std::vector<std::int64_t> out;
    for (std::int64_t i : ids) {
      const auto size = static_cast<std::int64_t>(data.size());
      check(i >= -size && i < size, r.where(n) + ": index " + std::to_string(i) + " outside " +
                                        std::to_string(size) + " values");
      out.push_back(data[static_cast<std::size_t>(i < 0 ? i + size : i)]);
    }
    r.set_host(n, 0, host_ints(r.host, indices.shape(), out));
    return;
  }
  const ag::Var& table = r.var(n, 0);
  const int rank = static_cast<int>(table.shape().size());
  const int axis = axis_of(r.attr_int(n, "axis", 0), rank, r.where(n));
  if (axis != 0 || rank != 2) {
    // Any axis, any rank: one slice per index, concatenated, then the index dimensions in
    // place of the gathered axis (differentiable; meant for small index counts).
    const std::int64_t count = table.dim(axis);
    std::vector<ag::Var> parts;
    for (std::int64_t i : ids) {
      check(i >= -count && i < count, [&] {
        return r.where(n) + ": index " + std::to_string(i) + " outside " + std::to_string(count);
      });
      const std::int64_t at = i < 0 ? i + count : i;
      parts.push_back(ag::slice(r.tape, table, axis, at, at + 1));
    }
    ag::Var joined = parts.size() == 1 ? parts[0] : ag::concat(r.tape, parts, axis);
    Shape out(table.shape().begin(), table.shape().begin() + axis);
    out.insert(out.end(), indices.shape().begin(), indices.shape().end());
    out.insert(out.end(), table.shape().begin() + axis + 1, table.shape().end());
    r.set(n, 0, ag::reshape(r.tape, joined, out));
    return;
  }
  if (const Tensor& direct = r.value(n, 1).device_ids; direct.defined()) {
    r.set(n, 0, ag::embedding(r.tape, table, direct));  // the kernel checks the ids' range
    return;
  }
  std::vector<std::int32_t> rows;
  for (std::int64_t i : ids) {
    const std::int64_t count = table.dim(0);
    check(i >= -count && i < count, r.where(n) + ": index " + std::to_string(i) + " outside " +
                                        std::to_string(count) + " rows");
    rows.push_back(static_cast<std::int32_t>(i < 0 ? i + count : i));
  }
  Tensor id_tensor = Tensor::from_ints(indices.shape(), rows, r.host).to(r.backend);
  r.set(n, 0, ag::embedding(r.tape, table, id_tensor));
}

// starts, ends, axes, steps: host integers; only step 1 is supported.
void slice(Runner& r, const io::OnnxNode& n) {
  const Value& v = r.value(n, 0);
  const Shape s = v.var.defined() ? v.var.shape() : v.host.shape();
  const int rank = static_cast<int>(s.size());
  std::vector<std::int64_t> starts = r.ints(n, 1), ends = r.ints(n, 2);
  std::vector<std::int64_t> axes = r.has_input(n, 3) ? r.ints(n, 3) : std::vector<std::int64_t>{};
  std::vector<std::int64_t> steps = r.has_input(n, 4) ? r.ints(n, 4) : std::vector<std::int64_t>{};
  if (axes.empty())
    for (std::size_t i = 0; i < starts.size(); ++i)
      axes.push_back(static_cast<std::int64_t>(i));
  check(starts.size() == ends.size() && starts.size() == axes.size(),
        r.where(n) + ": starts, ends and axes differ in length");
  check(steps.empty() || steps.size() == axes.size(),
        r.where(n) + ": steps has " + std::to_string(steps.size()) + " entries for " +
            std::to_string(axes.size()) + " axes");
  if (std::any_of(steps.begin(), steps.end(), [](std::int64_t st) { return st != 1; })) {
    // Other steps (negative ones too): the indices kept along each axis, then every
    // combination of them, taken at its linear position.
    std::vector<std::vector<std::int64_t>> kept(s.size());
    for (std::size_t d = 0; d < s.size(); ++d) {
      kept[d].resize(static_cast<std::size_t>(s[d]));
      std::iota(kept[d].begin(), kept[d].end(), std::int64_t{0});
    }
    for (std::size_t i = 0; i < axes.size(); ++i) {
      const auto axis = static_cast<std::size_t>(axis_of(axes[i], rank, r.where(n)));
      const std::int64_t dim = s[axis], step = steps[i];
      check(step != 0, r.where(n) + ": a step of 0");
      std::int64_t at = starts[i] < 0 ? starts[i] + dim : starts[i];
      std::int64_t end = ends[i] < 0 ? ends[i] + dim : ends[i];
      std::vector<std::int64_t>& k = kept[axis];
      k.clear();
      if (step > 0) {
        at = std::clamp<std::int64_t>(at, 0, dim);
        end = std::clamp<std::int64_t>(end, 0, dim);
        for (; at < end; at += step)
          k.push_back(at);
      } else if (dim > 0) {  // as the spec clamps: starts to [0, dim - 1], ends to [-1, dim - 1]
        at = std::clamp<std::int64_t>(at, 0, dim - 1);
        end = std::clamp<std::int64_t>(end, -1, dim - 1);
        for (; at > end; at += step)
          k.push_back(at);
      }
    }
    Shape out;
    for (const auto& k : kept)
      out.push_back(static_cast<std::int64_t>(k.size()));
    const Strides strides = contiguous_strides(s);
    std::vector<std::int32_t> linear;
    std::vector<std::int64_t> index(s.size(), 0);
    for (std::int64_t e = 0; e < shape_numel(out); ++e) {
      std::int64_t offset = 0;
      for (std::size_t d = 0; d < s.size(); ++d)
        offset += kept[d][static_cast<std::size_t>(index[d])] * strides[d];
      linear.push_back(static_cast<std::int32_t>(offset));
      for (std::size_t d = s.size(); d-- > 0;) {
        if (++index[d] < out[d])
          break;
        index[d] = 0;
      }
    }
    check(shape_numel(s) < (std::int64_t{1} << 31), r.where(n) + ": more than 2^31 elements");
    if (v.var.defined()) {
      r.set(n, 0, pick_elements(r, v.var, linear, out));
    } else {
      const std::vector<std::int64_t> values = r.ints(n, 0);
      std::vector<std::int64_t> picked;
      for (std::int32_t at : linear)
        picked.push_back(values[static_cast<std::size_t>(at)]);
      r.set_host(n, 0, host_ints(r.host, out, picked));
    }
    return;
  }
  ag::Var x = v.var;
  Tensor host = v.host;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const int axis = axis_of(axes[i], rank, r.where(n));
    const std::int64_t dim = s[static_cast<std::size_t>(axis)];
    auto clamp = [&](std::int64_t at) {
      return std::clamp(at < 0 ? at + dim : at, std::int64_t{0}, dim);
    };
    const std::int64_t begin = clamp(starts[i]), end = std::max(begin, clamp(ends[i]));
    if (x.defined())
      x = ag::slice(r.tape, x, axis, begin, end);
    else
      host = host.slice(axis, begin, end);
  }
  if (x.defined())
    r.set(n, 0, x);
  else
    r.set_host(n, 0, host.to(r.host));  // a contiguous copy
}

void unsqueeze(Runner& r, const io::OnnxNode& n) {
  const Value& v = r.value(n, 0);
  const Shape s = v.var.defined() ? v.var.shape() : v.host.shape();
  std::vector<std::int64_t> axes = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "axes");
  const int rank = static_cast<int>(s.size() + axes.size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (std::int64_t a : axes) {
    const auto axis = static_cast<std::size_t>(axis_of(a, rank, r.where(n)));
    // A repeated axis leaves the output with fewer inserted dimensions than axes, and the
    // input's dimensions would run out below.
    check(!inserted[axis],
          r.where(n) + ": axis " + std::to_string(a) + " appears twice in axes " + shape_str(axes));
    inserted[axis] = true;
  }
  Shape out;
  std::size_t next = 0;
  for (int i = 0; i < rank; ++i)
    out.push_back(inserted[static_cast<std::size_t>(i)] ? 1 : s.at(next++));
  if (v.var.defined())
    r.set(n, 0, ag::reshape(r.tape, v.var, out));
  else
    r.set_host(n, 0, host_ints(r.host, out, r.ints(n, 0)));
}

void concat(Runner& r, const io::OnnxNode& n) {
  const std::int64_t axis = r.attr_int(n, "axis", 0);
  bool all_host = true;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    all_host = all_host && is_host(r, n, i);
  if (all_host) {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      check(r.value(n, i).host.rank() == 1, r.where(n) + ": integer inputs must be vectors");
      std::vector<std::int64_t> part = r.ints(n, i);
      out.insert(out.end(), part.begin(), part.end());
    }
    r.set_host(n, 0, host_ints(r.host, {static_cast<std::int64_t>(out.size())}, out));
    return;
  }
  std::vector<ag::Var> parts;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    parts.push_back(r.var(n, i));
  r.set(n, 0,
        ag::concat(r.tape, parts,
                   axis_of(axis, static_cast<int>(parts[0].shape().size()), r.where(n))));
}

using namespace io::onnx_type;  // kFloat, kInt64, kFloat8E4M3FN, ...

// x held in f32 but rounded to a narrower format: x + (rounded - x), which is exactly the
// rounded value (the difference is exact, by Sterbenz) and lets the gradient straight
// through; where x is infinite or NaN (x - x is NaN) the rounded value itself is taken.
ag::Var rounded_like(Runner& r, const ag::Var& x, const Tensor& rounded) {
  const Tensor delta = dispatch::call1(OpId::sub, {rounded, x.value()});
  const Tensor zero_where_finite = dispatch::call1(OpId::sub, {x.value(), x.value()});
  const Tensor finite = compare_on_device(zero_where_finite, zero_where_finite, Comparison::eq);
  return ag::where(r.tape, finite, ag::add(r.tape, x, ag::Var(delta, false)),
                   ag::Var(rounded, false));
}

// Cast to `to`: float stays a float tensor on the device; integers and booleans are host
// values (a float cast to an integer truncates toward zero, on the device, and its values
// come to the host, where integers live).
void cast_to(Runner& r, const io::OnnxNode& n, std::int64_t to) {
  const Value& v = r.value(n, 0);
  const bool to_float = to == kFloat || to == kDouble || to == kFloat16 || to == kBfloat16;
  const bool to_int = to == kUint8 || to == kInt8 || to == kUint16 || to == kInt16 ||
                      to == kInt32 || to == kInt64 || to == kUint32 || to == kUint64 ||
                      to == kUint4 || to == kInt4 || to == kUint2 || to == kInt2;
  const bool to_narrow_float = (to >= kFloat8E4M3FN && to <= kFloat8E5M2FNUZ) || to == kFloat4E2M1;
  check(to_float || to_int || to_narrow_float || to == kBool,
        r.where(n) + ": cast to ONNX element type " + std::to_string(to) + " is not supported");
  if (to_narrow_float) {  // FP8 and FP4: rounded on the host (no kernel computes in them)
    const ag::Var x = r.as_float(n, 0);
    const NarrowFloat format = to == kFloat8E4M3FN     ? NarrowFloat::e4m3fn
                               : to == kFloat8E4M3FNUZ ? NarrowFloat::e4m3fnuz
                               : to == kFloat8E5M2     ? NarrowFloat::e5m2
                               : to == kFloat8E5M2FNUZ ? NarrowFloat::e5m2fnuz
                                                       : NarrowFloat::e2m1fn;
    const bool saturate = r.attr_int(n, "saturate", 1) != 0;
    std::vector<float> values = r.read_on_host(n, x.value()).to_floats();
    for (float& f : values)
      f = narrow_float_round(f, format, saturate);
    r.set(n, 0, rounded_like(r, x, Tensor::from_floats(x.shape(), values, r.host).to(r.backend)));
    return;
  }
  if (v.var.defined() && to_float) {
    if (to == kFloat16 || to == kBfloat16) {  // rounded on the device by the catalog's cast
      Attrs narrow, wide;
      narrow.dtype = to == kFloat16 ? DType::f16 : DType::bf16;
      wide.dtype = DType::f32;
      const Tensor rounded =
          dispatch::call1(OpId::cast, {dispatch::call1(OpId::cast, {v.var.value()}, narrow)}, wide);
      r.set(n, 0, rounded_like(r, v.var, rounded));
      return;
    }
    r.set(n, 0, v.var);
    return;
  }
  if (!v.var.defined() && to_float) {
    r.set(n, 0, r.as_float(n, 0));
    return;
  }
  std::vector<std::int64_t> values;
  if (v.var.defined()) {
    if (to == kBool) {  // x != 0
      Tensor zero = compare_on_device(v.var.value(), r.scalar(0.0f).value(), Comparison::eq);
      values = host_values(r.host, r.read_on_host(n, zero));
      for (std::int64_t& x : values)
        x = x == 0;
    } else {
      Attrs i32;
      i32.dtype = DType::i32;
      values =
          host_values(r.host, r.read_on_host(n, dispatch::call1(OpId::cast, {v.var.value()}, i32)));
    }
  } else {
    values = r.ints(n, 0);
  }
  const Shape& shape = v.var.defined() ? v.var.shape() : v.host.shape();
  // Narrower integer types wrap, as a C cast does.
  for (std::int64_t& x : values) {
    if (to == kBool)
      x = x != 0;
    else if (to == kUint8)
      x = static_cast<std::uint8_t>(x);
    else if (to == kInt8)
      x = static_cast<std::int8_t>(x);
    else if (to == kUint16)
      x = static_cast<std::uint16_t>(x);
    else if (to == kInt16)
      x = static_cast<std::int16_t>(x);
    else if (to == kInt32)
      x = static_cast<std::int32_t>(x);
    else if (to == kUint32)
      x = static_cast<std::uint32_t>(x);
    else if (to == kUint4 || to == kUint2)  // the low bits, as a C cast to a narrower type
      x &= to == kUint4 ? 0xF : 0x3;
    else if (to == kInt4 || to == kInt2) {
      const int bits = to == kInt4 ? 4 : 2;
      x &= (1 << bits) - 1;
      if (x >> (bits - 1))
        x -= std::int64_t{1} << bits;
    }
  }
  if (to == kBool || to == kUint8) {
    std::vector<std::uint8_t> bytes(values.begin(), values.end());
    r.set_host(n, 0, Tensor::from_host(shape, DType::u8, bytes.data(), r.host));
  } else {
    r.set_host(n, 0, host_ints(r.host, shape, values));
  }
}

void cast(Runner& r, const io::OnnxNode& n) {
  cast_to(r, n, r.attr_int(n, "to", kFloat));
}

// CastLike: to the element type of input 1 (a float, or an integer type).
void cast_like(Runner& r, const io::OnnxNode& n) {
  const Value& like = r.value(n, 1);
  if (like.onnx_type != 0) {
    cast_to(r, n, like.onnx_type);
    return;
  }
  if (like.var.defined()) {
    cast_to(r, n, kFloat);
    return;
  }
  const DType t = like.host.dtype();
  cast_to(r, n, t == DType::u8 ? kUint8 : t == DType::i32 ? kInt32 : kInt64);
}

void reduce_mean(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  std::vector<std::int64_t> axes = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "axes");
  const bool keepdims = r.attr_int(n, "keepdims", 1) != 0;
  if (axes.empty() && r.attr_int(n, "noop_with_empty_axes", 0) != 0) {
    r.set(n, 0, x);
    return;
  }
  r.set(n, 0, ag::mean(r.tape, x, axes, keepdims));
}

// x ^ y. Integers on the host (an integer exponent: checked repeated products; a float
// one: double pow truncated). A fixed exponent that is a small integer is repeated
// multiplication (exact, negative bases included); 0.5 is sqrt; anything else is float
// pow from e^{y log|x|}.
void pow(Runner& r, const io::OnnxNode& n) {
  if (is_host(r, n, 0) && is_host(r, n, 1)) {  // integers: repeated products, checked
    std::string where = r.where(n);
    r.set_host(n, 0,
               host_broadcast(
                   r.value(n, 0).host, r.value(n, 1).host, DType::i64,
                   [](std::int64_t x, std::int64_t y) -> std::int64_t {
                     if (y < 0)  // 1, -1 stay; larger bases truncate to 0
                       return x == 1 ? 1 : x == -1 ? (y % 2 == 0 ? 1 : -1) : 0;
                     std::int64_t p = 1;
                     for (std::int64_t k = 0; k < y && p != 0; ++k)
                       if (__builtin_mul_overflow(p, x, &p))
                         throw Error("integer Pow overflows int64");
                     return p;
                   },
                   where));
    return;
  }
  if (is_host(r, n, 0)) {
    // An integer base and a float exponent: as ONNX Runtime computes it, pow in double,
    // truncated toward zero to the base's type.
    const Tensor& base = r.value(n, 0).host;
    const Tensor exponent = r.input_on_host(n, 1);
    const std::string where = r.where(n);
    const Shape shape = broadcast_shapes(base.shape(), exponent.shape(), where);
    const std::vector<std::int64_t> xs = host_values(r.host, base);
    const std::vector<float> ys = exponent.to_floats();
    const Strides sx = broadcast_strides(base.shape(), shape),
                  sy = broadcast_strides(exponent.shape(), shape);
    std::vector<std::int64_t> out(static_cast<std::size_t>(shape_numel(shape)));
    for_each_index(shape, [&](std::int64_t k, const std::vector<std::int64_t>& index) {
      const double v = std::trunc(
          std::pow(static_cast<double>(xs[static_cast<std::size_t>(offset_of(index, sx))]),
                   static_cast<double>(ys[static_cast<std::size_t>(offset_of(index, sy))])));
      check(std::isfinite(v) && std::fabs(v) < 9.2e18,
            where + ": integer Pow gives " + std::to_string(v) + ", outside int64");
      out[static_cast<std::size_t>(k)] = static_cast<std::int64_t>(v);
    });
    r.set_host(n, 0, host_tensor(r.host, shape, out, base.dtype()));
    return;
  }
  const ag::Var& x = r.var(n, 0);
  std::optional<double> constant;
  if (is_host(r, n, 1) && r.value(n, 1).host.numel() == 1)
    constant = static_cast<double>(r.ints(n, 1).at(0));
  else if (!is_host(r, n, 1) && r.var(n, 1).value().numel() == 1 && r.value(n, 1).fixed)
    constant = r.input_on_host(n, 1).item();
  auto one = [&] { return r.constant(Tensor::from_floats({}, std::vector<float>{1.0f}, r.host)); };
  if (constant && *constant == std::round(*constant) && std::fabs(*constant) <= 16) {
    const auto e = static_cast<int>(std::fabs(*constant));
    ag::Var y = e == 0 ? ag::add(r.tape, ag::scale(r.tape, x, 0.0), one()) : x;  // x^0: ones
    for (int k = 1; k < e; ++k)
      y = ag::mul(r.tape, y, x);
    if (*constant < 0)
      y = ag::div(r.tape, one(), y);
    r.set(n, 0, y);
    return;
  }
  if (constant && *constant == 0.5) {
    r.set(n, 0, ag::sqrt(r.tape, x));
    return;
  }
  ag::Var exponent;
  if (is_host(r, n, 1)) {
    std::vector<std::int64_t> ints = r.ints(n, 1);
    std::vector<float> v(ints.begin(), ints.end());
    exponent = r.constant(Tensor::from_floats(r.value(n, 1).host.shape(), v, r.host));
  } else {
    exponent = r.var(n, 1);
  }
  // x^y as float pow defines it (C, numpy, ONNX): |x|^y = exp(y log|x|); a negative base
  // gives (-1)^y |x|^y when y is an integer, the sign from y's parity y - 2 floor(y/2), and
  // NaN otherwise; y = 0 gives 1 for every x. The sign and the masks are computed from y's
  // values, off the tape: d/dy of sign |x|^y is sign |x|^y log|x|, through the magnitude.
  ag::Tape& tape = r.tape;
  const ag::Var zero = r.scalar(0.0f);
  ag::Var magnitude = ag::exp(tape, ag::mul(tape, exponent, ag::log(tape, absolute(r, x))));
  const ag::Var y_values(exponent.value(), false);
  ag::Var odd = ag::sub(
      tape, y_values,
      ag::scale(tape, ag::math(tape, ag::scale(tape, y_values, 0.5), MathFunction::floor), 2.0));
  ag::Var sign = ag::sub(tape, one(), ag::scale(tape, odd, 2.0));
  const Tensor integral = compare_on_device(ag::math(tape, y_values, MathFunction::floor).value(),
                                            exponent.value(), Comparison::eq);
  ag::Var negative_base = ag::where(tape, integral, ag::mul(tape, sign, magnitude),
                                    r.scalar(std::numeric_limits<float>::quiet_NaN()));
  ag::Var y = ag::where(tape, compare_on_device(x.value(), zero.value(), Comparison::lt),
                        negative_base, magnitude);
  y = ag::where(tape, compare_on_device(exponent.value(), zero.value(), Comparison::eq), one(), y);
  r.set(n, 0, y);
}

}  // namespace

void add_shape_ops(OpTable& table) {
  table["Add"] = arithmetic<ag::add>;
  table["Cast"] = cast;
  table["CastLike"] = cast_like;
  table["Concat"] = concat;
  table["Div"] = arithmetic<ag::div>;
  table["Gather"] = gather;
  table["Mul"] = arithmetic<ag::mul>;
  table["Pow"] = pow;
  table["ReduceMean"] = reduce_mean;
  table["Shape"] = shape;
  table["Slice"] = slice;
  table["Sub"] = arithmetic<ag::sub>;
  table["Unsqueeze"] = unsqueeze;
}

}  // namespace loom::nn::onnx_import
