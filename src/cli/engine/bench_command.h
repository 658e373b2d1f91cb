// cli/engine/bench_command — `loom bench --device X`: measure a backend and write its device
// profile (docs/device-profile.md), the file `loom plan --profile` reads.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace loom::cli {

struct BenchOptions {
  std::string device = "cpu", out, chip;
  bool quick = false;
};

CLI::App* add_bench_command(CLI::App& app, BenchOptions& options);
int run_bench(const BenchOptions& options);

}  // namespace loom::cli
