// onnx/runner.h — inside the ONNX importer: the values flowing through a graph and the
// runner each ONNX op's translation reads its inputs from and writes its outputs to.
// model.cpp runs the graph; ops.cpp, shape_ops.cpp, conv_ops.cpp and the other *_ops.cpp
// translate the ops. Not a public header: nothing outside onnx/ includes it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/error.h"
#include "dispatch/dispatch.h"
#include "nn/model.h"
#include "onnx/parser.h"

namespace loom::nn::onnx_import {

namespace ag = loom::autograd;

// A value flowing through the graph: a float tensor as a Var (on the model's device,
// differentiable), or an integer tensor on the host (shapes, axes, indices).
struct Value {
  ag::Var var;
  Tensor host;
  // A graph input of token ids as Loom gave them (i32, on the model's device): an
  // embedding lookup reads them there, with no host copy that graph capture would freeze.
  Tensor device_ids;
  // The ONNX element type a graph input declares (0: not known); CastLike reads it, since
  // narrow types (float16, FP8, INT4) are held widened.
  int onnx_type = 0;
  // The same at every step: computed from constants and shapes alone, not from the graph's
  // inputs or parameters (the causal mask an exporter builds from ones and Trilu). Its
  // values may be read on the host while a graph is captured, since a replay could not see
  // them change.
  bool fixed = false;
};

// An integer (or bool) host tensor's values as int64.
std::vector<std::int64_t> host_values(Backend& host, const Tensor& t);

class Runner {
 public:
  // `backend` runs the graph's float work; `host` holds its integer tensors and shape
  // arithmetic (the CPU: dispatch::host()).
  Runner(const io::OnnxGraph& graph, ag::Tape& tape, const ForwardOptions& options,
         Backend& backend, Backend& host)
      : graph_(graph), tape(tape), options(options), backend(backend), host(host) {}

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
    return host_values(host, v.host);
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
    check(i < node.outputs.size(), where(node) + ": has no output " + std::to_string(i));
    env[node.outputs[i]] = Value{ag::Var(), std::move(t), Tensor()};
  }
  ag::Var constant(const Tensor& host_tensor) { return ag::Var(host_tensor.to(backend), false); }
  ag::Var scalar(float v) {
    return constant(Tensor::from_floats({}, std::span<const float>(&v, 1), host));
  }
  // Input i's shape, float or integer.
  Shape shape_of(const io::OnnxNode& node, std::size_t i) const {
    const Value& v = value(node, i);
    return v.var.defined() ? v.var.shape() : v.host.shape();
  }
  // Input i as a float: a float input as it is, an integer one as a float constant.
  ag::Var as_float(const io::OnnxNode& node, std::size_t i) {
    const Value& v = value(node, i);
    if (v.var.defined())
      return v.var;
    std::vector<std::int64_t> values = ints(node, i);
    std::vector<float> f(values.begin(), values.end());
    return constant(Tensor::from_floats(v.host.shape(), f, host));
  }
  // A device tensor's values, read on the host (for results that have no gradient and
  // feed host computations: comparisons, ArgMax, Range's limits). Refused while a graph is
  // captured, since a replay would repeat this step's values, unless the node's inputs are
  // fixed (the same at every step).
  Tensor read_on_host(const io::OnnxNode& node, const Tensor& t) const {
    check(!dispatch::recording() || fixed_inputs(node),
          where(node) +
              ": reads a device tensor's values on the host, which a captured graph "
              "would freeze at this step's values (run this model in eager mode)");
    return t.to(host);
  }
  // Float input i's values on the host (an op's setting: Pad's value, Resize's scales).
  // Refused while a graph is captured unless the input is fixed.
  Tensor input_on_host(const io::OnnxNode& node, std::size_t i) {
    check(!dispatch::recording() || value(node, i).fixed,
          where(node) + ": reads input '" + node.inputs[i] +
              "' on the host, which a captured graph would freeze at this step's values, and "
              "the input may change between steps (run this model in eager mode)");
    return as_float(node, i).value().to(host);
  }
  std::int64_t opset() const { return graph_.opset; }
  // Whether every input the node is given is fixed (see Value::fixed).
  bool fixed_inputs(const io::OnnxNode& node) const {
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      if (has_input(node, i) && !value(node, i).fixed)
        return false;
    return true;
  }

  const io::OnnxGraph& graph_;
  ag::Tape& tape;
  const ForwardOptions& options;
  Backend& backend;
  Backend& host;
  std::map<std::string, Value> env;
  std::size_t node_index = 0;  // counts every node run, subgraphs' too (dropout sites)
  // Node executions left to this run of the graph, shared with its subgraphs: a file whose
  // loops would run without end, or nest into billions of iterations, stops with an error.
  std::int64_t node_budget = std::int64_t{1} << 22, node_limit = std::int64_t{1} << 22;
};

// One ONNX op's translation into autograd calls.
using OpFn = std::function<void(Runner& r, const io::OnnxNode& node)>;
using OpTable = std::map<std::string, OpFn>;

// Each file's ops, added to `table` under their ONNX names.
void add_tensor_ops(OpTable& table);     // ops.cpp: arithmetic, matmul, softmax, views, ...
void add_shape_ops(OpTable& table);      // shape_ops.cpp: host shape arithmetic, gather, slice, ...
void add_conv_ops(OpTable& table);       // conv_ops.cpp: convolution, pooling, normalisation
void add_logic_ops(OpTable& table);      // logic_ops.cpp: comparisons, logic, Where, Max, Min
void add_reduce_ops(OpTable& table);     // reduce_ops.cpp: reductions, norms, losses
void add_attention_ops(OpTable& table);  // attention_ops.cpp: Attention, TopK, OneHot
void add_resize_ops(OpTable& table);     // resize_ops.cpp: Resize, CumSum, BitShift
void add_window_ops(OpTable& table);     // window_ops.cpp: ConvTranspose, LpPool
// Convolution and pooling of any rank, stride, dilation and padding (window_ops.cpp);
// Conv, MaxPool and AveragePool use them where the catalog's 2-D ops do not fit.
void general_conv(Runner& r, const io::OnnxNode& n);
void general_pool(Runner& r, const io::OnnxNode& n);
void add_layout_ops(OpTable& table);   // layout_ops.cpp: Split, Pad, Range, activations
void add_control_ops(OpTable& table);  // control_ops.cpp: If, Loop, Scan
void add_index_ops(OpTable& table);    // index_ops.cpp: Scatter*, GatherND, GroupNorm, Einsum
// Runs op f, when input 0 is an integer host tensor, with the integer host tensors among
// `inputs` held as f32 values (|v| <= 2^23, so sums of two stay exact; else a named error), and
// gives f's float outputs back as integers of input 0's type (rounded to the nearest;
// logic_ops.cpp). With a float input 0, f runs as it is.
void through_floats(Runner& r, const io::OnnxNode& n, const OpFn& f,
                    const std::vector<std::size_t>& inputs);
// Runs `nodes` in order on r (model.cpp): each op's translation, then the fixedness
// of its outputs (Value::fixed).
void run_nodes(Runner& r, const std::vector<io::OnnxNode>& nodes);

inline int axis_of(std::int64_t axis, int rank, const std::string& where) {
  check(axis >= -rank && axis < rank, where + ": axis " + std::to_string(axis) +
                                          " is outside a rank-" + std::to_string(rank) + " tensor");
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

// An i64 tensor on the host.
inline Tensor host_ints(Backend& host, const Shape& shape,
                        const std::vector<std::int64_t>& values) {
  return Tensor::from_host(shape, DType::i64, values.data(), host);
}

// A host tensor of `dtype` (u8 for booleans, i64 otherwise) holding `values`.
inline Tensor host_tensor(Backend& host, const Shape& shape,
                          const std::vector<std::int64_t>& values, DType dtype) {
  if (dtype != DType::u8)
    return host_ints(host, shape, values);
  std::vector<std::uint8_t> bytes(values.begin(), values.end());
  return Tensor::from_host(shape, DType::u8, bytes.data(), host);
}

// out[i] = f(a[i], b[i]) over host integer tensors with numpy broadcasting, as `dtype`
// (i64, or u8 for a boolean result), on the host that holds `a`.
Tensor host_broadcast(const Tensor& a, const Tensor& b, DType dtype,
                      std::int64_t (*f)(std::int64_t, std::int64_t), const std::string& where);

// The elements of x at linear positions, shaped `out`: one embedding lookup of x read as a
// column, so the gradient scatters back to the positions taken (onnx_attention_ops.cpp).
ag::Var pick_elements(Runner& r, const ag::Var& x, const std::vector<std::int32_t>& linear,
                      const Shape& out);

// The linear index into `data` of every element that GatherElements, TopK and the like
// pick (ScatterElements writes): index[e] along `axis`, the other coordinates those of
// element e of a tensor shaped `out` (onnx_attention_ops.cpp).
std::vector<std::int32_t> linear_indices(const Shape& data, const Shape& out,
                                         const std::vector<std::int64_t>& index, int axis,
                                         const std::string& where);

// |x| = relu(x) + relu(-x), differentiable (onnx_logic_ops.cpp).
ag::Var absolute(Runner& r, const ag::Var& x);
// A u8 tensor on x's device: 1 where a (how) b holds; a and b broadcast (onnx_logic_ops.cpp).
Tensor compare_on_device(const Tensor& a, const Tensor& b, Comparison how);

// Whether input i is an integer tensor on the host.
inline bool is_host(const Runner& r, const io::OnnxNode& n, std::size_t i) {
  return r.has_input(n, i) && r.value(n, i).host.defined();
}

}  // namespace loom::nn::onnx_import
