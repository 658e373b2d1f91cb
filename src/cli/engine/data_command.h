// cli/engine/data_command — `loom data prepare`: text or JSONL into a Megatron indexed corpus.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace loom::cli {

struct DataOptions {
  std::string tokenizer, out, json_key = "text";
  std::vector<std::string> inputs;
  bool no_eos = false;
  CLI::App* prepare = nullptr;
};
CLI::App* add_data_command(CLI::App& app, DataOptions& options);
int run_data(const DataOptions& options);

}  // namespace loom::cli
