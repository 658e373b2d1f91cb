// ONNX control flow: If, Loop and Scan, run eagerly. A subgraph runs on a Runner of its
// own that sees every value of the enclosing scope (ONNX lets a body read them by name),
// its own initializers as constants, and the values the op binds to its inputs. The tape
// records the subgraph's calls like any others, so gradients flow through the branch
// taken and through every iteration. The condition and trip count are host values; a
// graph with control flow is not captured (OnnxModel::capturable says so). Every node a
// subgraph runs counts against the graph's one budget of node executions (Runner), so no
// file can loop without end.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "onnx/runner.h"

namespace loom::nn::onnx_import {

namespace {

const io::OnnxGraph& subgraph(const Runner& r, const io::OnnxNode& n, const std::string& name) {
  auto it = n.attributes.find(name);
  check(it != n.attributes.end() && it->second.kind == io::OnnxAttribute::Kind::graph &&
            it->second.graph != nullptr,
        r.where(n) + ": needs the graph attribute '" + name + "'");
  return *it->second.graph;
}

// Runs `body` with `inputs` bound to its inputs, in a scope that sees r's values; returns
// its outputs.
std::vector<Value> run_subgraph(Runner& r, const io::OnnxNode& n, const io::OnnxGraph& body,
                                const std::vector<Value>& inputs) {
  check(inputs.size() == body.inputs.size(),
        body.path + ": the body takes " + std::to_string(body.inputs.size()) + " inputs, " +
            r.where(n) + " gives it " + std::to_string(inputs.size()));
  Runner inner(body, r.tape, r.options, r.backend, r.host);
  inner.env = r.env;
  // One count of nodes run and one budget for the whole graph: dropout sites stay distinct
  // across iterations, and nested loops cannot multiply their way past the budget.
  inner.node_index = r.node_index;
  inner.node_budget = r.node_budget;
  inner.node_limit = r.node_limit;
  for (const auto& [name, tensor] : body.initializers) {
    Value v;
    if (tensor.dtype() == DType::f32)
      v.var = inner.constant(tensor);
    else
      v.host = tensor;
    v.fixed = true;
    inner.env[name] = std::move(v);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i)
    inner.env[body.inputs[i].name] = inputs[i];
  run_nodes(inner, body.nodes);
  r.node_index = inner.node_index;
  r.node_budget = inner.node_budget;
  std::vector<Value> outputs;
  for (const io::OnnxValueInfo& out : body.outputs) {
    auto it = inner.env.find(out.name);
    check(it != inner.env.end(), body.path + ": output '" + out.name + "' is never computed");
    outputs.push_back(it->second);
  }
  return outputs;
}

Value host_scalar(Backend& host, std::int64_t v, DType dtype) {
  Value out;
  out.host = host_tensor(host, {}, {dtype == DType::u8 ? std::int64_t{v != 0} : v}, dtype);
  return out;
}

// A boolean (or integer) value's truth: a host scalar, or a float one read on the host.
bool truth(Runner& r, const io::OnnxNode& n, const Value& v, const std::string& what) {
  if (v.host.defined()) {
    check(v.host.numel() == 1,
          r.where(n) + ": " + what + " must hold one value, got " + shape_str(v.host.shape()));
    return host_values(r.host, v.host).front() != 0;
  }
  check(v.var.defined() && v.var.value().numel() == 1,
        r.where(n) + ": " + what + " must be a scalar");
  return r.read_on_host(n, v.var.value()).to_floats().front() != 0.0f;
}

// Host tensor t with one more axis of size 1 at `axis`, and t's elements at `index` of
// `axis` without that axis: the stacking and slicing of Loop's and Scan's host values.
Tensor host_take(Backend& host, const Tensor& t, int axis, std::int64_t index) {
  const Shape& s = t.shape();
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d)
    outer *= s[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < s.size(); ++d)
    inner *= s[d];
  const std::int64_t len = s[static_cast<std::size_t>(axis)];
  const std::vector<std::int64_t> all = host_values(host, t);
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(outer * inner));
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t i = 0; i < inner; ++i)
      out.push_back(all[static_cast<std::size_t>((o * len + index) * inner + i)]);
  Shape shape = s;
  shape.erase(shape.begin() + axis);
  return host_tensor(host, shape, out, t.dtype());
}

// The values of one scan output over the iterations, stacked along a new `axis` (all
// float or all host; each iteration's the same shape).
Value stack(Runner& r, const io::OnnxNode& n, const std::vector<Value>& parts, std::int64_t axis,
            const io::OnnxValueInfo& declared, const std::string& what) {
  if (parts.empty()) {
    // No iteration ran (a trip count of 0, a condition false from the start): an empty
    // tensor, shaped as the body declares its element with 0 along the new axis.
    bool known = !declared.shape.empty() || declared.onnx_type != 0;
    for (std::int64_t d : declared.shape)
      known = known && d >= 0;
    check(known, r.where(n) + ": " + what +
                     " ran no iteration, and the body does not declare "
                     "the shape of '" +
                     declared.name + "' to make it empty");
    Shape shape(declared.shape.begin(), declared.shape.end());
    shape.insert(shape.begin() + axis_of(axis, static_cast<int>(shape.size()) + 1, r.where(n)), 0);
    Value out;
    if (declared.dtype == DType::f32)
      out.var = r.constant(Tensor::from_floats(shape, std::vector<float>{}, r.host));
    else
      out.host = host_tensor(r.host, shape, {}, declared.dtype);
    return out;
  }
  const bool on_host = parts.front().host.defined();
  const Shape& one = on_host ? parts.front().host.shape() : parts.front().var.shape();
  const int rank = static_cast<int>(one.size()) + 1;
  const int at = axis_of(axis, rank, r.where(n));
  Shape with_axis = one;
  with_axis.insert(with_axis.begin() + at, 1);
  for (const Value& p : parts)
    check(p.host.defined() == on_host && (on_host ? p.host.shape() : p.var.shape()) == one,
          r.where(n) + ": " + what + " changes its shape or type between iterations (" +
              shape_str(one) + " first)");
  Value out;
  if (!on_host) {
    std::vector<ag::Var> pieces;
    for (const Value& p : parts)
      pieces.push_back(ag::reshape(r.tape, p.var, with_axis));
    out.var = pieces.size() == 1 ? pieces.front() : ag::concat(r.tape, pieces, at);
    return out;
  }
  // Host: element (outer, k, inner) of the result is element (outer, inner) of part k.
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < at; ++d)
    outer *= one[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(at); d < one.size(); ++d)
    inner *= one[d];
  std::vector<std::vector<std::int64_t>> values;
  for (const Value& p : parts)
    values.push_back(host_values(r.host, p.host));
  std::vector<std::int64_t> all;
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& v : values)
      for (std::int64_t i = 0; i < inner; ++i)
        all.push_back(v[static_cast<std::size_t>(o * inner + i)]);
  Shape shape = one;
  shape.insert(shape.begin() + at, static_cast<std::int64_t>(parts.size()));
  out.host = host_tensor(r.host, shape, all, parts.front().host.dtype());
  return out;
}

// If(cond): the outputs of then_branch or else_branch.
void if_op(Runner& r, const io::OnnxNode& n) {
  const bool taken = truth(r, n, r.value(n, 0), "the condition");
  const io::OnnxGraph& branch = subgraph(r, n, taken ? "then_branch" : "else_branch");
  std::vector<Value> outputs = run_subgraph(r, n, branch, {});
  check(outputs.size() == n.outputs.size(),
        r.where(n) + ": the branch has " + std::to_string(outputs.size()) + " outputs, the node " +
            std::to_string(n.outputs.size()));
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (!n.outputs[i].empty())
      r.env[n.outputs[i]] = outputs[i];
}

// Loop(M, cond, v...): while i < M and cond, (cond, v..., scan...) = body(i, cond, v...);
// the outputs are the final v... and each scan value stacked over the iterations.
void loop(Runner& r, const io::OnnxNode& n) {
  const io::OnnxGraph& body = subgraph(r, n, "body");
  std::int64_t trips = std::numeric_limits<std::int64_t>::max();
  if (r.has_input(n, 0))
    trips = r.ints(n, 0).at(0);
  bool go = r.has_input(n, 1) ? truth(r, n, r.value(n, 1), "the condition") : true;
  const DType cond_type =
      r.has_input(n, 1) && r.value(n, 1).host.defined() ? r.value(n, 1).host.dtype() : DType::u8;
  std::vector<Value> carried;
  for (std::size_t i = 2; i < n.inputs.size(); ++i)
    carried.push_back(r.value(n, i));
  check(body.outputs.size() >= 1 + carried.size(),
        r.where(n) + ": the body gives " + std::to_string(body.outputs.size()) +
            " outputs, fewer than the condition and " + std::to_string(carried.size()) +
            " loop-carried values");
  const std::size_t scans = body.outputs.size() - 1 - carried.size();
  check(n.outputs.size() <= carried.size() + scans,
        r.where(n) + ": has more outputs than the body's loop-carried and scan values");
  std::vector<std::vector<Value>> scanned(scans);
  for (std::int64_t i = 0; i < trips && go; ++i) {
    std::vector<Value> in{host_scalar(r.host, i, DType::i64),
                          host_scalar(r.host, go ? 1 : 0, cond_type)};
    in.insert(in.end(), carried.begin(), carried.end());
    std::vector<Value> out = run_subgraph(r, n, body, in);
    go = truth(r, n, out[0], "the body's condition");
    std::copy(out.begin() + 1, out.begin() + 1 + static_cast<std::ptrdiff_t>(carried.size()),
              carried.begin());
    for (std::size_t k = 0; k < scans; ++k)
      scanned[k].push_back(out[1 + carried.size() + k]);
  }
  for (std::size_t k = 0; k < carried.size() && k < n.outputs.size(); ++k)
    if (!n.outputs[k].empty())
      r.env[n.outputs[k]] = carried[k];
  for (std::size_t k = 0; k < scans && carried.size() + k < n.outputs.size(); ++k)
    if (!n.outputs[carried.size() + k].empty())
      r.env[n.outputs[carried.size() + k]] =
          stack(r, n, scanned[k], 0, body.outputs[1 + carried.size() + k],
                "scan output " + std::to_string(k));
}

// Scan (opset 9 on): state... and scan inputs sliced along their axes, one element per
// iteration, forward or reversed; (state..., scan outputs...) = body(state..., slices...).
void scan(Runner& r, const io::OnnxNode& n) {
  check(r.opset() >= 9, r.where(n) + ": Scan of opset " + std::to_string(r.opset()) +
                            " (with a batch axis and sequence_lens) is not supported; opset 9 "
                            "and later are");
  const io::OnnxGraph& body = subgraph(r, n, "body");
  const std::int64_t num_scan = r.attr_int(n, "num_scan_inputs", -1);
  check(num_scan >= 1 && static_cast<std::size_t>(num_scan) <= n.inputs.size(),
        r.where(n) + ": num_scan_inputs " + std::to_string(num_scan) + " does not fit its " +
            std::to_string(n.inputs.size()) + " inputs");
  const std::size_t states = n.inputs.size() - static_cast<std::size_t>(num_scan);
  auto per_input = [&](const char* name, std::size_t count) {
    std::vector<std::int64_t> v = r.attr_ints(n, name);
    if (v.empty())
      v.assign(count, 0);
    check(v.size() == count, r.where(n) + ": " + name + " has " + std::to_string(v.size()) +
                                 " entries for " + std::to_string(count) + " values");
    return v;
  };
  const std::vector<std::int64_t> in_axes = per_input("scan_input_axes", num_scan);
  const std::vector<std::int64_t> in_dirs = per_input("scan_input_directions", num_scan);
  check(body.outputs.size() >= states, r.where(n) + ": the body gives fewer outputs than the " +
                                           std::to_string(states) + " state values");
  const std::size_t scan_outs = body.outputs.size() - states;
  const std::vector<std::int64_t> out_axes = per_input("scan_output_axes", scan_outs);
  const std::vector<std::int64_t> out_dirs = per_input("scan_output_directions", scan_outs);
  std::vector<Value> state;
  for (std::size_t i = 0; i < states; ++i)
    state.push_back(r.value(n, i));
  // Each scan input's axis and length; all lengths agree.
  std::vector<int> axes;
  std::int64_t length = -1;
  for (std::size_t k = 0; k < static_cast<std::size_t>(num_scan); ++k) {
    const Shape shape = r.shape_of(n, states + k);
    const int axis = axis_of(in_axes[k], static_cast<int>(shape.size()), r.where(n));
    axes.push_back(axis);
    const std::int64_t len = shape[static_cast<std::size_t>(axis)];
    check(length < 0 || len == length, r.where(n) + ": scan inputs have lengths " +
                                           std::to_string(length) + " and " + std::to_string(len));
    length = len;
  }
  std::vector<std::vector<Value>> scanned(scan_outs);
  for (std::int64_t t = 0; t < length; ++t) {
    std::vector<Value> in = state;
    for (std::size_t k = 0; k < axes.size(); ++k) {
      const std::int64_t at = in_dirs[k] != 0 ? length - 1 - t : t;
      const Value& whole = r.value(n, states + k);
      Value slice;
      if (whole.host.defined()) {
        slice.host = host_take(r.host, whole.host, axes[k], at);
      } else {
        Shape without = whole.var.shape();
        without.erase(without.begin() + axes[k]);
        slice.var = ag::reshape(r.tape, ag::slice(r.tape, whole.var, axes[k], at, at + 1), without);
      }
      in.push_back(slice);
    }
    std::vector<Value> out = run_subgraph(r, n, body, in);
    std::copy(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(states), state.begin());
    for (std::size_t k = 0; k < scan_outs; ++k)
      scanned[k].push_back(out[states + k]);
  }
  for (std::size_t k = 0; k < states && k < n.outputs.size(); ++k)
    if (!n.outputs[k].empty())
      r.env[n.outputs[k]] = state[k];
  for (std::size_t k = 0; k < scan_outs && states + k < n.outputs.size(); ++k) {
    if (n.outputs[states + k].empty())
      continue;
    std::vector<Value>& parts = scanned[k];
    if (out_dirs[k] != 0)
      std::reverse(parts.begin(), parts.end());
    r.env[n.outputs[states + k]] = stack(r, n, parts, out_axes[k], body.outputs[states + k],
                                         "scan output " + std::to_string(k));
  }
}

}  // namespace

void add_control_ops(OpTable& table) {
  table["If"] = if_op;
  table["Loop"] = loop;
  table["Scan"] = scan;
}

}  // namespace loom::nn::onnx_import
