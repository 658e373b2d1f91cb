#include "cli/engine/ops_command.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "autograd/functions.h"
#include "cli/engine/torch_report.h"
#include "core/error.h"
#include "core/job_contract.h"
#include "core/op_catalog.h"
#include "data/text.h"
#include "dispatch/devices.h"
#include "dispatch/dispatch.h"
#include "graph/graph.h"
#include "nn/decoder.h"
#include "nn/init.h"
#include "onnx/model.h"
#include "onnx/parser.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/step_measure.h"
#include "train/training_run.h"

namespace loom::cli {
namespace {

// One op's calls per step by path (what decides its coverage: train/step_measure.h).
using Cell = train::OpPaths;

// The step captured in graph mode, without and with elementwise fusion.
struct FusionResult {
  bool capturable = true;
  bool kernel = true;  // the backend runs fused_elementwise natively (else the pass fuses nothing)
  std::size_t nodes_unfused = 0, nodes_fused = 0;
  double step_seconds_unfused = 0, step_seconds_fused = 0;
  std::vector<graph::FusedChain> chains;
  std::size_t gemm_biases = 0;     // matmul + bias pairs folded into linear
  std::size_t gemm_epilogues = 0;  // GEMM + chain pairs folded into matmul_elementwise
  std::size_t duplicates = 0;      // repeated copy/fill/expand/cast nodes merged
};

struct Report {
  std::map<OpId, Cell> cells;
  double step_seconds = 0;
  std::int64_t vocab = 0;  // a GPT's vocabulary
  std::optional<FusionResult> fusion;
  // An imported model's element types and how each is held (io::describe_element_types).
  std::optional<std::string> element_types;
};

// `loom ops --json`'s objects are the job contract's (contract::record::kOpsSchemaVersion,
// which the fleet service checks). 1: backend, model, step_s, launches_per_step,
// transformer, ops; with --fusion, fusion (gemm_biases and duplicates added later: within
// a version fields are only added, and readers ignore the unknown).

// The forward and backward pass captured in graph mode (graph::CapturedStep, as
// `loom train --mode graph` runs it), then AdamW: the mean time of o.steps replays (at
// least 3) after the capturing and the checking call, unfused and fused.
FusionResult measure_fusion(const OpsOptions& o, Backend& device, nn::Model& model,
                            const Tensor& inputs, const Tensor& targets, optim::AdamW& opt) {
  FusionResult result;
  if (const auto* imported = dynamic_cast<const nn::OnnxModel*>(&model);
      imported != nullptr && !imported->capturable()) {
    result.capturable = false;
    return result;
  }
  std::vector<nn::Parameter>& params = model.parameters();
  Attrs probe;
  result.kernel = device.supports(OpCall{OpId::fused_elementwise, {}, {}, probe});
  for (bool fuse : {false, true}) {
    graph::CapturedStep captured(graph::Passes::all(fuse));
    std::vector<std::size_t> with_grad;
    auto forward_backward = [&] {
      autograd::Tape tape;
      autograd::Var loss =
          autograd::cross_entropy(tape, model.forward(tape, inputs, {true, 1}), targets);
      tape.backward(loss);
      std::vector<Tensor> outputs{loss.value()};
      with_grad.clear();
      for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].var.grad().defined()) {
          with_grad.push_back(i);
          outputs.push_back(params[i].var.grad());
        }
      return outputs;
    };
    auto step = [&] {
      std::vector<Tensor> in{inputs, targets};
      for (const nn::Parameter& p : params)
        in.push_back(p.var.value());
      std::vector<Tensor> outputs = captured.run(in, forward_backward);
      for (std::size_t k = 0; k < with_grad.size(); ++k)
        params[with_grad[k]].var.state()->grad = outputs[k + 1];
      opt.step(1e-3);
      opt.zero_grad();
      outputs[0].item();
    };
    step();  // capture
    step();  // check against eager execution
    const int steps = std::max(o.steps, 3);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i)
      step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
    (fuse ? result.step_seconds_fused : result.step_seconds_unfused) = seconds;
    (fuse ? result.nodes_fused : result.nodes_unfused) = captured.graph()->stats().nodes;
    if (fuse) {
      result.chains = captured.fusion().chains;
      result.gemm_biases = captured.fusion().gemm_biases;
      result.gemm_epilogues = captured.fusion().gemm_epilogues;
      result.duplicates = captured.fusion().duplicates;
    }
  }
  return result;
}

// One training step (forward, backward, clipping, AdamW) of the model on `device`.
// Counters and time are per step: one untimed warm-up step, then the mean of o.steps.
Report measure(const OpsOptions& o, Backend& device) {
  train::ModelSpec spec;
  spec.kind = o.model;
  if (o.model == "gpt") {
    spec.layers = o.layers;
    spec.width = o.width;
    spec.heads = o.heads;
    spec.context = o.context;
    spec.vocab = o.vocab;
  } else if (nn::is_decoder_family(o.model)) {
    train::TrainConfig shape;  // the decoder loom train builds for these keys
    shape.model = o.model;
    shape.layers = o.layers;
    shape.width = o.width;
    shape.heads = o.heads;
    shape.kv_heads = o.kv_heads;
    shape.context = o.context;
    spec = train::decoder_spec(shape, o.vocab);
  } else if (o.model == "onnx") {
    check(!o.onnx.empty(), "loom ops --model onnx needs --onnx FILE");
    spec.onnx = o.onnx;
  } else {
    // loom train's defaults for the image models (core/job_contract.def)
    spec.width = o.model == "mlp" ? 512 : 128;
    spec.layers = 2;
  }
  train::SyntheticStep synthetic = train::synthetic_step(spec, o.batch, device);
  auto& model = synthetic.model;
  const Tensor& inputs = synthetic.inputs;
  const Tensor& targets = synthetic.targets;
  check(device.set_matmul_precision(o.precision == "bf16" ? DType::bf16 : DType::f32),
        "loom ops: " + std::string(device.name()) + " has no " + o.precision + " matmul products");
  struct Restore {  // the device is the process's: leave it as found
    Backend& device;
    ~Restore() { device.set_matmul_precision(DType::f32); }
  } restore{device};
  optim::AdamW opt(model->parameters(), {});
  auto step = [&] {
    autograd::Tape tape;
    autograd::Var loss =
        autograd::cross_entropy(tape, model->forward(tape, inputs, {true, 1}), targets);
    tape.backward(loss);
    optim::clip_grad_norm(model->parameters(), 1.0);
    opt.step(1e-3);
    opt.zero_grad();
    loss.value().item();
  };
  std::optional<FusionResult> fusion;
  if (o.fusion)
    fusion = measure_fusion(o, device, *model, inputs, targets, opt);
  // One untimed step first (allocation, kernel selection), unless only one is asked for.
  train::StepMeasure measured = train::measure_steps(device, o.steps > 1 ? 1 : 0, o.steps, step);
  Report r;
  r.cells = std::move(measured.ops);
  r.step_seconds = measured.step_seconds;
  r.vocab = o.vocab;
  r.fusion = std::move(fusion);
  if (const auto* imported = dynamic_cast<const nn::OnnxModel*>(model.get()))
    r.element_types = io::describe_element_types(imported->graph());
  return r;
}

std::string cell_text(const Cell& c) {
  if (!c.used())
    return "-";
  char buf[64];
  std::uint64_t calls = c.native.calls + c.decomposed.calls + c.fallback.calls;
  if (c.fallback.calls) {
    std::snprintf(buf, sizeof buf, "fallback %llu (%.1f MB)",
                  static_cast<unsigned long long>(calls),
                  static_cast<double>(c.fallback.bytes_moved) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%s %llu", dispatch::path_name(c.path()),
                  static_cast<unsigned long long>(calls));
  }
  double ms = (c.native.seconds + c.decomposed.seconds + c.fallback.seconds) * 1e3;
  return std::string(buf) +
         (ms >= 0.01 ? ", " + std::to_string(ms).substr(0, std::to_string(ms).find('.') + 3) + " ms"
                     : std::string());
}

}  // namespace

CLI::App* add_ops_command(CLI::App& app, OpsOptions& o) {
  CLI::App* ops =
      app.add_subcommand("ops", "operator coverage of a model's training step on each backend");
  ops->add_option("--model", o.model,
                  "gpt | llama | mistral | qwen2 | qwen3 | mlp | cnn | onnx (with --onnx FILE)")
      ->check(CLI::IsMember({"gpt", "llama", "mistral", "qwen2", "qwen3", "mlp", "cnn", "onnx"}));
  ops->add_option("--onnx", o.onnx, "model onnx: the .onnx file whose training step to report");
  ops->add_option("--backend", o.backend, "a backend name or all");
  ops->add_flag("--json", o.json, "one JSON object per backend");
  ops->add_option("--layers", o.layers, "gpt: transformer blocks")->check(CLI::Range(1, 1024));
  ops->add_option("--width", o.width, "gpt: embedding width")->check(CLI::Range(1, 65536));
  ops->add_option("--heads", o.heads, "gpt: attention heads")->check(CLI::Range(1, 1024));
  ops->add_option("--kv_heads", o.kv_heads,
                  "decoder families: key/value heads (0: as many as heads)")
      ->check(CLI::Range(0, 1024));
  ops->add_option("--context", o.context, "gpt: context length")->check(CLI::Range(1, 1 << 20));
  ops->add_option("--batch", o.batch, "gpt: sequences per step")->check(CLI::Range(1, 1 << 20));
  ops->add_option("--vocab", o.vocab, "gpt: vocabulary size")->check(CLI::Range(1, 1 << 24));
  ops->add_option("--steps", o.steps,
                  "timed steps after one warm-up step (1: the first step alone)")
      ->check(CLI::Range(1, 100000));
  ops->add_option("--precision", o.precision, "f32 | bf16: the operands of matmul products")
      ->check(CLI::IsMember({"f32", "bf16"}));
  ops->add_option("--config", o.config,
                  "a training config (YAML): measure the step loom train runs for it (its model, "
                  "data, mode, fusion, dropout, precision)");
  ops->add_option("--threads", o.threads, "CPU threads (default: all, or the config's)")
      ->check(CLI::Range(1, 1024));
  ops->add_flag("--fusion", o.fusion,
                "also capture the step in graph mode: each fused chain of elementwise ops, and "
                "the step's time unfused and fused");
  ops->add_flag("--sync", o.sync,
                "wait for each op to finish on its device, so times are device times per op "
                "(removes overlap: for profiling)");
  ops->add_option("--torch_report", o.torch_report,
                  "show the report a PyTorch script on the loom device wrote at exit "
                  "(LOOM_TORCH_REPORT=FILE, docs/pytorch.md) instead of measuring a model")
      ->excludes(ops->get_option("--config"))
      ->excludes(ops->get_option("--onnx"))
      ->excludes(ops->get_option("--fusion"));
  return ops;
}

namespace {
// The model, shape and batch of a training config, as `loom train CONFIG` builds them
// (the fleet service asks for the coverage and speed of a job's own model this way); the
// step itself is measured as `loom train` runs it (measure_config).
OpsOptions with_config(OpsOptions o, train::TrainConfig& cfg) {
  check(!o.fusion,
        "loom ops --config: --fusion measures the flags' model; a config's step "
        "runs as its mode and fusion keys say (mode: graph, fusion: true)");
  cfg.load_yaml(o.config);
  cfg.finalize();
  o.model = cfg.model;
  o.onnx = cfg.onnx;
  o.batch = cfg.batch;
  o.layers = cfg.layers;
  o.width = cfg.width;
  o.heads = cfg.heads;
  o.kv_heads = cfg.kv_heads;
  o.context = cfg.context;
  o.precision = cfg.precision;
  if (o.threads == 0)
    o.threads = cfg.threads;
  cfg.threads = o.threads;
  return o;
}

// The config's training step on `device_name`, through the trainer's own pieces.
Report measure_config(const OpsOptions& o, const train::TrainConfig& cfg,
                      const std::string& device_name) {
  train::StepMeasure measured = train::measure_training_step(cfg, device_name, o.steps);
  Report r;
  r.cells = std::move(measured.ops);
  r.step_seconds = measured.step_seconds;
  r.vocab = measured.vocab;
  return r;
}

namespace record = contract::record;

// The GPT's shape as the planner's performance model reads it (the fleet service prices a
// chip's step with it).
nlohmann::ordered_json transformer_record(const OpsOptions& o, std::int64_t vocab) {
  return {{record::kLayers, o.layers}, {record::kHidden, o.width},       {record::kHeads, o.heads},
          {record::kFfn, 4 * o.width}, {record::kVocab, vocab},          {record::kSeq, o.context},
          {record::kBatch, o.batch},   {record::kPrecision, o.precision}};
}

// One backend's `loom ops --json` object (the job contract's record: the fleet service
// reads it).
nlohmann::ordered_json json_of(const OpsOptions& o, const std::string& backend, const Report& r) {
  nlohmann::ordered_json j{{record::kSchemaVersion, record::kOpsSchemaVersion},
                           {"backend", backend},
                           {"model", o.model},
                           {record::kStepSeconds, r.step_seconds}};
  // Op calls per step that reach the device or come back from it: native kernels and
  // fallbacks (a decomposed op's parts are counted as the ops they are).
  std::uint64_t launches = 0;
  for (const auto& [op, c] : r.cells)
    launches += c.native.calls + c.fallback.calls;
  j[record::kLaunchesPerStep] = launches;
  if (r.element_types)
    j["element_types"] = *r.element_types;
  if (o.model == "gpt" || nn::is_decoder_family(o.model))
    j[record::kTransformer] = transformer_record(o, r.vocab);
  for (const auto& [op, c] : r.cells)
    j[record::kOps][std::string(op_name(op))] = {
        {record::kOpPath, dispatch::path_name(c.path())},
        {"calls", c.native.calls + c.decomposed.calls + c.fallback.calls},
        {"bytes_moved", c.fallback.bytes_moved},
        {"seconds", c.native.seconds + c.decomposed.seconds + c.fallback.seconds}};
  if (const auto& f = r.fusion) {
    nlohmann::ordered_json fusion{{"capturable", f->capturable}, {"kernel", f->kernel}};
    if (f->capturable) {
      fusion["nodes_unfused"] = f->nodes_unfused;
      fusion["nodes_fused"] = f->nodes_fused;
      fusion["step_s_unfused"] = f->step_seconds_unfused;
      fusion["step_s_fused"] = f->step_seconds_fused;
      fusion["gemm_biases"] = f->gemm_biases;
      fusion["gemm_epilogues"] = f->gemm_epilogues;
      fusion["duplicates"] = f->duplicates;
      fusion["chains"] = nlohmann::json::array();
      for (const graph::FusedChain& c : f->chains)
        fusion["chains"].push_back({{"node", c.node},
                                    {"members", c.members},
                                    {"program", c.program},
                                    {"gemm_epilogue", c.gemm_epilogue}});
    }
    j["fusion"] = fusion;
  }
  return j;
}

// The text report: every op used on any backend by path, then each backend's summary and
// fusion.
void print_table(const OpsOptions& o, const std::vector<std::string>& names,
                 const std::vector<Report>& reports) {
  if (reports.front().element_types)
    std::printf("element types of %s: %s\n", o.onnx.c_str(),
                reports.front().element_types->c_str());
  std::printf("training step of %s (%s products): calls per step by path, and %s\n%-26s %-10s",
              o.model.c_str(), o.precision.c_str(),
              o.sync
                  ? "device time per step (each op waited for)"
                  : "time per step (host time: on an asynchronous device, --sync for device time)",
              "op", "role");
  for (const auto& n : names)
    std::printf(" %-32s", n.c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < kNumOps; ++i) {
    auto op = static_cast<OpId>(i);
    bool used = false;
    for (const auto& r : reports)
      used = used || (r.cells.count(op) && r.cells.at(op).used());
    if (!used)
      continue;
    std::printf("%-26s %-10s", std::string(op_name(op)).c_str(),
                std::string(role_name(op_info(op).role)).c_str());
    for (const auto& r : reports)
      std::printf(" %-32s", r.cells.count(op) ? cell_text(r.cells.at(op)).c_str() : "-");
    std::printf("\n");
  }
  for (std::size_t b = 0; b < names.size(); ++b) {
    int counts[3] = {0, 0, 0};
    std::uint64_t bytes = 0;
    for (const auto& [op, c] : reports[b].cells) {
      if (!c.used())
        continue;
      ++counts[static_cast<int>(c.path())];
      bytes += c.fallback.bytes_moved;
    }
    std::printf(
        "%s: %d ops native, %d decomposed, %d fall back to the CPU (%.1f MB copied per step); step "
        "%.1f ms\n",
        names[b].c_str(), counts[0], counts[1], counts[2], static_cast<double>(bytes) / 1e6,
        reports[b].step_seconds * 1e3);
  }
  for (std::size_t b = 0; b < names.size(); ++b) {
    const auto& f = reports[b].fusion;
    if (!f)
      continue;
    if (!f->capturable) {
      std::printf(
          "\nfusion on %s: the model reads integer inputs on the host; graph mode "
          "cannot capture its step\n",
          names[b].c_str());
      continue;
    }
    if (!f->kernel) {
      std::printf(
          "\nfusion on %s: none (the backend has no fused_elementwise kernel, so the "
          "pass leaves its graph as captured: %zu nodes, %.2f ms per step)\n",
          names[b].c_str(), f->nodes_unfused, f->step_seconds_unfused * 1e3);
      continue;
    }
    std::size_t replaced = 0;
    for (const graph::FusedChain& c : f->chains)
      replaced += c.members;
    std::printf(
        "\nfusion on %s: %zu duplicate nodes merged, %zu chains replace %zu of %zu graph nodes, "
        "%zu GEMM biases folded into linear, %zu GEMM epilogues (%zu left); step in graph mode "
        "%.2f ms unfused, %.2f ms fused (%.2fx)\n",
        names[b].c_str(), f->duplicates, f->chains.size(), replaced, f->nodes_unfused,
        f->gemm_biases, f->gemm_epilogues, f->nodes_fused, f->step_seconds_unfused * 1e3,
        f->step_seconds_fused * 1e3, f->step_seconds_unfused / f->step_seconds_fused);
    for (const graph::FusedChain& c : f->chains)
      std::printf("  node %-4zu %2zu ops%s: %s\n", c.node, c.members,
                  c.gemm_epilogue ? " (in a GEMM's epilogue)" : "", c.program.c_str());
  }
}
}  // namespace

int run_ops(const OpsOptions& given) {
  if (!given.torch_report.empty())
    return print_torch_report(given.torch_report, given.json);
  train::TrainConfig cfg;
  const OpsOptions o = given.config.empty() ? given : with_config(given, cfg);
  if (o.threads > 0)
    dispatch::host().set_threads(static_cast<int>(o.threads));
  dispatch::set_synchronous_timing(o.sync);
  std::vector<std::string> names =
      o.backend == "all" ? dispatch::device_names() : std::vector<std::string>{o.backend};
  std::vector<Report> reports;
  for (const auto& n : names)
    reports.push_back(o.config.empty() ? measure(o, dispatch::device(n))
                                       : measure_config(o, cfg, n));
  if (o.json) {
    for (std::size_t b = 0; b < names.size(); ++b)
      std::printf("%s\n", json_of(o, names[b], reports[b]).dump().c_str());
    return 0;
  }
  print_table(o, names, reports);
  return 0;
}

}  // namespace loom::cli
