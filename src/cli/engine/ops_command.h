// cli/engine/ops_command — `loom ops`: what a model's training step runs on each backend.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace loom::cli {

struct OpsOptions {
  std::string model = "gpt";
  std::string onnx;  // model onnx: the file
  std::string backend = "all";
  bool json = false;
  // gpt's and the decoder families' shape (defaults: the default training run) and the timed steps
  // after one warm-up.
  std::int64_t layers = 4, width = 128, heads = 4, context = 64, batch = 12, vocab = 65;
  std::int64_t kv_heads = 0;  // decoder families: key/value heads (0: as many as heads)
  int steps = 1;
  std::string precision = "f32";  // f32 | bf16: the operands of matmul products
  bool sync = false;              // time each op to its completion on the device
  bool fusion = false;  // also capture the step in graph mode: the fused chains, and its time
                        // per step unfused and fused
  std::string config;   // a training config (YAML): its step, as loom train runs it, is measured
  std::int64_t threads = 0;  // CPU threads (0: the default)
  std::string torch_report;  // a PyTorch script's LOOM_TORCH_REPORT file, shown instead
};

CLI::App* add_ops_command(CLI::App& app, OpsOptions& options);
int run_ops(const OpsOptions& options);

}  // namespace loom::cli
