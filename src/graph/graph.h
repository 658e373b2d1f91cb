// graph/ (floor 4) — capture a step once, optimise it, replay it.
//
// Capture runs the step eagerly once while dispatch reports every kernel it runs (after
// decompositions are expanded and inputs made contiguous): the op, its attributes, and
// the storage regions it reads and writes. A storage first seen as a fresh kernel output
// is *internal*: the graph owns it at replay. Every other storage is *external* and used
// in place: the declared inputs (batch, parameters), which the caller passes again at
// each replay, and anything else the step reads (optimizer state, constants).
//
// Passes, in order:
//   eliminate_dead_nodes: drops nodes whose results nobody reads and that write no
//     external storage.
//   merge_duplicate_nodes (graph/fusion.cpp): a copy, fill, expand or cast that repeats an
//     earlier one (same op, attributes and inputs, nothing rewritten in between, each
//     output written once) is dropped and its readers read the earlier output: the
//     backward pass re-makes the layout copies and constants of the forward one.
//   fold_gemm_biases (graph/fusion.cpp): a matmul and the add of a bias [N] to its product,
//     the add its only reader, become one linear node, the bias folded into the GEMM (on the
//     CPU the GEMM accumulates onto rows preset to the bias): one pass over the product
//     less. Only on a backend whose linear is native.
//   fuse_elementwise (graph/fusion.cpp): each chain of elementwise nodes (add, mul, exp,
//     gelu, the *_backward pairs, ...; core/fused_elementwise.h) becomes one
//     fused_elementwise node at the chain's last node's place: one pass over memory
//     instead of one per op. An intermediate read after the chain's end (or a graph
//     output) is written by the fused node too; one read outside the chain before its
//     end keeps its node out. All nodes of a chain have the same output shape (inputs may
//     broadcast), except that a chain may hold row reductions (sum or mean over the last
//     axis, kept) and elementwise nodes of their one-per-row shape; a chain without a
//     reduction keeps no node of that shape. Nothing between a node and the chain's end
//     rewrites what it reads. Only on a
//     backend that runs the fused op natively, unless asked to fuse anyway (its decomposition then
//     runs the chain).
//   fold_gemm_epilogues (graph/fusion.cpp): a matmul or linear whose product a chain
//     without row reductions reads next becomes one matmul_elementwise node at the
//     chain's place, where the backend runs that op (OpenCL: the chain in the GEMM's
//     store; CUDA: a cuBLASLt epilogue where the chain is one). See the declaration below.
//   plan_memory: gives each internal storage an offset in one arena per device such
//     that storages whose lifetimes overlap never share bytes (greedy by size, as
//     TFLite's arena planner). Without it, each internal storage has its own buffer.
// Replay runs the nodes in capture order through dispatch::execute, so dispatch counts
// and LOOM_STRICT apply as in eager mode, with each per-step dropout seed renewed.
// Outputs are views of graph memory, valid until the next replay.
//
// What a captured step may not do: read a device value on the host to decide what to
// run next (the replay repeats the captured decision), or read host data created during
// the step that changes from step to step without declaring it as an input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/op_catalog.h"
#include "core/tensor.h"
#include "dispatch/dispatch.h"

namespace loom::graph {

// A region of a storage as one kernel argument sees it.
struct Operand {
  int storage = -1;         // index into Graph::storages(); -1: an undefined (optional) input
  std::int64_t offset = 0;  // elements
  Shape shape;
  Strides strides;
  DType dtype = DType::f32;
};

struct Node {
  OpId op;
  Attrs attrs;
  Backend* backend = nullptr;
  std::vector<Operand> inputs, outputs;
};

struct StorageInfo {
  std::size_t bytes = 0;
  Backend* backend = nullptr;
  int input = -1;                    // external: index of the declared input it backs, or -1
  bool internal = false;             // first written as a fresh kernel output during capture
  std::shared_ptr<Buffer> external;  // undeclared external storage, used in place
};

struct GraphStats {
  std::size_t captured_nodes = 0, nodes = 0;
  std::size_t fused_chains = 0;    // fused_elementwise nodes made by fuse_elementwise
  std::size_t gemm_biases = 0;     // linear nodes made by fold_gemm_biases
  std::size_t gemm_epilogues = 0;  // matmul_elementwise nodes made by fold_gemm_epilogues
  std::size_t duplicates = 0;      // nodes merge_duplicate_nodes dropped
  std::size_t internal_storages = 0, external_storages = 0;
  std::size_t internal_bytes = 0;  // sum of the internal storages' sizes
  std::size_t memory_bytes = 0;    // what replay allocates for them (arena or one each)
  bool planned = false;
};

struct FusionOptions {
  // Fuse on a backend without a fused kernel too (the node then runs decomposed, as the
  // chain it replaced): for tests of that path.
  bool without_kernel = false;
  // Chains may take in row reductions (sum or mean over the last axis, kept) and the
  // elementwise steps on their values: a normalisation written in primitives becomes one
  // node. false: reductions end chains, as before.
  bool reductions = true;
};

struct FusedChain {
  std::size_t node = 0;        // the fused node's index in the graph after the pass
  std::size_t members = 0;     // nodes it replaced
  std::string program;         // ElementwiseProgram::describe()
  bool gemm_epilogue = false;  // folded into the GEMM that produces its input 0 after
};

struct FusionReport {
  std::size_t nodes_before = 0, nodes_after = 0;
  std::vector<FusedChain> chains;
  std::size_t gemm_biases = 0;     // matmul + bias pairs fold_gemm_biases made one linear node
  std::size_t gemm_epilogues = 0;  // GEMM + chain pairs fold_gemm_epilogues made one node
  std::size_t duplicates = 0;      // repeated nodes merge_duplicate_nodes dropped
};

// Which passes CapturedStep runs after a capture (each can be turned off).
struct Passes {
  bool merge_duplicates = true;
  bool fold_gemm_biases = true;
  bool fuse_elementwise = true;
  bool fold_gemm_epilogues = true;
  FusionOptions fusion;
  // Every optimising pass on or off (dead-node elimination and the memory plan always run).
  static Passes all(bool on) {
    Passes p;
    p.merge_duplicates = p.fold_gemm_biases = p.fuse_elementwise = p.fold_gemm_epilogues = on;
    return p;
  }
};

struct ReplayOptions {
  std::uint64_t step_seed = 0;  // dropout nodes with per-step masks use mix_seed(step_seed, site)
  // Called during the replay, on the replaying thread, once output k is final: after the
  // last node that reads or writes it. From then on no node touches it, so another
  // thread may read and rewrite it in place (e.g. all-reduce a gradient while the rest
  // of the backward pass runs).
  std::function<void(std::size_t k)> output_ready;
};

class Graph {
 public:
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<StorageInfo>& storages() const { return storages_; }
  std::size_t num_inputs() const { return inputs_.size(); }
  std::size_t num_outputs() const { return outputs_.size(); }
  const GraphStats& stats() const { return stats_; }
  std::string summary() const;  // one line: nodes, storages, memory
  // One line per node: index, op, output and input shapes (in=storage:shape).
  std::string listing() const;

  // Passes (before the first replay).
  void eliminate_dead_nodes();
  FusionReport fuse_elementwise(const FusionOptions& options = {});
  // GEMM epilogue, bias: a matmul whose product only an add of a per-column bias reads
  // becomes one linear node (the bias folded into the GEMM), where the backend runs linear
  // natively. Returns how many pairs it folded. The product's rounding can differ from
  // the add's (the CPU starts the GEMM's sums from the bias): within 1e-5 relative over 20
  // training steps (test), not bit for bit.
  std::size_t fold_gemm_biases();
  // GEMM epilogue, chain: a matmul or linear node whose product an elementwise chain
  // without row reductions reads next (a fused_elementwise node or a single elementwise
  // node), as a whole (of its shape, or through a reshape that keeps its rows: the node
  // then works in the product's shape, the chain's other operands viewed in it, and is
  // not made when one has no such view), becomes one matmul_elementwise node at the chain's
  // place (linear's bias the program's first step), where the backend runs it natively:
  // the chain runs on each value as the GEMM produces it. The product is not stored,
  // unless later nodes read it too: then a linear's (a step of the program) is one more
  // output; a matmul's is left unfolded.
  // Bit-exact where the backend computes the chain as it did on the stored product
  // (OpenCL); CUDA's cuBLASLt epilogues round their own way (within 1e-5 relative over 20
  // GPT steps, tested). Returns how many pairs it folded.
  // `merged` (optional) receives each folded fused chain's program with the program of
  // the node that replaced it.
  std::size_t fold_gemm_epilogues(
      std::vector<std::pair<const ElementwiseProgram*, const ElementwiseProgram*>>* merged =
          nullptr);
  // Drops each copy, fill, expand or cast node that repeats an earlier one on the same
  // inputs (nothing rewrites them in between; both outputs fresh intermediates written
  // once, of the same size); its readers read the earlier output. Bit-exact. Returns how
  // many nodes it dropped.
  std::size_t merge_duplicate_nodes();
  void plan_memory();
  // Byte offset of each internal storage in its device's arena (-1: not internal). Set by
  // plan_memory; tests use it to check that no two live storages share bytes.
  const std::vector<std::int64_t>& arena_offsets() const { return arena_offsets_; }
  // Lifetime [first node, last node] of each storage in the current node list;
  // outputs live to nodes().size().
  std::vector<std::pair<std::int64_t, std::int64_t>> lifetimes() const;

  // Runs the step with `inputs` in place of the captured inputs (same shapes and dtypes,
  // same device, contiguous).
  void replay(std::span<const Tensor> inputs, const ReplayOptions& options = {});
  // Output i of the last replay (or of the capture, before any replay).
  Tensor output(std::size_t index) const;

 private:
  // Removes the nodes marked in `removed` (indexed as nodes_), keeping the others' order.
  void drop_nodes(const std::vector<bool>& removed);

  friend class Capture;
  void materialize();  // allocates internal memory and builds each node's tensors
  Tensor tensor_of(const Operand& operand) const;

  std::vector<Node> nodes_;
  std::vector<StorageInfo> storages_;
  std::vector<TensorSpec> inputs_;           // declared inputs' shapes and dtypes
  std::vector<std::int64_t> input_offsets_;  // declared inputs' element offsets at capture
  std::vector<Operand> outputs_;
  std::vector<Tensor> captured_outputs_;  // the capture's own results, until the first replay
  std::vector<std::int64_t> arena_offsets_;
  GraphStats stats_;

  // Replay state.
  bool materialized_ = false;
  std::vector<std::shared_ptr<Buffer>> storage_buffers_;  // per storage: its arena or own buffer
  std::vector<std::int64_t> storage_base_;                // per storage: byte offset in that buffer
  std::vector<std::shared_ptr<Buffer>> arenas_;
  std::vector<Tensor> bound_inputs_;
  // Each node's argument tensors, built once by materialize(); the operands on declared
  // inputs (listed in rebinds_) are rebuilt at each replay from the tensors passed.
  std::vector<std::vector<Tensor>> node_inputs_, node_outputs_;
  struct Rebind {
    std::size_t node, index;
    bool output;
  };
  std::vector<Rebind> rebinds_;
  std::vector<std::vector<std::size_t>> ready_after_;  // per node: outputs final after it
  std::vector<std::size_t> ready_at_start_;            // outputs no node touches
  bool replayed_ = false;
};

// A step run eagerly once while captured, then replayed. The second call also runs the
// step eagerly and checks that the replay gave the same outputs: a step that creates a
// tensor outside dispatch (a host copy or upload inside the step) would otherwise be
// replayed with that tensor's first value, silently. A mismatch throws, naming the output.
class CapturedStep {
 public:
  explicit CapturedStep(Passes passes = {}) : passes_(passes) {}
  // Runs the step eagerly and returns its outputs (each defined).
  using StepFn = std::function<std::vector<Tensor>()>;
  // `inputs`: what the step reads that may change between calls (see Capture). Returns the
  // step's outputs: the capture's, the verifying eager run's, or the replay's. Passes run
  // after the capture: dead-node elimination, elementwise fusion (unless turned off) and
  // the memory plan.
  std::vector<Tensor> run(std::span<const Tensor> inputs, const StepFn& step,
                          const ReplayOptions& options = {});
  // The last run() replayed the graph alone (its outputs are graph memory, and
  // options.output_ready was called); false for the capturing and the verifying call.
  bool replayed() const { return replayed_; }
  const Graph* graph() const { return graph_ ? &*graph_ : nullptr; }
  // What fuse_elementwise did at capture (empty when it did not run).
  const FusionReport& fusion() const { return fusion_; }

 private:
  Passes passes_;
  FusionReport fusion_;
  std::optional<Graph> graph_;
  int calls_ = 0;
  bool replayed_ = false;
};

// Records the kernels run on this thread between construction and finish().
class Capture final : public dispatch::Recorder {
 public:
  // `inputs`: the tensors the caller will pass again at each replay (the batch, the
  // parameters). Each must be contiguous.
  explicit Capture(std::span<const Tensor> inputs);
  ~Capture() override;
  Capture(const Capture&) = delete;
  Capture& operator=(const Capture&) = delete;

  // Stops recording and returns the graph whose outputs are `outputs` (tensors produced
  // during the capture, or inputs).
  Graph finish(std::span<const Tensor> outputs);

  void executed(Backend& backend, OpId op, std::span<const Tensor> inputs,
                std::span<const Tensor> outputs, const Attrs& attrs, bool fresh_outputs) override;

 private:
  int storage_of(const Tensor& t, bool fresh);
  Operand operand_of(const Tensor& t, bool fresh);

  Graph graph_;
  std::vector<Tensor> inputs_;
  // Storage identity: the Buffer's address, valid while the weak reference lives (an
  // intermediate's memory goes back as soon as the step drops it, and a later buffer may
  // then take the same address: that is a new storage).
  std::map<const Buffer*, int> index_;
  std::vector<std::weak_ptr<Buffer>> seen_;
  dispatch::Recorder* previous_ = nullptr;
  bool active_ = true;
};

}  // namespace loom::graph
