// cli/engine/train_command — `loom train`, `loom sample`, `loom eval` and `loom export`: a thin
// layer over train/.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>

namespace loom::cli {

// Every key of the job contract is a flag (`--key` and `--dashed-key`); a YAML file may give
// them too, the command line winning.
struct TrainOptions {
  std::string config_path;
  std::map<std::string, std::string> values;  // the flags given a value, by key
  std::map<std::string, bool> flags;          // the bare flags (`--resume` alone: true)
  CLI::App* command = nullptr;
};
CLI::App* add_train_command(CLI::App& app, TrainOptions& options);
int run_train(const TrainOptions& options);  // the job contract's exit status

struct SampleOptions {
  std::string checkpoint, prompt;
  std::int64_t tokens = 500, seed = 1337;
  double temperature = 0.8, top_p = 1.0;
};
CLI::App* add_sample_command(CLI::App& app, SampleOptions& options);
int run_sample(const SampleOptions& options);

struct EvalOptions {
  std::string checkpoint, data;
  std::int64_t batch = 64;
  bool json = false;
};
CLI::App* add_eval_command(CLI::App& app, EvalOptions& options);
int run_eval(const EvalOptions& options);

struct ExportOptions {
  std::string checkpoint, out;
};
CLI::App* add_export_command(CLI::App& app, ExportOptions& options);
int run_export(const ExportOptions& options);

}  // namespace loom::cli
