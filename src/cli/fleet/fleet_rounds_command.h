// cli/fleet/fleet_rounds_command — `loom fleet rounds`: round-based, time-sliced scheduling as
// Gavel simulates it (cluster/sched/rounds.h), on Gavel's continuous workload or a trace,
// over several seeds, with the mean JCT of a window of jobs and its spread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

struct FleetRoundsOptions {
  std::string fleet, gavel, throughputs, policy = "all", window;
  double jobs_per_hour = 0;  // > 0: Gavel's continuous workload at this input rate
  bool single_gpu = false;   // continuous-single instead of continuous-multiple
  std::vector<std::uint32_t> seeds{0};
  std::int64_t max_active_jobs = 20000;
  std::int64_t stop_after = 0;  // > 0: the continuous workload ends after this many jobs
  bool json = false;
  bool strict_throughputs = false;       // --gavel: refuse extrapolated run times
  bool sensitivity = false;              // also +/-20% throughputs, extrapolated jobs left out
  std::string solver = "water_filling";  // which max-min optimum (MaxMinSolver)
  CLI::App* command = nullptr;
};

void add_fleet_rounds_command(CLI::App& fleet, FleetRoundsOptions& options);
int run_fleet_rounds(const FleetRoundsOptions& options);

}  // namespace loom::cli
