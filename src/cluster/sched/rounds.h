// cluster/sched/rounds — round-based, time-sliced scheduling as Gavel simulates it
// (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
// Workloads", OSDI 2020; scheduler.py in stanford-futuredata/gavel), so that Loom's
// figures can be held against Gavel's.
//
// A policy gives each job a share of time on each chip type (an allocation: X[j][t] in
// [0, 1], sum over t at most 1, sum over j of chips_j X[j][t] at most the type's chips).
// Every round (360 s) the chips go to the jobs whose received time lags their share most:
// priority = X[j][t] / (the fraction of type t's time job j has had since the allocation
// was computed), per type, highest first; a job runs on one type a round, on chips_j chips
// of it. The allocation is recomputed when jobs arrived or finished, at most every 1,920 s
// (Gavel's minimum time between resets); a job that arrived since is not in it and waits.
//
// Policies (Gavel's names):
//   max_min_fairness       type-agnostic max-min fairness (the paper's "LAS"): maximise
//                          min_j chips_j / w_j x sum_t X[j][t], every type alike;
//   max_min_fairness_perf  heterogeneity-aware max-min fairness (the paper's "Gavel"):
//                          maximise min_j sum_t T[j][t] chips_j X[j][t] / (w_j P_j), T the
//                          job's throughput on type t and P_j its throughput under an equal
//                          share of every type (sum_t T[j][t] N_t / sum_t N_t);
// each solved as linear programs by GLPK (linear_program.h); and Gavel's FIFO family,
//   fifo                   first come, first served, non-preemptive: a job keeps the type
//                          it was given until it finishes (the paper's "FIFO");
//   fifo_perf              first come, first served, each allocation given afresh in
//                          arrival order, every job to the fastest type with room for it
//                          (the paper's heterogeneity-aware FIFO, "Gavel");
// both give each job all or nothing of one type (FifoAllocator below). The max-min optimum is not
// unique: only the least share is pinned down. Loom takes the max-min fair allocation in
// its standard (lexicographic) sense, by water-filling: maximise the least share, settle
// the jobs that cannot get more (non-zero duals), maximise the least share of the rest,
// and so on. Gavel solves one program with an interior-point solver (ECOS) and takes the
// point it ends at; the jobs that are not the bottleneck get whatever that point gives
// them. RoundOptions::solver = interior_point does that instead (one program, ended
// inside its optima by GLPK's interior-point method), and reproduces Gavel's figures
// where water-filling does not (bench/RESULTS.md, docs/fleet.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cluster/sched/fleet.h"
#include "cluster/sched/gavel.h"
#include "cluster/sched/jobs.h"

namespace loom::cluster {

enum class RoundPolicy { max_min_fairness, max_min_fairness_perf, fifo, fifo_perf };

// Which of the max-min optima the max-min policies take (rounds.h's header comment):
//   water_filling   the lexicographic max-min fair allocation (Loom's default), over
//                   classes of alike jobs, by simplex;
//   interior_point  Gavel's own way: one program over every job (no classes), maximising
//                   the least share, solved by an interior-point method without crossover
//                   (GLPK's, where Gavel uses ECOS), taking the point it ends at.
enum class MaxMinSolver { water_filling, interior_point };
std::optional<RoundPolicy> parse_round_policy(const std::string& text);  // nullopt: not one
const char* round_policy_name(RoundPolicy policy);

struct RoundOptions {
  double round_s = 360;           // Gavel's time_per_iteration
  double min_reset_s = 1920;      // minimum time between allocation recomputations
  std::uint32_t seed = 0;         // the type-agnostic policies' type order (seed + 5, as Gavel)
  std::int64_t window_begin = 0;  // JCT over the jobs with ids in [begin, end): Gavel
  std::int64_t window_end = -1;   // measures 4000-5000 of a continuous stream; -1: all
  std::int64_t max_active_jobs = 20000;  // more waiting at once: the run stops, saturated
  MaxMinSolver solver = MaxMinSolver::water_filling;
};

struct RoundReport {
  RoundPolicy policy = RoundPolicy::max_min_fairness;
  std::int64_t jobs = 0, finished = 0, window_jobs = 0;
  double mean_jct_s = 0;      // over the window's jobs
  double mean_jct_all_s = 0;  // over every finished job
  double end_s = 0;           // simulated time at the end
  std::int64_t rounds = 0, allocations = 0;
  std::int64_t programs = 0;  // linear programs solved (water-filling: several per allocation)
  bool saturated = false;     // stopped at max_active_jobs: the queue grew without bound
  std::vector<std::string> rejected;  // jobs no chip type of the fleet can run
  std::vector<double> jct_s;          // per job id (NaN: not finished)
  std::vector<double> utilization;  // per chip type (in `types`): busy chip-seconds / (chips x end)
  std::vector<std::string> types;
};

// Jobs in arrival order; nullopt when there are no more.
using JobSource = std::function<std::optional<Job>()>;

// Runs `jobs` on `fleet` (each pool's chip is a type; pools of one type are pooled; chips
// per node play no part: every chip is its own server, as in Gavel's figures) until every
// job of the window has finished (or the source is empty and every job has).
RoundReport simulate_rounds(const Fleet& fleet, const JobSource& jobs, RoundPolicy policy,
                            const RoundOptions& options = {});

// The allocation `policy` gives these jobs on chip types with `chips` chips each: X[j][t].
// `rate[j][t]`: job j's throughput on type t (0: cannot run there); `scale[j]` its chips,
// `weight[j]` its priority weight. Exposed for tests.
std::vector<std::vector<double>> round_allocation(
    RoundPolicy policy, const std::vector<std::vector<double>>& rate,
    const std::vector<std::int64_t>& scale, const std::vector<double>& weight,
    const std::vector<std::int64_t>& chips, std::int64_t* programs = nullptr,
    MaxMinSolver solver = MaxMinSolver::water_filling);

// Gavel's FIFO allocation (policies/fifo.py), as Gavel's code runs it, because its FIFO
// figure was drawn by that code. Jobs are taken in id (arrival) order; each allocated job
// gets X = 1 on one type, the others X = 0 (and a job with X = 0 on a type never runs
// there, even on idle chips: Gavel's invalid_allocation_zero). Chip types are considered
// in name order. With `performance_aware`, every allocation starts afresh and a job goes
// to the type with its highest throughput among those with room for it. Without it the
// allocation persists: a finished job's chips go to the first waiting job if it fits
// there, and the rest of the queue is placed one job at a time. Gavel's code draws a
// random index among the types with room but then places the job on the last type of
// its list of types with free chips (by name, "v100" before "p100" and "k80" fill up;
// even when that type has no room left, while another type has), and uses the random
// index only to decide which type leaves the list when one fills. Loom does the same:
// a random type puts a third of the jobs on K80s and gives 38.8 h at 0.2 jobs/h where
// Gavel's FIFO figure has 17.3 h (about a V100 run time; bench/RESULTS.md).
class FifoAllocator {
 public:
  FifoAllocator(bool performance_aware, std::uint32_t seed)
      : performance_aware_(performance_aware), rng_(seed) {}
  // X[j][t] for the jobs now active (`ids` ascending), `rate[j][t]` their throughputs (0:
  // cannot run there), `scale[j]` their chips; `type_names[t]` and `chips[t]` the types.
  std::vector<std::vector<double>> allocate(const std::vector<std::int64_t>& ids,
                                            const std::vector<std::vector<double>>& rate,
                                            const std::vector<std::int64_t>& scale,
                                            const std::vector<std::string>& type_names,
                                            const std::vector<std::int64_t>& chips);

 private:
  bool performance_aware_;
  PythonRandom rng_;  // Gavel's FIFOPolicy(seed=seed)
  std::map<std::int64_t, std::pair<std::size_t, std::int64_t>> allocation_;  // id -> type, chips
};

}  // namespace loom::cluster
