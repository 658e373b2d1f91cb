#include "graph/graph.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"
#include "core/fused_elementwise.h"

namespace loom::graph {
namespace {

// Arena offsets are multiples of this: a cache line on CPUs, a transaction on GPUs, and
// a multiple of every dtype's size, so element offsets stay whole.
constexpr std::size_t kArenaAlignment = 256;

std::size_t align_up(std::size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// [first, end) element range a view reaches (first == end for an empty view).
std::pair<std::int64_t, std::int64_t> extent(std::int64_t offset, const Shape& shape,
                                             const Strides& strides) {
  if (shape_numel(shape) == 0)
    return {offset, offset};
  std::int64_t last = offset;
  for (std::size_t i = 0; i < shape.size(); ++i)
    last += (shape[i] - 1) * strides[i];
  return {offset, last + 1};
}

std::string megabytes(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return text;
}

}  // namespace

// ---------------------------------------------------------------------------
// Capture
// ---------------------------------------------------------------------------

Capture::Capture(std::span<const Tensor> inputs) : inputs_(inputs.begin(), inputs.end()) {
  for (std::size_t i = 0; i < inputs_.size(); ++i) {
    const Tensor& t = inputs_[i];
    check(t.defined() && t.is_contiguous(), [&] {
      return "graph capture: input " + std::to_string(i) +
             " must be a defined, contiguous tensor, got " +
             (t.defined() ? t.describe() : std::string("an undefined tensor"));
    });
    check(index_.find(t.storage().get()) == index_.end(), [&] {
      return "graph capture: input " + std::to_string(i) + " (" + t.describe() +
             ") shares storage with an earlier input; pass separate tensors";
    });
    int s = storage_of(t, false);
    graph_.storages_[s].input = static_cast<int>(i);
    graph_.storages_[s].external.reset();  // bound anew at each replay
    graph_.inputs_.push_back({t.shape(), t.dtype()});
    graph_.input_offsets_.push_back(t.offset());
  }
  previous_ = dispatch::set_recorder(this);
}

Capture::~Capture() {
  if (active_)
    dispatch::set_recorder(previous_);
}

int Capture::storage_of(const Tensor& t, bool fresh) {
  const Buffer* key = t.storage().get();
  if (auto it = index_.find(key); it != index_.end() && !fresh) {
    std::shared_ptr<Buffer> alive = seen_[it->second].lock();
    if (alive.get() == key)
      return it->second;
  }
  StorageInfo info;
  info.bytes = key->bytes();
  info.backend = &t.backend();
  info.internal = fresh;
  if (!fresh)
    info.external = t.storage();  // used in place at replay: keep it alive
  graph_.storages_.push_back(std::move(info));
  seen_.push_back(t.storage());
  const int id = static_cast<int>(graph_.storages_.size() - 1);
  index_[key] = id;
  return id;
}

Operand Capture::operand_of(const Tensor& t, bool fresh) {
  if (!t.defined())
    return Operand{};
  Operand o{storage_of(t, fresh), t.offset(), t.shape(), t.strides(), t.dtype()};
  if (int in = graph_.storages_[o.storage].input; in >= 0) {
    // A declared input is rebound at replay; its operands must lie inside it.
    auto [first, end] = extent(o.offset, o.shape, o.strides);
    const std::int64_t base = graph_.input_offsets_[in];
    check(first >= base && end <= base + shape_numel(graph_.inputs_[in].shape), [&] {
      return "graph capture: a kernel reads outside input " + std::to_string(in) + " (" +
             inputs_[in].describe() + ") in its storage; pass that whole region as the input";
    });
  }
  return o;
}

void Capture::executed(Backend& backend, OpId op, std::span<const Tensor> inputs,
                       std::span<const Tensor> outputs, const Attrs& attrs, bool fresh_outputs) {
  Node node{op, attrs, &backend, {}, {}};
  for (const Tensor& t : inputs)
    node.inputs.push_back(operand_of(t, false));
  for (const Tensor& t : outputs)
    node.outputs.push_back(operand_of(t, fresh_outputs));
  graph_.nodes_.push_back(std::move(node));
}

Graph Capture::finish(std::span<const Tensor> outputs) {
  check(active_, "graph capture: finish() called twice");
  dispatch::set_recorder(previous_);
  active_ = false;
  for (const Tensor& t : outputs) {
    check(t.defined(), "graph capture: an output is undefined");
    graph_.outputs_.push_back(operand_of(t, false));
    graph_.captured_outputs_.push_back(t);
  }
  graph_.stats_.captured_nodes = graph_.nodes_.size();
  graph_.stats_.nodes = graph_.nodes_.size();
  return std::move(graph_);
}

// ---------------------------------------------------------------------------
// Passes
// ---------------------------------------------------------------------------

void Graph::eliminate_dead_nodes() {
  check(!materialized_, "graph: passes run before the first replay");
  // Walk backwards: a node is live when it writes external storage (a side effect the
  // caller sees) or a storage a live node or an output reads. Nodes only read what
  // earlier nodes wrote, so one backward pass decides every node.
  std::vector<bool> needed(storages_.size(), false);
  for (const Operand& o : outputs_)
    needed[o.storage] = true;
  std::vector<Node> kept;
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    bool live = false;
    for (const Operand& o : it->outputs)
      live = live || !storages_[o.storage].internal || needed[o.storage];
    if (!live)
      continue;
    for (const Operand& o : it->inputs)
      if (o.storage >= 0)
        needed[o.storage] = true;
    for (const Operand& o : it->outputs)
      needed[o.storage] = true;  // an in-place write needs its producer
    kept.push_back(std::move(*it));
  }
  std::reverse(kept.begin(), kept.end());
  nodes_ = std::move(kept);
  stats_.nodes = nodes_.size();
}

std::vector<std::pair<std::int64_t, std::int64_t>> Graph::lifetimes() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> life(storages_.size(), {-1, -1});
  auto touch = [&](int s, std::int64_t at) {
    if (s < 0)
      return;
    if (life[s].first < 0)
      life[s].first = at;
    life[s].second = std::max(life[s].second, at);
  };
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    for (const Operand& o : nodes_[n].inputs)
      touch(o.storage, static_cast<std::int64_t>(n));
    for (const Operand& o : nodes_[n].outputs)
      touch(o.storage, static_cast<std::int64_t>(n));
  }
  for (const Operand& o : outputs_)
    touch(o.storage, static_cast<std::int64_t>(nodes_.size()));
  return life;
}

void Graph::plan_memory() {
  check(!materialized_, "graph: passes run before the first replay");
  const auto life = lifetimes();
  arena_offsets_.assign(storages_.size(), -1);
  // Largest first; each goes to the lowest offset that no time-overlapping placed storage
  // of the same device occupies.
  std::vector<int> order;
  for (std::size_t s = 0; s < storages_.size(); ++s)
    if (storages_[s].internal && life[s].first >= 0)
      order.push_back(static_cast<int>(s));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return storages_[a].bytes > storages_[b].bytes; });
  struct Placed {
    std::int64_t offset, end, first, last;
    Backend* backend;
  };
  std::vector<Placed> placed;
  for (int s : order) {
    const std::int64_t size = static_cast<std::int64_t>(align_up(storages_[s].bytes));
    std::vector<const Placed*> conflicts;
    for (const Placed& p : placed)
      if (p.backend == storages_[s].backend && p.first <= life[s].second && life[s].first <= p.last)
        conflicts.push_back(&p);
    std::sort(conflicts.begin(), conflicts.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    std::int64_t offset = 0;
    for (const Placed* p : conflicts) {
      if (offset + size <= p->offset)
        break;  // fits in the gap before p
      offset = std::max(offset, p->end);
    }
    arena_offsets_[s] = offset;
    placed.push_back({offset, offset + size, life[s].first, life[s].second, storages_[s].backend});
  }
  stats_.planned = true;
}

// ---------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------

Tensor Graph::tensor_of(const Operand& o) const {
  if (o.storage < 0)
    return Tensor();
  const StorageInfo& info = storages_[o.storage];
  if (info.input >= 0) {
    const Tensor& bound = bound_inputs_[info.input];
    return Tensor::view_of(bound.storage(), o.offset - input_offsets_[info.input] + bound.offset(),
                           o.shape, o.strides, o.dtype);
  }
  const std::int64_t base =
      storage_base_[o.storage] / static_cast<std::int64_t>(dtype_size(o.dtype));
  return Tensor::view_of(storage_buffers_[o.storage], base + o.offset, o.shape, o.strides, o.dtype);
}

void Graph::materialize() {
  const auto life = lifetimes();
  storage_buffers_.assign(storages_.size(), nullptr);
  storage_base_.assign(storages_.size(), 0);
  stats_.internal_storages = stats_.external_storages = 0;
  stats_.internal_bytes = stats_.memory_bytes = 0;
  std::map<Backend*, std::int64_t> arena_size;
  for (std::size_t s = 0; s < storages_.size(); ++s) {
    const StorageInfo& info = storages_[s];
    if (life[s].first < 0)
      continue;  // no longer referenced
    if (!info.internal) {
      ++stats_.external_storages;
      storage_buffers_[s] = info.external;  // null for declared inputs (bound at replay)
      continue;
    }
    ++stats_.internal_storages;
    stats_.internal_bytes += info.bytes;
    if (stats_.planned)
      arena_size[info.backend] =
          std::max(arena_size[info.backend],
                   arena_offsets_[s] + static_cast<std::int64_t>(align_up(info.bytes)));
  }
  std::map<Backend*, std::shared_ptr<Buffer>> arena;
  for (auto [backend, size] : arena_size) {
    arena[backend] = std::make_shared<Buffer>(backend->allocate(static_cast<std::size_t>(size)));
    arenas_.push_back(arena[backend]);
    stats_.memory_bytes += static_cast<std::size_t>(size);
  }
  for (std::size_t s = 0; s < storages_.size(); ++s) {
    const StorageInfo& info = storages_[s];
    if (!info.internal || life[s].first < 0)
      continue;
    if (stats_.planned) {
      storage_buffers_[s] = arena[info.backend];
      storage_base_[s] = arena_offsets_[s];
    } else {
      storage_buffers_[s] = std::make_shared<Buffer>(info.backend->allocate(info.bytes));
      stats_.memory_bytes += info.bytes;
    }
  }
  node_inputs_.assign(nodes_.size(), {});
  node_outputs_.assign(nodes_.size(), {});
  rebinds_.clear();
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    for (bool output : {false, true}) {
      const std::vector<Operand>& operands = output ? nodes_[n].outputs : nodes_[n].inputs;
      std::vector<Tensor>& tensors = output ? node_outputs_[n] : node_inputs_[n];
      for (std::size_t k = 0; k < operands.size(); ++k) {
        const bool on_input = operands[k].storage >= 0 && storages_[operands[k].storage].input >= 0;
        tensors.push_back(on_input ? Tensor() : tensor_of(operands[k]));
        if (on_input)
          rebinds_.push_back({n, k, output});
      }
    }
  }
  // When each output is final: after its last reference (not counting the end of the graph).
  ready_after_.assign(nodes_.size(), {});
  ready_at_start_.clear();
  std::vector<std::int64_t> last(storages_.size(), -1);
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    for (const Operand& o : nodes_[n].inputs)
      if (o.storage >= 0)
        last[o.storage] = static_cast<std::int64_t>(n);
    for (const Operand& o : nodes_[n].outputs)
      last[o.storage] = static_cast<std::int64_t>(n);
  }
  for (std::size_t k = 0; k < outputs_.size(); ++k) {
    const std::int64_t at = last[outputs_[k].storage];
    if (at < 0)
      ready_at_start_.push_back(k);
    else
      ready_after_[static_cast<std::size_t>(at)].push_back(k);
  }
  materialized_ = true;
}

void Graph::replay(std::span<const Tensor> inputs, const ReplayOptions& options) {
  check(inputs.size() == inputs_.size(), [&] {
    return "graph replay: got " + std::to_string(inputs.size()) +
           " inputs, the graph was captured with " + std::to_string(inputs_.size());
  });
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    check(t.defined() && t.is_contiguous() && t.shape() == inputs_[i].shape &&
              t.dtype() == inputs_[i].dtype,
          [&] {
            return "graph replay: input " + std::to_string(i) + " is " +
                   (t.defined() ? t.describe() : std::string("undefined")) +
                   ", expected contiguous " + std::string(dtype_name(inputs_[i].dtype)) +
                   shape_str(inputs_[i].shape);
          });
  }
  if (!materialized_) {
    // The capture's intermediates go back first, so planned memory can reuse their bytes.
    captured_outputs_.clear();
    std::set<Backend*> devices;
    for (const StorageInfo& info : storages_)
      devices.insert(info.backend);
    for (Backend* device : devices)
      device->release_cached_memory();
    materialize();
  }
  bound_inputs_.assign(inputs.begin(), inputs.end());
  for (std::size_t s = 0; s < storages_.size(); ++s)
    if (storages_[s].input >= 0)
      check(&bound_inputs_[storages_[s].input].backend() == storages_[s].backend, [&] {
        return "graph replay: input " + std::to_string(storages_[s].input) + " is on " +
               std::string(bound_inputs_[storages_[s].input].backend().name()) +
               ", the graph was captured on " + std::string(storages_[s].backend->name());
      });
  replayed_ = true;  // output() now gives graph memory
  if (options.output_ready)
    for (std::size_t k : ready_at_start_)
      options.output_ready(k);
  for (const Rebind& b : rebinds_) {
    const Node& node = nodes_[b.node];
    (b.output ? node_outputs_ : node_inputs_)[b.node][b.index] =
        tensor_of((b.output ? node.outputs : node.inputs)[b.index]);
  }
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    Node& node = nodes_[n];
    if (node.attrs.seed_per_step)
      node.attrs.seed = mix_seed(options.step_seed, node.attrs.seed_site);
    dispatch::execute(*node.backend, node.op, node_inputs_[n], node_outputs_[n], node.attrs);
    if (options.output_ready)
      for (std::size_t k : ready_after_[n])
        options.output_ready(k);
  }
}

Tensor Graph::output(std::size_t index) const {
  check(index < outputs_.size(), [&] {
    return "graph: output " + std::to_string(index) + " of " + std::to_string(outputs_.size());
  });
  if (!replayed_)
    return captured_outputs_[index];
  return tensor_of(outputs_[index]);
}

std::string Graph::listing() const {
  std::string s;
  auto operand_text = [&](const Operand& o) {
    if (o.storage < 0)
      return std::string("-");
    const StorageInfo& info = storages_[o.storage];
    std::string kind = info.internal ? "t" : (info.input >= 0 ? "in" : "ext");
    return kind + std::to_string(o.storage) + shape_str(o.shape);
  };
  for (std::size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    s += std::to_string(n) + " " + std::string(op_name(node.op)) + " ";
    for (std::size_t k = 0; k < node.outputs.size(); ++k)
      s += (k ? "," : "") + operand_text(node.outputs[k]);
    s += " <-";
    for (const Operand& o : node.inputs)
      s += " " + operand_text(o);
    if (node.attrs.program != nullptr)
      s += " = " + node.attrs.program->describe();
    s += "\n";
  }
  return s;
}

std::string Graph::summary() const {
  std::string s = "graph: " + std::to_string(stats_.nodes) + " nodes";
  if (stats_.nodes != stats_.captured_nodes)
    s += " (" + std::to_string(stats_.captured_nodes) + " captured" +
         (stats_.fused_chains ? ", " + std::to_string(stats_.fused_chains) + " fused chains" : "") +
         (stats_.gemm_biases ? ", " + std::to_string(stats_.gemm_biases) + " GEMM biases folded"
                             : "") +
         ")";
  if (materialized_) {
    s += ", " + std::to_string(stats_.internal_storages) + " intermediate tensors (" +
         megabytes(stats_.internal_bytes) + ") in " + megabytes(stats_.memory_bytes) +
         (stats_.planned ? " of planned memory" : "") + ", " +
         std::to_string(stats_.external_storages) + " external";
  }
  return s;
}

// ---------------------------------------------------------------------------
// CapturedStep
// ---------------------------------------------------------------------------

std::vector<Tensor> CapturedStep::run(std::span<const Tensor> inputs, const StepFn& step,
                                      const ReplayOptions& options) {
  ++calls_;
  replayed_ = false;
  if (!graph_) {
    Capture capture(inputs);
    std::vector<Tensor> outputs = step();
    graph_ = capture.finish(outputs);
    graph_->eliminate_dead_nodes();
    const std::size_t duplicates = passes_.merge_duplicates ? graph_->merge_duplicate_nodes() : 0;
    const std::size_t gemm_biases = passes_.fold_gemm_biases ? graph_->fold_gemm_biases() : 0;
    if (passes_.fuse_elementwise)
      fusion_ = graph_->fuse_elementwise(passes_.fusion);
    if (passes_.fold_gemm_epilogues) {
      // The chains folded into a GEMM are reported as such, and every chain at its node's
      // place after the fold (the GEMM nodes it removed move later nodes up).
      std::map<const ElementwiseProgram*, std::size_t> chain_of;
      for (std::size_t k = 0; k < fusion_.chains.size(); ++k)
        chain_of[graph_->nodes()[fusion_.chains[k].node].attrs.program.get()] = k;
      std::vector<std::pair<const ElementwiseProgram*, const ElementwiseProgram*>> merged;
      fusion_.gemm_epilogues = graph_->fold_gemm_epilogues(&merged);
      for (const auto& [before, after] : merged)
        if (auto c = chain_of.find(before); c != chain_of.end()) {
          fusion_.chains[c->second].gemm_epilogue = true;
          fusion_.chains[c->second].program = after->describe();
          chain_of[after] = c->second;
        }
      for (std::size_t i = 0; i < graph_->nodes().size(); ++i)
        if (auto c = chain_of.find(graph_->nodes()[i].attrs.program.get()); c != chain_of.end())
          fusion_.chains[c->second].node = i;
      fusion_.nodes_after = graph_->nodes().size();
    }
    fusion_.gemm_biases = gemm_biases;
    fusion_.duplicates = duplicates;
    graph_->plan_memory();
    return outputs;
  }
  if (calls_ > 2) {
    graph_->replay(inputs, options);
    replayed_ = true;
    std::vector<Tensor> outputs;
    for (std::size_t k = 0; k < graph_->num_outputs(); ++k)
      outputs.push_back(graph_->output(k));
    return outputs;
  }
  // Second call: the step run eagerly, then replayed on the same inputs (the same kernels:
  // equal to rounding, bitwise on the CPU). Eager first, so its intermediates are freed
  // before the replay allocates the planned memory. The eager outputs are returned.
  std::vector<Tensor> eager = step();
  check(eager.size() == graph_->num_outputs(), [&] {
    return "graph: the step returned " + std::to_string(eager.size()) +
           " outputs, it was captured with " + std::to_string(graph_->num_outputs());
  });
  ReplayOptions replay = options;
  replay.output_ready = nullptr;  // these outputs are only compared
  graph_->replay(inputs, replay);
  // One output at a time on the host (the eager outputs stay on their device until then):
  // a copy of all of them at once was the peak of a GPT-2-sized run's memory.
  for (std::size_t k = 0; k < eager.size(); ++k) {
    const std::vector<float> want = eager[k].to_floats(), got = graph_->output(k).to_floats();
    check(got.size() == want.size(),
          [&] { return "graph: output " + std::to_string(k) + " changed size"; });
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double a = got[i], b = want[i];
      check(a == b || std::fabs(a - b) <= 1e-5 + 1e-4 * std::fabs(b), [&] {
        return "graph mode: the replayed step differs from the same step run eagerly (output " +
               std::to_string(k) + ", element " + std::to_string(i) + ": " + std::to_string(a) +
               " against " + std::to_string(b) +
               "). The step makes a tensor outside dispatch (a host copy or upload), which a "
               "replay repeats with its first value; declare it as an input, or use mode = eager";
      });
    }
  }
  return eager;
}

}  // namespace loom::graph
