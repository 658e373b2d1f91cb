#include "onnx/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "autograd/functions.h"
#include "core/error.h"
#include "onnx/runner.h"

namespace loom::nn {

namespace ag = loom::autograd;

namespace {

using onnx_import::OpTable;
using onnx_import::Runner;
using onnx_import::Value;

const OpTable& op_table() {
  static const OpTable table = [] {
    OpTable t;
    onnx_import::add_tensor_ops(t);
    onnx_import::add_shape_ops(t);
    onnx_import::add_conv_ops(t);
    onnx_import::add_logic_ops(t);
    onnx_import::add_reduce_ops(t);
    onnx_import::add_layout_ops(t);
    onnx_import::add_attention_ops(t);
    onnx_import::add_resize_ops(t);
    onnx_import::add_window_ops(t);
    onnx_import::add_control_ops(t);
    onnx_import::add_index_ops(t);
    // Ops defined on integers too, whose float translation gives the same values when
    // every integer is exact in f32: an integer data input goes through it (Clip, Pad,
    // MaxPool, TopK, ReduceMax of int8/uint8/int64/bool, Split of shape values). Pow of
    // integers is computed on the host (shape_ops.cpp).
    const std::vector<std::pair<const char*, std::vector<std::size_t>>> integer_ops{
        {"Clip", {0, 1, 2}}, {"Pad", {0}},       {"MaxPool", {0}}, {"TopK", {0}},
        {"ReduceMax", {0}},  {"ReduceMin", {0}}, {"Split", {0}}};
    for (const auto& [name, inputs] : integer_ops)
      t[name] = [f = t.at(name), inputs = inputs](Runner& r, const io::OnnxNode& n) {
        onnx_import::through_floats(r, n, f, inputs);
      };
    return t;
  }();
  return table;
}

}  // namespace

namespace onnx_import {

void run_nodes(Runner& r, const std::vector<io::OnnxNode>& nodes) {
  for (const io::OnnxNode& node : nodes) {
    auto it = op_table().find(node.op_type);
    check(node.domain.empty() && it != op_table().end(),
          r.where(node) + ": ONNX op " + (node.domain.empty() ? "" : node.domain + ".") +
              node.op_type +
              " is not supported by Loom's importer yet (`loom onnx MODEL` lists the model's ops)");
    check(--r.node_budget >= 0,
          r.where(node) + ": the graph ran more than " + std::to_string(r.node_limit) +
              " nodes, its loops' iterations included (OnnxModel::set_node_limit)");
    // A shape is the same at every step of a captured graph (capture fixes the shapes), so
    // Shape's and Size's results are fixed whatever they read. Dropout draws a new mask
    // each step, and a node with a subgraph reads values its inputs do not list: neither
    // is fixed.
    bool has_subgraph = false;
    for (const auto& [name, a] : node.attributes)
      has_subgraph = has_subgraph || a.kind == io::OnnxAttribute::Kind::graph;
    const bool fixed = node.op_type == "Shape" || node.op_type == "Size" ||
                       (node.op_type != "Dropout" && !has_subgraph && r.fixed_inputs(node));
    it->second(r, node);
    for (const std::string& out : node.outputs)
      if (auto v = r.env.find(out); v != r.env.end())
        v->second.fixed = fixed;
    ++r.node_index;
  }
}

}  // namespace onnx_import

const std::vector<std::string>& onnx_supported_ops() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, fn] : op_table())
      v.push_back(name);
    return v;
  }();
  return names;
}

namespace {

// Inputs that are an op's settings, not data a gradient reaches: Resize's roi and scales,
// Upsample's scales, Pad's value, Range's limits, Clip's bounds, Dropout's ratio, Pow's
// exponent, the quantisation scale and zero point, BatchNormalization's running mean and
// variance (PyTorch's buffers: in the
// inference form they stay as imported, as when a model is fine-tuned with BatchNorm in
// eval mode; the training form computes the updated ones as outputs).
bool setting_input(const std::string& op, std::size_t input) {
  if (op == "Resize")
    return input == 1 || input == 2;
  if (op == "Upsample" || op == "Dropout")
    return input == 1;
  if (op == "Pad")
    return input == 2;
  if (op == "Range")
    return true;
  if (op == "Clip")
    return input == 1 || input == 2;
  if (op == "Pow")  // the exponent: a learnable power is not what exporters write
    return input == 1;
  if (op == "BatchNormalization")  // the running statistics: buffers, not trained
    return input == 3 || input == 4;
  if (op == "DequantizeLinear" || op == "QuantizeLinear")  // the scale and zero point
    return input == 1 || input == 2;
  return false;
}

// A rank-0 initializer that PyTorch's dynamo exporter made from a literal of the model's
// code (GELU's 0.044715, sqrt(2/pi)): it names them val_N, where a module's parameters,
// scalar ones too (CLIP's logit_scale), keep their module path. The TorchScript exporter
// writes such literals as Constant nodes instead.
bool exporter_literal(const std::string& name, const Tensor& tensor) {
  if (tensor.rank() != 0)
    return false;
  std::size_t digits = name.rfind("val_", 0) == 0 ? 4 : name.rfind("_val_", 0) == 0 ? 5 : 0;
  return digits > 0 && name.size() > digits &&
         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(digits), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

OnnxModel::OnnxModel(const std::string& path, Backend& backend, Backend& host)
    : graph_(io::read_onnx(path, host)), backend_(backend), host_(host) {
  // Initializers some node reads as data (the others are only settings, constants).
  // Subgraphs (If's branches, Loop's body) may read them by name too.
  std::set<std::string> data_inputs;
  auto collect = [&](const std::vector<io::OnnxNode>& nodes, auto& self) -> void {
    for (const io::OnnxNode& node : nodes) {
      for (std::size_t i = 0; i < node.inputs.size(); ++i)
        if (!setting_input(node.op_type, i))
          data_inputs.insert(node.inputs[i]);
      for (const auto& [name, a] : node.attributes)
        if (a.kind == io::OnnxAttribute::Kind::graph && a.graph != nullptr)
          self(a.graph->nodes, self);
    }
  };
  collect(graph_.nodes, collect);
  std::map<std::string, Tensor> floats;
  for (const auto& [name, tensor] : graph_.initializers) {
    if (tensor.dtype() == DType::f32) {
      std::vector<float> values = tensor.to_floats();
      if (!std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); }) ||
          !data_inputs.count(name) || exporter_literal(name, tensor)) {
        // A mask with -inf (attention) is a constant, not something to train; so is an
        // op's setting (Resize's scales, Clip's bounds, Pow's exponent), and so is a literal
        // of the exported code (exporter_literal).
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
  return capture_refusal().empty();
}

std::string OnnxModel::capture_refusal() const {
  std::set<std::string> integer_inputs;
  for (const io::OnnxValueInfo& in : graph_.inputs)
    if (in.dtype != DType::f32)
      integer_inputs.insert(in.name);
  for (const io::OnnxNode& node : graph_.nodes) {
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      if (integer_inputs.count(node.inputs[i]) && !(node.op_type == "Gather" && i == 1) &&
          node.op_type != "Shape")
        return "node '" + node.name + "' (" + node.op_type + ") reads the integer input '" +
               node.inputs[i] + "' on the host, which a captured step cannot replay";
    for (const auto& [name, a] : node.attributes)
      if (a.kind == io::OnnxAttribute::Kind::graph)
        return "node '" + node.name + "' (" + node.op_type + ") runs a subgraph ('" + name +
               "'), which graph mode does not capture yet";
  }
  return "";
}

std::vector<OnnxModel::OpUse> OnnxModel::coverage() const {
  std::vector<OpUse> uses;
  // The nodes of the graph and of its subgraphs (If's branches, Loop's and Scan's bodies).
  auto count = [&](const std::vector<io::OnnxNode>& nodes, auto& self) -> void {
    for (const io::OnnxNode& node : nodes) {
      auto it = std::find_if(uses.begin(), uses.end(),
                             [&](const OpUse& u) { return u.op == node.op_type; });
      if (it == uses.end()) {
        const bool supported = node.domain.empty() && op_table().count(node.op_type) > 0;
        uses.push_back({node.op_type, 0, supported});
        it = uses.end() - 1;
      }
      ++it->count;
      for (const auto& [name, a] : node.attributes)
        if (a.kind == io::OnnxAttribute::Kind::graph && a.graph != nullptr)
          self(a.graph->nodes, self);
    }
  };
  count(graph_.nodes, count);
  return uses;
}

std::vector<std::pair<ag::Var, Tensor>> OnnxModel::run_graph(ag::Tape& tape,
                                                             const std::vector<Tensor>& inputs,
                                                             const ForwardOptions& options) {
  check(inputs.size() == graph_.inputs.size(), graph_.path + ": the graph takes " +
                                                   std::to_string(graph_.inputs.size()) +
                                                   " inputs, got " + std::to_string(inputs.size()));
  Runner r(graph_, tape, options, backend_, host_);
  r.node_limit = r.node_budget = node_limit_;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const io::OnnxValueInfo& info = graph_.inputs[i];
    Tensor given = inputs[i];
    Tensor device_ids;
    if (info.dtype == DType::i64 && given.dtype() == DType::i32) {  // Loom's token ids are i32
      if (&given.backend() == &backend_ && given.is_contiguous())
        device_ids = given;
      std::vector<std::int32_t> ids = given.to_ints();
      std::vector<std::int64_t> wide(ids.begin(), ids.end());
      given = Tensor::from_host(given.shape(), DType::i64, wide.data(), host_);
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
      r.env[info.name] = Value{ag::Var(), given.to(host_), device_ids};
    r.env[info.name].onnx_type = info.onnx_type;
  }
  for (const auto& [name, index] : param_index_)
    r.env[name] = Value{params_[index].var, Tensor(), Tensor()};
  for (const auto& [name, tensor] : host_constants_)
    r.env[name] = Value{ag::Var(), tensor, Tensor()};
  for (const auto& [name, var] : float_constants_)
    r.env[name] = Value{var, Tensor(), Tensor()};
  for (const auto& [name, tensor] : host_constants_)
    r.env[name].fixed = true;
  for (const auto& [name, var] : float_constants_)
    r.env[name].fixed = true;
  onnx_import::run_nodes(r, graph_.nodes);
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
  // The rows are the product of the leading dimensions, not numel / V, which divides by
  // zero when V is 0.
  if (y.shape().size() > 2) {
    const Shape& s = y.shape();
    y = ag::reshape(tape, y, {shape_numel(Shape(s.begin(), s.end() - 1)), s.back()});
  }
  return y;
}

namespace {

// Values of an f32/i64/i32/u8 tensor as doubles.
std::vector<double> numbers(Backend& host, const Tensor& t) {
  Tensor h = t.to(host);
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

OutputError output_error(const Tensor& got_tensor, const Tensor& want, double atol, double rtol) {
  check(got_tensor.shape() == want.shape(), "output_error: shapes " +
                                                shape_str(got_tensor.shape()) + " and " +
                                                shape_str(want.shape()) + " differ");
  const std::vector<float> got = got_tensor.to_floats(), ref = want.to_floats();
  OutputError e;
  double worst_ratio = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const bool same = got[k] == ref[k] || (std::isnan(got[k]) && std::isnan(ref[k]));
    double diff = same ? 0.0 : std::fabs(static_cast<double>(got[k]) - ref[k]);
    if (std::isnan(diff))
      diff = std::numeric_limits<double>::infinity();
    e.max_abs = std::max(e.max_abs, diff);
    const double bound = atol + rtol * std::fabs(ref[k]);
    const double ratio = diff == 0 ? 0.0 : diff / bound;
    worst_ratio =
        std::max(worst_ratio, std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio);
  }
  e.within_tolerance = worst_ratio <= 1.0;
  return e;
}

OnnxTestResult run_onnx_backend_test(const std::string& folder, Backend& device, Backend& host) {
  const std::filesystem::path dir(folder);
  OnnxTestResult r{dir.filename().string(), "pass", ""};
  try {
    OnnxModel model((dir / "model.onnx").string(), device, host);
    for (const auto& use : model.coverage())
      if (!use.supported) {
        r.status = "unsupported";
        r.detail += (r.detail.empty() ? "" : ", ") + use.op;
      }
    if (r.status == "unsupported")
      return r;
    // Ops whose reference outputs come from numpy's random generator.
    bool random = false;
    for (const io::OnnxNode& node : model.graph().nodes)
      random = random || (node.op_type == "Dropout" && node.inputs.size() > 2) ||
               node.op_type == "Bernoulli" || node.op_type == "Multinomial" ||
               node.op_type.rfind("Random", 0) == 0;
    const std::filesystem::path data = dir / "test_data_set_0";
    std::vector<Tensor> inputs;
    for (std::size_t i = 0; std::filesystem::exists(data / ("input_" + std::to_string(i) + ".pb"));
         ++i)
      inputs.push_back(
          io::read_onnx_tensor((data / ("input_" + std::to_string(i) + ".pb")).string(), host));
    std::vector<Tensor> outputs = model.evaluate(inputs);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      Tensor want =
          io::read_onnx_tensor((data / ("output_" + std::to_string(k) + ".pb")).string(), host);
      if (outputs[k].shape() != want.shape()) {
        r.status = "fail";
        r.detail = "output " + std::to_string(k) + " is " + shape_str(outputs[k].shape()) +
                   ", expected " + shape_str(want.shape());
        return r;
      }
      std::vector<double> got = numbers(host, outputs[k]), ref = numbers(host, want);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const bool same =
            got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));  // inf, nan
        // An infinity matches only itself: against one, the tolerance below is infinite
        // too (|x - inf| <= 1e-3 * inf holds for every finite x).
        const bool infinite = std::isinf(got[i]) || std::isinf(ref[i]);
        if (!same &&
            (infinite || !(std::fabs(got[i] - ref[i]) <= 1e-7 + 1e-3 * std::fabs(ref[i])))) {
          r.status = random ? "random" : "fail";
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
