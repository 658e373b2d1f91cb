#include "nn/onnx_model.h"

#include <algorithm>
#include <functional>
#include <numeric>

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
    env[node.outputs[i]] = Value{std::move(v), Tensor()};
  }
  void set_host(const io::OnnxNode& node, std::size_t i, Tensor t) {
    env[node.outputs[i]] = Value{ag::Var(), std::move(t)};
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

template <ag::Var (*F)(ag::Tape&, const ag::Var&, const ag::Var&)>
void binary(Runner& r, const io::OnnxNode& n) {
  r.set(n, 0, F(r.tape, r.var(n, 0), r.var(n, 1)));
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
  check(a.shape().size() >= 2 && b.shape().size() >= 2,
        r.where(n) + ": MatMul of vectors (rank 1) is not supported yet");
  r.set(n, 0, ag::matmul(r.tape, a, b));
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
  r.env[n.outputs.at(0)] = r.value(n, 0);
}

// Inference: the identity. Training: inverted dropout with this step's seed.
void dropout(Runner& r, const io::OnnxNode& n) {
  const ag::Var& x = r.var(n, 0);
  double ratio = r.attr_float(n, "ratio", 0.5);
  if (r.has_input(n, 1))
    ratio = r.value(n, 1).host.defined() ? static_cast<double>(r.ints(n, 1).at(0))
                                         : static_cast<double>(r.var(n, 1).value().item());
  if (!r.options.training || ratio == 0.0) {
    r.set(n, 0, x);
    return;
  }
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

const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table = {
      {"Add", binary<ag::add>}, {"Constant", constant},
      {"Div", binary<ag::div>}, {"Dropout", dropout},
      {"Exp", unary<ag::exp>},  {"Flatten", flatten},
      {"Gemm", gemm},           {"Identity", identity},
      {"Log", unary<ag::log>},  {"MatMul", matmul},
      {"Mul", binary<ag::mul>}, {"Relu", unary<ag::relu>},
      {"Reshape", reshape},     {"Softmax", softmax},
      {"Sub", binary<ag::sub>}, {"Tanh", unary<ag::tanh>},
      {"Transpose", transpose},
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
  for (const auto& [name, tensor] : graph_.initializers) {
    if (tensor.dtype() == DType::f32) {
      param_index_[name] = params_.size();
      params_.push_back(Parameter{name, ag::Var(tensor.to(backend), true), tensor.rank() >= 2});
    } else {
      host_constants_[name] = tensor;
    }
  }
  check(!graph_.inputs.empty(), path + ": the graph has no inputs besides its initializers");
  check(!graph_.outputs.empty(), path + ": the graph has no outputs");
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

std::vector<ag::Var> OnnxModel::run(ag::Tape& tape, const std::vector<Tensor>& inputs,
                                    const ForwardOptions& options) {
  check(inputs.size() == graph_.inputs.size(), graph_.path + ": the graph takes " +
                                                   std::to_string(graph_.inputs.size()) +
                                                   " inputs, got " + std::to_string(inputs.size()));
  Runner r(graph_, tape, options, backend_);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const io::OnnxValueInfo& info = graph_.inputs[i];
    check(inputs[i].dtype() == info.dtype, graph_.path + ": input '" + info.name + "' is " +
                                               inputs[i].describe() + ", expected " +
                                               std::string(dtype_name(info.dtype)));
    // Dimension 0 is the batch: exporters often fix it at the example's size, and the
    // graph usually computes for any, so it may differ; the others must match.
    bool shape_ok = info.shape.empty() || info.shape.size() == inputs[i].shape().size();
    for (std::size_t d = 1; shape_ok && d < info.shape.size(); ++d)
      shape_ok = info.shape[d] < 0 || info.shape[d] == inputs[i].shape()[d];
    check(shape_ok, graph_.path + ": input '" + info.name + "' is " + inputs[i].describe() +
                        ", the graph declares " + shape_str(info.shape) +
                        " (-1: any; the batch dimension may differ)");
    if (inputs[i].dtype() == DType::f32)
      r.env[info.name] = Value{ag::Var(inputs[i].to(backend_), false), Tensor()};
    else
      r.env[info.name] = Value{ag::Var(), inputs[i].to(cpu::backend())};
  }
  for (const auto& [name, index] : param_index_)
    r.env[name] = Value{params_[index].var, Tensor()};
  for (const auto& [name, tensor] : host_constants_)
    r.env[name] = Value{ag::Var(), tensor};
  for (const io::OnnxNode& node : graph_.nodes) {
    auto it = op_table().find(node.op_type);
    check(node.domain.empty() && it != op_table().end(),
          r.where(node) + ": ONNX op " + (node.domain.empty() ? "" : node.domain + ".") +
              node.op_type +
              " is not supported by Loom's importer yet (`loom onnx MODEL` lists the model's ops)");
    it->second(r, node);
    ++r.node_index;
  }
  std::vector<ag::Var> outputs;
  for (const io::OnnxValueInfo& out : graph_.outputs) {
    auto it = r.env.find(out.name);
    check(it != r.env.end() && it->second.var.defined(),
          graph_.path + ": graph output '" + out.name +
              "' is not a float tensor computed by the graph");
    outputs.push_back(it->second.var);
  }
  return outputs;
}

ag::Var OnnxModel::forward(ag::Tape& tape, const Tensor& inputs, const ForwardOptions& options) {
  return run(tape, {inputs}, options).front();
}

}  // namespace loom::nn
