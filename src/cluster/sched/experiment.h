// cluster/sched/experiment — the scheduling experiments `loom fleet simulate` and
// `loom fleet rounds` run, set up from their sources: which jobs on which fleet, what their
// run times rest on, and each run over seeds and perturbed throughputs. The commands only
// parse flags and print what these return.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cluster/sched/fleet.h"
#include "cluster/sched/gavel.h"
#include "cluster/sched/jobs.h"
#include "cluster/sched/rounds.h"
#include "cluster/sched/simulator.h"

namespace loom::cluster {

// Where a discrete-event simulation's jobs come from: exactly one of the four sources.
struct WorkloadSource {
  std::string fleet;                   // CHIP:NODESxCHIPS,... or a YAML file (not with alibaba)
  std::string gavel;                   // a Gavel trace
  std::string throughputs;             // its table (default: ../simulation_throughputs.json)
  bool strict_throughputs = false;     // refuse extrapolated run times
  std::string alibaba, alibaba_nodes;  // an Alibaba PAI 2023 pod list and its node list
  std::string jobs, catalog;           // a YAML list of training jobs, sized on the catalog
  std::int64_t synthetic = 0;          // this many synthetic jobs at `load`, from `seed`
  double load = 0.8;
  std::uint64_t seed = 1;
};

struct Workload {
  Fleet fleet;
  std::vector<Job> jobs;
  std::string source;  // what the jobs are, in words
  std::string basis;   // what their run times rest on, in words
  // The same as counts: ("measured", n), ("extrapolated", n), ("modelled", n), ...
  std::vector<std::pair<std::string, std::int64_t>> run_times;
};

// Errors name the flag that is missing or extra.
Workload load_workload(const WorkloadSource& source);

// The policies `name` runs ("all" or one); with shared chips "all" leaves las out (it
// preempts whole chips only) and `left_out` says so.
struct PolicyChoice {
  std::vector<Policy> policies;
  std::string left_out;
};
PolicyChoice choose_policies(const std::string& name, const std::vector<Job>& jobs);

// The mean JCT in hours of `policy` at each seed: the failures and each job's order of
// alike pools follow the seed, and so do the jobs when the source is synthetic.
std::vector<double> mean_jct_h_per_seed(const Workload& workload, const WorkloadSource& source,
                                        Policy policy, Failures failures,
                                        const Preemption& preemption,
                                        const std::vector<std::uint64_t>& seeds);

// --- Round-based scheduling (Gavel's): the continuous workload or a trace ---

struct RoundsWorkloadSource {
  std::string fleet;
  std::string gavel;            // a trace, or
  double jobs_per_hour = 0;     // > 0: Gavel's continuous workload at this rate
  bool single_gpu = false;      // continuous-single instead of continuous-multiple
  std::int64_t stop_after = 0;  // > 0: the continuous workload ends after this many jobs
  std::string throughputs;      // default: the trace's ../simulation_throughputs.json, or the
                                // repository's data/traces/gavel/ one
  bool strict_throughputs = false;
  std::string window;  // "FIRST:END" (empty: 4000:5000 continuous, every job for a trace)
};

// The mean JCT over seeds with a 95% interval; no mean when a seed saturated.
struct SeedSummary {
  std::optional<double> mean_h;
  double ci95_h = 0;
};

class RoundsExperiment {
 public:
  RoundsExperiment(const RoundsWorkloadSource& source, RoundOptions options);
  RoundsExperiment(const RoundsExperiment&) = delete;
  RoundsExperiment& operator=(const RoundsExperiment&) = delete;

  // One seed's run, every throughput times `speed`, without the extrapolated jobs when
  // `measured_only`.
  RoundReport run(RoundPolicy policy, std::uint32_t seed, double speed = 1.0,
                  bool measured_only = false) const;
  SeedSummary over_seeds(RoundPolicy policy, const std::vector<std::uint32_t>& seeds, double speed,
                         bool measured_only) const;

  const Fleet& fleet() const { return fleet_; }
  const RoundOptions& options() const { return options_; }
  bool continuous() const { return source_.jobs_per_hour > 0; }
  const std::string& workload() const { return workload_; }  // in words
  const std::string& basis() const { return basis_; }        // what run times rest on
  std::int64_t extrapolated() const { return extrapolated_; }

 private:
  RoundsWorkloadSource source_;
  RoundOptions options_;
  Fleet fleet_;
  std::unique_ptr<GavelThroughputs> table_;
  std::vector<Job> trace_;
  std::int64_t extrapolated_ = 0;
  std::string workload_, basis_;
};

// "all" or one name.
std::vector<RoundPolicy> choose_round_policies(const std::string& name);

// Summary of per-seed means: nullopt mean when `saturated` or there are none.
SeedSummary summarize(const std::vector<double>& means_h, bool saturated);

}  // namespace loom::cluster
