#include "nn/onnx_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <span>

#include "autograd/functions.h"
#include "backends/cpu/cpu_backend.h"
#include "core/error.h"

namespace loom::nn {

namespace ag = loom::autograd;

namespace {

// A value flowing through the graph: a float tensor as a Var (on the model's device,
// differentiable), or an integer tensor on the host (shapes, axes, indices).
struct Value {
  ag::Var var;
  Tensor host;
  // A graph input of token ids as Loom gave them (i32, on the model's device): an
  // embedding lookup reads them there, with no host copy that graph capture would freeze.
  Tensor device_ids;
};

class Runner;
using OpFn = void (*)(Runner& r, const io::OnnxNode& node);

class Runner {
 public:
  Runner(const io::OnnxGraph& graph, ag::Tape& tape, const ForwardOptions& options,
         Backend& backend)
      : graph_(graph), tape(tape), options(options), backend(backend) {}

  std::string where(const io::OnnxNode& node) const {
    return graph_.path + ": node '" + node.name + "' (" + node.op_type + ")";
  }
  bool has_input(const io::OnnxNode& node, std::size_t i) const {
    return i < node.inputs.size() && !node.inputs[i].empty();
  }
  const Value& value(const io::OnnxNode& node, std::size_t i) const {
    check(has_input(node, i), where(node) + ": input " + std::to_string(i) + " is missing");
    auto it = env.find(node.inputs[i]);
    check(it != env.end(),
          where(node) + ": input '" + node.inputs[i] + "' is not computed before it");
    return it->second;
  }
  const ag::Var& var(const io::OnnxNode& node, std::size_t i) const {
    const Value& v = value(node, i);
    check(v.var.defined(),
          where(node) + ": input '" + node.inputs[i] + "' is an integer tensor, expected float");
    return v.var;
  }
  // An integer input known on the host (a constant or initializer), as int64 values.
  std::vector<std::int64_t> ints(const io::OnnxNode& node, std::size_t i) const {
    const Value& v = value(node, i);
    check(v.host.defined(), where(node) + ": input '" + node.inputs[i] +
                                "' must be a constant integer tensor (shapes computed at run time "
                                "from tensor values are not supported yet)");
    std::vector<std::int64_t> out(static_cast<std::size_t>(v.host.numel()));
    if (v.host.dtype() == DType::i64) {
      const auto* p = v.host.data<std::int64_t>();
      std::copy(p, p + v.host.numel(), out.begin());
    } else if (v.host.dtype() == DType::u8) {
      const auto* p = v.host.data<std::uint8_t>();
      std::copy(p, p + v.host.numel(), out.begin());
    } else {
      std::vector<std::int32_t> i32 = v.host.to_ints();
      std::copy(i32.begin(), i32.end(), out.begin());
    }
    return out;
  }
  std::int64_t attr_int(const io::OnnxNode& node, const std::string& name,
                        std::int64_t fallback) const {
    auto it = node.attributes.find(name);
    return it == node.attributes.end() ? fallback : it->second.i;
  }
  double attr_float(const io::OnnxNode& node, const std::string& name, double fallback) const {
    auto it = node.attributes.find(name);
    return it == node.attributes.end() ? fallback : it->second.f;
  }
  std::vector<std::int64_t> attr_ints(const io::OnnxNode& node, const std::string& name) const {
    auto it = node.attributes.find(name);
    return it == node.attributes.end() ? std::vector<std::int64_t>{} : it->second.ints;
  }
  void set(const io::OnnxNode& node, std::size_t i, ag::Var v) {
    check(i < node.outputs.size(), where(node) + ": has no output " + std::to_string(i));
    env[node.outputs[i]] = Value{std::move(v), Tensor(), Tensor()};
  }
  void set_host(const io::OnnxNode& node, std::size_t i, Tensor t) {
    env[node.outputs[i]] = Value{ag::Var(), std::move(t), Tensor()};
  }
  ag::Var constant(const Tensor& host_tensor) { return ag::Var(host_tensor.to(backend), false); }
  std::int64_t opset() const { return graph_.opset; }

  const io::OnnxGraph& graph_;
  ag::Tape& tape;
  const ForwardOptions& options;
  Backend& backend;
  std::map<std::string, Value> env;
  std::size_t node_index = 0;
};

int axis_of(std::int64_t axis, int rank, const std::string& where) {
  check(axis >= -rank && axis < rank, where + ": axis " + std::to_string(axis) +
                                          " is outside a rank-" + std::to_string(rank) + " tensor");
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

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

void softmax(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  const bool opset13 = r.opset() >= 13;
  const int axis = axis_of(r.attr_int(n, "axis", opset13 ? -1 : 1), rank, r.where(n));
  if (axis == rank - 1) {
    r.set(n, 0, ag::softmax(r.tape, x));
  } else if (opset13) {
    // Move the axis last, normalise there, move it back.
    std::vector<int> order(static_cast<std::size_t>(rank));
    std::iota(order.begin(), order.end(), 0);
    std::swap(order[static_cast<std::size_t>(axis)], order.back());
    r.set(n, 0, ag::permute(r.tape, ag::softmax(r.tape, ag::permute(r.tape, x, order)), order));
  } else {
    // Before opset 13: the input is read as a matrix [prod(dims < axis), prod(dims >= axis)].
    const Shape& s = x.shape();
    std::int64_t rows =
        std::accumulate(s.begin(), s.begin() + axis, std::int64_t{1}, std::multiplies<>());
    ag::Var flat = ag::reshape(r.tape, x, {rows, shape_numel(s) / std::max<std::int64_t>(rows, 1)});
    r.set(n, 0, ag::reshape(r.tape, ag::softmax(r.tape, flat), s));
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

void reshape(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  std::vector<std::int64_t> target = r.ints(n, 1);
  const bool allow_zero = r.attr_int(n, "allowzero", 0) != 0;
  Shape shape;
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    std::int64_t d = target[i];
    if (d == 0 && !allow_zero) {
      check(i < x.shape().size(), r.where(n) + ": shape entry 0 copies dimension " +
                                      std::to_string(i) + " of a rank-" +
                                      std::to_string(x.shape().size()) + " input");
      d = x.shape()[i];
    }
    if (d == -1) {
      check(infer < 0, r.where(n) + ": more than one -1 in the target shape");
      infer = static_cast<int>(i);
    } else {
      check(d >= 0,
            r.where(n) + ": negative dimension " + std::to_string(d) + " in the target shape");
      known *= d;
    }
    shape.push_back(d);
  }
  if (infer >= 0) {
    check(known > 0 && x.value().numel() % known == 0,
          r.where(n) + ": cannot infer the -1 of the target shape for " + x.value().describe());
    shape[static_cast<std::size_t>(infer)] = x.value().numel() / known;
  }
  check(shape_numel(shape) == x.value().numel(),
        r.where(n) + ": cannot reshape " + x.value().describe() + " to " + shape_str(shape));
  r.set(n, 0, ag::reshape(r.tape, x, shape));
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
  if (r.env.count(n.outputs.at(0)))
    return;  // an initializer alias the model holds as its own parameter
  r.env[n.outputs.at(0)] = r.value(n, 0);
}

// Inference: the identity. Training: inverted dropout with this step's seed.
void dropout(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  double ratio = r.attr_float(n, "ratio", 0.5);
  if (r.has_input(n, 1))
    ratio = r.value(n, 1).host.defined() ? static_cast<double>(r.ints(n, 1).at(0))
                                         : static_cast<double>(r.var(n, 1).value().item());
  // ONNX's training_mode input overrides the run's mode when given.
  const bool training = r.has_input(n, 2) ? r.ints(n, 2).at(0) != 0 : r.options.training;
  if (!training || ratio == 0.0) {
    r.set(n, 0, x);
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) {  // the mask: every element kept
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(x.value().numel()), 1);
      r.set_host(n, 1, Tensor::from_host(x.shape(), DType::u8, keep.data(), cpu::backend()));
    }
    return;
  }
  check(n.outputs.size() < 2 || n.outputs[1].empty(),
        r.where(n) + ": the mask output of dropout in training is not supported yet");
  r.set(n, 0, ag::dropout(r.tape, x, ratio, r.options.dropout_seed, r.node_index));
}

void constant(Runner& r, const io::OnnxNode& n) {
  const auto& attrs = n.attributes;
  Backend& host = cpu::backend();
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

// ---- shape arithmetic on the host -------------------------------------------------
// Exporters compute shapes with Shape, Gather, Slice, Concat and integer arithmetic;
// those values live on the host as i64 tensors.

Tensor host_ints(const Shape& shape, const std::vector<std::int64_t>& values) {
  return Tensor::from_host(shape, DType::i64, values.data(), cpu::backend());
}

bool is_host(const Runner& r, const io::OnnxNode& n, std::size_t i) {
  return r.has_input(n, i) && r.value(n, i).host.defined();
}

// Integer a (op) b with numpy broadcasting of a one-element side; Div truncates as C++.
void host_binary(Runner& r, const io::OnnxNode& n) {
  const Tensor& ta = r.value(n, 0).host;
  const Tensor& tb = r.value(n, 1).host;
  std::vector<std::int64_t> a = r.ints(n, 0), b = r.ints(n, 1);
  check(a.size() == b.size() || a.size() == 1 || b.size() == 1,
        r.where(n) + ": integer operands of " + std::to_string(a.size()) + " and " +
            std::to_string(b.size()) + " values do not broadcast");
  const std::size_t count = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(count);
  for (std::size_t k = 0; k < count; ++k) {
    std::int64_t x = a[a.size() == 1 ? 0 : k], y = b[b.size() == 1 ? 0 : k];
    if (n.op_type == "Add")
      out[k] = x + y;
    else if (n.op_type == "Sub")
      out[k] = x - y;
    else if (n.op_type == "Mul")
      out[k] = x * y;
    else {
      check(y != 0, r.where(n) + ": integer division by zero");
      out[k] = x / y;
    }
  }
  r.set_host(n, 0, host_ints(a.size() >= b.size() ? ta.shape() : tb.shape(), out));
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
  r.set_host(n, 0, host_ints({static_cast<std::int64_t>(dims.size())}, dims));
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
    r.set_host(n, 0, host_ints(indices.shape(), out));
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
      check(i >= -count && i < count,
            r.where(n) + ": index " + std::to_string(i) + " outside " + std::to_string(count));
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
  Tensor id_tensor = Tensor::from_ints(indices.shape(), rows, cpu::backend()).to(r.backend);
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
  ag::Var x = v.var;
  Tensor host = v.host;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    check(steps.empty() || steps[i] == 1,
          r.where(n) + ": slices with a step other than 1 are not supported yet");
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
    r.set_host(n, 0, host.to(cpu::backend()));  // a contiguous copy
}

void unsqueeze(Runner& r, const io::OnnxNode& n) {
  const Value& v = r.value(n, 0);
  const Shape s = v.var.defined() ? v.var.shape() : v.host.shape();
  std::vector<std::int64_t> axes = r.has_input(n, 1) ? r.ints(n, 1) : r.attr_ints(n, "axes");
  const int rank = static_cast<int>(s.size() + axes.size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (std::int64_t a : axes)
    inserted[static_cast<std::size_t>(axis_of(a, rank, r.where(n)))] = true;
  Shape out;
  std::size_t next = 0;
  for (int i = 0; i < rank; ++i)
    out.push_back(inserted[static_cast<std::size_t>(i)] ? 1 : s.at(next++));
  if (v.var.defined())
    r.set(n, 0, ag::reshape(r.tape, v.var, out));
  else
    r.set_host(n, 0, host_ints(out, r.ints(n, 0)));
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
    r.set_host(n, 0, host_ints({static_cast<std::int64_t>(out.size())}, out));
    return;
  }
  std::vector<ag::Var> parts;
  for (std::size_t i = 0; i < n.inputs.size(); ++i)
    parts.push_back(r.var(n, i));
  r.set(n, 0,
        ag::concat(r.tape, parts,
                   axis_of(axis, static_cast<int>(parts[0].shape().size()), r.where(n))));
}

// Float stays float; integers stay integers (as i64) or become a float constant.
void cast(Runner& r, const io::OnnxNode& n) {
  constexpr std::int64_t kFloat = 1, kDouble = 11;
  const std::int64_t to = r.attr_int(n, "to", kFloat);
  const Value& v = r.value(n, 0);
  const bool to_float = to == kFloat || to == kDouble;
  if (v.var.defined()) {
    check(to_float,
          r.where(n) + ": casting a float tensor to an integer type is not supported yet");
    r.set(n, 0, v.var);
  } else if (to_float) {
    std::vector<std::int64_t> ints = r.ints(n, 0);
    std::vector<float> values(ints.begin(), ints.end());
    r.set(n, 0, r.constant(Tensor::from_floats(v.host.shape(), values, cpu::backend())));
  } else {
    r.set_host(n, 0, host_ints(v.host.shape(), r.ints(n, 0)));
  }
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

// x ^ y. A constant exponent that is a small integer is repeated multiplication (exact
// as in every framework, negative bases included); 0.5 is sqrt; anything else is
// e^{y log x}, which needs x > 0.
void pow(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  std::optional<double> constant;
  if (is_host(r, n, 1) && r.value(n, 1).host.numel() == 1)
    constant = static_cast<double>(r.ints(n, 1).at(0));
  else if (!is_host(r, n, 1) && r.var(n, 1).value().numel() == 1 && !r.var(n, 1).requires_grad())
    constant = r.var(n, 1).value().item();
  auto one = [&] {
    return r.constant(Tensor::from_floats({}, std::vector<float>{1.0f}, cpu::backend()));
  };
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
    exponent = r.constant(Tensor::from_floats(r.value(n, 1).host.shape(), v, cpu::backend()));
  } else {
    exponent = r.var(n, 1);
  }
  r.set(n, 0, ag::exp(r.tape, ag::mul(r.tape, exponent, ag::log(r.tape, x))));
}

// ---- convolutional networks --------------------------------------------------------

// All entries of an ints attribute equal to `value` (absent: true).
bool all_equal(std::span<const std::int64_t> values, std::int64_t value) {
  return std::all_of(values.begin(), values.end(), [&](std::int64_t v) { return v == value; });
}

// One stride (and padding) for both spatial dimensions, as the catalog's 2-D ops take.
std::int64_t uniform(const Runner& r, const io::OnnxNode& n, const std::string& name,
                     std::int64_t fallback) {
  std::vector<std::int64_t> v = r.attr_ints(n, name);
  if (v.empty())
    return fallback;
  check(all_equal(v, v[0]),
        r.where(n) + ": " + name + " " + shape_str(v) +
            " must be equal in every dimension (Loom's 2-D operators take one)");
  return v[0];
}

void check_no_dilation(const Runner& r, const io::OnnxNode& n) {
  auto it = n.attributes.find("auto_pad");
  check(it == n.attributes.end() || it->second.s == "NOTSET" || it->second.s == "VALID",
        r.where(n) + ": auto_pad " + (it == n.attributes.end() ? "" : it->second.s) +
            " is not supported yet");
  check(all_equal(r.attr_ints(n, "dilations"), 1),
        r.where(n) + ": dilations other than 1 are not supported yet");
}

// ONNX pads [top, left, bottom, right] of a 2-D window op (absent: none).
std::array<std::int64_t, 4> pads_of(const Runner& r, const io::OnnxNode& n) {
  std::vector<std::int64_t> p = r.attr_ints(n, "pads");
  if (p.empty())
    return {0, 0, 0, 0};
  check(p.size() == 4, r.where(n) + ": pads " + shape_str(p) + " must have 4 entries for 2-D");
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
      return r.constant(Tensor::from_floats(s, values, cpu::backend()));
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
// groups are separate convolutions over channel slices, concatenated.
void conv(Runner& r, const io::OnnxNode& n) {
  ag::Var x = r.var(n, 0);
  const ag::Var& w = r.var(n, 1);
  check(x.shape().size() == 4, r.where(n) + ": only 2-D convolution (NCHW input) is supported yet");
  check_no_dilation(r, n);
  const std::int64_t stride = uniform(r, n, "strides", 1), groups = r.attr_int(n, "group", 1);
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
                cpu::backend()));
  check(groups >= 1 && x.dim(1) % groups == 0 && out_channels % groups == 0 &&
            w.dim(1) * groups == x.dim(1),
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
  return {kernel[0], uniform(r, n, "strides", 1)};
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
  auto [kernel, stride] = pool_window(r, n);
  const ag::Var& x = r.var(n, 0);
  std::array<std::int64_t, 4> pads = with_ceil(r, n, x, pads_of(r, n), kernel, stride);
  ag::Var padded = pad_spatial(r, x, pads, -std::numeric_limits<float>::infinity());
  r.set(n, 0, ag::max_pool2d(r.tape, padded, kernel, stride));
}

// Padding counts as zeros (count_include_pad = 1), or the sum is divided by the number of
// real elements in each window: avg(x padded with 0) / avg(ones padded with 0).
void average_pool(Runner& r, const io::OnnxNode& n) {
  check(r.attr_int(n, "ceil_mode", 0) == 0,
        r.where(n) + ": ceil_mode is not supported yet for AveragePool");
  auto [kernel, stride] = pool_window(r, n);
  const ag::Var& x = r.var(n, 0);
  std::array<std::int64_t, 4> pads = pads_of(r, n);
  ag::Var y = ag::avg_pool2d(r.tape, pad_spatial(r, x, pads, 0.0f), kernel, stride);
  if (r.attr_int(n, "count_include_pad", 0) == 0 && !all_equal(pads, 0)) {
    Shape plane{1, 1, x.dim(2), x.dim(3)};
    ag::Var ones = r.constant(Tensor::from_floats(
        plane, std::vector<float>(static_cast<std::size_t>(shape_numel(plane)), 1.0f),
        cpu::backend()));
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

// Inference form: y = (x - mean) / sqrt(var + eps) * scale + bias, per channel (axis 1).
void batch_normalization(Runner& r, const io::OnnxNode& n) {
  check(r.attr_int(n, "training_mode", 0) == 0 && (n.outputs.size() < 2 || n.outputs[1].empty()),
        r.where(n) +
            ": BatchNormalization in training mode is not supported yet (export in eval mode)");
  const ag::Var& x = r.var(n, 0);
  const int rank = static_cast<int>(x.shape().size());
  check(rank >= 2, r.where(n) + ": the input needs a channel axis");
  Shape per_channel{x.dim(1)};
  for (int d = 2; d < rank; ++d)
    per_channel.push_back(1);  // [C,1,1]: broadcasts over N and the spatial axes
  auto channel = [&](std::size_t i) { return ag::reshape(r.tape, r.var(n, i), per_channel); };
  const double eps = r.attr_float(n, "epsilon", 1e-5);
  ag::Var eps_tensor = r.constant(
      Tensor::from_floats({}, std::vector<float>{static_cast<float>(eps)}, cpu::backend()));
  ag::Var rstd = ag::sqrt(r.tape, ag::add(r.tape, channel(4), eps_tensor));
  ag::Var normed = ag::div(r.tape, ag::sub(r.tape, x, channel(3)), rstd);
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
          {}, std::vector<float>{static_cast<float>(r.attr_float(n, attr, 0))}, cpu::backend()));
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

// ---- more elementwise ------------------------------------------------------------------

ag::Var one_like(Runner& r) {
  return r.constant(Tensor::from_floats({}, std::vector<float>{1.0f}, cpu::backend()));
}

void sigmoid(Runner& r, const io::OnnxNode& n) {  // 1 / (1 + e^{-x})
  ag::Var one = one_like(r);
  r.set(n, 0,
        ag::div(r.tape, one,
                ag::add(r.tape, one, ag::exp(r.tape, ag::scale(r.tape, r.var(n, 0), -1.0)))));
}

void neg(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, ag::scale(r.tape, r.var(n, 0), -1.0));
}

void abs(Runner& r, const io::OnnxNode& n) {  // relu(x) + relu(-x)
  const ag::Var& x = r.var(n, 0);
  r.set(n, 0, ag::add(r.tape, ag::relu(r.tape, x), ag::relu(r.tape, ag::scale(r.tape, x, -1.0))));
}

void reciprocal(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, ag::div(r.tape, one_like(r), r.var(n, 0)));
}

const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table = {
      {"Abs", abs},
      {"Add", arithmetic<ag::add>},
      {"AveragePool", average_pool},
      {"BatchNormalization", batch_normalization},
      {"Clip", clip},
      {"Conv", conv},
      {"GlobalAveragePool", global_average_pool},
      {"MaxPool", max_pool},
      {"Neg", neg},
      {"Reciprocal", reciprocal},
      {"Sigmoid", sigmoid},
      {"Cast", cast},
      {"Concat", concat},
      {"Constant", constant},
      {"Div", arithmetic<ag::div>},
      {"Dropout", dropout},
      {"Erf", unary<ag::erf>},
      {"Exp", unary<ag::exp>},
      {"Flatten", flatten},
      {"Gather", gather},
      {"Gemm", gemm},
      {"Identity", identity},
      {"Log", unary<ag::log>},
      {"MatMul", matmul},
      {"Mul", arithmetic<ag::mul>},
      {"Pow", pow},
      {"ReduceMean", reduce_mean},
      {"Relu", unary<ag::relu>},
      {"Reshape", reshape},
      {"Shape", shape},
      {"Slice", slice},
      {"Softmax", softmax},
      {"Sqrt", unary<ag::sqrt>},
      {"Sub", arithmetic<ag::sub>},
      {"Tanh", unary<ag::tanh>},
      {"Transpose", transpose},
      {"Unsqueeze", unsqueeze},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& onnx_supported_ops() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, fn] : op_table())
      v.push_back(name);
    return v;
  }();
  return names;
}

OnnxModel::OnnxModel(const std::string& path, Backend& backend)
    : graph_(io::read_onnx(path, cpu::backend())), backend_(backend) {
  std::map<std::string, Tensor> floats;
  for (const auto& [name, tensor] : graph_.initializers) {
    if (tensor.dtype() == DType::f32) {
      std::vector<float> values = tensor.to_floats();
      if (!std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); })) {
        // A mask with -inf (attention) is a constant, not something to train.
        float_constants_[name] = ag::Var(tensor.to(backend), false);
        continue;
      }
      floats[name] = tensor;
      param_index_[name] = params_.size();
      params_.push_back(Parameter{name, ag::Var(tensor.to(backend), true), tensor.rank() >= 2});
    } else {
      host_constants_[name] = tensor;
    }
  }
  // Exporters store equal initializers once and name the others through Identity nodes
  // (torch.onnx: LayerNorm biases that all start at zero). They are separate parameters
  // of the model, so each gets its own copy here, and training keeps them apart.
  for (const io::OnnxNode& node : graph_.nodes) {
    if (node.op_type != "Identity" || node.inputs.size() != 1 || node.outputs.size() != 1 ||
        !floats.count(node.inputs[0]) || param_index_.count(node.outputs[0]))
      continue;
    const Tensor& value = floats[node.inputs[0]];
    param_index_[node.outputs[0]] = params_.size();
    params_.push_back(
        Parameter{node.outputs[0], ag::Var(value.to(backend), true), value.rank() >= 2});
    untied_.insert(node.outputs[0]);
  }
  check(!graph_.outputs.empty(), path + ": the graph has no outputs");
}

bool OnnxModel::capturable() const {
  std::set<std::string> integer_inputs;
  for (const io::OnnxValueInfo& in : graph_.inputs)
    if (in.dtype != DType::f32)
      integer_inputs.insert(in.name);
  for (const io::OnnxNode& node : graph_.nodes)
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      if (integer_inputs.count(node.inputs[i]) && !(node.op_type == "Gather" && i == 1) &&
          node.op_type != "Shape")
        return false;  // their values are read on the host
  return true;
}

std::vector<OnnxModel::OpUse> OnnxModel::coverage() const {
  std::vector<OpUse> uses;
  for (const io::OnnxNode& node : graph_.nodes) {
    auto it = std::find_if(uses.begin(), uses.end(),
                           [&](const OpUse& u) { return u.op == node.op_type; });
    if (it == uses.end()) {
      const bool supported = node.domain.empty() && op_table().count(node.op_type) > 0;
      uses.push_back({node.op_type, 0, supported});
      it = uses.end() - 1;
    }
    ++it->count;
  }
  return uses;
}

std::vector<std::pair<ag::Var, Tensor>> OnnxModel::run_graph(ag::Tape& tape,
                                                             const std::vector<Tensor>& inputs,
                                                             const ForwardOptions& options) {
  check(inputs.size() == graph_.inputs.size(), graph_.path + ": the graph takes " +
                                                   std::to_string(graph_.inputs.size()) +
                                                   " inputs, got " + std::to_string(inputs.size()));
  Runner r(graph_, tape, options, backend_);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const io::OnnxValueInfo& info = graph_.inputs[i];
    Tensor given = inputs[i];
    Tensor device_ids;
    if (info.dtype == DType::i64 && given.dtype() == DType::i32) {  // Loom's token ids are i32
      if (&given.backend() == &backend_ && given.is_contiguous())
        device_ids = given;
      std::vector<std::int32_t> ids = given.to_ints();
      std::vector<std::int64_t> wide(ids.begin(), ids.end());
      given = Tensor::from_host(given.shape(), DType::i64, wide.data(), cpu::backend());
    }
    check(given.dtype() == info.dtype, graph_.path + ": input '" + info.name + "' is " +
                                           given.describe() + ", expected " +
                                           std::string(dtype_name(info.dtype)));
    // Dimension 0 is the batch: exporters often fix it at the example's size, and the
    // graph usually computes for any, so it may differ; the others must match.
    bool shape_ok = info.shape.empty() || info.shape.size() == given.shape().size();
    for (std::size_t d = 1; shape_ok && d < info.shape.size(); ++d)
      shape_ok = info.shape[d] < 0 || info.shape[d] == given.shape()[d];
    check(shape_ok, graph_.path + ": input '" + info.name + "' is " + given.describe() +
                        ", the graph declares " + shape_str(info.shape) +
                        " (-1: any; the batch dimension may differ)");
    // Used in place when already on the device: a copy made here would be a tensor that
    // graph capture cannot see being written.
    const bool in_place = &given.backend() == &backend_ && given.is_contiguous();
    if (given.dtype() == DType::f32)
      r.env[info.name] =
          Value{ag::Var(in_place ? given : given.to(backend_), false), Tensor(), Tensor()};
    else
      r.env[info.name] = Value{ag::Var(), given.to(cpu::backend()), device_ids};
  }
  for (const auto& [name, index] : param_index_)
    r.env[name] = Value{params_[index].var, Tensor(), Tensor()};
  for (const auto& [name, tensor] : host_constants_)
    r.env[name] = Value{ag::Var(), tensor, Tensor()};
  for (const auto& [name, var] : float_constants_)
    r.env[name] = Value{var, Tensor(), Tensor()};
  for (const io::OnnxNode& node : graph_.nodes) {
    auto it = op_table().find(node.op_type);
    check(node.domain.empty() && it != op_table().end(),
          r.where(node) + ": ONNX op " + (node.domain.empty() ? "" : node.domain + ".") +
              node.op_type +
              " is not supported by Loom's importer yet (`loom onnx MODEL` lists the model's ops)");
    it->second(r, node);
    ++r.node_index;
  }
  std::vector<std::pair<ag::Var, Tensor>> outputs;
  for (const io::OnnxValueInfo& out : graph_.outputs) {
    auto it = r.env.find(out.name);
    check(it != r.env.end(), graph_.path + ": graph output '" + out.name + "' is never computed");
    outputs.emplace_back(it->second.var, it->second.host);
  }
  return outputs;
}

std::vector<ag::Var> OnnxModel::run(ag::Tape& tape, const std::vector<Tensor>& inputs,
                                    const ForwardOptions& options) {
  std::vector<ag::Var> vars;
  std::size_t k = 0;
  for (auto& [var, host] : run_graph(tape, inputs, options)) {
    check(var.defined(), graph_.path + ": graph output '" + graph_.outputs[k].name +
                             "' is an integer tensor, not something to differentiate");
    vars.push_back(var);
    ++k;
  }
  return vars;
}

std::vector<Tensor> OnnxModel::evaluate(const std::vector<Tensor>& inputs) {
  ag::Tape tape;
  tape.set_recording(false);
  std::vector<Tensor> values;
  for (auto& [var, host] : run_graph(tape, inputs, {}))
    values.push_back(var.defined() ? var.value() : host);
  return values;
}

ag::Var OnnxModel::forward(ag::Tape& tape, const Tensor& inputs, const ForwardOptions& options) {
  ag::Var y = run(tape, {inputs}, options).front();
  // The Model contract: logits [rows, classes] (a language model's [B,T,V] -> [B*T,V]).
  if (y.shape().size() > 2)
    y = ag::reshape(tape, y, {y.value().numel() / y.shape().back(), y.shape().back()});
  return y;
}

namespace {

// Values of an f32/i64/i32/u8 tensor as doubles.
std::vector<double> numbers(const Tensor& t) {
  Tensor h = t.to(cpu::backend());
  std::vector<double> v(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    switch (h.dtype()) {
      case DType::f32:
        v[i] = h.data<float>()[i];
        break;
      case DType::i64:
        v[i] = static_cast<double>(h.data<std::int64_t>()[i]);
        break;
      case DType::i32:
        v[i] = h.data<std::int32_t>()[i];
        break;
      case DType::u8:
        v[i] = h.data<std::uint8_t>()[i];
        break;
      default:
        throw Error("cannot compare a " + std::string(dtype_name(h.dtype())) + " tensor");
    }
  }
  return v;
}

// One ONNX backend test: the model on test_data_set_0's inputs against its outputs, with
// the ONNX runner's default tolerance (rtol 1e-3, atol 1e-7).
}  // namespace

OnnxTestResult run_onnx_backend_test(const std::string& folder, Backend& device) {
  const std::filesystem::path dir(folder);
  OnnxTestResult r{dir.filename().string(), "pass", ""};
  try {
    OnnxModel model((dir / "model.onnx").string(), device);
    for (const auto& use : model.coverage())
      if (!use.supported) {
        r.status = "unsupported";
        r.detail += (r.detail.empty() ? "" : ", ") + use.op;
      }
    if (r.status == "unsupported")
      return r;
    const std::filesystem::path data = dir / "test_data_set_0";
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; std::filesystem::exists(data / ("input_" + std::to_string(i) + ".pb"));
         ++i)
      inputs.push_back(io::read_onnx_tensor(
          (data / ("input_" + std::to_string(i) + ".pb")).string(), cpu::backend()));
    std::vector<Tensor> outputs = model.evaluate(inputs);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      Tensor want = io::read_onnx_tensor((data / ("output_" + std::to_string(k) + ".pb")).string(),
                                         cpu::backend());
      if (outputs[k].shape() != want.shape()) {
        r.status = "fail";
        r.detail = "output " + std::to_string(k) + " is " + shape_str(outputs[k].shape()) +
                   ", expected " + shape_str(want.shape());
        return r;
      }
      std::vector<double> got = numbers(outputs[k]), ref = numbers(want);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const bool same =
            got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));  // inf, nan
        if (!same && !(std::fabs(got[i] - ref[i]) <= 1e-7 + 1e-3 * std::fabs(ref[i]))) {
          r.status = "fail";
          r.detail = "output " + std::to_string(k) + " element " + std::to_string(i) + ": " +
                     std::to_string(got[i]) + ", expected " + std::to_string(ref[i]);
          return r;
        }
      }
    }
  } catch (const std::exception& e) {
    r.status = "error";
    r.detail = e.what();
  }
  return r;
}

}  // namespace loom::nn
