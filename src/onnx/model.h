// onnx/model.h — a model imported from ONNX, run (and trained) by Loom's engine.
//
// Each ONNX node becomes differentiable catalog calls (autograd functions), so an
// imported model runs on every backend through dispatch (native, decomposed or counted
// fallback) and trains like a native one. Its parameters are the float initializers,
// under their ONNX names, except those holding non-finite values (attention masks with
// -inf), those that are only an op's setting (Clip's bounds) and the literals of the
// exported code (the dynamo exporter's rank-0 val_N), which stay constants; an initializer
// that the exporter shared between several names through Identity nodes becomes one
// parameter per name. ONNX does not tell
// parameters from buffers, so a finite buffer (e.g. a positional table registered as a
// buffer) trains too. Integer initializers and constants (shapes, axes) stay on the host,
// where shape arithmetic belongs.
//
// Supported ONNX ops are listed by onnx_supported_ops(); a model with any other op
// loads, reports it in coverage(), and fails with the node's name and op when run.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dispatch/devices.h"
#include "nn/model.h"
#include "onnx/parser.h"

namespace loom::nn {

// The ONNX op types the importer maps onto catalog operators, sorted.
const std::vector<std::string>& onnx_supported_ops();

// One test of the ONNX backend suite (a folder with model.onnx and test_data_set_0/
// input_N.pb, output_N.pb): the model on those inputs against those outputs, with the
// ONNX runner's default tolerance (rtol 1e-3, atol 1e-7; integers exactly).
struct OnnxTestResult {
  // status: pass | fail | error | unsupported (detail: the ops) | random (the expected
  // output was drawn from numpy's generator: Dropout in training mode, the Random* ops,
  // Bernoulli; a mismatch there says nothing, and it is never counted as a pass)
  std::string test, status, detail;
};
OnnxTestResult run_onnx_backend_test(const std::string& folder, Backend& device,
                                     Backend& host = dispatch::host());

// How far a model's output `got` is from an expected `want` of the same shape: the largest
// |got - want| and whether every element is within atol + rtol * |want|. Equal values
// (infinities included) and NaN against NaN agree; any other NaN or infinity is an
// infinite error, so it cannot hide behind a maximum.
struct OutputError {
  double max_abs = 0;
  bool within_tolerance = true;
};
OutputError output_error(const Tensor& got, const Tensor& want, double atol, double rtol);

class OnnxModel final : public Model {
 public:
  // Reads `path` and places its float initializers on `backend` as parameters.
  // Integer tensors, shape arithmetic and the file's initializers live on `host` (the
  // CPU) until a float one moves to `backend`.
  OnnxModel(const std::string& path, Backend& backend, Backend& host = dispatch::host());

  std::vector<Parameter>& parameters() override { return params_; }
  // The first graph input is `inputs`; returns the first graph output.
  autograd::Var forward(autograd::Tape& tape, const Tensor& inputs,
                        const ForwardOptions& options) override;
  std::string kind() const override { return "onnx"; }

  // Every graph output for the given graph inputs (in the graph's input order).
  std::vector<autograd::Var> run(autograd::Tape& tape, const std::vector<Tensor>& inputs,
                                 const ForwardOptions& options);
  // Inference: every graph output as a tensor (float on the device, integers on the host).
  std::vector<Tensor> evaluate(const std::vector<Tensor>& inputs);

  struct OpUse {
    std::string op;
    int count = 0;
    bool supported = false;
  };
  // True when a training step of this model can be captured as a graph: integer inputs
  // (token ids) are only used as Gather indices or for their shape, never read as values
  // on the host, where a captured replay could not see them change, and no node runs a
  // subgraph (If, Loop, Scan: their trip counts and branches are decided on the host).
  bool capturable() const;
  // Why a training step cannot be captured ("" when it can): the node and the reason.
  std::string capture_refusal() const;
  // Each op type of the graph, in first-use order, with its count and support.
  std::vector<OpUse> coverage() const;
  const io::OnnxGraph& graph() const { return graph_; }
  // The most nodes one run of the graph may execute, its loops' iterations included (by
  // default 2^22): a file whose Loop never ends stops with an error, never a hang.
  void set_node_limit(std::int64_t limit) { node_limit_ = limit; }

 private:
  // Each output as a Var (float) or a host tensor (integers).
  std::vector<std::pair<autograd::Var, Tensor>> run_graph(autograd::Tape& tape,
                                                          const std::vector<Tensor>& inputs,
                                                          const ForwardOptions& options);
  io::OnnxGraph graph_;
  Backend& backend_;
  Backend& host_;
  std::int64_t node_limit_ = std::int64_t{1} << 22;
  std::vector<Parameter> params_;
  std::map<std::string, std::size_t> param_index_;        // initializer name -> params_ index
  std::map<std::string, Tensor> host_constants_;          // non-float initializers
  std::map<std::string, autograd::Var> float_constants_;  // initializers with non-finite values
  std::set<std::string> untied_;  // parameters made from an Identity of an initializer
};

}  // namespace loom::nn
