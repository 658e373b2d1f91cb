// cli/ops_command — `loom ops`: what a model's training step runs on each backend.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace loom::cli {

struct OpsOptions {
  std::string model = "gpt";
  std::string backend = "all";
  bool json = false;
};

CLI::App* add_ops_command(CLI::App& app, OpsOptions& options);
int run_ops(const OpsOptions& options);

}  // namespace loom::cli
