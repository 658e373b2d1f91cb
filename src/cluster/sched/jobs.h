// cluster/sched/jobs — the jobs a fleet runs: when each arrives, how many chips it asks
// for, and how long it runs on each chip type that can run it. Loaded from a Gavel trace
// (measured throughputs per worker type), from a list of transformer training jobs (run
// times from the performance model, cluster/perf), or generated for scale tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cluster/catalog/catalog.h"
#include "cluster/sched/fleet.h"

namespace loom::cluster {

struct Job {
  std::int64_t id = 0;
  std::string name;  // the workload ("ResNet-50 (batch size 64)", "llama3-8b")
  double arrival_s = 0;
  std::int64_t chips = 1;
  // A share of one chip, in thousandths (1-999; chips is then 1): the job shares a chip
  // with others whose shares sum to at most 1,000 (GPU sharing). 0: whole chips.
  std::int64_t milli = 0;
  // Run time in seconds on `chips` chips of each chip type that can run the job; a type
  // missing here cannot (no measurement, or the model does not fit its memory).
  std::map<std::string, double> seconds_on;
  // Gavel's jobs: the steps the job runs (0: not counted in steps) and its priority weight
  // (higher: a larger fair share under the round-based policies).
  double steps = 0;
  double weight = 1;
  // Its run times are extrapolated (a scale factor the throughput table lacks), not measured.
  bool extrapolated = false;
};

// A Gavel trace (TSV) in any of Gavel's formats, told apart by their field count: 10
// (job_type, command, working_directory, num_steps_arg, needs_data_dir, total_steps,
// scale_factor, priority_weight, SLO, arrival_time: Gavel's current one), 9 (the same
// without working_directory), 7 (job_type, command, num_steps_arg, needs_data_dir,
// total_steps, arrival_time_s, scale_factor: the bundled traces) or 6 (without
// needs_data_dir); with Gavel's throughput table (JSON: worker type -> "('<job_type>',
// <scale factor>)" -> {"null": steps/s alone}). A job runs total_steps steps; on each
// worker type its time is total_steps / throughput. Where the table has no entry for a
// scale factor, the largest measured one below it is scaled linearly (an assumption,
// counted in `extrapolated` and marked on the job).
// `strict`: refuse extrapolation instead (an error naming the job, its type, its scale
// factor and the measured ones).
std::vector<Job> load_gavel_trace(const std::string& trace_path,
                                  const std::string& throughputs_path,
                                  std::int64_t* extrapolated = nullptr, bool strict = false);

// What a result's numbers rest on, for sensitivity reports: the jobs with every
// throughput multiplied by `speed` (every run time divided by it), and the jobs whose run
// times were measured (the extrapolated ones left out; ids kept).
std::vector<Job> with_speed(std::vector<Job> jobs, double speed);
std::vector<Job> without_extrapolated(const std::vector<Job>& jobs);

// Transformer training jobs, YAML: jobs: [{model: llama3-8b, tokens: 2e10, chips: 64,
// arrival_h: 0.5}, ...], optionally global_batch (sequences) and seq. A job's time on each
// pool's chip type comes from the best feasible layout the planner finds for that chip
// and count (ThroughputCache).
std::vector<Job> load_training_jobs(const std::string& path, const Catalog& catalog,
                                    const Fleet& fleet);

// `count` jobs arriving as a Poisson process whose offered load is `load`: over the
// arrival period, the jobs bring `load` times the fleet's chip-seconds of work, counted
// at the speed of the first pool's chip type. Chip counts and run times are heavy-tailed
// (powers of two up to a node, 5% of 2-16 whole nodes; run times log-uniform from 5
// minutes to 5 days), and each further chip type is 1/4x to 4x as fast per job: a
// stand-in for a production mix, for scale and policy comparisons.
std::vector<Job> synthetic_jobs(std::int64_t count, const Fleet& fleet, double load,
                                std::uint64_t seed);

}  // namespace loom::cluster
