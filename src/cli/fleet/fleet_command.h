// cli/fleet/fleet_command — `loom fleet simulate`: a job list on a fleet under each policy.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::cli {

struct FleetOptions {
  std::string fleet;                   // CHIP:NODESxCHIPS,... or a YAML file
  std::string gavel;                   // a Gavel trace
  std::string alibaba, alibaba_nodes;  // Alibaba PAI 2023: pod list, node list
  std::string
      throughputs;   // its throughput table (default: ../simulation_throughputs.json beside it)
  std::string jobs;  // a YAML list of transformer training jobs
  std::int64_t synthetic = 0;
  double load = 0.8;
  std::uint64_t seed = 1;
  std::vector<std::uint64_t> seeds;  // more than one: also the mean JCT over them, with an interval
  std::string policy = "all";
  std::string catalog;
  bool json = false;
  std::string placements;  // CSV of every job's placement, per policy
  // Node failures (0: none), repairs, checkpoints and restarts (cluster::Failures).
  double node_mtbf_hours = 0, repair_hours = 2, checkpoint_minutes = 30, restart_minutes = 10;
  double quantum_minutes = 10;      // las: the preemption quantum
  bool strict_throughputs = false;  // --gavel: refuse extrapolated run times
  bool sensitivity = false;         // report the mean JCT under +/-20% throughputs too
};

CLI::App* add_fleet_command(CLI::App& app, FleetOptions& options);
int run_fleet(const FleetOptions& options);

}  // namespace loom::cli
