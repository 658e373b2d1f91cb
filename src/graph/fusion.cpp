// Graph::fuse_elementwise: chains of elementwise nodes become one fused_elementwise node
// (core/fused_elementwise.h). See graph.h for when a chain may be fused.
// Graph::fold_gemm_biases: a matmul and the bias add after it become one linear node.
// Graph::merge_duplicate_nodes: a copy, fill, expand or cast repeating an earlier one goes.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/fused_elementwise.h"
#include "graph/graph.h"

namespace loom::graph {
namespace {

constexpr std::size_t kMaxSteps = 64;  // a longer chain is split: its registers stay in L1

// Whether `o` is dense row-major from its offset (size-1 dimensions aside).
bool dense(const Operand& o) {
  std::int64_t expected = 1;
  for (std::size_t d = o.shape.size(); d-- > 0;) {
    if (o.shape[d] != 1 && o.strides[d] != expected)
      return false;
    expected *= o.shape[d];
  }
  return true;
}

// `o`, a dense operand of an elementwise chain of shape `from`, viewed in the shape `to` of
// the product the chain reads (the same elements, rows of the same length): a dense operand
// of the chain's shape is the same bytes as `to`; one value per column (every dimension
// but the last 1) is that row. Anything else does not carry over: nullopt.
std::optional<Operand> in_product_shape(const Operand& o, const Shape& from, const Shape& to) {
  Operand r = o;
  if (o.shape == from && dense(o)) {
    r.shape = to;
    r.strides = contiguous_strides(to);
    return r;
  }
  const bool one_row =
      !o.shape.empty() && o.shape.back() == to.back() && shape_numel(o.shape) == o.shape.back();
  if (one_row || shape_numel(o.shape) == 1) {
    r.shape = {o.shape.empty() ? 1 : o.shape.back()};
    r.strides = {o.strides.empty() ? 1 : o.strides.back()};
    return r;
  }
  return std::nullopt;
}

bool contiguous_from_start(const Operand& o) {
  return o.offset == 0 && dense(o);
}

// Who reads and who writes each storage, in node order, and which are graph outputs.
struct Access {
  std::vector<std::vector<std::size_t>> readers, writers;
  std::vector<bool> is_output;
};
Access accesses(const std::vector<Node>& nodes, std::size_t storages,
                const std::vector<Operand>& outputs) {
  Access a{std::vector<std::vector<std::size_t>>(storages),
           std::vector<std::vector<std::size_t>>(storages), std::vector<bool>(storages, false)};
  for (const Operand& o : outputs)
    a.is_output[o.storage] = true;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const Operand& o : nodes[i].inputs)
      if (o.storage >= 0 && (a.readers[o.storage].empty() || a.readers[o.storage].back() != i))
        a.readers[o.storage].push_back(i);
    for (const Operand& o : nodes[i].outputs)
      a.writers[o.storage].push_back(i);
  }
  return a;
}

// A zero-size tensor of `operand`'s rank and dtype on `backend`: asks a kernel table
// whether it takes a call, whose conditions read ranks and dtypes, without the data.
Tensor probe_of(const Operand& operand, Backend& backend) {
  return Tensor::empty(Shape(operand.shape.size(), 0), operand.dtype, backend);
}

}  // namespace

void Graph::drop_nodes(const std::vector<bool>& removed) {
  std::vector<Node> kept;
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (!removed[i])
      kept.push_back(std::move(nodes_[i]));
  nodes_ = std::move(kept);
  stats_.nodes = nodes_.size();
}

std::size_t Graph::merge_duplicate_nodes() {
  check(!materialized_, "graph: passes run before the first replay");
  const Access access = accesses(nodes_, storages_.size(), outputs_);
  // A node whose one output is a fresh intermediate, written by it alone and read as a
  // whole from the storage's start: its value stays what it wrote.
  auto settled_output = [&](const Node& n) {
    if (n.outputs.size() != 1)
      return false;
    const Operand& y = n.outputs[0];
    return storages_[y.storage].internal && !access.is_output[y.storage] &&
           access.writers[y.storage].size() == 1 && contiguous_from_start(y);
  };
  auto same_operand = [](const Operand& a, const Operand& b) {
    return a.storage == b.storage && a.offset == b.offset && a.shape == b.shape &&
           a.strides == b.strides && a.dtype == b.dtype;
  };
  std::vector<int> replaced_by(storages_.size(), -1);  // a dropped output's storage -> the kept one
  std::vector<bool> removed(nodes_.size(), false);
  std::vector<std::size_t> candidates;  // kept nodes that later ones may repeat
  std::size_t merged = 0;
  for (std::size_t j = 0; j < nodes_.size(); ++j) {
    Node& node = nodes_[j];
    for (Operand& in : node.inputs)
      if (in.storage >= 0 && replaced_by[in.storage] >= 0)
        in.storage = replaced_by[in.storage];
    if ((node.op != OpId::copy && node.op != OpId::fill && node.op != OpId::expand &&
         node.op != OpId::cast) ||
        !settled_output(node))
      continue;
    bool reads_itself = false;
    for (const Operand& in : node.inputs)
      reads_itself = reads_itself || in.storage == node.outputs[0].storage;
    if (reads_itself)
      continue;
    std::optional<std::size_t> earlier;
    for (std::size_t i : candidates) {
      const Node& first = nodes_[i];
      if (first.op != node.op || first.backend != node.backend || !(first.attrs == node.attrs) ||
          first.inputs.size() != node.inputs.size() ||
          first.outputs[0].shape != node.outputs[0].shape ||
          first.outputs[0].dtype != node.outputs[0].dtype ||
          storages_[first.outputs[0].storage].bytes != storages_[node.outputs[0].storage].bytes)
        continue;
      bool same = true;
      for (std::size_t k = 0; same && k < node.inputs.size(); ++k) {
        same = same_operand(first.inputs[k], node.inputs[k]);
        // What both read must not change between them.
        if (same && node.inputs[k].storage >= 0)
          for (std::size_t w : access.writers[node.inputs[k].storage])
            same = same && !(w > i && w < j);
      }
      if (same) {
        earlier = i;
        break;
      }
    }
    if (!earlier) {
      candidates.push_back(j);
      continue;
    }
    replaced_by[node.outputs[0].storage] = nodes_[*earlier].outputs[0].storage;
    removed[j] = true;
    ++merged;
  }
  drop_nodes(removed);
  stats_.duplicates += merged;
  return merged;
}

std::size_t Graph::fold_gemm_biases() {
  check(!materialized_, "graph: passes run before the first replay");
  const Access access = accesses(nodes_, storages_.size(), outputs_);
  const std::vector<bool>& is_output = access.is_output;
  std::vector<bool> removed(nodes_.size(), false);
  std::size_t folded = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node& product = nodes_[i];
    // x[..., K] op(w) with w a matrix: what linear computes. Its product a fresh
    // intermediate, written here alone.
    if (product.op != OpId::matmul || product.attrs.trans_a || product.inputs.size() != 2 ||
        product.outputs.size() != 1 || product.inputs[1].shape.size() != 2 ||
        product.inputs[0].storage < 0 || product.inputs[1].storage < 0)
      continue;
    const Operand& c = product.outputs[0];
    if (c.dtype != DType::f32 || !storages_[c.storage].internal || is_output[c.storage] ||
        access.writers[c.storage].size() != 1 || !contiguous_from_start(c) ||
        access.readers[c.storage].size() != 1)
      continue;
    const std::size_t j = access.readers[c.storage][0];
    Node& add = nodes_[j];
    if (add.op != OpId::add || add.inputs.size() != 2 || add.outputs.size() != 1 ||
        add.backend != product.backend || add.outputs[0].shape != c.shape)
      continue;
    const int which = add.inputs[0].storage == c.storage ? 0 : 1;
    const Operand& read = add.inputs[which];
    const Operand& bias = add.inputs[1 - which];
    // The add reads the whole product as written, and a bias of one value per column:
    // shape [N] or [1, ..., 1, N].
    const std::int64_t n = c.shape.back();
    bool per_column = bias.storage >= 0 && bias.storage != c.storage && bias.dtype == DType::f32 &&
                      !bias.shape.empty() && bias.shape.back() == n &&
                      bias.shape.size() <= c.shape.size();
    for (std::size_t d = 0; per_column && d + 1 < bias.shape.size(); ++d)
      per_column = bias.shape[d] == 1;
    // The sum moves to the matmul's place: it must be a fresh intermediate that nothing
    // between the two could have read.
    const Operand& y = add.outputs[0];
    if (read.offset != 0 || read.shape != c.shape || read.strides != c.strides || !per_column ||
        !storages_[y.storage].internal || access.writers[y.storage].size() != 1 ||
        !contiguous_from_start(y) || y.storage == bias.storage || y.storage == c.storage ||
        (!access.readers[y.storage].empty() && access.readers[y.storage].front() <= j))
      continue;
    // linear runs at the matmul's place: nothing in between may rewrite the bias.
    bool rewritten = false;
    for (std::size_t w : access.writers[bias.storage])
      rewritten = rewritten || (w > i && w < j);
    if (rewritten)
      continue;
    Operand bias_row = bias;
    bias_row.shape = {n};
    bias_row.strides = {bias.strides.empty() ? 1 : bias.strides.back()};
    Attrs attrs;
    attrs.trans_b = product.attrs.trans_b;
    Backend& backend = *product.backend;
    const Tensor probes[] = {probe_of(product.inputs[0], backend),
                             probe_of(product.inputs[1], backend), probe_of(bias_row, backend)};
    Tensor probe_out[] = {probe_of(add.outputs[0], backend)};
    if (!backend.supports(OpCall{OpId::linear, probes, probe_out, attrs}))
      continue;
    product.op = OpId::linear;
    product.attrs = attrs;
    product.inputs.push_back(bias_row);
    product.outputs[0] = add.outputs[0];
    removed[j] = true;
    ++folded;
  }
  drop_nodes(removed);
  stats_.gemm_biases += folded;
  return folded;
}

std::size_t Graph::fold_gemm_epilogues(
    std::vector<std::pair<const ElementwiseProgram*, const ElementwiseProgram*>>* merged_programs) {
  check(!materialized_, "graph: passes run before the first replay");
  const Access access = accesses(nodes_, storages_.size(), outputs_);
  std::vector<bool> removed(nodes_.size(), false);
  std::vector<int> product_of(storages_.size(), -1);  // a storage -> the GEMM node writing it
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if ((nodes_[i].op == OpId::matmul || nodes_[i].op == OpId::linear) &&
        nodes_[i].outputs.size() == 1)
      product_of[nodes_[i].outputs[0].storage] = static_cast<int>(i);
  std::size_t folded = 0;
  for (std::size_t j = 0; j < nodes_.size(); ++j) {
    Node& chain = nodes_[j];
    // The chain: a fused_elementwise node without row reductions, or one elementwise node
    // (as a one-step program).
    std::shared_ptr<const ElementwiseProgram> program;
    Shape shape;
    if (chain.op == OpId::fused_elementwise && !chain.attrs.program->reduces()) {
      program = chain.attrs.program;
      shape = chain.attrs.shape;
    } else if (fusable_elementwise(chain.op) && chain.op != OpId::expand &&
               chain.outputs.size() == 1 &&
               static_cast<int>(chain.inputs.size()) == elementwise_arity(chain.op)) {
      auto one = std::make_shared<ElementwiseProgram>();
      one->num_inputs = static_cast<int>(chain.inputs.size());
      ElementwiseStep step{chain.op, {0, chain.inputs.size() == 2 ? 1 : -1}, chain.attrs.alpha};
      one->steps.push_back(step);
      program = one;
      shape = chain.outputs[0].shape;
    } else {
      continue;
    }
    // The product it reads: a fresh f32 intermediate of the chain's shape that this node
    // reads as a whole, written once by a matmul or linear node before it. If nodes after
    // the chain read it too (the backward pass reads a layer's output), linear's product
    // (with its bias, a step of the program) is written as one more output.
    int q = -1;
    bool escapes = false;
    for (std::size_t k = 0; k < chain.inputs.size() && q < 0; ++k) {
      const Operand& o = chain.inputs[k];
      if (o.storage < 0 || product_of[o.storage] < 0 || removed[product_of[o.storage]])
        continue;
      const Node& gemm = nodes_[product_of[o.storage]];
      const Operand& c = gemm.outputs[0];
      const std::vector<std::size_t>& readers = access.readers[c.storage];
      bool later = !readers.empty() && readers.front() == j;  // the chain reads it first
      for (std::size_t r = 1; later && r < readers.size(); ++r)
        later = readers[r] > j;
      const bool kept = readers.size() > 1 || access.is_output[c.storage];
      // Read whole: as the product's view, or (a reshape, as autograd reads a linear
      // layer's [B*T, N] product as [B, T, N]) as a dense view of the chain's shape with
      // rows of the product's length.
      const bool whole =
          o.offset == 0 && o.shape == shape &&
          ((o.shape == c.shape && o.strides == c.strides) ||
           (contiguous_from_start(o) && !shape.empty() && !c.shape.empty() &&
            shape.back() == c.shape.back() && shape_numel(shape) == shape_numel(c.shape)));
      if (c.dtype == DType::f32 && storages_[c.storage].internal && later &&
          (!kept || gemm.op == OpId::linear) && access.writers[c.storage].size() == 1 &&
          contiguous_from_start(c) && whole && gemm.backend == chain.backend) {
        q = static_cast<int>(k);
        escapes = kept;
      }
    }
    if (q < 0 || (escapes && program->output_registers().size() + 1 >
                                 static_cast<std::size_t>(kMaxFusedOutputs)))
      continue;
    const std::size_t i = static_cast<std::size_t>(product_of[chain.inputs[q].storage]);
    const Node& gemm = nodes_[i];
    // The GEMM runs at the chain's place: nothing in between may rewrite its operands.
    bool rewritten = false;
    for (const Operand& o : gemm.inputs)
      for (std::size_t w : access.writers[o.storage])
        rewritten = rewritten || (w > i && w < j);
    if (rewritten)
      continue;
    // Read through a reshape: the node works in the product's shape, the chain's other
    // operands viewed in it (or the pair is left unfolded where one cannot be).
    const Shape& product_shape = gemm.outputs[0].shape;
    std::vector<Operand> chain_inputs = chain.inputs, chain_outputs = chain.outputs;
    if (shape != product_shape) {
      bool viewable = true;
      for (std::vector<Operand>* list : {&chain_inputs, &chain_outputs})
        for (Operand& o : *list) {
          if (o.storage == chain.inputs[q].storage) {
            o = gemm.outputs[0];
            continue;
          }
          std::optional<Operand> v = in_product_shape(o, shape, product_shape);
          viewable = viewable && v.has_value();
          if (v)
            o = *v;
        }
      if (!viewable)
        continue;
    }
    // The new program: input 0 the product, then linear's bias (added by a first step, as
    // linear adds it after the sum), then the chain's other inputs.
    const bool with_bias = gemm.op == OpId::linear;
    std::vector<Operand> inputs{gemm.inputs[0], gemm.inputs[1]};
    auto merged = std::make_shared<ElementwiseProgram>();
    std::vector<int> register_of(static_cast<std::size_t>(program->num_inputs), -1);
    int next_input = 1;
    if (with_bias)
      inputs.push_back(gemm.inputs[2]), ++next_input;
    for (std::size_t k = 0; k < chain.inputs.size(); ++k)
      if (chain.inputs[k].storage == chain.inputs[q].storage)
        register_of[k] = -2;  // the product (the chain reads it as a whole only)
      else
        register_of[k] = next_input++, inputs.push_back(chain_inputs[k]);
    merged->num_inputs = next_input;
    const int product_register = with_bias ? merged->num_inputs : 0;
    if (with_bias)
      merged->steps.push_back(ElementwiseStep{OpId::add, {0, 1}, 0.0});
    for (int& r : register_of)
      if (r == -2)
        r = product_register;
    const int shift = merged->num_inputs + (with_bias ? 1 : 0) - program->num_inputs;
    auto map = [&](int r) {
      return r < 0 ? r : r < program->num_inputs ? register_of[r] : r + shift;
    };
    for (const ElementwiseStep& s : program->steps)
      merged->steps.push_back(ElementwiseStep{s.op, {map(s.args[0]), map(s.args[1])}, s.alpha});
    for (int r : program->output_registers())
      merged->outputs.push_back(map(r));
    std::vector<Operand> outputs = chain_outputs;
    if (escapes) {  // linear's value, read again later: written too
      merged->outputs.push_back(product_register);
      outputs.push_back(gemm.outputs[0]);
    }
    Attrs attrs;
    attrs.trans_a = gemm.attrs.trans_a;
    attrs.trans_b = gemm.attrs.trans_b;
    attrs.shape = product_shape;
    attrs.program = merged;
    Backend& backend = *chain.backend;
    std::vector<Tensor> probes;
    for (const Operand& o : inputs)
      probes.push_back(probe_of(o, backend));
    std::vector<Tensor> probe_out;
    for (const Operand& o : outputs)
      probe_out.push_back(probe_of(o, backend));
    if (!backend.supports(OpCall{OpId::matmul_elementwise, probes, probe_out, attrs}))
      continue;
    if (merged_programs != nullptr && chain.op == OpId::fused_elementwise)
      merged_programs->emplace_back(chain.attrs.program.get(), merged.get());
    chain.op = OpId::matmul_elementwise;
    chain.attrs = attrs;
    chain.inputs = std::move(inputs);
    chain.outputs = std::move(outputs);
    removed[i] = true;
    ++folded;
  }
  drop_nodes(removed);
  stats_.gemm_epilogues += folded;
  return folded;
}

FusionReport Graph::fuse_elementwise(const FusionOptions& options) {
  check(!materialized_, "graph: passes run before the first replay");
  const std::size_t n = nodes_.size();
  const Access access = accesses(nodes_, storages_.size(), outputs_);
  const auto& readers = access.readers;
  const auto& writers = access.writers;
  const std::vector<bool>& is_output = access.is_output;

  // A row reduction: sum or mean over the last axis only, kept as size 1, of a value whose
  // rows hold more than one element.
  auto reduces_rows = [&](const Node& node) {
    if (!options.reductions || !row_reduction(node.op) || !node.attrs.keepdim ||
        node.inputs.size() != 1 || node.attrs.axes.size() != 1)
      return false;
    const Shape& in = node.inputs[0].shape;
    const auto rank = static_cast<std::int64_t>(in.size());
    const std::int64_t axis =
        node.attrs.axes[0] < 0 ? node.attrs.axes[0] + rank : node.attrs.axes[0];
    return rank >= 1 && axis == rank - 1 && in.back() > 1;
  };
  // A node may join a chain when it is an elementwise f32 op (or a row reduction) on a
  // backend that runs the fused op, and its one output is a fresh intermediate that it
  // alone writes.
  auto candidate = [&](std::size_t i) {
    const Node& node = nodes_[i];
    if (!(fusable_elementwise(node.op) || reduces_rows(node)) || node.outputs.size() != 1)
      return false;
    const Operand& out = node.outputs[0];
    if (out.dtype != DType::f32 || !storages_[out.storage].internal ||
        writers[out.storage].size() != 1 || !contiguous_from_start(out))
      return false;
    for (const Operand& o : node.inputs)
      if (o.storage < 0 || o.dtype != DType::f32)
        return false;
    // Asked without tensors: a backend's fused kernel takes any f32 chain (a reduction is
    // asked with a program that reduces, for a backend with no row kernel to decline).
    static const auto reducing = std::make_shared<const ElementwiseProgram>(
        ElementwiseProgram{1, {ElementwiseStep{OpId::sum, {0, -1}}}, {}});
    Attrs probe;
    probe.shape = row_reduction(node.op) ? node.inputs[0].shape : out.shape;
    if (row_reduction(node.op))
      probe.program = reducing;
    return options.without_kernel ||
           node.backend->supports(OpCall{OpId::fused_elementwise, {}, {}, probe});
  };
  // The shapes a chain's nodes may have: one shape, or, once it holds a row reduction, the
  // reduced value's full shape and its row shape.
  struct ChainShape {
    Shape shape;                // the end's output shape
    std::optional<Shape> full;  // set once the chain holds a reduction
  };
  std::vector<ChainShape> shape_of_chain(n);
  auto fits = [&](std::size_t end, const Node& node) {
    const ChainShape& c = shape_of_chain[end];
    const Shape& y = node.outputs[0].shape;
    const bool reduction = reduces_rows(node);
    if (c.full)
      return reduction ? node.inputs[0].shape == *c.full && y == row_shape(*c.full)
                       : y == *c.full || y == row_shape(*c.full);
    if (reduction)  // read by the chain's row-shaped or (broadcast) full-shaped nodes
      return y == c.shape || node.inputs[0].shape == c.shape;
    // Without a reduction yet, a node of the row shape may join tentatively: a reduction
    // found further back makes it a row step, else it is dropped from the chain below.
    return y == c.shape || (options.reductions && !c.shape.empty() && c.shape.back() > 1 &&
                            y == row_shape(c.shape));
  };

  // Walk backwards, so each node's readers have settled their chain first. A node joins
  // the chain of its first reader when every reader before that chain's end is in the
  // chain and reads the whole output in the chain's shape, and nothing between the node
  // and the chain's end rewrites what the node reads (the fused node runs at the end's
  // place). Readers after the end, or the graph's outputs, make the value escape: the
  // fused node writes it too.
  std::vector<std::int64_t> chain(n, -1);  // index of the chain's last node
  std::vector<std::size_t> size(n, 0);
  std::vector<int> outputs(n, 0);  // per chain end: the values the fused node writes
  std::vector<bool> escapes(n, false);
  // Nodes of the row shape that joined a chain which then found no reduction: the walk
  // runs again with these joining only chains of their own shape.
  std::vector<bool> settled_row(n, false);
  auto walk = [&] {
    std::fill(chain.begin(), chain.end(), -1);
    std::fill(size.begin(), size.end(), 0);
    std::fill(outputs.begin(), outputs.end(), 0);
    std::fill(escapes.begin(), escapes.end(), false);
    for (std::size_t i = n; i-- > 0;) {
      if (!candidate(i))
        continue;
      chain[i] = static_cast<std::int64_t>(i);
      size[i] = 1;
      outputs[i] = 1;
      const Operand& out = nodes_[i].outputs[0];
      shape_of_chain[i] = {out.shape, reduces_rows(nodes_[i])
                                          ? std::optional<Shape>(nodes_[i].inputs[0].shape)
                                          : std::nullopt};
      const auto& rs = readers[out.storage];
      if (rs.empty())
        continue;
      const std::int64_t end = chain[rs.front()];
      bool join =
          end >= 0 && size[end] < kMaxSteps && nodes_[end].backend == nodes_[i].backend &&
          fits(static_cast<std::size_t>(end), nodes_[i]) &&
          !(settled_row[i] && !shape_of_chain[end].full && out.shape != shape_of_chain[end].shape);
      bool escaping = is_output[out.storage];
      for (std::size_t r : rs) {
        if (join && chain[r] != end) {
          join = static_cast<std::int64_t>(r) > end;
          escaping = true;
          continue;
        }
        for (const Operand& o : nodes_[r].inputs)
          if (o.storage == out.storage)
            join = join && o.offset == 0 && o.shape == out.shape && o.strides == out.strides;
      }
      join = join && (!escaping || outputs[end] < kMaxFusedOutputs);
      for (const Operand& o : nodes_[i].inputs)
        for (std::size_t w : writers[o.storage])
          join = join && !(w > i && static_cast<std::int64_t>(w) < end && chain[w] != end);
      if (join) {
        chain[i] = end;
        ++size[end];
        outputs[end] += escaping;
        escapes[i] = escaping;
        if (reduces_rows(nodes_[i]) && !shape_of_chain[end].full)
          shape_of_chain[end].full = nodes_[i].inputs[0].shape;
      }
    }
    // A chain that found no reduction may keep only nodes of its end's shape. (A node of
    // the row shape reads only row-shaped values, so every node that joined through one
    // is of the row shape too.)
    bool again = false;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t end = chain[i];
      if (end >= 0 && !shape_of_chain[end].full &&
          nodes_[i].outputs[0].shape != shape_of_chain[end].shape) {
        settled_row[i] = true;
        again = true;
      }
    }
    return again;
  };
  while (walk()) {
  }

  // Each chain of two or more nodes becomes one node at its end's place.
  FusionReport report;
  std::map<std::int64_t, std::vector<std::size_t>> members;
  for (std::size_t i = 0; i < n; ++i)
    if (chain[i] >= 0 && size[chain[i]] >= 2)
      members[chain[i]].push_back(i);
  std::map<std::int64_t, Node> fused;
  for (auto& [end, nodes] : members) {
    Node node{OpId::fused_elementwise, {}, nodes_[end].backend, {}, {}};
    std::map<int, int> step_of_storage;  // a member's output storage -> its step
    for (std::size_t k = 0; k < nodes.size(); ++k)
      step_of_storage[nodes_[nodes[k]].outputs[0].storage] = static_cast<int>(k);
    // The chain's inputs: every operand no member produces, each view once.
    std::map<std::tuple<int, std::int64_t, Shape, Strides>, int> input_of;
    for (std::size_t m : nodes)
      for (const Operand& o : nodes_[m].inputs)
        if (!step_of_storage.count(o.storage) &&
            input_of
                .emplace(std::make_tuple(o.storage, o.offset, o.shape, o.strides),
                         static_cast<int>(node.inputs.size()))
                .second)
          node.inputs.push_back(o);
    auto program = std::make_shared<ElementwiseProgram>();
    program->num_inputs = static_cast<int>(node.inputs.size());
    for (std::size_t m : nodes) {
      const Node& member = nodes_[m];
      ElementwiseStep s{member.op, {-1, -1}, member.attrs.alpha};
      for (std::size_t k = 0; k < member.inputs.size(); ++k) {
        const Operand& o = member.inputs[k];
        auto step = step_of_storage.find(o.storage);
        s.args[k] = step != step_of_storage.end()
                        ? program->num_inputs + step->second
                        : input_of.at(std::make_tuple(o.storage, o.offset, o.shape, o.strides));
      }
      program->steps.push_back(s);
    }
    // Outputs: the escaping values in chain order, then the end's.
    for (std::size_t k = 0; k < nodes.size(); ++k)
      if (escapes[nodes[k]] || nodes[k] == static_cast<std::size_t>(end)) {
        program->outputs.push_back(program->num_inputs + static_cast<int>(k));
        node.outputs.push_back(nodes_[nodes[k]].outputs[0]);
      }
    node.attrs.shape =
        shape_of_chain[end].full ? *shape_of_chain[end].full : nodes_[end].outputs[0].shape;
    node.attrs.program = program;
    fused.emplace(end, std::move(node));
  }
  std::vector<Node> kept;
  for (std::size_t i = 0; i < n; ++i) {
    if (auto it = fused.find(static_cast<std::int64_t>(i)); it != fused.end()) {
      report.chains.push_back(
          {kept.size(), members[it->first].size(), it->second.attrs.program->describe()});
      kept.push_back(std::move(it->second));
    } else if (chain[i] < 0 || size[chain[i]] < 2) {
      kept.push_back(std::move(nodes_[i]));
    }
  }
  report.nodes_before = n;
  report.nodes_after = kept.size();
  nodes_ = std::move(kept);
  stats_.nodes = nodes_.size();
  stats_.fused_chains += report.chains.size();
  return report;
}

}  // namespace loom::graph
